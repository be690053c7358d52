"""The monitor's real-model track on smollm2 (experiments.monitor.real): the readouts' activations read on the
greedy passes equal a forward pass over the prompt and its answer; the samples' shared prefix gives the logits of
each whole prompt; and a small run end to end — every answer scored by the stated match, every signal judged or
said unavailable, conformal risk control checked against its bound on held-out questions."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

import experiments
from experiments import monitor as experiment
from experiments.calibration.kadavath import expanded_cache, shared_prefix
from experiments.monitor.real import is_right, length_batches, monitored_real, prefix_cache, read_real_inputs
from experiments.monitor.signals import residuals
from lab.analysis.monitor import SIGNALS
from lab.folders import is_trained
from tests.builders import page, rendered, smollm2_folder, texts

pytestmark = pytest.mark.real

N_QUESTIONS = 16  # a few batches, within the tests' minutes on two loaded cores


@pytest.fixture(scope="module")
def cfg():
    return experiment.Config(
        model="smollm2", quick=True, n_questions=N_QUESTIONS, k_samples=2, n_resplits=20, n_boot=50, threads=2
    )


@pytest.fixture(scope="module")
def inputs(cfg, monkeypatch_module):
    if not is_trained("smollm2"):
        monkeypatch_module.setenv("FORMA_ZOO_DIR", str(smollm2_folder().parent))
    with torch.inference_mode():
        return read_real_inputs(cfg)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def generated(inputs, cfg):
    return monitored_real(inputs, cfg)


def test_the_readouts_rows_are_those_of_a_forward_pass_over_prompt_and_answer(inputs, generated):
    probe_rows, pik_rows, hooks = generated["readout_rows"]
    first = length_batches(inputs.prompts)[0]
    for row in range(first.start, first.stop):
        n = generated["lengths"][row]
        prompt = inputs.prompts[row]
        answer = inputs.tokenizer.encode(generated["rows"][row]["generated"], add_special_tokens=False)
        tokens = torch.tensor([prompt + answer[: n - 1]]) if n > 1 else torch.tensor([prompt])
        acts = residuals(inputs.model, tokens, list(hooks))
        p = len(prompt)
        torch.testing.assert_close(pik_rows[row], acts[hooks[1]][0, p - 1], atol=1e-4, rtol=1e-4)
        # the first answer token's row is the prompt's last position: the same whatever the answer's tokens are
        torch.testing.assert_close(probe_rows[row][0], acts[hooks[0]][0, p - 1], atol=1e-4, rtol=1e-4)


def test_samples_on_the_shared_prefix_see_the_whole_prompts_logits(inputs):
    shared = shared_prefix(inputs.prompts)
    assert shared > 50  # the shots
    cache = prefix_cache(inputs.model, inputs.prompts[0][:shared])
    part = length_batches(inputs.prompts)[0]
    own = torch.tensor([ids[shared:] for ids in inputs.prompts[part]])
    with torch.inference_mode():
        on_prefix = inputs.model.next_token_logits(own, expanded_cache(cache, len(own)))
        whole = inputs.model.next_token_logits(torch.tensor(inputs.prompts[part]))
    torch.testing.assert_close(on_prefix, whole, atol=1e-3, rtol=1e-3)


@pytest.fixture(scope="module")
def real_run(inputs, cfg, tmp_path_factory, monkeypatch_module):
    """A small run of the track as `forma run monitor --model smollm2` records it: runs/monitor_real/<stamp>/."""
    from lab.runs import run_and_record

    monkeypatch_module.setenv("FORMA_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))
    name = experiments.run_name("monitor", cfg)
    folder = run_and_record(name, cfg, lambda config, out: experiment.run(config, out, inputs))
    return json.loads((folder / "results.json").read_text()), folder


def test_a_small_run_end_to_end(real_run):
    results, folder = real_run
    prompts = pd.read_parquet(folder / "prompts.parquet")
    assert folder.parent.name == "monitor_real"
    assert len(prompts) == N_QUESTIONS and prompts["id"].is_unique
    right = [is_right(g, a) for g, a in zip(prompts["generated"], prompts["answer"])]
    assert (prompts["false"] == ~np.array(right)).all()
    assert results["source"]["model_label"] == "SmolLM2-135M-Instruct, 4-bit GGUF dequantized"
    judged = {row["signal"] for row in results["signals"]}
    assert judged | set(results["unavailable"]) == set(SIGNALS) and not judged & set(results["unavailable"])
    for check in results["crc_check"]:
        assert check["holds"] == (check["realised_joint_risk_ci95"][0] <= check["bound"])
    assert results["timing"]["total_s"] > 0 and results["peak_rss_gb"] > 0  # the process's peak: the suite's


def test_a_run_continued_into_its_folder_reads_its_parts_back_and_ends_as_one_that_ran_straight_through(
    real_run, inputs, cfg, tmp_path, monkeypatch
):
    """A run keeps its monitored generation and its samples in parts/ as each ends; a run continued into a folder
    holding them (what a run killed after them leaves) generates and samples nothing again, and its results equal
    those of the run that was never interrupted, bit for bit."""
    import shutil

    from experiments.monitor import real

    straight, folder = real_run
    kept = sorted(p.name for p in (folder / "parts").iterdir())
    assert kept == ["generation.json", "generation.safetensors", "sampling.safetensors"]
    shutil.copytree(folder / "parts", tmp_path / "parts")

    def again(*args, **kwargs):
        raise AssertionError("computed again, not read back")

    monkeypatch.setattr(real, "monitored_real", again)
    monkeypatch.setattr(real, "real_sampling", again)
    resumed = experiment.run(cfg, tmp_path, inputs)
    for results in (resumed, straight):
        results.pop("timing"), results.pop("peak_rss_gb")
    assert json.loads(json.dumps(resumed, default=str)) == straight
    assert pd.read_parquet(tmp_path / "prompts.parquet").equals(pd.read_parquet(folder / "prompts.parquet"))


def test_the_monitor_page_shows_the_real_run_below_the_toy_world_in_words(real_run, monkeypatch):
    results, folder = real_run
    monkeypatch.setenv("FORMA_RUNS_DIR", str(folder.parents[1]))
    at = page("monitor").run()
    assert not at.exception, at.exception
    said = texts(at)
    assert "forma run monitor" in said  # no toy-world run here: the page says how to make one
    assert "On a real language model" in [h.value for h in at.header]
    read = " ".join(rendered(m.value) for m in at.markdown)  # as a reader sees the escaped run text
    assert "SmolLM2-135M-Instruct, 4-bit GGUF dequantized" in read and "real question set" in read
    shown = " ".join([said, *(str(t.value) for t in at.table)])
    assert not [key for key in SIGNALS if "_" in key and key in shown]  # signals in words, never by their keys
