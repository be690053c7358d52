"""Probes that cannot fool their reader: one home for AUROC and its bootstrap, constant features flagged,
entity-disjoint train / validation / test splits, and the verdict rules (docs/definitions.md §5)."""

import numpy as np
import pytest
import torch

from lab.analysis.probes.fitting import feature_rank
from lab.analysis.probes.probe import fit_probe
from lab.analysis.probes.readouts import judge_readouts, shuffled_control
from lab.analysis.probes.splits import group_partition
from lab.metrics import discrimination
from lab.metrics.discrimination import MIN_PER_CLASS, Metric, auroc, auroc_ci, bootstrap_ci


def test_auroc_and_bootstrap_have_one_home():
    assert auroc is discrimination.auroc and bootstrap_ci is discrimination.bootstrap_ci
    assert discrimination.Metric is discrimination.Metric and auroc_ci is discrimination.auroc_ci


def test_partition_is_entity_disjoint_and_covers_every_row():
    groups = np.repeat(np.arange(50), 3)
    train, validation, test = group_partition(groups, (0.4, 0.3, 0.3), seed=2)
    parts = [set(groups[p]) for p in (train, validation, test)]
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
    assert sorted(np.concatenate([train, validation, test]).tolist()) == list(range(150))
    assert [len(p) for p in parts] == [20, 15, 15]
    assert all(len(p) == 1 for p in group_partition(np.arange(3), (0.8, 0.1, 0.1)))  # each part keeps a group
    with pytest.raises(ValueError, match="at least 3 groups"):
        group_partition(np.zeros(5), (0.4, 0.3, 0.3))


def test_constant_features_are_flagged_and_not_scored():
    """A value-slot residual at layer 0 is the same vector for every person: rank 0, no AUROC (not 0.5)."""
    rng = np.random.default_rng(0)
    X = np.tile(rng.normal(size=16), (200, 1))
    y = rng.integers(0, 2, 200)
    assert feature_rank(X) == 0
    assert feature_rank(X + 1e-9 * rng.normal(size=X.shape)) == 0  # rounding-level variation counts as none
    assert feature_rank(rng.normal(size=(200, 16))) == 16
    probe = fit_probe(X, y, "logistic", n_bootstrap=50)
    assert probe.constant and probe.fitted is None and np.isnan(probe.metrics["auroc"].value)
    assert "constant features" in probe.metrics["auroc"].why_no_interval and "constant" in str(probe)
    with pytest.raises(ValueError, match="constant features"):
        probe.predict_scores(X)
    assert shuffled_control(X, y, "mlp", n_bootstrap=50, mlp_steps=10).constant


def test_probe_auroc_carries_its_class_counts_and_a_stratified_interval():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 8, generator=g)
    y = (X[:, 0] > 0).long()
    probe = fit_probe(X, y, "logistic", groups=np.repeat(np.arange(100), 4), n_bootstrap=100)
    m = probe.metrics["auroc"]
    assert m.n_pos + m.n_neg == len(probe.test_index) and m.low <= m.value <= m.high and m.why_no_interval is None


# --- the verdict ---------------------------------------------------------------------------------
def row(
    readout,
    layer,
    validation,
    test,
    shuffled=(0.5, 0.4, 0.6),
    untrained=(0.5, 0.4, 0.6),
    candidate=True,
    constant=False,
    n=(40, 40),
):
    def fields(key, m):
        return Metric(*m, n_pos=n[0], n_neg=n[1]).fields(key)

    return {
        "readout": readout,
        "position": "value slot",
        "layer": layer,
        "candidate": candidate,
        "constant": constant,
        "validation_auroc": validation,
        "validation_auroc_n_pos": n[0],
        "validation_auroc_n_neg": n[1],
        **fields("auroc", test),
        **fields("control_shuffled_auroc", shuffled),
        **fields("control_untrained_auroc", untrained),
    }


def test_the_baseline_is_best_and_the_verdict_says_so_without_choosing_it():
    """The model's own confidence beats every readout: it is reported as the baseline, the chosen readout is
    the best *candidate* on validation, and its verdict is judged on its own test interval."""
    rows = [
        row("logistic probe", 1, 0.55, (0.52, 0.45, 0.60)),
        row("mlp probe", 2, 0.58, (0.54, 0.47, 0.61)),
        row("lens cloze confidence", 2, 0.95, (0.94, 0.9, 0.97), candidate=False),
    ]  # the output itself
    baseline = Metric(0.94, 0.90, 0.97, 40, 40)
    verdict = judge_readouts(rows, "P(IK)", baseline)
    assert verdict["chosen"]["readout"] == "mlp probe" and verdict["verdict"] == "no signal beyond its controls"
    assert verdict["carries_signal"] is False
    assert "Baseline (the model's own confidence, not a candidate): 0.940" in verdict["sentence"]
    assert verdict["sentence"].endswith("its estimate is above the chosen readout's.")
    assert verdict["baseline"]["auroc"] == 0.94


def test_selection_uses_validation_not_test():
    rows = [row("logistic probe", 0, 0.80, (0.60, 0.50, 0.70)), row("logistic probe", 1, 0.60, (0.99, 0.98, 1.0))]
    assert judge_readouts(rows, "P(IK)")["chosen"]["layer"] == 0


def test_constant_readouts_are_not_candidates():
    rows = [row("logistic probe", 0, 0.5, (0.5, 0.5, 0.5), constant=True)]
    assert judge_readouts(rows, "P(IK)")["verdict"] == "nothing to score"
    rows.append(row("logistic probe", 1, 0.51, (0.52, 0.44, 0.6)))
    assert judge_readouts(rows, "P(IK)")["chosen"]["layer"] == 1


def test_a_real_signal_must_clear_both_controls_intervals():
    strong = row("logistic probe", 1, 0.9, (0.88, 0.80, 0.95))
    verdict = judge_readouts([strong], "P(IK)")
    assert verdict["verdict"] == "carries the signal" and verdict["carries_signal"] is True
    assert verdict["chosen"]["margin_over_controls"] == pytest.approx(0.80 - 0.6)
    # The untrained model scores as high: the signal comes from the input tokens, not from training.
    echo = row("logistic probe", 1, 0.9, (0.88, 0.80, 0.95), untrained=(0.85, 0.78, 0.92))
    assert judge_readouts([echo], "P(IK)")["verdict"] == "no signal beyond its controls"
    missing = row("logistic probe", 1, 0.9, (0.88, 0.80, 0.95))
    missing["control_untrained_auroc"] = None
    assert judge_readouts([missing], "P(IK)")["verdict"] == "no verdict"


def test_too_few_items_is_not_enough_data_in_words():
    few = row("logistic probe", 0, 1.0, (1.0, 1.0, 1.0), shuffled=(1.0, 1.0, 1.0), n=(3, 2))
    verdict = judge_readouts([few], "P(IK)")
    assert verdict["verdict"] == "not enough data" and verdict["carries_signal"] is None
    assert f"at least {MIN_PER_CLASS} of each" in verdict["sentence"] and "3 right and 2 wrong" in verdict["sentence"]


def test_probes_on_ten_items_end_in_not_enough_data():
    """Ten items, each its own group: train / validation / test of 4 / 3 / 3 — never an interval, never a verdict,
    however well the probe and the shuffled control happen to score."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(10, 6, generator=g)
    y = np.array([0, 1] * 5)
    train, validation, test = group_partition(np.arange(10), (0.4, 0.3, 0.3), seed=0)
    probe = fit_probe(X, y, "logistic", split=(train, test), n_folds=2, n_bootstrap=50)
    shuffled = shuffled_control(X, y, "logistic", split=(train, test), n_folds=2, n_bootstrap=50)
    val = discrimination.auroc_ci(probe.predict_scores(X[validation]).numpy(), y[validation])
    r = {
        "readout": "logistic probe",
        "position": "last prompt token",
        "layer": 0,
        "candidate": True,
        "constant": False,
        **val.fields("validation_auroc"),
        **probe.metrics["auroc"].fields("auroc"),
        **shuffled.metrics["auroc"].fields("control_shuffled_auroc"),
        **probe.metrics["auroc"].fields("control_untrained_auroc"),
    }
    assert probe.metrics["auroc"].why_no_interval is not None
    assert judge_readouts([r], "P(IK)")["verdict"] == "not enough data"


def test_a_planted_signal_passes_end_to_end():
    """Fitted probes, not hand-made rows: a direction planted in the trained model's features is found on validation,
    clears the shuffled-label control and the "untrained" features (noise of the same shape) on test."""
    rng = np.random.default_rng(5)
    n, d = 600, 12
    groups = np.repeat(np.arange(n // 2), 2)
    X = rng.normal(size=(n, d))
    y = (X[:, 0] + 0.5 * rng.normal(size=n) > 0).astype(int)
    X_untrained = rng.normal(size=(n, d))
    train, validation, test = group_partition(groups, (0.4, 0.3, 0.3), seed=0)
    options = dict(groups=groups, split=(train, test), n_bootstrap=200)
    rows = []
    for layer, features in enumerate((rng.normal(size=(n, d)), X)):  # layer 0 carries nothing, layer 1 the signal
        probe = fit_probe(features, y, "logistic", **options)
        rows.append(
            {
                "readout": "logistic probe",
                "position": "last token",
                "layer": layer,
                "candidate": True,
                "constant": probe.constant,
                **discrimination.auroc_ci(probe.predict_scores(features[validation]).numpy(), y[validation]).fields(
                    "validation_auroc"
                ),
                **probe.metrics["auroc"].fields("auroc"),
                **shuffled_control(features, y, "logistic", **options)
                .metrics["auroc"]
                .fields("control_shuffled_auroc"),
                **fit_probe(X_untrained, y, "logistic", **options).metrics["auroc"].fields("control_untrained_auroc"),
            }
        )
    verdict = judge_readouts(rows, "planted")
    assert verdict["chosen"]["layer"] == 1 and verdict["verdict"] == "carries the signal"
    assert verdict["sentence"].startswith("planted: carries the signal")
