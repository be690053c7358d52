"""The dashboard without a browser (Streamlit's AppTest): every page renders, with and without runs and models."""

import json
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import lab.zoo as zoo
from lab import HookedTransformer, ModelConfig
from lab.tokenize import word_level

PAGES = Path(__file__).resolve().parents[1] / "dashboards"
EXPERIMENT_PAGES = ["kl", "hallucination", "calibration", "equations"]


@pytest.fixture
def empty(tmp_path, monkeypatch):
    """No runs and no trained model: a fresh clone."""
    (tmp_path / "runs").mkdir()
    zoo_copy = tmp_path / "models"
    for name in zoo.zoo_names():
        (zoo_copy / name).mkdir(parents=True)
        shutil.copy(zoo.DEFAULT_ZOO_DIR / name / "model.toml", zoo_copy / name / "model.toml")
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo_copy))
    return tmp_path


def heatmap_rows(chart) -> int:
    z = json.loads(chart.proto.spec)["data"][0]["z"]
    return int(z["shape"].split(",")[0]) if isinstance(z, dict) else len(z)  # plotly may encode arrays


def page(name: str) -> AppTest:
    return AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=60)


def texts(at: AppTest) -> str:
    return " ".join(str(e.value) for e in [*at.info, *at.warning, *at.error, *at.markdown])


@pytest.mark.parametrize("name", ["home", "explorer", "training", *EXPERIMENT_PAGES])
def test_every_page_renders_on_a_fresh_clone_and_says_what_to_run(empty, name):
    at = page(name).run()
    assert not at.exception, at.exception
    said = texts(at)
    expected = {"home": "forma run kl", "explorer": "forma train pydoc", "training": "forma train pydoc"}
    assert expected.get(name, f"forma run {name}") in said


@pytest.mark.parametrize("name", EXPERIMENT_PAGES)
def test_a_corrupted_results_json_is_a_message_not_a_traceback(empty, name):
    folder = empty / "runs" / name / "2026-01-01T00-00-00Z"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text("{not json")
    at = page(name).run()
    assert not at.exception
    assert "unreadable results.json" in texts(at)


def _tiny_pydoc(zoo_copy: Path) -> HookedTransformer:
    words = ["Return", "the", "number", "of", "items", "in", "list", "file", "."]
    tokenizer = word_level(words)
    cfg = ModelConfig(d_vocab=tokenizer.get_vocab_size(), d_model=32, n_layers=2, n_heads=4, n_ctx=32)
    model = HookedTransformer(cfg, seed=0, tokenizer=tokenizer)
    model.save(zoo_copy / "pydoc")
    return model


def test_explorer_shows_every_view_of_a_model(empty):
    _tiny_pydoc(empty / "models")
    at = page("explorer").run()
    assert not at.exception, at.exception
    charts = at.get("plotly_chart")
    # attention, residual norms, logit lens, attribution; patching says the default corruption ("list." is
    # one unknown word to this vocabulary, and so is "file.") changes nothing
    assert len(charts) == 4 and "no logit difference" in texts(at)
    attention = json.loads(charts[0].proto.spec)
    assert attention["data"][0]["type"] == "heatmap"
    assert heatmap_rows(charts[0]) == 8  # "Return the number of items in the list." → 8 words
    at.slider(key="attn_layer").set_value(1).run()
    assert not at.exception
    at.text_input(key="prompt").input("Return the items").run()
    assert not at.exception
    assert heatmap_rows(at.get("plotly_chart")[0]) == 3


def test_explorer_reports_a_bad_prompt_and_a_missing_folder(empty):
    _tiny_pydoc(empty / "models")
    at = page("explorer").run()
    at.text_input(key="prompt").input("").run()
    assert not at.exception and "empty" in texts(at)
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
    records = [{"step": s, "train_loss_nats": 3.0 - s / 10, **({"val_loss_nats": 3.1 - s / 10} if s % 5 == 0 else {})}
               for s in range(1, 11)]
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    at = page("training").run()
    assert not at.exception
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [trace["name"] for trace in spec["data"]] == ["train", "held-out"]


def _decode_array(z):
    import base64

    import numpy as np

    if isinstance(z, dict):  # plotly's binary encoding
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(
            [int(n) for n in z["shape"].split(",")])
    return np.asarray(z)


def test_explorer_views_show_the_library_numbers(empty):
    """One value of each view — attention, logit lens, patching — equals what lab computes."""
    import numpy as np
    import torch

    from lab.analysis.lens import logit_lens
    from lab.analysis.patching import patch_positions

    model = _tiny_pydoc(empty / "models")
    prompt = "Return the number of items in the list ."
    tokens = model.to_tokens(prompt)
    with torch.inference_mode():
        answer = int(model(tokens)[0, -1].argmax())
        # a one-word corruption that changes the (random) model's prediction
        corrupted_text = next(c for i in range(9) for w in ("file", "the", "items", "Return")
                              for c in [" ".join(w if j == i else x for j, x in enumerate(prompt.split()))]
                              if int(model(model.to_tokens(c))[0, -1].argmax()) != answer)
    at = page("explorer").run()
    at.text_input(key="prompt").input(prompt).run()
    at.text_input(key="corrupted").input(corrupted_text).run()
    assert not at.exception, at.exception
    specs = {json.loads(c.proto.spec)["layout"]["title"]["text"].split(",")[0].split(":")[0]: json.loads(c.proto.spec)
             for c in at.get("plotly_chart")}
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
    from dashboards.common import figures

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


@pytest.mark.parametrize("name", ["kl", "hallucination", "equations"])
def test_experiment_pages_open_with_their_headlines(quick_run, quick_runs_dir, monkeypatch, name):
    """Supported headlines first, in the run's own sentences; then each unsupported one with why not."""
    results = json.loads((quick_run(name) / "results.json").read_text())
    monkeypatch.setenv("FORMA_RUNS_DIR", str(quick_runs_dir))
    at = page(name).run()
    assert not at.exception, at.exception
    shown = " ".join(m.value for m in at.markdown)
    for headline in results["headlines"]:
        assert (headline["sentence"] if headline["supported"] else headline["why_not"]) in shown, headline["name"]
    unsupported = [h for h in results["headlines"] if not h["supported"]]
    if unsupported:
        assert "Not shown, because this run cannot support it" in shown
        assert all(h["sentence"] not in shown for h in unsupported)
