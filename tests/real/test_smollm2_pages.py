"""The dashboard's explorer on the real model, as a newcomer meets it: it opens on smollm2 with a real prompt, every
one of its 270 heads in one picture, and every tab draws."""

import pytest

from tests.builders import explorer_charts, page, smollm2_folder, texts

pytestmark = pytest.mark.real


def test_the_explorer_opens_on_the_real_model_with_a_real_prompt_and_every_head(monkeypatch, tmp_path):
    folder = smollm2_folder()
    monkeypatch.setenv("FORMA_ZOO_DIR", str(folder.parent))
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    at = page("explorer")
    at.default_timeout = 300
    at.run()
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="model_choice").value == "smollm2"
    assert at.text_input(key="prompt").value == "The capital of France is Paris. The capital of Italy is"
    assert [c.key for c in at.get("plotly_chart")] == ["attention", "attention_heads"]  # the open tab's alone
    charts = explorer_charts(at)
    assert {"attention", "attention_heads", "norms", "lens", "dla", "patching", "heads"} <= set(charts), sorted(charts)
    assert "All 270 heads" in charts["attention_heads"].proto.spec
    assert "Traceback" not in texts(at)
