"""The dashboard without a browser (Streamlit's AppTest): every page renders, with and without runs and models."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import experiments
from dashboards.pages import pages
from lab import HookedTransformer, ModelConfig
from tests.builders import explorer_charts, long_numbers, open_explorer_tab, page, rendered, texts, tiny_pydoc

EXPERIMENT_PAGES = experiments.experiment_names()


def heatmap_rows(chart) -> int:
    z = json.loads(chart.proto.spec)["data"][0]["z"]
    return int(z["shape"].split(",")[0]) if isinstance(z, dict) else len(z)  # plotly may encode arrays


def rendered_table(frame):
    """An st.table's frame as a reader sees it: every cell, index entry and column name rendered."""
    shown = frame.map(rendered).rename(columns=rendered)
    shown.index = [rendered(i) for i in shown.index]
    return shown


@pytest.mark.parametrize("name", [name for name, _ in pages()])
def test_every_page_renders_on_a_fresh_clone_and_says_what_to_run(empty, name):
    at = page(name).run()
    assert not at.exception, at.exception
    said = texts(at)
    expected = {
        "home": "forma run kl",
        "explorer": "forma build pydoc",
        "training": "forma build pydoc",
        "graphs": "forma transcoders pydoc",
        "features": "forma transcoders pydoc",
        "compare": "forma run kl --quick",
    }
    assert expected.get(name, f"forma run {name}") in said


@pytest.mark.parametrize("name", EXPERIMENT_PAGES)
def test_a_corrupted_results_json_is_a_message_not_a_traceback(empty, name):
    folder = empty / "runs" / name / "2026-01-01T00-00-00Z"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text("{not json")
    at = page(name).run()
    assert not at.exception
    assert "unreadable results.json" in texts(at)


def test_explorer_shows_every_view_of_a_model(empty):
    from lab.analysis.counterfactual import corruptions

    model = tiny_pydoc(empty / "models")
    at = page("explorer").run()
    assert not at.exception, at.exception
    assert [c.key for c in at.get("plotly_chart")] == ["attention", "attention_heads"]  # the open tab's alone
    patching = open_explorer_tab(at, "Patching")
    assert "No one-token change of this prompt" in texts(patching)
    charts = list(explorer_charts(at).values())
    # attention (one head, and every head beside it), residual norms, logit lens, attribution, input attribution,
    # head detectors; this random model predicts the same token whatever one token of the default prompt is swapped
    # for, and patching says so
    assert [c.key for c in charts] == [
        "attention",
        "attention_heads",
        "norms",
        "lens",
        "dla",
        "input_attribution",
        "heads",
    ]
    assert list(corruptions(model, model.to_tokens(at.text_input(key="prompt").value))) == []
    truth = texts(open_explorer_tab(at, "Ground-truth lens"))
    assert "Ground-truth lens needs" not in truth and "known (the zoo's Markov" in truth
    open_explorer_tab(at, "Attention")
    attention = json.loads(charts[0].proto.spec)
    assert attention["data"][0]["type"] == "heatmap"
    assert heatmap_rows(charts[0]) == 8  # "Return the number of items in the list." → 8 words
    at.slider(key="attn_layer").set_value(1).run()
    assert not at.exception
    at.text_input(key="prompt").input("Return the items").run()
    assert not at.exception
    assert heatmap_rows(at.get("plotly_chart")[0]) == 3


def test_explorer_reports_a_bad_prompt_and_a_missing_folder(empty):
    tiny_pydoc(empty / "models")
    at = page("explorer").run()
    at.text_input(key="prompt").input("").run()
    assert not at.exception and "empty" in texts(at)
    at.text_input(key="prompt").input(" ".join(["the"] * 300)).run()  # longer than its context: refused, never cut
    assert not at.exception and "sequence of 300 tokens" in texts(at), texts(at)
    at.selectbox(key="model_choice").select("local folder…").run()
    at.text_input(key="model_path").input(str(empty / "nowhere")).run()
    assert not at.exception and "nowhere" in texts(at)


def test_calibration_temperature_slider_recomputes_ece(empty):
    import numpy as np
    import pandas as pd

    folder = empty / "runs" / "calibration" / "run1"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (200, 4))
    items = pd.DataFrame({f"option_logit_{k}": logits[:, k] for k in range(4)})
    items["answer_index"] = rng.integers(0, 4, 200)
    items.to_parquet(folder / "items.parquet")
    (folder / "results.json").write_text(json.dumps({"mc": {"n": 200, "accuracy": 0.25}}))
    at = page("calibration").run()
    assert not at.exception, at.exception
    before = [m.value for m in at.markdown if "ECE" in m.value]
    at.slider(key="temperature").set_value(3.0).run()
    after = [m.value for m in at.markdown if "ECE" in m.value]
    assert before and after and before != after


def test_training_curves_of_a_trained_model(empty):
    train = empty / "models" / "markov" / "train"
    train.mkdir(parents=True)
    records = [
        {"step": s, "train_loss_nats": 3.0 - s / 10, **({"val_loss_nats": 3.1 - s / 10} if s % 5 == 0 else {})}
        for s in range(1, 11)
    ]
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    at = page("training").run()
    assert not at.exception
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [trace["name"] for trace in spec["data"]] == ["train", "held-out"]
    card = {"quick": True, "steps": 10, "provenance": {"started_utc": "2026-01-02T03-04-05Z"}}
    (empty / "models" / "markov" / "card.json").write_text(json.dumps(card))
    at = page("training").run()  # the curves say which model they are of: quick, its steps, when it was trained
    caption = rendered(" ".join(c.value for c in at.caption))
    assert "markov: the quick recipe, 10 steps, trained 2 January 2026, 03:04 UTC" in caption, caption
    assert "(a quick model: forma build markov builds the full one)" in caption


def _decode_array(z):
    import base64

    import numpy as np

    if isinstance(z, dict):  # plotly's binary encoding
        flat = np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"])
        return flat.reshape([int(n) for n in z["shape"].split(",")]) if "shape" in z else flat
    return np.asarray(z)


def test_explorer_views_show_the_library_numbers(empty):
    """One value of each view — attention, logit lens, patching — equals what lab computes."""
    import numpy as np
    import torch

    from lab.analysis.lens import logit_lens
    from lab.analysis.patching import patch_positions

    model = tiny_pydoc(empty / "models")
    prompt = "Return the number of items in the list ."
    tokens = model.to_tokens(prompt)
    with torch.inference_mode():
        answer = int(model(tokens)[0, -1].argmax())
        # a one-word corruption that changes the (random) model's prediction
        corrupted_text = next(
            c
            for i in range(9)
            for w in ("file", "the", "items", "Return")
            for c in [" ".join(w if j == i else x for j, x in enumerate(prompt.split()))]
            if int(model(model.to_tokens(c))[0, -1].argmax()) != answer
        )
    at = page("explorer").run()
    at.text_input(key="prompt").input(prompt).run()
    open_explorer_tab(at, "Patching")
    at.text_input(key="corrupted").input(corrupted_text).run()
    assert not at.exception, at.exception
    specs = {
        json.loads(c.proto.spec)["layout"]["title"]["text"].split(",")[0].split(":")[0]: json.loads(c.proto.spec)
        for c in explorer_charts(at).values()
    }
    _, cache = model.run_with_cache(tokens)
    shown = _decode_array(specs["Attention pattern"]["data"][0]["z"])
    assert np.allclose(shown, cache["blocks.0.attn.hook_pattern"][0, 0].numpy(), atol=1e-6)
    lens = _decode_array(specs["Logit lens"]["data"][0]["z"])
    assert np.allclose(lens, logit_lens(model, tokens)[:, 0].exp().max(-1).values.numpy(), atol=1e-6)
    patching = next(v for k, v in specs.items() if k.startswith("Share of logit"))
    corrupted = model.to_tokens(corrupted_text)
    with torch.inference_mode():
        wrong = int(model(corrupted)[0, -1].argmax())
    expected = patch_positions(model, tokens, corrupted, "resid_pre", answer=answer, wrong=wrong).normalized()
    assert np.allclose(_decode_array(patching["data"][0]["z"]), expected.numpy(), atol=1e-5)


LIVE_CHARTS = {"calibration": 1}  # the reliability diagram the temperature slider redraws


@pytest.mark.parametrize("name", EXPERIMENT_PAGES)
def test_every_experiment_page_draws_its_quick_run(quick_run, quick_runs_dir, monkeypatch, name):
    from dashboards.display import figures

    folder = quick_run(name)
    monkeypatch.setenv("FORMA_RUNS_DIR", str(quick_runs_dir))
    at = page(name).run()
    assert not at.exception, at.exception
    assert folder.name in " ".join(c.value for c in at.caption)  # the header names the run it shows
    assert len(at.get("plotly_chart")) == len(figures(folder)) + LIVE_CHARTS.get(name, 0) >= 2
    for box in at.selectbox:  # every choice a page offers renders too
        for option in box.options:
            box.select(option).run()
            assert not at.exception, (name, box.label, option)


@pytest.mark.parametrize("name", EXPERIMENT_PAGES)
def test_experiment_pages_open_with_their_headlines(quick_run, quick_runs_dir, monkeypatch, name):
    """Supported headlines first, in the run's own sentences, as text (never read as markdown); then each
    unsupported one named in words (never by its key) with why not."""
    from lab.headlines import title

    results = json.loads((quick_run(name) / "results.json").read_text())
    monkeypatch.setenv("FORMA_RUNS_DIR", str(quick_runs_dir))
    at = page(name).run()
    assert not at.exception, at.exception
    said = " ".join(t.value for t in at.text)
    for headline in results["headlines"]:
        if headline["supported"]:
            assert f"• {headline['sentence']}" in said, headline["name"]
        else:
            assert f"• {title(headline['name'])}: {headline['why_not']}" in said, headline["name"]
    unsupported = [h for h in results["headlines"] if not h["supported"]]
    if unsupported:
        assert "Not shown, because this run cannot support it" in " ".join(m.value for m in at.markdown)
        assert all(h["sentence"] not in said for h in unsupported if h["sentence"])
        assert all(f"{h['name']}:" not in said for h in unsupported if "_" in h["name"])


def test_calibration_opens_at_the_checkpoint_its_headlines_describe(quick_run, quick_runs_dir, monkeypatch):
    """The checkpoint selector comes before the numbers it controls and starts at the end of training, where the
    headlines' ECE and temperature are measured; every section names the checkpoint it shows; the partial
    checkpoint is one click away, with its own numbers."""
    results = json.loads((quick_run("calibration") / "results.json").read_text())
    monkeypatch.setenv("FORMA_RUNS_DIR", str(quick_runs_dir))
    at = page("calibration").run()
    assert not at.exception, at.exception
    assert at.radio(key="checkpoint").value == "end"
    heads = {h["name"]: h for h in results["headlines"]}

    def ece_card() -> str:
        return next(m.value for m in at.metric if m.label.startswith("ECE"))

    assert ece_card() == f"{results['at_end']['mc']['ece_15_equal_width']:.3f}"
    assert ece_card() == f"{heads['cloze_ece_beyond_noise']['value']:.3f}"
    assert f"T = {heads['temperature_above_1']['value']:.3f}" in " ".join(m.value for m in at.markdown)
    sections = [s.value for s in at.subheader]
    assert sections and all("end of training" in s for s in sections)
    at.radio(key="checkpoint").set_value("partial").run()
    assert not at.exception, at.exception
    assert ece_card() == f"{results['mc']['ece_15_equal_width']:.3f}"
    assert all("partial checkpoint" in s.value for s in at.subheader)


def test_the_monitor_page_colours_tokens_and_abstains_where_the_library_says(quick_run, quick_runs_dir, monkeypatch):
    """The page's generation is the library's: the same tokens as Monitor.generate, and the abstention point of
    abstain_at at the run's CRC threshold for the chosen signal and α."""
    import torch

    from experiments.monitor.config import SUBJECT
    from experiments.monitor.readouts import load_readouts
    from lab.analysis.monitor import Monitor, abstain_at

    folder = quick_run("monitor")
    results = json.loads((folder / "results.json").read_text())
    monkeypatch.setenv("FORMA_RUNS_DIR", str(quick_runs_dir))
    at = page("monitor").run()
    assert not at.exception, at.exception
    prompt = at.text_input[0].value
    signal, alpha = at.selectbox[0].value, at.selectbox[1].value
    model = HookedTransformer.load(folder / "model")
    probe, p_ik, signs = load_readouts(folder)
    out = Monitor(model, probe=probe, p_ik=p_ik).generate(
        torch.tensor([model.tokenizer.encode(prompt).ids]), 2, subject=SUBJECT
    )
    words = [model.tokenizer.id_to_token(int(t)) for t in out.new_tokens[0]]
    threshold = next(
        a["crc"]["threshold"] for a in results["abstention"] if a["signal"] == signal and a["alpha"] == alpha
    )
    risk = (signs[signal] * out.signals[signal][0].double()).tolist()
    stop = abstain_at(risk, 2, threshold)
    from dashboards.display import plain

    shown = " ".join(m.value for m in at.markdown)
    for word, r in zip(words, risk):
        assert f":{'red' if r > threshold else 'green'}[{plain(word)}]" in shown
    assert (f"abstains at new token {stop + 1}" if stop is not None else "the answer is given") in shown
    at.text_input[0].input("<bos> nobody-knows-this birthday").run()
    assert not at.exception and "not in its vocabulary" in texts(at)


@pytest.mark.parametrize("name", EXPERIMENT_PAGES)
def test_pages_answer_in_numbers_a_reader_can_read(quick_run, quick_runs_dir, monkeypatch, name):
    """No raw JSON tree, and no number printed with more than 6 significant digits in a sentence or a table
    (the exact values are in tooltips and results.json); tables are plain HTML, drawn by every browser."""
    quick_run(name)
    monkeypatch.setenv("FORMA_RUNS_DIR", str(quick_runs_dir))
    at = page(name).run()
    assert not at.exception, at.exception
    assert not at.json, f"{name}: st.json shows a raw tree"
    shown = [rendered(str(m.value)) for m in [*at.markdown, *at.caption, *at.subheader, *at.text]]
    shown += [rendered_table(frame.value).to_string() for frame in at.table]
    long = [hit for text in shown for hit in long_numbers(text)]
    assert not long, f"{name}: {long[:5]}"


def test_the_long_number_check_catches_a_raw_float():
    assert long_numbers("measured 6.2831852475690795 and 0.29791459781529295, 0.1234 and 12,345.5") == [
        "6.2831852475690795",
        "0.29791459781529295",
    ]
    assert not long_numbers("0.0006283 · 12,345.6 · 1e-05 · 2026-12-01T17-15-46Z · v1.43.3 · 0.1234")


def _chart(at: AppTest, key: str) -> dict:
    return json.loads(explorer_charts(at)[key].proto.spec)


def test_explorer_patching_starts_from_a_pair_whose_predictions_differ(empty):
    """The default corrupted prompt swaps one token and changes the prediction; both heatmaps (layer × position,
    layer × head) and the head detectors are the library's numbers."""
    import numpy as np
    import torch

    from lab.analysis.heads import detect_heads
    from lab.analysis.patching import patch_heads, patch_positions

    model = tiny_pydoc(empty / "models", seed=1)
    at = open_explorer_tab(page("explorer").run(), "Patching")
    assert not at.exception, at.exception
    clean = model.to_tokens(at.text_input(key="prompt").value)
    corrupted = model.to_tokens(at.text_input(key="corrupted").value)
    assert clean.shape == corrupted.shape and (clean != corrupted).sum() == 1
    with torch.inference_mode():
        answer, wrong = int(model(clean)[0, -1].argmax()), int(model(corrupted)[0, -1].argmax())
    assert answer != wrong
    by_position = patch_positions(model, clean, corrupted, "resid_pre", answer=answer, wrong=wrong).normalized()
    by_head = patch_heads(model, clean, corrupted, answer=answer, wrong=wrong).normalized()
    assert np.allclose(_decode_array(_chart(at, "patching")["data"][0]["z"]), by_position.numpy(), atol=1e-5)
    assert np.allclose(_decode_array(_chart(at, "patching_heads")["data"][0]["z"]), by_head.numpy(), atol=1e-5)
    scores = detect_heads(model)
    shown = [_decode_array(trace["z"]) for trace in _chart(at, "heads")["data"]]
    for values, kind in zip(shown, ("previous_token", "duplicate_token", "induction")):
        assert np.allclose(values, getattr(scores, kind).numpy(), atol=1e-6), kind


def test_explorer_ground_truth_lens_of_a_source_world_model(empty):
    """A model whose folder records a Markov source: the lens's KL to the true law per layer is
    lab.analysis.lens.ground_truth_lens's, and its last layer is the model's own KL."""
    import numpy as np
    import torch

    from lab.analysis.lens import ground_truth_lens
    from lab.data.sources import MarkovSource
    from lab.runs import write_json
    from tests.builders import tiny_config

    source = MarkovSource(10, order=2, seed=0)
    model = HookedTransformer(tiny_config(d_vocab=10, n_ctx=16), seed=2).eval()
    model.save(empty / "models" / "markov")
    write_json(empty / "models" / "markov" / "world.json", {"spec": {"kind": "markov"}, "source": source.to_dict()})
    at = page("explorer").run()
    at.selectbox(key="model_choice").select("markov").run()
    assert not at.exception, at.exception
    ids = [int(t) for t in at.text_input(key="prompt").value.split()]
    lens = ground_truth_lens(model, torch.tensor([ids]), source.conditionals([ids]))
    last, mean = _chart(at, "truth_kl")["data"]
    assert np.allclose(_decode_array(last["y"]), lens.kl_nats[:, 0, -1].numpy(), atol=1e-9)
    assert np.allclose(_decode_array(mean["y"]), lens.kl_nats[:, 0].mean(-1).numpy(), atol=1e-9)
    shown = _decode_array(_chart(at, "truth_lens")["data"][0]["z"])
    assert np.allclose(shown[0], source.conditionals([ids])[0, -1]) and shown.shape == (model.cfg.n_layers + 2, 10)
    open_explorer_tab(at, "Ground-truth lens").slider(key="truth_pos").set_value(3).run()
    assert not at.exception
    truth_kl = next(c for c in at.get("plotly_chart") if c.key == "truth_kl")
    assert np.allclose(_decode_array(json.loads(truth_kl.proto.spec)["data"][0]["y"]), lens.kl_nats[:, 0, 3].numpy())


def test_explorer_reads_any_local_hugging_face_folder(empty, tmp_path):
    """A folder Forma converts (GPT-2), one it does not (GPT-J: through the bridge, with the views that read hooks),
    and folders that are not models: each a sentence on the page, never a traceback."""
    import torch
    from transformers import GPTJConfig, GPTJForCausalLM

    from tests.builders import hf_model, word_tokenizer

    gpt2, gptj, broken, bare = (tmp_path / n for n in ("gpt2", "gptj", "broken", "bare"))
    hf_model("gpt2", randomise=False).save_pretrained(gpt2)  # as initialised: its prompt has a flipping corruption
    word_tokenizer(gpt2)
    torch.manual_seed(0)
    GPTJForCausalLM(
        GPTJConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=64, vocab_size=100, n_positions=64)
    ).save_pretrained(gptj)
    word_tokenizer(gptj)
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "gpt2", "n_layer": "two"')
    bare.mkdir()
    at = page("explorer").run()
    at.selectbox(key="model_choice").select("local folder…").run()
    at.text_input(key="model_path").input(str(gpt2)).run()
    assert not at.exception, at.exception
    assert "converted to a Forma model by lab.hf.convert.from_hf" in texts(at)
    assert {"attention", "lens", "patching", "patching_heads", "heads"} <= set(explorer_charts(at))
    assert "No trust report yet" in texts(at)
    at.button(key="trust_button").click().run()
    assert not at.exception, at.exception
    assert "Hugging Face logits" in at.code[0].value and "fused vs explicit attention" in at.code[0].value
    at.text_input(key="model_path").input(str(gptj)).run()
    assert not at.exception, at.exception
    assert "TransformerBridge" in texts(at)
    assert "a bridged model shows attention" in texts(open_explorer_tab(at, "Residual stream"))
    assert {"attention", "patching", "patching_heads", "heads"} <= set(explorer_charts(at))
    for folder, words in ((broken, "config.json"), (bare, "bare")):
        at.text_input(key="model_path").input(str(folder)).run()
        assert not at.exception, (folder, at.exception)
        assert words in " ".join(str(e.value) for e in [*at.error, *at.warning]), folder


def test_home_shows_each_models_card_numbers(empty):
    from dashboards.display import short

    card = {
        "name": "markov",
        "quick": False,
        "n_params": 170272,
        "steps": 3000,
        "train_s": 317.1371884429991,
        "best_val_loss_nats": 2.882032934824626,
        "val_kl_to_truth_nats": 0.06499305809728059,
    }
    (empty / "models" / "markov" / "card.json").write_text(json.dumps(card))
    (empty / "models" / "markov" / "model.safetensors").write_bytes(b"")
    at = page("home").run()
    assert not at.exception, at.exception
    table = rendered_table(at.table[0].value)
    row = table.loc["markov"]
    assert row["trained"] == "yes" and row["parameters"] == "170,272" and row["steps"] == "3,000"
    assert row["KL to the true law (nats)"] == short(card["val_kl_to_truth_nats"]) == "0.06499"
    assert row["held-out loss (nats)"] == short(card["best_val_loss_nats"]) and row["perplexity"] == "—"
    assert table.loc["facts", "trained"] == "no: forma build facts makes it"


def running_job(folder: Path, job: str, step: int, total: int) -> None:
    """A progress file as a job at work writes it (this process stands in for the job)."""
    import os
    import time

    from lab.progress import PROGRESS_FILE, Progress, Stage

    stage = Stage("train", step, total, "step", elapsed_s=12.0, eta_s=36.0)
    record = Progress(job, "running", os.getpid(), "2026-01-01T00:00:00Z", 20.0, time.time(), stage)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PROGRESS_FILE).write_text(json.dumps(record.to_json()))


@pytest.mark.parametrize("name", EXPERIMENT_PAGES)
def test_an_experiment_page_shows_its_running_jobs_progress(empty, name):
    """While `forma run NAME` works on the page's first run: its step / total, elapsed and ETA, not "no run"."""
    running_job(empty / "runs" / name / "2026-01-01T00-00-00Z", f"forma run {name} --quick", 30, 120)
    at = page(name).run()
    assert not at.exception, at.exception
    bars = at.get("progress")
    assert len(bars) == 1 and bars[0].proto.value == 25
    assert f"forma run {name} --quick: 0:20 elapsed; train step 30/120 (25%), ETA 0:36" in bars[0].proto.text, bars[
        0
    ].proto.text
    assert f"No run of `{name}` yet" not in texts(at)


def test_a_page_follows_a_job_every_two_seconds_and_looks_for_a_first_run_less_often(empty, quick_run, monkeypatch):
    """How often a page looks again (st.fragment's run_every): while a job works on its run, every
    PROGRESS_REFRESH_S; with no run and no job, every FIRST_RUN_LOOK_S (a job started later still appears); with a
    run and no job, never. The kl page has two sections: its toy run's, and its real-model track's (no run here)."""
    import shutil as sh

    import streamlit as st

    from dashboards.display import FIRST_RUN_LOOK_S, PROGRESS_REFRESH_S

    looks: list[float | None] = []
    fragment = st.fragment

    def recorded(body, run_every=None):
        looks.append(run_every)
        return fragment(body, run_every=run_every)

    monkeypatch.setattr(st, "fragment", recorded)
    for folder, expected in [
        (None, [FIRST_RUN_LOOK_S, FIRST_RUN_LOOK_S]),
        ("2026-01-01T00-00-00Z", [PROGRESS_REFRESH_S, FIRST_RUN_LOOK_S]),
        (quick_run("kl").name, [None, FIRST_RUN_LOOK_S]),
    ]:
        if folder == "2026-01-01T00-00-00Z":
            running_job(empty / "runs" / "kl" / folder, "forma run kl --quick", 30, 120)
        elif folder is not None:
            sh.rmtree(empty / "runs" / "kl")
            sh.copytree(quick_run("kl"), empty / "runs" / "kl" / folder)
        looks.clear()
        assert not page("kl").run().exception
        assert looks == expected, folder
    assert FIRST_RUN_LOOK_S > PROGRESS_REFRESH_S


@pytest.mark.parametrize("name", ["home", "explorer", *EXPERIMENT_PAGES])
def test_a_page_whose_job_the_demo_has_queued_says_so(empty, name):
    """While `forma demo` works, a page whose run (or model) it has queued says where the job waits — not "no
    run yet" or "not trained yet"; the calibration run says it waits for pydoc's training, whose model it reads."""
    from lab.jobs import write_queue

    jobs = [
        ("forma build pydoc --quick", ["build", "pydoc", "--quick"]),
        *((f"forma run {e} --quick", ["run", e, "--quick"]) for e in EXPERIMENT_PAGES),
    ]
    write_queue(jobs, {label: "running" if i == 0 else "waiting" for i, (label, _) in enumerate(jobs)})
    at = page(name).run()
    assert not at.exception, at.exception
    said = texts(at)
    assert "No run of" not in said and "not trained yet" not in said
    if name == "home":
        assert all(
            f"Queued by `forma demo` ({i + 1} ahead): `forma run {e} --quick`" in said
            for i, e in enumerate(EXPERIMENT_PAGES)
        )
        assert rendered_table(at.table[0].value).loc["pydoc", "trained"] == "no: started by `forma demo`"
    elif name == "explorer":
        assert "`forma build pydoc --quick` has started (`forma demo`)" in said
    else:
        ahead = 1 + EXPERIMENT_PAGES.index(name)
        assert f"Queued by `forma demo` ({ahead} ahead): `forma run {name} --quick` starts" in said
        assert ("after `forma build pydoc --quick`, whose result it reads" in said) == (name == "calibration")


def test_a_page_over_an_older_run_says_a_new_one_is_on_its_way(quick_run, quick_runs_dir, tmp_path, monkeypatch):
    import shutil as sh

    runs = tmp_path / "runs"
    sh.copytree(quick_run("equations"), runs / "equations" / quick_run("equations").name)
    running_job(runs / "equations" / "9999-01-01T00-00-00Z", "forma run equations --quick", 1, 4)
    monkeypatch.setenv("FORMA_RUNS_DIR", str(runs))
    at = page("equations").run()
    assert not at.exception, at.exception
    assert len(at.get("progress")) == 1
    assert "the page fills in again when this job ends" in " ".join(c.value for c in at.caption)
    assert "checks pass" in " ".join(m.value for m in at.markdown)  # the older run's results still show


def test_the_training_page_shows_a_model_being_trained(empty):
    running_job(empty / "models" / "facts", "forma build facts", 300, 1200)
    at = page("training").run()
    assert not at.exception, at.exception
    assert [b.proto.text for b in at.get("progress")] == [
        "`forma build facts: 0:20 elapsed; train step 300/1200 (25%), ETA 0:36`"
    ]


def two_runs(quick_run, tmp_path, name: str) -> tuple[Path, Path]:
    """The session's quick run of NAME and a copy of it under a later folder name with another seed recorded:
    two runs for the compare page, without running the experiment again."""
    import shutil as sh

    base = tmp_path / "runs" / name
    first = base / quick_run(name).name
    sh.copytree(quick_run(name), first)
    second = base / "9999-01-01T00-00-00Z"
    sh.copytree(first, second)
    provenance = json.loads((second / "provenance.json").read_text())
    (second / "provenance.json").write_text(json.dumps(provenance | {"seed": 7}))
    return second, first  # newest first, as the page lists them


def test_compare_shows_two_runs_headlines_and_figures_side_by_side(quick_run, tmp_path, monkeypatch):
    from dashboards.display import figures
    from lab.headlines import title

    newer, older = two_runs(quick_run, tmp_path, "equations")
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    at = page("compare").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="compare_a").value == newer.name and at.selectbox(key="compare_b").value == older.name
    results = json.loads((older / "results.json").read_text())
    shown = " ".join(t.value for t in at.text)
    supported = [h for h in results["headlines"] if h["supported"]]
    assert supported and all(shown.count(h["sentence"]) == 2 for h in supported)  # once per run
    table = rendered_table(at.table[0].value)
    assert list(table.index) == [title(h["name"]) for h in results["headlines"]]
    assert set(table["same direction"]) <= {"yes", "—"} and "yes" in set(table["same direction"])
    assert "seed 7" in " ".join(c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 2 * len(figures(older)) >= 2
    at.selectbox(key="compare_b").select(newer.name).run()
    assert "the same run" in texts(at)


def test_compare_with_one_run_says_how_to_make_another(quick_run, tmp_path, monkeypatch):
    import shutil as sh

    sh.copytree(quick_run("equations"), tmp_path / "runs" / "equations" / quick_run("equations").name)
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    at = page("compare").run()
    assert not at.exception, at.exception
    assert "forma run equations --quick --seed 1" in texts(at)


def test_a_chart_keeps_one_colour_per_series_across_its_panels_and_whole_layer_ticks():
    """dashboards.charts.readable: a series drawn in three panels (plotly would colour it by trace order, panel by
    panel) has one colour and one legend entry; a layer axis ticks at whole numbers; a long title is wrapped; no
    axis uses SI prefixes; the figure is tall enough for its legend."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from dashboards.charts import TITLE_CHARS, readable

    fig = make_subplots(rows=1, cols=3)
    for col in (1, 2, 3):
        for gamma in (0.5, 1.0, 2.0)[:col]:  # each panel starts its own colour cycle at a different series
            fig.add_trace(go.Scatter(x=[0, 1, 2], y=[gamma, col, 1], name=f"γ = {gamma}"), row=1, col=col)
    fig.update_xaxes(title_text="layer")
    fig.update_layout(
        title="A title long enough to run off a chart drawn in one of two columns, and then some more "
        "words so that it has to wrap twice at the width the page allows for it"
    )
    readable(fig)
    colours: dict[str, set] = {}
    for trace in fig.data:
        colours.setdefault(trace.name, set()).add(trace.line.color)
    assert all(len(c) == 1 for c in colours.values()) and len({c.pop() for c in colours.values()}) == 3
    assert [t.showlegend for t in fig.data if t.name == "γ = 0.5"] == [None, False, False]
    assert all(fig.layout[a].dtick == 1 and fig.layout[a].tickmode == "linear" for a in ("xaxis", "xaxis2", "xaxis3"))
    assert all(len(line) <= TITLE_CHARS for line in fig.layout.title.text.split("<br>"))
    assert "<br>" in fig.layout.title.text and fig.layout.yaxis.exponentformat == "power"
    many = readable(go.Figure([go.Scatter(x=[0, 1], y=[i, i], name=f"position {i}") for i in range(19)]))
    assert many.layout.height >= 19 * 21  # a legend entry is drawn 19 px high, with a gap


def test_an_axis_that_counts_ticks_at_whole_numbers_and_a_legend_clears_a_second_axis():
    """dashboards.charts.readable: bars at whole-number exposures (0 and 1, which plotly would tick at -0.5, 0.5, 1.5)
    tick at whole numbers, a long count at a round whole step; an x axis of fractions, a log axis and an axis with
    ticks of its own keep theirs; with a second axis on the right, the legend sits beyond that axis's ticks; bins
    named in text ("0", "1", "2-5", "6+") are categories, every one drawn."""
    import numpy as np
    import plotly.graph_objects as go
    import plotly.io as pio

    from dashboards.charts import readable, whole_step

    exposures = readable(go.Figure(go.Bar(x=[0, 1], y=[0.3, 0.7]), layout={"xaxis_title": "statements seen"}))
    assert (exposures.layout.xaxis.tickmode, exposures.layout.xaxis.dtick, exposures.layout.xaxis.tick0) == (
        "linear",
        1,
        0,
    )
    assert exposures.layout.yaxis.tickmode is None  # shares on y: plotly's own ticks
    steps = readable(go.Figure(go.Scatter(x=list(range(0, 50_001, 500)), y=[1.0] * 101)))
    assert steps.layout.xaxis.dtick == 10_000  # about 8 ticks, at a round step
    assert [whole_step(x) for x in (0.4, 1, 1.5, 3, 7, 11)] == [1, 1, 2, 5, 10, 20]
    for kept in (
        go.Figure(go.Scatter(x=[0.1, 0.5, 0.9], y=[1, 2, 3])),
        go.Figure(go.Scatter(x=[0, 1], y=[1, 2]), layout={"xaxis": {"tickvals": [0, 1], "ticktext": ["a", "b"]}}),
    ):
        assert readable(kept).layout.xaxis.dtick is None
    log = readable(go.Figure(go.Scatter(x=[10, 100, 1000], y=[1, 2, 3]), layout={"xaxis_type": "log"}))
    assert log.layout.xaxis.tickmode is None and log.layout.xaxis.dtick == "D2"  # a log axis: powers of ten, not steps
    two_axes = go.Figure(
        [go.Scatter(x=[1, 2], y=[0.1, 0.2], name="KL"), go.Scatter(x=[1, 2], y=[2.8, 3.4], name="H", yaxis="y2")],
        layout={"yaxis2": {"overlaying": "y", "side": "right"}},
    )
    assert readable(two_axes).layout.legend.x > 1.05 and two_axes.layout.legend.xanchor == "left"
    assert readable(go.Figure(go.Scatter(x=[1, 2], y=[1, 2], name="one axis"))).layout.legend.x is None
    # a run's figure read back from JSON holds numpy arrays as typed arrays ({"dtype", "bdata"}): read as numbers
    saved = go.Figure(
        [
            go.Scatter(x=np.array([0.31, 0.55, 0.92]), y=np.array([0.2, 0.6, 0.9]), name="partial"),
            go.Scatter(x=[0, 1], y=[0, 1], name="perfect calibration"),
        ]
    )
    assert readable(pio.from_json(saved.to_json())).layout.xaxis.dtick is None  # confidences, not counts
    layers = go.Figure(go.Scatter(x=np.arange(3.0), y=np.ones(3)), layout={"xaxis_title": "layer"})
    assert readable(pio.from_json(layers.to_json())).layout.xaxis.dtick == 1
    bins = readable(go.Figure(go.Bar(x=["0", "1", "2-5", "6+"], y=[0.3, 0.5, 0.9, 1.0])))
    assert bins.layout.xaxis.type == "category"  # plotly's own guess, linear, would leave "2-5" and "6+" off


def test_a_chart_names_the_monitors_signals_as_its_table_does():
    """dashboards.charts.relabel with the monitor's words: a bar's category, a series' name and a word of the title
    read "top probability", never the key max_prob; a key inside another word is left alone."""
    import plotly.graph_objects as go

    from dashboards.charts import relabel
    from lab.names import SIGNALS

    fig = relabel(
        go.Figure(
            [
                go.Bar(x=["max_prob", "p_ik"], y=[0.7, 0.4], name="all false claims"),
                go.Scatter(x=[0, 1], y=[0.2, 0.3], name="semantic_entropy"),
            ],
            layout={
                "title": "Abstention on max_prob: thresholds (not max_probability)",
                "annotations": [{"text": "markov: p_ik", "showarrow": False}],
            },
        ),
        SIGNALS,
    )
    assert list(fig.data[0].x) == ["top probability", "P(IK)"] and fig.data[1].name == "semantic entropy"
    assert fig.layout.title.text == "Abstention on top probability: thresholds (not max_probability)"
    assert fig.layout.annotations[0].text == "markov: P(IK)"  # a panel's title too


def test_a_byte_level_token_reads_as_its_bytes():
    """A byte-level BPE token that is part of a UTF-8 character reads ⟨0xC3⟩, never '\ufffd'; a whole character
    reads as itself; a byte-fallback piece (<0xE2>) as ⟨0xE2⟩."""
    from dashboards.explorer_tabs import token_text
    from lab.data.stdlib_corpus import train_bpe
    from lab.data.tokenizers import readable_text, readable_token

    tokenizer = train_bpe("Return the list.\n\n\nReturn the items.", vocab_size=270)
    model = HookedTransformer(
        ModelConfig(d_vocab=tokenizer.get_vocab_size(), d_model=16, n_layers=1, n_heads=2, n_ctx=16),
        tokenizer=tokenizer,
    )
    ids = tokenizer.encode("café").ids
    assert [token_text(model, i) for i in ids][-2:] == ["⟨0xC3⟩", "⟨0xA9⟩"]
    assert "".join(model.to_string([i]) for i in ids[-2:]) == "\ufffd\ufffd"  # what the page showed before
    assert readable_token("\ufffd", "<0xE2>") == "⟨0xE2⟩" and readable_token("caf", "caf") == "caf"
    # a window of tokens (the graph page's top contexts) cut through "é": its bytes, not '\ufffd'; a whole one as text
    ids = tokenizer.encode("café list").ids
    cut = [i for i in ids if "\ufffd" in tokenizer.decode([i])][:1] + ids[-2:]  # "é"'s first byte, then " list"
    assert "\ufffd" in tokenizer.decode(cut) and "\ufffd" not in readable_text(tokenizer, cut)
    assert readable_text(tokenizer, cut).startswith("⟨0xC3⟩")
    assert readable_text(tokenizer, ids) == tokenizer.decode(ids)


def test_explorer_lens_selector_and_input_attribution_show_the_library_numbers(empty):
    """The Lenses tab's tuned and Jacobian lenses are lab.analysis's, fitted on what the explorer fits them on
    (dashboards.explorer_tabs.lens_corpus); the input-attribution tab's rows are lab.analysis.input_attribution's
    scores and the exhaustive effects, each scaled by its largest |score|."""
    import numpy as np
    import torch

    from dashboards.explorer_tabs import lens_corpus
    from lab.analysis.input_attribution import input_attributions, resample_effects
    from lab.analysis.jacobian_lens import fit_jacobian_lens
    from lab.analysis.tuned_lens import fit_tuned_lens

    model = tiny_pydoc(empty / "models")
    prompt = "Return the number of items in the list ."
    tokens = model.to_tokens(prompt)
    at = page("explorer").run()
    at.text_input(key="prompt").input(prompt).run()
    open_explorer_tab(at, "Lenses")
    corpus = lens_corpus(model, empty / "models" / "pydoc")
    assert corpus.shape == (32, 32) and (corpus[:, 0] == model.tokenizer.token_to_id("<bos>")).all()
    for kind, fit in (("tuned", fit_tuned_lens), ("jacobian", fit_jacobian_lens)):
        at.radio(key="lens_kind").set_value(kind).run()
        assert not at.exception, at.exception
        chart = next(c for c in at.get("plotly_chart") if c.key == "lens")
        shown = _decode_array(json.loads(chart.proto.spec)["data"][0]["z"])
        expected = fit(model, corpus).log_probs(model, tokens)[:, 0].exp().max(-1).values.numpy()
        assert np.allclose(shown, expected, atol=1e-5), kind
    chart = next(
        c for c in open_explorer_tab(at, "Input attribution").get("plotly_chart") if c.key == "input_attribution"
    )
    rows = _decode_array(json.loads(chart.proto.spec)["data"][0]["z"])
    scores = input_attributions(model, tokens)
    expected = [v[0] / v[0].abs().max() for v in scores.values()] + [resample_effects(model, tokens)[0]]
    expected[-1] = expected[-1] / expected[-1].abs().max()
    assert np.allclose(rows, torch.stack(expected).numpy(), atol=1e-5)


def test_every_head_of_a_many_headed_model_is_one_tiled_picture_each_tile_its_pattern():
    """Past OVERVIEW_MOST heads (a real model's 270) the overview tiles every head's pattern into one heatmap:
    tile (layer, head) is that head's query × key pattern, and its hover names the layer, head, query and key."""
    import numpy as np
    import torch

    from dashboards.explorer_tabs import OVERVIEW_MOST, tiled_heads_figure

    cfg = ModelConfig(d_vocab=20, d_model=36, n_layers=9, n_heads=9, n_ctx=8)
    assert cfg.n_layers * cfg.n_heads > OVERVIEW_MOST
    model = HookedTransformer(cfg, seed=0).eval()
    tokens = torch.arange(3, 8)[None]
    _, cache = model.run_with_cache(tokens)
    fig = tiled_heads_figure(cache, cfg.n_layers, cfg.n_heads, chosen=(4, 7))
    assert len(fig.data) == 1
    z, where, pos = np.array(fig.data[0].z, dtype=float), np.array(fig.data[0].customdata), tokens.shape[1]
    for layer, head in [(0, 0), (4, 7), (8, 8)]:
        tile = z[layer * (pos + 1) : layer * (pos + 1) + pos, head * (pos + 1) : head * (pos + 1) + pos]
        assert np.allclose(tile, cache[f"blocks.{layer}.attn.hook_pattern"][0, head].numpy())
        assert tuple(where[layer * (pos + 1) + 2, head * (pos + 1) + 1]) == (layer, head, 2, 1)
    assert np.isnan(z[pos, :]).all()  # the blank row between layers 0 and 1


def made_run(runs: Path, name: str, results: dict, config: dict) -> Path:
    """A run folder of `name` as `forma run` leaves one: results, config and provenance."""
    folder = runs / name / "2026-01-02T03-04-05Z"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "provenance.json").write_text(json.dumps({"seed": 0, "git": {"commit": "0123456789abcdef"}}))
    return folder


@pytest.mark.parametrize("quick", [True, False])
def test_a_page_says_which_run_it_shows(empty, quick):
    """The header names the run, when it was made, its profile, its model and its config (folded away, and one
    click from config.json); a quick run is said to be one, above its numbers; a default-profile run is not."""
    made_run(empty / "runs", "equations", {"checks": [], "headlines": []}, {"seed": 0, "quick": quick})
    at = page("equations").run()
    assert not at.exception, at.exception
    caption = " ".join(c.value for c in at.caption)
    profile = "quick profile" if quick else "default profile"
    assert f"made 2 January 2026, 03:04 UTC · {profile} · its own models, trained by the run" in rendered(caption)
    assert [e.label for e in at.expander] == ["The run's config (config.json)"]
    assert any("quick run" in i.value for i in at.info) == quick


def test_a_claim_the_run_cannot_support_is_no_big_number(empty):
    """The hallucination page draws a card only for a claim its run supports: the vacuous bound's largest right
    side, and the Spearman of a run that cannot support its ordering, are reasons under "Not shown", not cards."""
    acceptance = {
        "spearman_monofact_vs_hallucination": {"1": 1.0},
        "largest_right_side": -0.12,
        "upweighting": [{"condition": "full + 5% ×10", "hallucination_reduction": 0.15}],
    }
    headlines = [
        {"name": "hallucination_rises_with_monofact_rate_at_every_epoch", "supported": False, "why_not": "too few"},
        {"name": "bound_holds", "supported": False, "why_not": "vacuous"},
        {"name": "upweighting full + 5% ×10", "supported": True, "sentence": "It lowers g(H)."},
    ]
    made_run(empty / "runs", "hallucination", {"sweep": [], "acceptance": acceptance, "headlines": headlines}, {})
    at = page("hallucination").run()
    assert not at.exception, at.exception
    assert [rendered(m.label) for m in at.metric] == ["g(H) lowered by, full + 5% ×10"]


def test_a_log_axis_is_labelled_as_often_as_its_length_allows():
    """Over three powers of ten, a full-width panel labels 1, 2 and 5 of each; one of two panels in half the width
    labels the powers alone (plotly's own 2 … 9 print over each other there)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from dashboards.charts import TITLE_CHARS, readable

    wide = go.Figure(go.Scatter(x=[1, 10, 100, 1000], y=[1, 2, 3, 4]))
    wide.update_xaxes(type="log")
    assert readable(wide).layout.xaxis.dtick == "D2"
    narrow = make_subplots(rows=1, cols=2)
    narrow.add_scatter(x=[1, 10, 100, 1000], y=[1, 2, 3, 4], row=1, col=1)
    narrow.update_xaxes(type="log", row=1, col=1)
    assert readable(narrow, TITLE_CHARS // 2).layout.xaxis.dtick == 1
