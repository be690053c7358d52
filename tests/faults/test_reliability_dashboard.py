"""The dashboard under damaged runs and model switches: a message that names the file and says what to run,
never a traceback; no widget text carried from one model to another. The graphs page's writes (a prompt's graph,
a supernode) killed before each of their file operations: the last whole graph.json stays, and the next write
works."""

import copy
import json
import shutil
from pathlib import Path

import pytest

import experiments
from lab import HookedTransformer, ModelConfig
from tests.builders import page, rendered, texts, tiny_pydoc

STAMP = "2026-01-01T00-00-00Z"


def warnings(at) -> str:
    """The page's warnings and errors as a reader sees them (their Markdown rendered: a page escapes the paths and
    errors it quotes)."""
    return " ".join(rendered(e.value) for e in [*at.warning, *at.error])


def write_run(root: Path, experiment: str, results: object) -> Path:
    folder = root / "runs" / experiment / STAMP
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_a_truncated_parquet_on_the_calibration_page_is_a_message_naming_it(empty):
    import numpy as np
    import pandas as pd

    folder = write_run(empty, "calibration", {"mc": {"n": 200, "accuracy": 0.25}})
    items = pd.DataFrame({f"option_logit_{k}": np.linspace(0, 1, 200) for k in range(4)} | {"answer_index": [0] * 200})
    items.to_parquet(folder / "items.parquet")
    data = (folder / "items.parquet").read_bytes()
    (folder / "items.parquet").write_bytes(data[: len(data) // 2])
    at = page("calibration").run()
    assert not at.exception, at.exception
    said = warnings(at)
    assert str(folder / "items.parquet") in said and "forma run calibration" in said
    assert "Cloze multiple choice" in [s.value for s in at.subheader]  # the rest of the page is still there


BAD_RESULTS = {
    "kl": [
        {"checkpoints": "three", "source": [1, 2]},
        {"checkpoints": ["not a dict"], "source": {}},
        {
            "checkpoints": [{"kl_nats": "x", "sampled_kl_se": 1.0, "sampled_kl_nats": "y"}],
            "source": {},
            "scaling": {"E_nats": "high", "E_ci95": 3},
        },
        {"unexpected": 1},
    ],
    "equations": [
        {"checks": "all"},
        {"checks": [1, 2]},
        {"checks": [{"passed": True, "name": "x"}, {"measured": 1}]},
        {"extra": []},
    ],
    "hallucination": [
        {"sweep": 3, "acceptance": []},
        {"sweep": [{"checkpoints": [1]}]},
        {"sweep": [], "acceptance": {"spearman_monofact_vs_hallucination": "b"}},
        {"other": 1},
    ],
    "calibration": [
        {"mc": "n/a", "temperature": [1]},
        {"mc": {"n": "many", "ece_ci95": 4}, "temperature": {"T": "hot"}},
        {"mc": None, "p_ik": "x"},
        {"p_ik": [{"a": 1}]},
    ],
    "monitor": [
        {"signals": "all", "abstention": {}},
        {"signals": [1, 2]},
        {"signals": [{"signal": "max_prob", "auroc": "high"}], "abstention": [{"alpha": "a"}]},
        {"other": 1},
    ],
    "scoreboard": [
        {"table": "all", "headlines": []},
        {"table": [1, 2], "worlds": []},
        {"table": [{"method": "x", "value": "high"}], "headlines": "none", "worlds": {}},
        {"other": 1},
    ],
}


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("name", experiments.experiment_names())
def test_a_results_json_with_unexpected_or_missing_fields_is_a_message_naming_it(empty, name, case):
    folder = write_run(empty, name, BAD_RESULTS[name][case])
    at = page(name).run()
    assert not at.exception, (BAD_RESULTS[name][case], at.exception)
    said = warnings(at)
    assert str(folder / "results.json") in said and f"forma run {name}" in said, said


def mutations(results: dict) -> list[tuple[str, dict]]:
    """results.json as other versions or hand edits might leave it: every top-level field missing, or of another
    type, or every value one level down of another type."""

    def deeper(value, new):
        if isinstance(value, dict):
            return {k: new for k in value}
        if isinstance(value, list):
            return [new for _ in value]
        return new

    cases = [("empty", {})]
    for label, new in (
        ("a string", "unexpected"),
        ("a number", 7),
        ("a list", ["unexpected"]),
        ("a dict", {"unexpected": "value"}),
    ):
        cases.append((f"every field {label}", {k: new for k in results}))
        cases.append((f"every field's contents {label}", {k: deeper(v, new) for k, v in results.items()}))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("name", experiments.experiment_names())
def test_every_experiment_page_survives_any_reshaped_results_json(quick_run, tmp_path, monkeypatch, name):
    """The session's real quick run, reshaped: each page shows a message naming results.json, never a traceback;
    the real run itself gives no such message."""
    source = quick_run(name)
    runs = tmp_path / "runs"
    folder = runs / name / STAMP
    shutil.copytree(source, folder)
    monkeypatch.setenv("FORMA_RUNS_DIR", str(runs))
    results = json.loads((folder / "results.json").read_text())
    at = page(name).run()
    assert not at.exception and str(folder / "results.json") not in warnings(at), warnings(at)
    for label, changed in mutations(copy.deepcopy(results)):
        (folder / "results.json").write_text(json.dumps(changed))
        at = page(name).run()
        assert not at.exception, (label, at.exception)
        if "contents" not in label:  # a field missing or of another type is named; deeper, some shapes still show
            assert str(folder / "results.json") in warnings(at), (label, warnings(at))


def _tiny_markov(zoo_copy: Path) -> HookedTransformer:
    """A model without a tokenizer, like the zoo's markov: its prompts are space-separated token ids."""
    model = HookedTransformer(ModelConfig(d_vocab=16, d_model=32, n_layers=1, n_heads=4, n_ctx=32), seed=0)
    model.save(zoo_copy / "markov")
    return model


DEFAULT_PROMPTS = {"pydoc": "Return the number of items in the list.", "markov": "1 2 3 4 5 6 7 8"}  # explorer's


def test_switching_models_in_the_explorer_starts_from_the_new_models_prompt(empty):
    tiny_pydoc(empty / "models")
    _tiny_markov(empty / "models")
    at = page("explorer").run()
    at.text_input(key="prompt").input("Return the").run()
    at.slider(key="attn_layer").set_value(1).run()  # pydoc has 2 layers, markov 1
    assert not at.exception
    at.selectbox(key="model_choice").select("markov").run()
    assert not at.exception, at.exception
    assert "invalid literal" not in texts(at) and not at.error, texts(at)
    assert at.text_input(key="prompt").value == DEFAULT_PROMPTS["markov"]
    at.text_input(key="prompt").input("3 1 4").run()
    at.selectbox(key="model_choice").select("pydoc").run()
    assert not at.exception and not at.error
    assert at.text_input(key="prompt").value == DEFAULT_PROMPTS["pydoc"]


# --- the graphs page's writes, killed ----------------------------------------------------------------------------
# A child that opens the graphs page in AppTest and, with "save", groups two nodes into a supernode named NAME and
# saves it; SIGKILLed just before the N-th watched file operation (tests/fault_zygote.py's) under the graphs folder,
# or, with N 0, tracing them to TRACE.
PAGE_CHILD = """
import json, os, signal, sys
from tests.fault_zygote import watched_path
graphs, n, trace, action, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
seen = 0
def hook(event, args):
    global seen
    path = watched_path(event, args)
    if path is None or not os.path.abspath(path).startswith(graphs):
        return
    seen += 1
    with open(trace, "a") as log:  # (outside the graphs folder: not itself watched)
        log.write(json.dumps({"n": seen, "event": event, "path": path}) + "\\n")
    if seen == n:
        os.kill(os.getpid(), signal.SIGKILL)
from streamlit.testing.v1 import AppTest
from dashboards.pages import page_file
at = AppTest.from_file(str(page_file("graphs")), default_timeout=300)
sys.addaudithook(hook)
at.run()
assert not at.exception, at.exception
if action == "save":
    ids = [i for i in at.multiselect(key="supernode_nodes").options if not i.startswith(("E_", "err_"))]
    at.multiselect(key="supernode_nodes").select(ids[0]).select(ids[1])
    at.text_input(key="supernode_name").input(name)
    at.button(key="supernode_save").click().run()
    assert not at.exception and at.success, (at.exception, at.warning)
"""


@pytest.mark.slow
def test_the_graphs_pages_writes_killed_at_every_file_operation_leave_the_last_whole_file_and_the_next_write_works(
    tmp_path,
):
    """The graphs page writes a prompt's graph the first time it draws it (graph.safetensors, then graph.json) and
    graph.json again when a person saves a supernode. Each killed (SIGKILL) just before each of its file
    operations under the graphs folder, in turn: the graph.json in place is whole — the previous one, or the new
    one — its supernodes all there; and the page run again draws the graph, saves the supernode, and leaves no
    temporary file behind. (Traced first, unkilled: the operations to kill at.)"""
    import os
    import subprocess
    import sys

    from lab.analysis.graphs.graph import GRAPHS_DIR, META_FILE, Graph
    from tests.builders import REPO, zoo_with_transcoders

    zoo_copy = zoo_with_transcoders(tmp_path)
    graphs = zoo_copy / "pydoc" / "transcoders" / "topk" / GRAPHS_DIR
    env = os.environ | {"FORMA_ZOO_DIR": str(zoo_copy), "FORMA_RUNS_DIR": str(tmp_path / "runs")}
    env |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}

    def child(n: int, action: str, name: str = "first") -> int:
        trace = tmp_path / "trace.jsonl"
        trace.unlink(missing_ok=True)
        argv = [sys.executable, "-c", PAGE_CHILD, str(graphs), str(n), str(trace), action, name]
        done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode in (0, -9), done.stderr[-3000:]
        return len(trace.read_text().splitlines()) if trace.exists() else 0

    def supernodes() -> list[str]:
        (folder,) = list(graphs.iterdir())
        return [s["name"] for s in Graph.load(folder).supernodes]

    def clean() -> None:
        (folder,) = list(graphs.iterdir())
        assert sorted(p.name for p in folder.iterdir()) == ["graph.json", "graph.safetensors"]

    drawing = child(0, "draw")  # the first draw's operations, traced
    assert drawing >= 2
    print(f"graphs page: killed at each of the first draw's {drawing} file operations", end="")
    for n in range(1, drawing + 1):
        shutil.rmtree(graphs)
        assert child(n, "draw") == n  # killed at operation n
        if graphs.exists() and any((folder / META_FILE).exists() for folder in graphs.iterdir()):
            assert supernodes() == []  # a graph.json in place is whole
        assert child(0, "save") > 0  # the page again: draws (anew or from what was whole) and saves
        assert supernodes() == ["first"], n
        clean()
    saving = child(0, "save", "second")  # a supernode's save over a graph that has one, traced
    assert saving >= 2
    print(f" and each of a supernode's save's {saving}")
    for n in range(1, saving + 1):
        before = supernodes()
        assert child(n, "save", f"killed-{n}") == n
        assert supernodes() in (before, [*before, f"killed-{n}"]), n  # the old graph.json, or the new, whole
        assert child(0, "save", f"then-{n}") > 0
        assert supernodes()[-1] == f"then-{n}", n
        clean()
