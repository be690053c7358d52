"""The monitor experiment: the quick run end to end through `forma run monitor`, every reported number
recomputed from the table it wrote, and the `--model PATH --qa FILE` path on a tiny random GPT-2 saved to disk."""

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from experiments import monitor as experiment
from experiments.monitor.config import KINDS, SPLITS, SUBJECT
from experiments.monitor.judging import familywise_level, judge
from experiments.monitor.qa import normalise, qa_prompt, read_qa
from experiments.monitor.readouts import load_readouts
from experiments.monitor.signals import residuals
from experiments.monitor.summary import auroc_headline
from lab.cli.parser import main
from lab.metrics.discrimination import auroc
from lab.metrics.selective import aurc, crc_threshold, selective_outcome
from tests.builders import VOCAB

HEADLINE_KEYS = {"name", "sentence", "value", "interval", "direction", "supported", "why_not"}


pytestmark = pytest.mark.usefixtures("one_thread")


EXPERIMENT = "monitor"  # the `quick` fixture (tests/experiments/conftest.py) runs it


def test_the_truth_of_every_claim_follows_the_world(quick):
    results, folder = quick
    prompts = pd.read_parquet(folder / "prompts.parquet")
    assert set(prompts["kind"]) == set(KINDS)
    invented = prompts[prompts["kind"] == "invented"]
    assert invented["false"].all() and (invented["person"] == -1).all()  # no such person: every value is false
    real = prompts[prompts["kind"] != "invented"]
    assert (real["false"] == (real["answer"] != real["truth"])).all()
    assert ((real["kind"] == "seen") == (real["exposure"] > 0)).all()
    # subjects are on one side only, and every split holds all three kinds
    names = prompts["first"] + " " + prompts["last"]
    assert names.is_unique and set(prompts["split"]) == set(SPLITS)
    for kind in KINDS:
        assert results["answers"][kind]["n"] == int((prompts["kind"] == kind).sum())


def test_every_signal_is_read_and_judged_on_the_test_split(quick):
    results, folder = quick
    prompts = pd.read_parquet(folder / "prompts.parquet")
    test = prompts[prompts["split"] == "test"]
    names = [row["signal"] for row in results["signals"]]
    assert set(names) == {
        "max_prob",
        "entropy",
        "margin",
        "lens_kl",
        "subject_attention",
        "probe",
        "p_ik",
        "self_consistency",
        "semantic_entropy",
    }
    for row in results["signals"]:
        risk, false = test[f"risk_{row['signal']}"].to_numpy(), test["false"].to_numpy()
        assert math.isclose(row["auroc"], auroc(risk, false), abs_tol=1e-12)
        assert row["auroc_n_pos"] == int(false.sum()) and row["auroc_n_neg"] == int((~false).sum())
        assert math.isclose(row["aurc"], aurc(risk, false), abs_tol=1e-12)
        assert row["aurc"] >= row["aurc_optimal"] - 1e-12
        low, high = row["auroc_ci95"]
        assert low <= row["auroc"] <= high
        joint = row["auroc_familywise_ci"]  # every separation claim at once: wider than each one's 95%
        assert row["auroc_familywise_level"] == familywise_level(len(names) + len(KINDS))
        assert joint[0] <= low and high <= joint[1]
        for kind, block in row["by_kind"].items():
            keep = (test["kind"] == kind) & test["false"] | ~test["false"]
            assert block["n_false"] == int((keep & test["false"]).sum())
            if block["n_false"]:
                assert math.isclose(block["auroc"], auroc(risk[keep], false[keep]), abs_tol=1e-12)
    # the model's own confidence separates false claims from right ones, and falls as the risk rises
    own = {h["name"]: h for h in results["headlines"]}["max_prob_separates"]
    assert own["supported"] and own["direction"] == -1


def test_abstention_thresholds_come_from_the_calibration_split_and_are_scored_on_test(quick):
    results, folder = quick
    prompts = pd.read_parquet(folder / "prompts.parquet")
    calibration, test = (prompts[prompts["split"] == s] for s in ("calibration", "test"))
    assert {a["alpha"] for a in results["abstention"]} == set(results["alphas"]) == {0.05, 0.1, 0.2}
    for entry in results["abstention"]:
        column = f"risk_{entry['signal']}"
        threshold = crc_threshold(calibration[column], calibration["false"], entry["alpha"])
        assert entry["crc"]["threshold"] == threshold
        assert entry["crc"] == json.loads(json.dumps(selective_outcome(test[column], test["false"], threshold)))
        assert entry["ltt"]["n_answered"] == int((test[column] <= entry["ltt"]["threshold"]).sum())


def test_headlines_are_a_function_of_the_results(quick):
    results, _ = quick
    assert results["headlines"] == experiment.headlines({k: v for k, v in results.items() if k != "headlines"})
    for h in results["headlines"]:
        assert set(h) == HEADLINE_KEYS
        assert h["supported"] or len(h["why_not"].split()) >= 3


def test_the_run_folder_holds_what_the_dashboard_generates_with(quick):
    from lab import HookedTransformer
    from lab.analysis.monitor import Monitor

    results, folder = quick
    model = HookedTransformer.load(folder / "model")
    probe, p_ik, signs = load_readouts(folder)
    assert signs == {row["signal"]: row["sign"] for row in results["signals"]}
    prompts = pd.read_parquet(folder / "prompts.parquet").head(4)
    ids = [model.tokenizer.encode(f"<bos> {f} {l} birthday").ids for f, l in zip(prompts["first"], prompts["last"])]
    import torch

    out = Monitor(model, probe=probe, p_ik=p_ik).generate(torch.tensor(ids), 2, subject=SUBJECT)
    answers = [" ".join(model.tokenizer.id_to_token(int(t)) for t in row) for row in out.new_tokens]
    assert answers == prompts["answer"].tolist()


def test_the_readouts_file_is_the_same_bytes_each_time_and_an_older_layout_still_reads(tmp_path):
    """The same readouts give the same bytes on every save (safetensors writes several metadata keys in an order
    that differs between saves: the readouts are one key); a file of the older layout (a key per readout) reads
    the same readouts."""
    from safetensors.torch import save_file

    from experiments.monitor.config import READOUT_FILE
    from experiments.monitor.readouts import save_readouts
    from lab.analysis.monitor import LinearReadout

    probe = LinearReadout("blocks.1.hook_resid_post", torch.arange(4.0), 0.25, -1)
    p_ik = LinearReadout("blocks.0.hook_resid_post", -torch.arange(4.0), -0.5, -2)
    signs = {"entropy": 1, "probe": -1, "p_ik": -1, "max_prob": -1}
    saved = set()
    for i in range(6):
        save_readouts(tmp_path / str(i), probe, p_ik, signs)
        saved.add((tmp_path / str(i) / READOUT_FILE).read_bytes())
    assert len(saved) == 1
    older = {"signs": json.dumps(signs)} | {
        name: json.dumps({"hook": r.hook, "bias": r.bias, "position": r.position})
        for name, r in (("probe", probe), ("p_ik", p_ik))
    }
    (tmp_path / "older").mkdir()
    save_file({"probe": probe.weight, "p_ik": p_ik.weight}, str(tmp_path / "older" / READOUT_FILE), metadata=older)
    for folder in (tmp_path / "0", tmp_path / "older"):
        read_probe, read_p_ik, read_signs = load_readouts(folder)
        assert read_signs == signs
        for read, wrote in ((read_probe, probe), (read_p_ik, p_ik)):
            assert (read.hook, read.bias, read.position) == (wrote.hook, wrote.bias, wrote.position)
            assert torch.equal(read.weight, wrote.weight)


def test_config_is_checked():
    with pytest.raises(ValueError, match="--qa needs --model"):
        experiment.Config(qa="questions.csv")
    with pytest.raises(ValueError, match="needs --qa"):  # a local model alone is no real-model track
        experiment.Config(model="some/folder")
    with pytest.raises(ValueError, match="alphas"):
        experiment.Config(alphas=(0.0,))
    with pytest.raises(ValueError, match="split_fractions"):
        experiment.Config(split_fractions=(0.5, 0.3, 0.3))


@pytest.mark.slow
def test_a_local_model_on_a_question_answer_csv(qa_folder, tmp_path):
    out = tmp_path / "run"
    assert (
        main(
            ["run", "monitor", "--model", str(qa_folder / "gpt2"), "--qa", str(qa_folder / "qa.csv"), "--out", str(out)]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["source"]["n_items"] == 30 and results["source"]["hooked"]
    scored = {row["signal"] for row in results["signals"]}
    assert scored == {"max_prob", "entropy", "margin", "lens_kl", "self_consistency", "semantic_entropy"}
    assert every_signal_is_scored_or_says_why(results)
    # a random model's answers are all false: no fold holds MIN_PER_CLASS right answers to fit a readout on
    for name in ("probe", "p_ik"):
        assert (
            results["unavailable"][name].startswith("not enough data") and "at least 10" in results["unavailable"][name]
        )
    # an α is scored when the calibration split lets both rules answer: n ≥ ⌈1/α⌉ − 1 (CRC), ⌈ln δ / ln(1 − α)⌉ (LTT)
    n_cal = results["source"]["n_by_split"]["calibration"]
    allowed = [
        a for a in results["alphas"] if n_cal >= max(math.ceil(1 / a) - 1, math.ceil(math.log(0.1) / math.log(1 - a)))
    ]
    assert allowed != results["alphas"]  # 30 questions are too few for some α
    assert sorted({a["alpha"] for a in results["abstention"]}) == allowed
    assert [a["alpha"] for a in results["abstention_unavailable"]] == [a for a in results["alphas"] if a not in allowed]
    assert all(
        f"holds {n_cal} questions" in a["why_not"] and "needs at least" in a["why_not"]
        for a in results["abstention_unavailable"]
    )
    prompts = pd.read_parquet(out / "prompts.parquet")
    assert (
        prompts["false"] == [normalise(g) != normalise(a) for g, a in zip(prompts["generated"], prompts["answer"])]
    ).all()
    assert results["headlines"] == experiment.headlines({k: v for k, v in results.items() if k != "headlines"})


def every_signal_is_scored_or_says_why(results) -> bool:
    from lab.analysis.monitor import SIGNALS

    scored = {row["signal"] for row in results["signals"]}
    reasons = results["unavailable"]
    return (
        scored | set(reasons) == set(SIGNALS)
        and not scored & set(reasons)
        and all(len(why.split()) >= 3 for why in reasons.values())
    )


QA_RUN = dict(k_samples=4, qa_max_new_tokens=6, n_boot=100, n_resplits=50)


@pytest.fixture(scope="module")
def labelled(qa_folder):
    """60 questions, every other one answered with the model's own greedy answer (so right), the rest with a word
    it never gives (false): enough of each class for the readouts, and 0.2 the only α calibration supports."""
    rng = np.random.default_rng(1)
    questions = [" ".join(f"w{i}" for i in rng.integers(0, VOCAB - 6, 5)) for _ in range(60)]

    def write(path, answers):
        with path.open("w", newline="") as f:
            csv.writer(f).writerows([["question", "answer"], *zip(questions, answers)])
        return path

    first = experiment.run(
        experiment.Config(
            model=str(qa_folder / "gpt2"),
            qa=str(write(qa_folder / "blank.csv", ["unsaid"] * 60)),
            **QA_RUN | {"k_samples": 1},
        ),
        qa_folder / "blank",
    )
    assert first["answers"]["qa"]["false_rate"] == 1.0
    greedy = pd.read_parquet(qa_folder / "blank" / "prompts.parquet")["generated"].tolist()
    cfg = experiment.Config(
        model=str(qa_folder / "gpt2"),
        qa=str(write(qa_folder / "labelled.csv", [g if i % 2 == 0 else "unsaid" for i, g in enumerate(greedy)])),
        **QA_RUN,
    )
    return cfg, experiment.run(cfg, qa_folder / "labelled"), qa_folder / "labelled"


@pytest.mark.slow
def test_every_signal_of_a_local_model_is_scored_once_the_answers_allow(labelled):
    cfg, results, folder = labelled
    assert results["answers"]["qa"]["false_rate"] == 0.5
    assert every_signal_is_scored_or_says_why(results)
    assert set(results["unavailable"]) == {"subject_attention"}  # a question marks no subject; all else is read
    prompts = pd.read_parquet(folder / "prompts.parquet")
    test = prompts[prompts["split"] == "test"]
    for row in results["signals"]:
        assert math.isclose(row["auroc"], auroc(test[f"risk_{row['signal']}"], test["false"]), abs_tol=1e-12)
    # self-consistency is a share of k samples, semantic entropy an entropy over k samples
    share = (
        results["signals"][[r["signal"] for r in results["signals"]].index("self_consistency")]["sign"]
        * prompts["risk_self_consistency"]
    )
    assert np.allclose(share * cfg.k_samples, np.round(share * cfg.k_samples)) and share.between(0, 1).all()
    assert prompts["risk_semantic_entropy"].abs().le(math.log(cfg.k_samples) + 1e-12).all()


@pytest.mark.slow
def test_the_sampling_baselines_are_k_seeded_answers_per_question(labelled, qa_folder):
    """Question i's k answers are drawn by `sample_continuations` with seed + 31 + i, cut and normalised like the
    greedy answer: recomputed here for two questions."""
    from experiments.calibration.mmlu import encode, load_local_model
    from lab.analysis.monitor import sample_continuations
    from lab.metrics.selective import answer_agreement, discrete_semantic_entropy

    cfg, results, folder = labelled
    prompts = pd.read_parquet(folder / "prompts.parquet")
    signs = {row["signal"]: row["sign"] for row in results["signals"]}
    model, tokenizer, _ = load_local_model(cfg.model)
    for i in (0, 7):
        ids = torch.tensor([encode(tokenizer, qa_prompt(prompts["question"][i]))])
        rows = sample_continuations(
            model,
            ids,
            cfg.k_samples,
            cfg.qa_max_new_tokens,
            seed=cfg.seed + 31 + i,
            eos_token_id=tokenizer.eos_token_id,
        )[0]
        texts = [normalise(tokenizer.decode(r.tolist()).split("\n")[0]) for r in rows]
        greedy = normalise(prompts["generated"][i])
        assert math.isclose(
            signs["self_consistency"] * prompts["risk_self_consistency"][i], answer_agreement(texts, greedy)
        )
        assert math.isclose(
            signs["semantic_entropy"] * prompts["risk_semantic_entropy"][i], discrete_semantic_entropy(texts)
        )


@pytest.mark.slow
def test_p_ik_on_a_local_model_is_cross_fitted_by_question(labelled):
    """The folds deal out every question once; each question's P(IK) is the readout fitted on the other folds
    (recomputed from the residual stream), never the one fitted on every question, which differs."""
    from experiments.calibration.mmlu import encode, load_local_model
    from lab.analysis.probes.cross_fit import cross_fit_probe
    from lab.analysis.probes.probe import fit_probe

    cfg, results, folder = labelled
    folds = results["readouts"]["folds"]
    assert sorted(q for fold in folds for q in fold) == list(range(60)) and len(folds) == cfg.qa_folds
    prompts = pd.read_parquet(folder / "prompts.parquet")
    model, tokenizer, _ = load_local_model(cfg.model)
    hook = results["readouts"]["p_ik"]["hook"]
    X = torch.stack(
        [
            residuals(model, torch.tensor([encode(tokenizer, qa_prompt(q))]), [hook])[hook][0, -1]
            for q in prompts["question"]
        ]
    )
    right = ~prompts["false"].to_numpy()
    held_out = cross_fit_probe(X, right, np.arange(60), cfg.qa_folds, seed=cfg.seed)
    assert [f.tolist() for f in held_out.folds] == folds
    p_ik = -prompts["risk_p_ik"].to_numpy()  # risk = −P(IK)
    assert np.allclose(p_ik, held_out.scores, atol=1e-6)
    everyone = fit_probe(X, right, "logistic", split=(np.arange(60), np.arange(60)), seed=cfg.seed, n_bootstrap=10)
    assert not np.allclose(p_ik, everyone.test_scores.numpy(), atol=1e-3)


@pytest.mark.slow
def test_abstention_on_a_local_model_where_calibration_allows(labelled):
    cfg, results, folder = labelled
    prompts = pd.read_parquet(folder / "prompts.parquet")
    calibration, test = (prompts[prompts["split"] == s] for s in ("calibration", "test"))
    n_cal = len(calibration)
    assert results["source"]["n_by_split"]["calibration"] == n_cal
    # ⌈1/α⌉ − 1 prompts for CRC, ⌈ln δ / ln(1 − α)⌉ for LTT (δ = 0.1): 19 and 45 at 0.05, 9 and 22 at 0.1, 4 and 11
    # at 0.2 — the calibration split's 11 … 21 questions support 0.2 alone
    assert 11 <= n_cal < 22
    assert {a["alpha"] for a in results["abstention"]} == {0.2}
    assert [a["alpha"] for a in results["abstention_unavailable"]] == [0.05, 0.1]
    for entry in results["abstention"]:
        column = f"risk_{entry['signal']}"
        threshold = crc_threshold(calibration[column], calibration["false"], 0.2)
        assert entry["crc"] == json.loads(json.dumps(selective_outcome(test[column], test["false"], threshold)))
    said = {h["name"]: h for h in results["headlines"]}
    assert not said["abstention_alpha_0.05"]["supported"] and "45" in said["abstention_alpha_0.05"]["why_not"]
    assert "crc_keeps_joint_risk_alpha_0.2" in said


@pytest.mark.slow
def test_a_local_model_run_is_determined_by_its_seed(labelled, tmp_path):
    cfg, results, folder = labelled
    again = experiment.run(cfg, tmp_path / "again")
    pd.testing.assert_frame_equal(
        pd.read_parquet(folder / "prompts.parquet"), pd.read_parquet(tmp_path / "again" / "prompts.parquet")
    )
    assert {k: v for k, v in again.items() if k != "timing"} == {k: v for k, v in results.items() if k != "timing"}


# --- cross-fitting: every question scored by a readout that never saw it -----------------------------
FAST = dict(grid=(1e-2, 1.0), n_bootstrap=10)  # a small regularisation search: these tests are of the folds


def grouped_data(n_groups=50, seed=0):
    rng = np.random.default_rng(seed)
    label = rng.permutation(np.arange(n_groups) % 2 == 0)  # one label per group (question), half of each
    groups = np.repeat(np.arange(n_groups), 2)  # two rows per group (answer tokens)
    X = rng.normal(size=(2 * n_groups, 6)) + 0.8 * np.repeat(label, 2)[:, None]
    return torch.tensor(X), np.repeat(label, 2), groups


def test_cross_fitted_scores_never_use_their_own_question():
    from lab.analysis.probes.cross_fit import cross_fit_probe
    from lab.analysis.probes.probe import fit_probe

    X, y, groups = grouped_data()
    fitted = cross_fit_probe(X, y, groups, 5, seed=3, **FAST)
    dealt = [g for fold in fitted.folds for g in fold.tolist()]
    assert sorted(dealt) == list(range(50))  # the folds are disjoint and together hold every question
    assert np.isfinite(fitted.scores).all() and len(fitted.regularization) == 5
    # a question's own label never reaches its own score; it does reach the other folds' scores
    g = int(fitted.folds[0][0])
    flipped = y.copy()
    flipped[groups == g] = ~flipped[groups == g]
    again = cross_fit_probe(X, flipped, groups, 5, seed=3, **FAST)
    own = np.isin(groups, fitted.folds[0])
    assert np.array_equal(again.scores[own], fitted.scores[own])
    assert not np.allclose(again.scores[~own], fitted.scores[~own])
    # the probe fitted on every question, scored on those same questions, is not what cross-fitting reports
    everyone = fit_probe(X, y, "logistic", split=(np.arange(100), np.arange(100)), seed=3, **FAST)
    assert not np.allclose(everyone.test_scores.numpy(), fitted.scores, atol=1e-3)
    # same seed, same scores
    assert np.array_equal(cross_fit_probe(X, y, groups, 5, seed=3, **FAST).scores, fitted.scores)


def test_cross_fitting_with_too_few_questions_of_a_class_says_so():
    from lab.analysis.probes.cross_fit import cross_fit_probe

    X, y, groups = grouped_data()
    few = y & (groups < 20)  # 10 or so positive questions: some fold is fitted on fewer than 10
    fitted = cross_fit_probe(X, few, groups, 5, seed=3, **FAST)
    assert fitted.scores is None and "at least 10 groups of each class" in fitted.why
    assert cross_fit_probe(X, y, groups, 60).why == "50 groups cannot be dealt into 60 folds"
    with pytest.raises(ValueError, match="n_folds must be an integer ≥ 2"):
        cross_fit_probe(X, y, groups, 1)


def test_question_answer_files_are_checked(tmp_path):
    assert normalise("  Paris. ") == normalise("paris")
    with pytest.raises(FileNotFoundError, match="no question–answer file"):
        read_qa(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("question,answer\nWhat?,Yes,extra\n")
    with pytest.raises(ValueError, match="line 2: expected 2 non-empty columns"):
        read_qa(bad)


def test_a_separation_headline_needs_its_familywise_interval_to_exclude_a_half():
    """With a dozen separation claims, a 95% interval that just excludes ½ is what chance gives about half the
    time: the headline is shown only when the familywise (Bonferroni) interval excludes ½ too."""
    assert familywise_level(12) == 1 - 0.05 / 12
    block = {
        "auroc": 0.566,
        "auroc_ci95": [0.501, 0.649],
        "auroc_familywise_ci": [0.47, 0.68],
        "auroc_familywise_level": familywise_level(12),
        "auroc_n_pos": 184,
        "auroc_n_neg": 67,
    }
    head = auroc_headline("x_separates", "The signal x", block, sign=1)
    assert not head["supported"] and head["direction"] == 0 and "familywise interval straddles ½" in head["why_not"]
    block["auroc_familywise_ci"] = [0.52, 0.62]
    head = auroc_headline("x_separates", "The signal x", block, sign=-1)
    assert head["supported"] and head["direction"] == -1 and head["interval"] == [0.52, 0.62]
    assert "99.6% familywise [0.520, 0.620]" in head["sentence"]


def test_separation_claims_on_scores_that_carry_no_signal_are_not_shown():
    """judge() and headlines() on risk scores drawn independently of which claims are false: no separation
    headline is supported (DeLong's familywise interval straddles ½), while a score that does carry the signal is."""
    rng = np.random.default_rng(4)
    n = 900
    kinds = rng.choice(np.array(KINDS), n)
    split = rng.choice(np.array(SPLITS), n, p=[0.4, 0.3, 0.3])
    false = rng.random(n) < 0.6
    scores = {"max_prob": rng.random(n), "entropy": rng.random(n), "margin": false + rng.normal(scale=0.5, size=n)}
    cfg = experiment.Config(quick=True, n_boot=200, n_resplits=20)
    rows, abstention, _ = judge(scores, false, kinds, split, {k: 1 for k in scores}, cfg)
    heads = {
        h["name"]: h
        for h in experiment.headlines({"signals": rows, "abstention": abstention, "abstention_signal": "max_prob"})
    }
    for name in (
        "max_prob_separates",
        "entropy_separates",
        "max_prob_separates_seen",
        "max_prob_separates_unseen",
        "max_prob_separates_invented",
    ):
        assert not heads[name]["supported"] and "familywise interval straddles ½" in heads[name]["why_not"], name
    assert heads["margin_separates"]["supported"] and "(DeLong)" in heads["margin_separates"]["sentence"]
    for row in rows:
        assert row["auroc_familywise_method"] == "DeLong"
        (low, high), (joint_low, joint_high) = row["auroc_ci95"], row["auroc_familywise_ci"]
        assert joint_low <= low <= high <= joint_high


def test_learn_then_test_is_shown_only_where_its_check_can_fail(quick):
    """A rule that answers in no more than δ + 3 standard errors of the draws keeps its promise by abstaining, so
    its check cannot fail: not shown, even when every draw that answered broke α; one that certified nothing says
    how near it came, with the smallest p-value measured."""
    results, _ = quick
    entry = json.loads(json.dumps(next(a for a in results["abstention"] if a["signal"] == "max_prob")))
    n = entry["resplits"]["n_resplits"]
    entry["resplits"].update(
        ltt_n_certifying=9,
        ltt_n_answering=9,
        ltt_n_above_alpha=9,
        ltt_share_above_alpha=9 / n,
        ltt_coverage=0.0023,
        ltt_coverage_answering=0.05,
        ltt_selective_risk=0.24,
        ltt_pooled_selective_risk=0.25,
    )
    rare = experiment.headlines(dict(results, abstention=[entry]))
    head = next(h for h in rare if h["name"].startswith("ltt_"))
    assert not head["supported"] and "cannot fail" in head["why_not"] and "above α in 9 of 9 draws" in head["why_not"]
    assert "0.23%" in head["why_not"]  # a share as measured, never rounded to 0%
    entry["resplits"].update(
        ltt_n_certifying=0,
        ltt_n_answering=0,
        ltt_n_above_alpha=0,
        ltt_share_above_alpha=0.0,
        ltt_smallest_p_value=0.31,
        ltt_smallest_p_value_median=0.72,
    )
    head = next(h for h in experiment.headlines(dict(results, abstention=[entry])) if h["name"].startswith("ltt_"))
    assert not head["supported"] and "smallest p-value over the grid was 0.31" in head["why_not"]


def test_the_abstention_figure_shows_what_the_headlines_state(quick):
    """Its points are the means over the re-draws of the calibration subjects that the headlines state, its bars
    the draws' own 5th–95th percentiles; LTT's error rate is drawn only where some draw answered."""
    import plotly.io as pio

    results, folder = quick
    figure = pio.from_json((folder / "abstention.json").read_text())
    chosen = [a for a in results["abstention"] if a["signal"] == results["abstention_signal"]]
    traces = {t.name: t for t in figure.data}
    crc = traces["CRC: answered and false"]
    assert list(crc.y) == pytest.approx([a["resplits"]["crc_joint_risk"] for a in chosen])
    assert list(crc.error_y.array) == pytest.approx(
        [a["resplits"]["crc_joint_risk_range90"][1] - a["resplits"]["crc_joint_risk"] for a in chosen]
    )
    heads = {h["name"]: h for h in results["headlines"]}
    for a, y in zip(chosen, crc.y):
        assert heads[f"crc_keeps_joint_risk_alpha_{a['alpha']:g}"]["value"] == pytest.approx(y)
    answering = [a for a in chosen if a["resplits"]["ltt_n_answering"]]
    ltt = [t for name, t in traces.items() if name.startswith("LTT: false among answered")]
    assert len(ltt) == bool(answering)
    if answering:
        assert list(ltt[0].y) == pytest.approx([a["resplits"]["ltt_selective_risk"] for a in answering])
    if len(answering) < len(chosen):
        assert any("LTT answers in no draw" in note.text for note in figure.layout.annotations)
