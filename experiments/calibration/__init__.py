"""Calibration: does the model know what it knows? (Kadavath et al. 2022, arXiv 2207.05221)

Definitions and what tiny models do: docs/definitions.md §3. Every number comes from the pure functions of
`lab.metrics.calibration` (ECE with 15 equal-width and 10 equal-mass bins, RMS, MCE, Brier and its
decomposition, NLL, AUROC, bootstrap intervals, the noise floor of a perfectly calibrated model with the
same confidences, temperature fitted by NLL); probes come from `lab.analysis.probes` on activations
streamed by `lab.analysis.activations`.

The synthetic world (`lab.data.facts.FactWorld`, one arbitrary birthday per person, Pareto popularity,
i.i.d. statements drawn with replacement): a person's *exposure* is the number of training statements
about them (0 — never seen —, 1, 2–5, 6+). A random share of the seen persons (the *format subset*) also
gets lettered quizzes ("Question : When was F L born ? A ) … D ) … Answer : B") and True/False
judgements ("F L birthday M d . Answer : True") in training; only the answer letter and the judgement
are scored, so the quizzes teach the format without stating facts as text. Every other person — seen
only in statements, or never seen — is an *evaluation person*.

Measured at two checkpoints: *partial* — training runs in equal stages, each followed by the held-out
NLL (independent i.i.d. statements from p, most of them of facts training holds too: `training.held_out` counts
them) and the cloze recall of the format persons and of the seen evaluation persons, and the partial checkpoint
is the stage (before the last) whose recall *of the format persons* is nearest `partial_recall` (0.6): it is
chosen on other persons than those it is reported on, so the evaluation persons' recall there is measured, not
selected (it need not be 0.6). The held-out optimum would
be the textbook choice, but in this world it comes where every seen person is already recalled (memorising
keeps lowering the held-out NLL of seen facts for longer than confident invention raises that of unseen
ones), so it cannot show partial recall; its step is reported beside the stages. And *end*: the end of
training. At each:

* cloze multiple choice (the primary readout): at the statement's value slot "<bos> F L birthday", the
  model's log-probability of each of 4 candidate values (the truth and 3 others: the quiz's options),
  renormalised over the 4; label mass = the share of the model's probability on the 4 at all.
* lettered multiple choice: the quiz prompt, probabilities of the letter tokens A–D after "Answer :",
  renormalised; label mass = the share on the 4 letters. On evaluation persons this measures knowledge
  *extraction* (a format trained on other persons); on held-out quizzes of the format subset it says
  whether the format itself was learned.
* temperature scaling: one T fitted by NLL on a calibration split of the evaluation persons (the cloze
  log-probabilities), both ECEs (15 equal-width, 10 equal-mass bins), NLL and Brier before and after on the test
  split (accuracy is unchanged by T).
* P(True): the model's own answer, sampled at T = 1 from the full softmax, put back into a claim and
  judged: P(True) = p(True) / (p(True) + p(False)) after "Answer :"; AUROC and Brier against whether the
  sampled answer was right, for the format subset (the judgement was trained on them) and outside it. Layer by
  layer too: the lens P(True) of every layer, chosen on a validation half of the persons and judged on the other
  half beside shuffled labels and the untrained model; baseline: the model's own probability of its answer.
* P(IK), layer by layer, on evaluation persons (label: the cloze answer is right), persons split train /
  validation / test: logistic and small-MLP probes on the residual stream at the last name token and at the value
  slot (fitted on train), and the logit-lens readouts of the layers before the last at the value slot (the cloze
  confidence recomputed from that layer's lens, the lens's top token probability, its negative entropy). The
  readout with the best validation AUROC is reported on test; baseline, beside it and never chosen: the model's
  own final cloze confidence (= the last layer's lens cloze confidence). Controls: the probe on shuffled labels
  (the lens readouts: scored against shuffled labels), and the same readout of an untrained model of the same
  shape. Verdicts by `judge_readouts` (docs/definitions.md §5): constant readouts are flagged, not
  scored; "carries the signal" needs the test interval above both controls' intervals; fewer than MIN_PER_CLASS
  right or wrong answers in the validation or test split is "not enough data".
* token-level calibration of next-token predictions on held-out English for the pydoc zoo model (its
  quick recipe, trained into the run folder, when the zoo model is not trained), through the logit lens
  at each layer as well.

`--model PATH --mmlu FILE.csv`: lettered multiple choice on MMLU's CSV layout (question, A, B, C, D,
answer; with or without a header) for any local Hugging Face causal LM — converted into a
HookedTransformer by `lab.hf.loading.load_hf` when the architecture is supported (SUPPORTED: GPT-2, LLaMA,
GPT-NeoX / Pythia, Qwen2, Mistral), else wrapped
by `lab.hf.loading.bridge` (TransformerBridge) — with temperature scaling and per-layer P(IK) probes on the
residual stream at the last prompt token, by the same rules (items split train / validation / test, controls,
"not enough data" for a small CSV).

The real-model track, `--model NAME` alone (`forma run calibration --model smollm2 [--quick]`, Config.real_track;
runs/calibration_real/<UTC timestamp>/): a pretrained zoo model with a tokenizer on the real question set
(lab.data.questions). `kadavath` reads multiple choice in Kadavath et al.'s format ("Question: …", "(A) …" to "(D) …",
"Answer: ("), zero-shot and 5-shot (shots drawn from questions not evaluated), plain and in the model's chat
template; `real` adds temperature scaling fitted on one half of the questions and judged on the other, a reliability
diagram, the model's sampled short answers judged by a stated rule, P(True) on them without and with brainstormed
samples, and a P(IK) probe at every layer against the model's own confidence (see `real`'s docstring).

`headlines(results)` (a pure function of the rest of results.json) states what the run supports, each with a
direction that the quick profile — a smaller run of the same experiment — must share with the default one;
what a run cannot support is kept with the reason (`why_not`), and the dashboard lists it as not shown.

Artefacts in `out`: items.parquet (one row per item: option_logit_0..3 — log-probabilities of the options,
so softmax(·/T) gives the option probabilities —, answer_index, kind = cloze/lettered, checkpoint,
split, person, exposure, label_mass, confidence, correct), p_true.parquet, p_ik.parquet,
token_level.parquet, stages.parquet, and plotly figures (reliability diagrams, ECE and accuracy by
exposure, P(IK) and P(True) AUROC by layer, token-level ECE by layer).

Where each part lives: `config` (Config and its profiles), `setting` (the world as token ids, the model's readings
of it, training in stages), `ece` (ECEs and temperature scaling), `readouts` (readouts chosen on validation and
reported on test, and P(IK)), `p_true`, `english` (token-level calibration), `mmlu` (`--model` with `--mmlu`),
`kadavath` (multiple choice on the real question set), `real` (the real-model track), `figures`, `summary`
(acceptance and headlines) and `synthetic` (the synthetic run); every name is imported from `experiments.calibration`
itself.
"""

from pathlib import Path
from typing import Any

from experiments import local_or_synthetic
from experiments.calibration.config import Config

# Every name the experiment had as one module, where it lives now: tests, docs and other experiments import
# them from here.
from experiments.calibration.mmlu import LocalInputs, read_mmlu_inputs, run_hf
from experiments.calibration.real import REAL_THREADS, run_real
from experiments.calibration.summary import headlines
from experiments.calibration.synthetic import run_synthetic
from lab.configs import torch_threads

# The synthetic experiment, or with cfg.model and cfg.mmlu the local model measured on its file (`run_hf`); its
# inputs: that model and file, read before the run folder is made (`read_mmlu_inputs`).
read_mmlu_or_none, run_mmlu_or_synthetic = local_or_synthetic(run_synthetic, run_hf, read_mmlu_inputs)


def read_inputs(cfg: Config) -> LocalInputs | None:
    """What a run reads before its folder is made: the model and MMLU file of a `--model --mmlu` run, else None (the
    real-model track loads its zoo model inside the run, whose name `forma run` has checked)."""
    return None if cfg.real_track else read_mmlu_or_none(cfg)


def run(cfg: Config, out: Path, inputs: LocalInputs | None = None) -> dict[str, Any]:
    """The synthetic experiment; with `--model --mmlu` the local model on its file; with `--model` alone the
    real-model track (`run_real`, into runs/calibration_real/)."""
    if not cfg.real_track:
        return run_mmlu_or_synthetic(cfg, out, inputs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with torch_threads(max(cfg.threads, REAL_THREADS)):
        return run_real(cfg, out)
