"""The calibration experiment: the quick run end to end through `forma run calibration`, and the
Hugging Face path (`--model PATH --mmlu FILE`) on a tiny random GPT-2 saved to disk with a small generated CSV,
through the converter and through TransformerBridge (which must agree)."""

import json

import numpy as np
import pandas as pd
import pytest

from experiments.calibration.mmlu import hf_lettered, letter_ids, load_local_model, mmlu_prompt, read_mmlu
from experiments.calibration.summary import (
    aurocs_without_counts,
    eces_without_interval,
    signed_headline,
    verdict_headline,
)
from lab.analysis.probes.readouts import VERDICTS
from lab.cli.parser import main
from lab.metrics.calibration import ece, fit_temperature, nll, softmax
from lab.metrics.discrimination import MIN_PER_CLASS
from tests.builders import REPO, VOCAB, hf_model, letter_tokenizer

BLOCK_KEYS = {
    "n",
    "accuracy",
    "label_mass",
    "ece_15_equal_width",
    "ece_10_equal_mass",
    "rms_ce",
    "mce",
    "brier",
    "nll",
    "ece_ci95",
    "noise_floor_ece",
    "ece_15_equal_width_debiased",
    "ece_10_equal_mass_debiased",
    "squared_ce_debiased",
    "by_exposure",
}
EXPOSURE_KEYS = {"exposure", "n", "accuracy", "mean_confidence", "ece", "ece_ci95", "noise_floor_ece", "ece_debiased"}
P_IK_KEYS = {
    "layer",
    "readout",
    "position",
    "candidate",
    "constant",
    "validation_auroc",
    "auroc",
    "auroc_ci95",
    "auroc_n_pos",
    "auroc_n_neg",
    "control_shuffled_auroc",
    "control_shuffled_auroc_ci95",
    "control_untrained_auroc",
}
TEMPERATURE_KEYS = {"T", "T_ci95", "nll_before", "nll_after", "nll_decrease", "nll_decrease_ci95"} | {
    f"{key}_{when}" for key in ("ece_15_equal_width", "ece_10_equal_mass") for when in ("before", "after")
}
HEADLINE_KEYS = {"name", "sentence", "value", "interval", "direction", "supported", "why_not"}
OPTION_COLUMNS = [f"option_logit_{k}" for k in range(4)]


EXPERIMENT = "calibration"  # the `quick` fixture (tests/experiments/conftest.py) runs it


# --- the quick run --------------------------------------------------------------------------------
def test_results_json_has_the_shape_of_issue_7(quick):
    results, folder = quick
    assert {"mc", "lettered", "temperature", "token_level", "p_true", "p_ik", "p_ik_baseline_auroc", "at_end"} <= set(
        results
    )
    for blocks in (results, results["at_end"]):
        for key in ("mc", "lettered"):
            assert BLOCK_KEYS <= set(blocks[key])
            assert [r["exposure"] for r in blocks[key]["by_exposure"]] == ["0", "1", "2-5", "6+"]
            assert all(EXPOSURE_KEYS <= set(r) for r in blocks[key]["by_exposure"])
            assert sum(r["n"] for r in blocks[key]["by_exposure"]) == blocks[key]["n"]
        assert TEMPERATURE_KEYS <= set(blocks["temperature"])
        assert {"auroc", "auroc_n_pos", "auroc_n_neg", "brier", "in_subset", "out_of_subset", "layers"} <= set(
            blocks["p_true"]
        )
        assert 0.0 <= blocks["p_ik_baseline_auroc"] <= 1.0
        assert (
            blocks["p_ik_verdict"]["verdict"] in VERDICTS
            and blocks["p_ik_summary"][0] == blocks["p_ik_verdict"]["sentence"]
        )
    n_layers = results["model"]["n_layers"]
    rows = results["p_ik"]
    assert all(P_IK_KEYS <= set(r) for r in rows)
    for readout, position in [
        ("logistic probe", "last name token"),
        ("logistic probe", "value slot"),
        ("mlp probe", "last name token"),
        ("mlp probe", "value slot"),
        ("lens cloze confidence", "value slot"),
        ("lens negative entropy", "value slot"),
    ]:
        layers = [r["layer"] for r in rows if r["readout"] == readout and r["position"] == position]
        assert layers == list(range(n_layers + 1)), (readout, position)
    assert all(r["auroc_ci95"][0] <= r["auroc"] <= r["auroc_ci95"][1] for r in rows if r["auroc_ci95"])
    layers = [r["layer"] for r in results["p_true"]["layers"]["by_layer"]]
    assert layers == list(range(n_layers + 1))
    assert all(HEADLINE_KEYS == set(h) for h in results["headlines"])
    token = results["token_level"]
    assert {"ece", "by_layer"} <= set(token) and token["by_layer"][-1]["ece"] == token["ece"]
    assert json.loads((folder / "config.json").read_text())["quick"] is True
    for figure in (
        "reliability_cloze",
        "reliability_lettered",
        "ece_by_exposure",
        "accuracy_by_exposure",
        "p_ik_auroc_by_layer",
        "p_true_auroc_by_layer",
        "token_level_by_layer",
    ):
        assert (folder / f"{figure}.json").is_file() and (folder / f"{figure}.html").is_file()


def test_every_ece_has_its_interval_and_noise_floor(quick):
    results, _ = quick
    assert eces_without_interval(results) == []
    assert results["acceptance"]["every_ece_has_interval_and_floor"]
    for block in (results["mc"], results["lettered"], *results["mc"]["by_exposure"], results["token_level"]):
        low, high = block["ece_ci95"]
        assert low <= high and block["noise_floor_ece"] > 0
    # The checker does catch a missing one.
    assert eces_without_interval({"x": [{"ece": 0.1, "ece_ci95": [0, 0.2]}]}) == ["results.x[0].ece"]


def test_every_auroc_has_its_class_counts(quick):
    results, _ = quick
    assert aurocs_without_counts(results) == []
    assert results["acceptance"]["every_auroc_has_counts"]
    assert aurocs_without_counts({"a": {"auroc": 0.7}}) == ["results.a.auroc"]


def test_p_ik_is_chosen_on_validation_and_never_picks_the_baseline(quick):
    """The last layer's lens readouts are the model's own output (its lens cloze confidence *is* the baseline):
    not candidates. Constant readouts (layer 0 at the value slot is the same vector for every person) are flagged
    and have no AUROC. The chosen readout is the candidate with the best validation AUROC."""
    results, _ = quick
    n_layers = results["model"]["n_layers"]
    for blocks in (results, results["at_end"]):
        rows = blocks["p_ik"]
        own = [r for r in rows if r["readout"] == "lens cloze confidence" and r["layer"] == n_layers][0]
        assert own["candidate"] is False and own["auroc"] == pytest.approx(blocks["p_ik_baseline_auroc"])
        flat = [r for r in rows if r["position"] == "value slot" and r["layer"] == 0 and "probe" in r["readout"]]
        assert flat and all(r["constant"] and r["feature_rank"] == 0 and np.isnan(r["auroc"]) for r in flat)
        candidates = [r for r in rows if r["candidate"] and not r["constant"]]
        chosen = blocks["p_ik_verdict"]["chosen"]
        best = max(candidates, key=lambda r: r["validation_auroc"])
        assert (chosen["readout"], chosen["position"], chosen["layer"]) == (
            best["readout"],
            best["position"],
            best["layer"],
        )
        counts = blocks["p_ik_info"]["class_counts"]
        assert chosen["auroc_n_pos"] == counts["test"]["n_pos"] and chosen["auroc_n_neg"] == counts["test"]["n_neg"]
        if blocks["p_ik_verdict"]["verdict"] == "carries the signal":
            assert chosen["auroc_ci95"][0] > max(
                chosen["control_shuffled_auroc_ci95"][1], chosen["control_untrained_auroc_ci95"][1]
            )
        assert "Baseline (the model's own confidence, not a candidate)" in blocks["p_ik_verdict"]["sentence"]


def test_items_parquet_is_what_the_dashboard_reads_and_reproduces_the_results(quick):
    results, folder = quick
    items = pd.read_parquet(folder / "items.parquet")
    assert set(
        OPTION_COLUMNS + ["answer_index", "kind", "checkpoint", "split", "person", "exposure", "label_mass"]
    ) <= set(items.columns)
    assert set(items["kind"]) == {"cloze", "lettered"} and set(items["checkpoint"]) == {"partial", "end"}
    cloze = items[(items["kind"] == "cloze") & (items["checkpoint"] == "partial")]
    assert len(cloze) == results["mc"]["n"] == results["world"]["n_eval_persons"]
    probs = softmax(cloze[OPTION_COLUMNS].to_numpy())
    correct = probs.argmax(axis=1) == cloze["answer_index"].to_numpy()
    assert correct.mean() == pytest.approx(results["mc"]["accuracy"])
    assert ece(probs.max(axis=1), correct) == pytest.approx(results["mc"]["ece_15_equal_width"])
    assert ((cloze["label_mass"] > 0) & (cloze["label_mass"] <= 1 + 1e-9)).all()


def test_temperature_scaling_does_not_raise_nll_on_the_calibration_split(quick):
    results, folder = quick
    items = pd.read_parquet(folder / "items.parquet")
    for checkpoint, block in (("partial", results["temperature"]), ("end", results["at_end"]["temperature"])):
        cal = items[
            (items["kind"] == "cloze") & (items["checkpoint"] == checkpoint) & (items["split"] == "calibration")
        ]
        logits, labels = cal[OPTION_COLUMNS].to_numpy(), cal["answer_index"].to_numpy()
        T = fit_temperature(logits, labels)
        assert T == pytest.approx(block["T"])
        assert nll(softmax(logits, T), labels) <= nll(softmax(logits), labels) + 1e-12
        assert block["nll_calibration_split_after"] <= block["nll_calibration_split_before"] + 1e-12
        assert block["accuracy_after"] == block["accuracy_before"]  # T > 0 keeps the order of the logits


def test_cloze_accuracy_rises_with_exposure_at_the_end(quick):
    results, _ = quick
    accuracy = {r["exposure"]: r["accuracy"] for r in results["at_end"]["mc"]["by_exposure"]}
    assert accuracy["0"] < accuracy["1"] <= accuracy["6+"]
    assert abs(accuracy["0"] - 0.25) < 0.15  # never-seen persons: near chance


def test_lettered_multiple_choice_of_a_local_hf_model(hf_folder, tmp_path):
    model_dir, csv_path = hf_folder
    out = tmp_path / "run"
    assert (
        main(["run", "calibration", "--quick", "--model", str(model_dir), "--mmlu", str(csv_path), "--out", str(out)])
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert "load_hf" in results["source"]["route"] and results["source"]["n_items"] == 40
    assert BLOCK_KEYS <= set(results["lettered"]) and results["lettered"]["n"] == 40
    assert TEMPERATURE_KEYS <= set(results["temperature"])
    assert all(HEADLINE_KEYS == set(h) for h in results["headlines"])
    assert eces_without_interval(results) == []
    items = pd.read_parquet(out / "items.parquet")
    assert set(OPTION_COLUMNS + ["answer_index", "label_mass"]) <= set(items.columns) and len(items) == 40
    assert ((items["label_mass"] > 0) & (items["label_mass"] <= 1 + 1e-9)).all()
    rows = results["p_ik"]
    assert rows and all(P_IK_KEYS <= set(r) for r in rows)
    assert sorted({r["layer"] for r in rows}) == [0, 1, 2]
    assert (out / "reliability_lettered.json").is_file() and (out / "p_ik_auroc_by_layer.json").is_file()
    # 40 items of a random model: 12 validation and 12 test items hold far fewer than 10 right answers each.
    assert results["p_ik_verdict"]["verdict"] == "not enough data"


def test_ten_mmlu_questions_are_not_enough_data_in_words(hf_folder, tmp_path):
    """The issue's case: ten questions, where the shuffled-label control also scored 1.0 and the summary claimed
    "carries the signal". Now no verdict is drawn, and the summary says why."""
    model_dir, csv_path = hf_folder
    small = tmp_path / "ten.csv"
    small.write_text("\n".join(csv_path.read_text().splitlines()[:11]) + "\n")  # the header and 10 questions
    out = tmp_path / "run"
    assert (
        main(["run", "calibration", "--quick", "--model", str(model_dir), "--mmlu", str(small), "--out", str(out)]) == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["source"]["n_items"] == 10
    assert results["p_ik_verdict"]["verdict"] == "not enough data"
    assert results["p_ik_verdict"]["carries_signal"] is None
    summary = " ".join(results["p_ik_summary"])
    assert "not enough data" in summary and f"at least {MIN_PER_CLASS}" in summary
    assert "carries the signal" not in summary
    shown = [h for h in results["headlines"] if h["supported"]]
    assert not any(h["name"] == "p_ik_verdict" for h in shown)
    assert all(h["why_not"] for h in results["headlines"] if not h["supported"])


def test_the_bridge_reads_the_same_letter_probabilities_as_the_converter(hf_folder):
    model_dir, csv_path = hf_folder
    items = read_mmlu(csv_path)
    frames = {}
    for loader in ("auto", "bridge"):
        model, tokenizer, route = load_local_model(model_dir, loader)
        assert ("TransformerBridge" in route) == (loader == "bridge")
        frames[loader], _, _ = hf_lettered(model, tokenizer, items)
    np.testing.assert_allclose(frames["auto"][OPTION_COLUMNS], frames["bridge"][OPTION_COLUMNS], atol=1e-4)


def test_an_unconverted_architecture_goes_through_the_bridge(hf_folder, tmp_path):
    """GPT-J has no converter (lab.hf.families.SUPPORTED does not list it): the run wraps it in a TransformerBridge and
    reads the same letter log-probabilities as Hugging Face's own forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, GPTJConfig, GPTJForCausalLM

    from lab.hf.families import SUPPORTED

    _, csv_path = hf_folder
    assert "gptj" not in SUPPORTED
    model_dir = tmp_path / "gptj"
    torch.manual_seed(0)
    GPTJForCausalLM(
        GPTJConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=64, vocab_size=VOCAB, n_positions=64)
    ).save_pretrained(model_dir)
    letter_tokenizer(model_dir)
    out = tmp_path / "run"
    assert (
        main(["run", "calibration", "--quick", "--model", str(model_dir), "--mmlu", str(csv_path), "--out", str(out)])
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert "TransformerBridge" in results["source"]["route"]
    assert results["p_ik"] and all(r["control_untrained_auroc"] is None for r in results["p_ik"] if not r["constant"])
    items = pd.read_parquet(out / "items.parquet")
    _, tokenizer, _ = load_local_model(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    first = read_mmlu(csv_path)[0]
    with torch.no_grad():
        ids = torch.tensor([tokenizer(mmlu_prompt(first))["input_ids"]])
        theirs = hf(ids).logits[0, -1].double().log_softmax(-1)[letter_ids(tokenizer)].numpy()
    np.testing.assert_allclose(items.loc[0, OPTION_COLUMNS].to_numpy(dtype=float), theirs, atol=1e-4)


def test_a_forma_model_folder_answers_too(hf_folder, tmp_path):
    """--model also takes a zoo name or a Forma model folder (its tokenizers.Tokenizer saved beside it)."""
    from lab import HookedTransformer
    from lab.data.tokenizers import word_level
    from tests.builders import tiny_config

    _, csv_path = hf_folder
    tokenizer = word_level(["A", "B", "C", "D", "Answer:"] + [f"w{i}" for i in range(VOCAB - 9)])
    HookedTransformer(tiny_config(d_vocab=tokenizer.get_vocab_size()), tokenizer=tokenizer).save(tmp_path / "forma")
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "calibration",
                "--quick",
                "--model",
                str(tmp_path / "forma"),
                "--mmlu",
                str(csv_path),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["source"]["route"].startswith("Forma model") and results["lettered"]["n"] == 40
    assert results["source"]["letter_token_ids"] == [tokenizer.token_to_id(letter) for letter in "ABCD"]


def test_hf_path_refuses_what_it_cannot_read(hf_folder, tmp_path, capsys):
    model_dir, csv_path = hf_folder
    assert main(["run", "calibration", "--quick", "--mmlu", str(csv_path), "--out", str(tmp_path / "a")]) == 2
    assert "--mmlu needs --model" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("What ?,w1,w2,w3,w4,E\n")
    with pytest.raises(ValueError, match="one of A, B, C, D"):
        read_mmlu(bad)
    bare = tmp_path / "no-tokenizer"
    hf_model("gpt2").save_pretrained(bare)
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        load_local_model(bare)


# --- headlines: a pure function of the results -----------------------------------------------------
def test_a_headline_has_a_direction_only_where_its_interval_decides_it():
    up = signed_headline("x", 0.3, [0.1, 0.5], 0.0, "rises", "falls", "the gap")
    assert (up["supported"], up["direction"], up["sentence"]) == (True, 1, "rises")
    down = signed_headline("x", -0.3, [-0.5, -0.1], 0.0, "rises", "falls", "the gap")
    assert (down["direction"], down["sentence"]) == (-1, "falls")
    straddles = signed_headline("x", 0.1, [-0.1, 0.3], 0.0, "rises", "falls", "the gap")
    assert not straddles["supported"] and straddles["direction"] is None
    assert "includes 0" in straddles["why_not"] and "cannot tell the direction" in straddles["why_not"]


def test_a_verdict_of_absence_needs_an_interval_that_reaches_the_controls():
    def verdict(carries, low, high):
        return {
            "what": "P(IK)",
            "carries_signal": carries,
            "sentence": "P(IK): …",
            "chosen": {
                "auroc": (low + high) / 2,
                "auroc_ci95": [low, high],
                "control_shuffled_auroc": 0.5,
                "control_untrained_auroc": 0.55,
            },
        }

    assert verdict_headline("v", verdict(True, 0.8, 0.9))["direction"] is True
    assert verdict_headline("v", verdict(False, 0.45, 0.65))["direction"] is False
    wide = verdict_headline("v", verdict(False, 0.6, 0.8))
    assert not wide["supported"] and "too few items" in wide["why_not"]
    none = verdict_headline("v", verdict(None, 0.6, 0.8) | {"sentence": "P(IK): not enough data — …"})
    assert not none["supported"] and none["why_not"].startswith("P(IK): not enough data")


def test_the_partial_checkpoint_is_chosen_on_the_format_persons_never_on_those_it_reports(quick):
    """The stage before the end whose recall of the format persons is nearest the target: where the evaluation
    persons' recall would choose another stage, the format persons' choice stands; the quick run and the committed
    default run (docs/measured/runs/calibration.json) record the stage this rule picks, and its recalls."""

    from experiments.calibration.setting import partial_stage

    stages = [
        {"step": 10, "recall_selection": 0.3, "recall_seen": 0.6},
        {"step": 20, "recall_selection": 0.62, "recall_seen": 0.9},
        {"step": 30, "recall_selection": 0.6, "recall_seen": 1.0},
    ]
    assert partial_stage(stages, 0.6, 30) == 1  # the end of training (step 30) is never the partial checkpoint
    assert partial_stage(stages, 0.6, 40) == 2 and partial_stage(stages, 0.3, 40) == 0
    assert partial_stage(stages[:1], 0.6, 10) is None
    stages[1]["recall_selection"] = stages[0]["recall_selection"]
    assert partial_stage(stages, 0.6, 30) == 0  # a tie: the earlier stage
    reference = json.loads((REPO / "docs/measured/runs/calibration.json").read_text())
    for results in (quick[0], reference):
        training = results["training"]
        chosen = training["stages"][
            partial_stage(training["stages"], training["partial_recall_target"], training["steps"])
        ]
        assert training["partial_step"] == chosen["step"] and f"step {chosen['step']} of" in results["checkpoint"]
        assert (training["partial_recall_selection"], training["partial_recall_seen"]) == (
            chosen["recall_selection"],
            chosen["recall_seen"],
        )
        assert "format persons" in training["partial_chosen_on"]
