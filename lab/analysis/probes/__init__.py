"""Probes: what can be read off an activation, measured honestly.

    ridge      ŷ = x·w + b,          w = argmin ‖Xw + b − y‖² + α‖w‖²          (regression; R²)
    logistic   P(y = 1 | x) = σ(x·w + b), w = argmin mean CE + ½λ‖w‖²         (classification; accuracy, AUROC)
               (k > 2 classes: softmax over x·W + b)
    mlp        P(y | x) = softmax(W₂ ReLU(W₁x + b₁) + b₂), AdamW with weight decay λ
               (or a regression output). A linear probe can miss what a small nonlinear one finds: a
               model's confidence may be a max over many value directions, not one direction
               (docs/definitions.md §3) — compare both, and both with the model's own readout.

Honesty, in order:
1. Features are standardised with the statistics of the rows a probe is fitted on, never the test rows.
2. Splits are by group (`groups[i]`, e.g. the person a fact is about): no group is on both sides of
   the train/test split or of any cross-validation fold, so a probe cannot score by recognising an
   entity it was fitted on.
3. The regularisation strength is chosen by k-fold (grouped) cross-validation on the training rows
   only, by held-out loss (squared error or cross-entropy, the proper scores the probes minimise).
4. Test metrics carry bootstrap 95% intervals (percentile method, Efron & Tibshirani 1993 §13.3),
   resampling groups rather than rows when groups are given (rows of one entity are not independent);
   an AUROC's interval is stratified (positives and negatives resampled separately), comes with n_pos /
   n_neg, and is refused below MIN_PER_CLASS of either class (`lab.metrics.discrimination.auroc_ci`).
5. Features without variation on the training rows (numerical rank 0: `feature_rank`) are flagged
   `constant` and not scored: a probe on them can only return its prior, AUROC exactly 0.5.
6. Controls: the same probe on shuffled labels (chance: AUROC ≈ 0.5, R² ≤ 0), and on the activations of
   a randomly initialised model of the same shape (`random_model`): what a probe finds there comes
   from the input tokens, not from anything the model learned (Hewitt & Liang 2019 argue for such
   controls; "Designing and Interpreting Probes with Control Tasks").
7. Choosing among readouts (probes, layers, lens readouts) is done on a validation split and the chosen
   one is reported on a separate test split (`group_partition`, `judge_readouts`); the model's own
   confidence is the baseline beside it, never a candidate. The verdict "carries the signal" needs the
   chosen readout's test interval to lie above both controls' intervals; too few items is "not enough
   data", said in words.
8. Cross-fitting (`cross_fit_probe`): when every item needs a held-out score (a monitor's signal on each question
   of a small file), the groups are dealt into K folds and each fold is scored by the probe fitted on the other
   K − 1; a fold whose training groups hold fewer than MIN_PER_CLASS of either class makes the whole readout
   "not enough data", said in words, and nothing is scored.

Linear probes also fit out of core: `fit_probe(store[name], y)` on an `ActivationStore` reads the
rows a shard at a time — ridge from per-fold sums (Σx, Σx², Σxxᵀ, Σxy), logistic by the same damped
Newton (or L-BFGS) steps with each gradient and Hessian summed over the shards — so memory is one shard
plus [features]² per fold, and the probe is the one the in-memory fit finds.

A linear probe's direction w (in activation space, undoing the standardisation) becomes a steering
vector with `steering_vector`; add it with `lab.analysis.steering.steer`.

Where each part lives: `splits` (group-aware splits), `fitting` (the fitted probe, features, their rank, the
held-out loss, accuracy and R²), `in_memory` (ridge, logistic and MLP fits and their cross-validation),
`shards` and `out_of_core` (the same fits from an ActivationStore's shards), `probe` (`fit_probe`, `fit_probes`,
`ProbeResult`, `probe_table`, `steering_vector`), `cross_fit` (`cross_fit_probe`) and `readouts` (controls,
`judge_readouts`); every name is imported from `lab.analysis.probes` itself.
"""

# Every name the probes had as one module, where it lives now: experiments, tests and docs import them from here
# (NEWTON_MAX_PARAMS is read in `fitting` at every fit: a change to it goes there).
