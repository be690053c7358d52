"""Catch hallucinations while they are generated: per-token risk signals read during KV-cached decoding
(`lab.analysis.monitor`), judged against the known truth of a fact world, and abstention that keeps its promise.

The world (`lab.data.facts.FactWorld`, one arbitrary birthday "Month day" per person, Pareto popularity, i.i.d.
statements "<bos> First Last birthday Month day . <eos>" drawn with replacement) and three kinds of subject:
*seen* persons (in at least one training statement), *unseen* real persons (in none: their true value cannot be known,
docs/definitions.md §2) and *invented* name pairs (a first and a last name of the world that form no person: every value
is false). The model — trained here, into the run folder — is prompted "<bos> First Last birthday" and generates the
value greedily (2 tokens) with the monitor on. The claim is false when the generated value is not the
subject's true value. Error kinds: a wrong value for a seen person, any false value for an unseen person, any value
for an invented person.

Subjects are split three ways, disjoint (no person or name pair on two sides): *fit* trains the two readouts and
chooses each signal's sign, *calibration* chooses the abstention thresholds, *test* reports everything.

Signals, each turned into a claim risk by `lab.analysis.monitor.claim_risk` (the riskiest of the answer's tokens,
risk = sign · value): max_prob, entropy, margin, lens_kl (middle layer against the last), subject_attention (the
upper half's attention mass on the two name tokens), probe (a logistic probe on the middle layer's residual stream at
every answer token, label "this claim is false", fitted on the fit split's persons), p_ik (a logistic probe at the
last name token of the last block's residual stream, label "the claim is right" — the P(IK) readout of the
calibration experiment, Kadavath et al. 2022), and the sampling baselines over the value slot: self_consistency
(the share of k answers sampled at T = 1 equal to the greedy one, Wang et al. 2023) and semantic_entropy (the
discrete semantic entropy of Farquhar et al. 2024 over the k answers). The sign of each signal is the one whose
AUROC on the fit split is ≥ ½ (the a priori sign, `RISK_SIGN`, is recorded beside it).

On the test split, per signal: AUROC for "the claim is false" with a stratified bootstrap 95% interval
(`lab.metrics.discrimination.auroc_ci`, n_pos / n_neg beside it) and DeLong's interval at the familywise level of
every separation claim of the run (Bonferroni; a bootstrap at 99.6% would rest on two resamples per tail), per
error kind (that kind's false claims against every right one), the risk–coverage curve, AURC, the oracle's AURC*
and E-AURC = AURC − AURC* (`lab.metrics.selective`). Abstention, for each α in `alphas`:

* split conformal risk control (Angelopoulos et al. 2022, arXiv 2208.02814) with the loss
  L_i(λ) = 1{answered at λ and false}, B = 1: λ̂ = the largest λ with (n/(n+1))·R̂_n(λ) + 1/(n+1) ≤ α on the
  calibration split. It promises E[P(answered and false)] ≤ α — the *joint* rate; the error rate among answered
  prompts is not monotone in λ, and CRC promises nothing about it.
* Learn then Test (Angelopoulos et al. 2021, arXiv 2110.01052) on a grid fixed from the fit split's risks, at
  δ = `ltt_delta`: with probability ≥ 1 − δ the error rate *among answered prompts* is ≤ α.
On the test split: coverage, the joint rate and the rate among answered, each with Wilson's 95% interval — and, for
the abstention signal, over `n_resplits` re-draws of which subjects calibrate (`judging.resplit`): what the
headlines state and the abstention figure draws, the means with the draws' own spread; for LTT also how many
draws certify and answer, their coverage and error rate among answers, and the smallest p-value it reached.

`--model PATH --qa FILE`: the monitor on a local Hugging Face causal LM or a Forma model with a question–answer CSV
(question, answer; a header row is skipped), prompted "Question: … / Answer:", the answer being the greedy
continuation up to its first line break, scored by exact match (case and surrounding spaces and full stops aside).
The questions are drawn into fit / calibration / test as the subjects are. Signals: the output ones; with a
HookedTransformer also lens_kl, the probe (the middle layer's residual stream at every answer token, label "this
answer is false") and P(IK) (the last block's residual stream at the last prompt token, label "this answer is
right"); and the sampling baselines, k answers per question drawn at T = 1 (seeded, KV-cached `decode`
for a HookedTransformer), each cut and normalised like the greedy one: self_consistency (the share equal to the
greedy answer) and semantic_entropy (over the classes of equal normalised answers). subject_attention is
unavailable: a question marks no subject. The probe and P(IK) are cross-fitted (`lab.analysis.probes.
cross_fit_probe`): the questions are dealt into `qa_folds` folds at random (the seed), regardless of their answers,
and each fold is scored by the readout fitted on the others, so every question's score comes from a readout that
never saw it. Over that random deal every question is treated alike, so the scores of calibration and test
questions stay exchangeable — what conformal risk control assumes (for one fixed deal, only approximately); Learn
then Test's binomial p-values further assume the calibration errors independent given the score, which readouts
fitted on each other's questions only approximate. A fold fitted on fewer than
MIN_PER_CLASS questions of either class (right, false) leaves the readout unavailable, the reason in words. CRC and
LTT are scored at each α whose calibration split can let both answer anything (CRC: n ≥ ⌈1/α⌉ − 1; LTT:
n ≥ ⌈ln δ / ln(1 − α)⌉); the other α are listed in `abstention_unavailable` with the reason. results.json's
`unavailable` names every signal not scored and why.

`--model smollm2` without `--qa`: the real-model track (`real`), the same signals and judgement on the pretrained
model's greedy answers to Forma's real short-answer questions (few-shot plain prompts, a stated match), with
conformal risk control checked on held-out questions (`judging.crc_check`), into runs/monitor_real/.

`headlines(results)` states what the run supports; a direction that the quick profile must share.

Artefacts in `out`: prompts.parquet (one row per subject: kind, split, generated and true value, false or not, every
signal's claim risk), curves.parquet (the test split's risk–coverage curve per signal), model/ (the trained model
and tokenizer, which the dashboard generates with), readouts.safetensors (the probe and P(IK) weights), and plotly
figures (AUROC by signal and error kind, risk–coverage curves, abstention by α).

Where each part lives: `config` (Config, its profiles, the constants), `setting` (the world, the subjects, the model),
`signals` (reading the signals and the sampling baselines), `judging` (AUROC, risk–coverage and the abstention
rules on the test split), `summary` (headlines), `readouts` (readouts.safetensors), `synthetic` (the synthetic
run), `qa` (`--model` with `--qa`) and `figures`; Config, run and every name other code imports are here, in
`experiments.monitor` itself.
"""

from pathlib import Path
from typing import Any

from experiments import local_or_synthetic

# Every name the experiment had as one module, where it lives now: tests, dashboards and benchmarks import them
# from here.
from experiments.monitor.config import Config
from experiments.monitor.qa import read_qa_inputs, run_qa
from experiments.monitor.real import REAL_THREADS, read_real_inputs, run_real
from experiments.monitor.summary import headlines
from experiments.monitor.synthetic import run_synthetic
from lab.configs import torch_threads

# The synthetic experiment, or with cfg.model and cfg.qa the local model measured on its file (`run_qa`;
# `read_qa_inputs`, the model and file read before the run folder is made).
_read_local, _run_local = local_or_synthetic(run_synthetic, run_qa, read_qa_inputs)


def read_inputs(cfg: Config) -> Any:
    """What the run reads before its folder is made: the real-model track's model and prompts
    (`read_real_inputs`), the local model and its file (`read_qa_inputs`), or None."""
    if cfg.real_track:
        with torch_threads(max(cfg.threads, REAL_THREADS)):
            return read_real_inputs(cfg)
    return _read_local(cfg)


def run(cfg: Config, out: Path, inputs: Any = None) -> dict[str, Any]:
    """The synthetic experiment, the local model on its question–answer file (`--model PATH --qa FILE`), or the
    real-model track (`--model smollm2`: `run_real`, on REAL_THREADS threads at least)."""
    if cfg.real_track:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        with torch_threads(max(cfg.threads, REAL_THREADS)):
            return run_real(cfg, out, inputs)
    return _run_local(cfg, out, inputs)
