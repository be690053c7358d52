"""The monitor experiment (issue 22): the quick run end to end through `forma run monitor`, every reported number
recomputed from the table it wrote, and the `--model PATH --qa FILE` path on a tiny random GPT-2 saved to disk."""

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest

from experiments import monitor as experiment
from lab.cli import main
from lab.metrics.calibration import auroc
from lab.metrics.selective import aurc, crc_threshold, selective_outcome
from tests.conftest import VOCAB, hf_gpt2

HEADLINE_KEYS = {"name", "sentence", "value", "interval", "direction", "supported", "why_not"}


@pytest.fixture(scope="module")
def quick(quick_run):
    folder = quick_run("monitor")  # `forma run monitor --quick`, shared with the dashboard's tests
    return json.loads((folder / "results.json").read_text()), folder


def test_the_truth_of_every_claim_follows_the_world(quick):
    results, folder = quick
    prompts = pd.read_parquet(folder / "prompts.parquet")
    assert set(prompts["kind"]) == set(experiment.KINDS)
    invented = prompts[prompts["kind"] == "invented"]
    assert invented["false"].all() and (invented["person"] == -1).all()  # no such person: every value is false
    real = prompts[prompts["kind"] != "invented"]
    assert (real["false"] == (real["answer"] != real["truth"])).all()
    assert ((real["kind"] == "seen") == (real["exposure"] > 0)).all()
    # subjects are on one side only, and every split holds all three kinds
    names = prompts["first"] + " " + prompts["last"]
    assert names.is_unique and set(prompts["split"]) == set(experiment.SPLITS)
    for kind in experiment.KINDS:
        assert results["answers"][kind]["n"] == int((prompts["kind"] == kind).sum())


def test_every_signal_is_read_and_judged_on_the_test_split(quick):
    results, folder = quick
    prompts = pd.read_parquet(folder / "prompts.parquet")
    test = prompts[prompts["split"] == "test"]
    names = [row["signal"] for row in results["signals"]]
    assert set(names) == {"max_prob", "entropy", "margin", "lens_kl", "subject_attention", "probe", "p_ik",
                          "self_consistency", "semantic_entropy"}
    for row in results["signals"]:
        risk, false = test[f"risk_{row['signal']}"].to_numpy(), test["false"].to_numpy()
        assert math.isclose(row["auroc"], auroc(risk, false), abs_tol=1e-12)
        assert row["auroc_n_pos"] == int(false.sum()) and row["auroc_n_neg"] == int((~false).sum())
        assert math.isclose(row["aurc"], aurc(risk, false), abs_tol=1e-12)
        assert row["aurc"] >= row["aurc_optimal"] - 1e-12
        low, high = row["auroc_ci95"]
        assert low <= row["auroc"] <= high
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
    probe, p_ik, signs = experiment.load_readouts(folder)
    assert signs == {row["signal"]: row["sign"] for row in results["signals"]}
    prompts = pd.read_parquet(folder / "prompts.parquet").head(4)
    ids = [model.tokenizer.encode(f"<bos> {f} {l} birthday").ids for f, l in zip(prompts["first"], prompts["last"])]
    import torch

    out = Monitor(model, probe=probe, p_ik=p_ik).generate(torch.tensor(ids), 2, subject=experiment.SUBJECT)
    answers = [" ".join(model.tokenizer.id_to_token(int(t)) for t in row) for row in out.new_tokens]
    assert answers == prompts["answer"].tolist()


def test_config_is_checked():
    with pytest.raises(ValueError, match="--model and --qa go together"):
        experiment.Config(qa="questions.csv")
    with pytest.raises(ValueError, match="alphas"):
        experiment.Config(alphas=(0.0,))
    with pytest.raises(ValueError, match="split_fractions"):
        experiment.Config(split_fractions=(0.5, 0.3, 0.3))


# --- any local Hugging Face model on a question–answer CSV -------------------------------------------
def word_tokenizer(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<pad>", "<bos>", "<eos>", "Question:", "Answer:"] + [f"w{i}" for i in range(VOCAB - 6)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(directory)


@pytest.fixture(scope="module")
def qa_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qa")
    hf_gpt2().save_pretrained(folder / "gpt2")
    word_tokenizer(folder / "gpt2")
    rng = np.random.default_rng(0)
    with (folder / "qa.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "answer"])
        for _ in range(30):
            writer.writerow([" ".join(f"w{i}" for i in rng.integers(0, VOCAB - 6, 5)), f"w{rng.integers(0, 9)}"])
    return folder


def test_a_local_model_on_a_question_answer_csv(qa_folder, tmp_path):
    out = tmp_path / "run"
    assert main(["run", "monitor", "--model", str(qa_folder / "gpt2"), "--qa", str(qa_folder / "qa.csv"),
                 "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["source"]["n_items"] == 30 and results["source"]["hooked"]
    assert {row["signal"] for row in results["signals"]} == {"max_prob", "entropy", "margin", "lens_kl"}
    prompts = pd.read_parquet(out / "prompts.parquet")
    assert (prompts["false"] == [experiment.normalise(g) != experiment.normalise(a)
                                 for g, a in zip(prompts["generated"], prompts["answer"])]).all()
    assert results["headlines"] == experiment.headlines({k: v for k, v in results.items() if k != "headlines"})


def test_question_answer_files_are_checked(tmp_path):
    assert experiment.normalise("  Paris. ") == experiment.normalise("paris")
    with pytest.raises(FileNotFoundError, match="no question–answer file"):
        experiment.read_qa(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("question,answer\nWhat?,Yes,extra\n")
    with pytest.raises(ValueError, match="row 2: expected 2 non-empty columns"):
        experiment.read_qa(bad)
