"""Files from outside Forma — a model folder, a run folder, an activation set, an offload folder — as a careless or
hostile source might leave them: nothing in them runs as code, nothing leads Forma outside their folder or hangs
it, nothing loads silently different from what transformers loads, and every refusal is one line naming the file
(exit 2 at the command line)."""

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lab.cli.parser import main
from tests.builders import (
    REPO,
    gpt2_folder,
    markup_in,
    one_error_line,
    page,
    rendered,
    rewrite_weights,
    texts,
    tiny_config,
)

ENV = os.environ | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# --- 1. a model folder's code never runs -----------------------------------------------------------------------
EVIL = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import GPT2Config, PreTrainedTokenizerFast


class EvilConfig(GPT2Config):
    model_type = "evilnet"


class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def remote_code_folder(directory: Path, marker: Path, in_tokenizer: bool = False) -> Path:
    """A GPT-2 folder whose config.json (or, with in_tokenizer, tokenizer_config.json) names code in the folder
    through `auto_map`; that code writes `marker` when it is imported."""
    gpt2_folder(directory, tokenizer=True)
    (directory / "evil.py").write_text(EVIL.format(marker=str(marker)))
    name = "tokenizer_config.json" if in_tokenizer else "config.json"
    config = json.loads((directory / name).read_text())
    if in_tokenizer:
        config |= {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": [None, "evil.EvilTokenizer"]}}
    else:
        config |= {
            "model_type": "evilnet",
            "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilConfig"},
        }
    (directory / name).write_text(json.dumps(config))
    return directory


AT_A_TERMINAL = """
import json, sys
from lab.cli.parser import main
csv_path, *folders = sys.argv[1:]
for folder in folders:
    codes = [main(["hooks", folder]), main(["trust", folder]),
             main(["run", "calibration", "--quick", "--model", folder, "--mmlu", csv_path, "--out", folder + "-run"])]
    from lab.hf.loading import bridge, load_hf
    from lab.hf.folder import local_tokenizer
    for load in (load_hf, bridge, local_tokenizer):
        try:
            load(folder)
            codes.append("loaded")
        except ValueError as err:
            codes.append(str(err))
    print("CODES " + json.dumps(codes), flush=True)
"""


def at_a_terminal(argv: list[str], timeout: float = 300) -> str:
    """Run argv with a pseudo-terminal as its stdin and stdout, answering "y" to any question, as a person who
    presses y at a prompt would; its output."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: argv, on the terminal
        os.execve(argv[0], argv, ENV)
    output, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
                if output.rstrip().endswith((b"[y/N]", b"[y/N]:")):
                    os.write(fd, b"y\n")
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    return output.decode(errors="replace")


@pytest.mark.processes  # each command at a terminal of its own
def test_a_folder_whose_config_names_its_own_code_is_refused_at_a_terminal_and_the_code_never_runs(tmp_path):
    """`forma hooks`, `forma trust`, `forma run --model`, load_hf, bridge and the tokenizer, each with a terminal
    that answers "y" to any question: one line naming auto_map, exit 2, and the folder's code never imported."""
    marker = tmp_path / "the-code-ran"
    folders = [
        remote_code_folder(tmp_path / f"model-{where}", marker, where == "tokenizer")
        for where in ("config", "tokenizer")
    ]
    csv_path = tmp_path / "mmlu.csv"
    csv_path.write_text("\n".join(f"w{i} w2,w3,w4,w5,w6,A" for i in range(12)) + "\n")
    output = at_a_terminal([sys.executable, "-c", AT_A_TERMINAL, str(csv_path), *map(str, folders)])
    assert not marker.exists(), output
    assert "[y/N]" not in output and "Traceback" not in output, output
    said = [json.loads(part.splitlines()[0]) for part in output.split("CODES ")[1:]]
    assert len(said) == 2, output
    for folder, codes, named in zip(folders, said, ("config.json", "tokenizer_config.json")):
        assert codes[:3] == [2, 2, 2], output
        refused = codes[3:5] if named == "config.json" else codes[3:]  # (a config's own tokenizer is plain)
        for message in refused:
            assert f"{named} asks to run Python code" in message and "auto_map" in message, message
        assert not (Path(str(folder) + "-run")).exists()  # refused before the run folder was made
    lines = [line for line in output.replace("\r", "").splitlines() if ": error:" in line]
    assert len(lines) == 6 and all(
        "auto_map" in line and "never runs a model folder's code" in line for line in lines
    ), lines


def test_the_explorer_refuses_such_a_folder_with_a_message(empty, tmp_path):
    marker = tmp_path / "the-code-ran"
    folder = remote_code_folder(tmp_path / "model", marker)
    at = page("explorer").run()
    at.selectbox(key="model_choice").select("local folder…").run()
    at.text_input(key="model_path").input(str(folder)).run()
    assert not at.exception and "asks to run Python code" in texts(at) and not marker.exists()


def test_every_hugging_face_loader_is_called_with_trust_remote_code_false():
    """Read from the source: every AutoX.from_pretrained and TransformerBridge.boot_transformers call in lab/,
    experiments/ and dashboards/ passes trust_remote_code=False."""
    import ast

    calls = []
    for folder in ("lab", "experiments", "dashboards"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    owner = node.func.value
                    auto = (
                        node.func.attr == "from_pretrained"
                        and isinstance(owner, ast.Name)
                        and owner.id.startswith("Auto")
                    )
                    if auto or node.func.attr == "boot_transformers":
                        safe = any(
                            k.arg == "trust_remote_code"
                            and isinstance(k.value, ast.Constant)
                            and k.value.value is False
                            for k in node.keywords
                        )
                        calls.append((f"{path.relative_to(REPO)}:{node.lineno}", safe))
    assert len(calls) >= 4 and all(safe for _, safe in calls), calls


# --- 2. a run folder leads nowhere outside it -----------------------------------------------------------------
def write_run(root: Path, experiment: str, results: object) -> Path:
    folder = root / "runs" / experiment / "2026-01-01T00-00-00Z"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_a_results_json_linked_from_outside_the_run_folder_is_refused(empty, tmp_path):
    from lab.runs import read_results

    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"headlines": [{"name": "x", "sentence": "THE-SECRET", "supported": True}]}))
    folder = empty / "runs" / "kl" / "2026-01-01T00-00-00Z"
    folder.mkdir(parents=True)
    (folder / "results.json").symlink_to(secret)
    with pytest.raises(ValueError, match="is a link that leads outside"):
        read_results(folder)
    for name in ("kl", "home"):
        at = page(name).run()
        assert not at.exception and "THE-SECRET" not in texts(at)
    assert "leads outside" in texts(page("kl").run())


def test_a_figure_linked_from_outside_or_fetching_from_outside_is_left_out_saying_why(empty, tmp_path):
    import plotly.graph_objects as go

    from lab.runs import read_figures

    folder = write_run(empty, "kl", {"checkpoints": [], "source": {}})
    figure = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    (tmp_path / "outside.json").write_text(figure.to_json())
    (folder / "linked.json").symlink_to(tmp_path / "outside.json")
    fetching = json.loads(figure.to_json())
    fetching["layout"]["images"] = [{"source": "http://127.0.0.1:9/beacon.png", "x": 0, "y": 0}]
    (folder / "fetching.json").write_text(json.dumps(fetching))
    (folder / "fine.json").write_text(figure.to_json())
    found, unreadable = read_figures(folder)
    assert [name for name, _ in found] == ["fine"]
    assert any(u.startswith("linked.json") and "leads outside" in u for u in unreadable), unreadable
    assert any(u.startswith("fetching.json") and "beacon.png" in u for u in unreadable), unreadable


@pytest.mark.parametrize("name", ["results.json", "figure.json", ".progress.json"])
def test_a_fifo_named_json_in_a_run_folder_never_hangs_a_page(empty, name):
    """A FIFO with no writer blocks whoever opens it for reading: on the experiment's page and on Home it is a
    message, within AppTest's timeout (a progress file is read in a run that has not finished)."""
    folder = write_run(empty, "kl", {"checkpoints": [], "source": {}})
    if name in ("results.json", ".progress.json"):
        (folder / "results.json").unlink()
    os.mkfifo(folder / name)
    for page_name in ("kl", "home"):
        at = page(page_name)
        at.default_timeout = 30
        at.run()
        assert not at.exception, at.exception
    if name != ".progress.json":
        assert "FIFO" in texts(page("kl").run())


def test_a_deeply_nested_results_json_cannot_take_a_page_down(empty):
    folder = write_run(empty, "kl", {})
    (folder / "results.json").write_text('{"checkpoints": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for name in ("home", "kl", "compare"):
        at = page(name).run()
        assert not at.exception, (name, at.exception)
    assert "nests deeper than" in texts(page("kl").run())


PAYLOAD = (
    "![beacon](http://127.0.0.1:9/beacon.png) <img src=x onerror=alert(1)> [a link](http://127.0.0.1:9/) "
    "https://127.0.0.1:9/auto **bold** :red[red] $x^2$"
)


@pytest.mark.parametrize("name", ["kl", "hallucination", "calibration", "monitor", "equations"])
def test_a_runs_text_is_shown_as_text_never_as_markup(empty, name):
    """Every headline's sentence, name and reason, with an image, a link, raw HTML, an autolink and Streamlit's
    directives in it: every element of the page shows the words, and none renders any of it."""
    headlines = [
        {
            "name": f"n {PAYLOAD}",
            "sentence": f"s {PAYLOAD}",
            "value": 1.0,
            "interval": None,
            "direction": 1,
            "supported": True,
            "why_not": None,
        },
        {
            "name": f"u {PAYLOAD}",
            "sentence": "hidden",
            "value": None,
            "interval": None,
            "direction": None,
            "supported": False,
            "why_not": f"w {PAYLOAD}",
        },
    ]
    write_run(
        empty,
        name,
        {
            "headlines": headlines,
            "p_ik_summary": [f"p {PAYLOAD}"],
            "checks": [
                {"name": PAYLOAD, "passed": True, "measured": PAYLOAD, "expected": 1, "tolerance": 1, "note": PAYLOAD}
            ],
        },
    )
    at = page(name).run()
    assert not at.exception, at.exception
    sources = [
        str(e.value) for kind in ("markdown", "caption", "subheader", "warning", "info", "error") for e in at.get(kind)
    ]
    sources += [str(cell) for table in at.table for cell in [*table.value.index, *table.value.to_numpy().ravel()]]
    plain = [str(e.value) for e in at.get("text")]  # st.text: shown as written, never read as Markdown
    run_text = [source for source in sources if "beacon" in source]
    assert run_text or any("beacon" in text for text in plain), (sources, plain)
    words = ("![beacon](http://127.0.0.1:9/beacon.png)", "<img src=x", "**bold**", ":red[red]", "$x^2$")
    for source in run_text:  # the page's own bold may stay; nothing of the run's renders
        assert not set(markup_in(source)) - {"strong_open"}, source
        shown = rendered(source)
        assert all(part in shown for part in words), shown
    for text in plain:
        if "beacon" in text:
            assert all(part in text for part in words), text


# --- 3. a tied config with a head of its own ------------------------------------------------------------------
def test_a_tied_config_whose_weights_hold_a_distinct_head_is_refused_naming_it(tmp_path):
    """transformers keeps a stored lm_head that differs from the embedding, whatever tie_word_embeddings says;
    Forma, which would tie them, refuses naming both (both load paths, and from_hf). The bridge is
    transformers' own model, and loads what transformers loads."""
    from transformers import AutoModelForCausalLM

    from lab.hf.convert import from_hf
    from lab.hf.loading import bridge, load_hf

    folder = gpt2_folder(tmp_path / "tied", tie=True, tokenizer=True)
    generator = torch.Generator().manual_seed(0)
    rewrite_weights(folder, lambda state: state.update({"lm_head.weight": torch.randn(100, 64, generator=generator)}))
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert hf.lm_head.weight is not hf.transformer.wte.weight  # what transformers does with such a folder
    for load in (lambda: load_hf(folder), lambda: load_hf(folder, device_map={"": "cpu"}), lambda: from_hf(hf)):
        with pytest.raises(ValueError, match=r"tie_word_embeddings.*lm_head\.weight.*transformer\.wte\.weight") as err:
            load()
        assert "\n" not in str(err.value)
    tokens = torch.randint(0, 100, (1, 8), generator=generator)
    with torch.no_grad():
        torch.testing.assert_close(bridge(folder)(tokens), hf(tokens).logits)
    assert main(["hooks", str(folder)]) == 2


# --- 6. an activation set is checked against its index ----------------------------------------------------------
@pytest.fixture(scope="module")
def activation_set(tmp_path_factory):
    from lab import HookedTransformer
    from lab.analysis.activations.store import save_activations

    model = HookedTransformer(tiny_config(), seed=0).eval()
    data = torch.randint(0, 100, (24, 8), generator=torch.Generator().manual_seed(0))
    folder = tmp_path_factory.mktemp("acts") / "set"
    store = save_activations(
        model, data, ["blocks.0.hook_resid_post"], folder, positions="all", batch_size=4, shard_mb=0.02, progress=False
    )
    assert len(store.index["shards"]) >= 3
    return folder, store.load()


def damaged(activation_set, tmp_path, change) -> Path:
    folder = tmp_path / "set"
    shutil.copytree(activation_set[0], folder)
    index = json.loads((folder / "index.json").read_text())
    change(folder, index)
    (folder / "index.json").write_text(json.dumps(index))
    return folder


def swap_files(folder, index):
    a, b = (folder / index["shards"][0]["file"]), (folder / index["shards"][1]["file"])
    a.rename(folder / "tmp"), b.rename(a), (folder / "tmp").rename(b)


def truncate_first(folder, index):
    path = folder / index["shards"][0]["file"]
    path.write_bytes(path.read_bytes()[:-64])


def flip_a_byte(folder, index):
    path = folder / index["shards"][1]["file"]
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGES = {
    "a truncated shard": (truncate_first, r"shard-00000\.safetensors"),
    "two shards swapped": (swap_files, r"shard-0000[01]\.safetensors"),
    "an inflated n_rows": (lambda f, i: i.update(n_rows=i["n_rows"] + 5), r"index\.json says n_rows"),
    "a row count that is not the shard's": (
        lambda f, i: (i["shards"][1].update(rows=i["shards"][1]["rows"] + 1), i.update(n_rows=i["n_rows"] + 1)),
        r"shard-00001\.safetensors holds \[",
    ),
    "a shard outside the folder": (
        lambda f, i: i["shards"][0].update(file="../outside.safetensors"),
        r"outside\.safetensors leads outside",
    ),
    "an edited byte": (flip_a_byte, r"shard-00001\.safetensors is not the shard the index recorded"),
    "shards listed out of order": (lambda f, i: i.update(shards=i["shards"][::-1]), r"not a harvest's order"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_an_activation_set_that_is_not_what_its_index_says_is_refused_naming_the_file(activation_set, tmp_path, damage):
    from lab.analysis.activations.store import ActivationStore

    change, named = DAMAGES[damage]
    (tmp_path / "outside.safetensors").write_bytes((activation_set[0] / "shard-00000.safetensors").read_bytes())
    folder = damaged(activation_set, tmp_path, change)
    with pytest.raises(ValueError, match=named) as err:
        ActivationStore(folder).load()
    assert "\n" not in str(err.value)


def test_an_intact_activation_set_loads_as_written(activation_set, tmp_path):
    from lab.analysis.activations.store import ActivationStore

    folder = damaged(activation_set, tmp_path, lambda f, i: None)
    loaded = ActivationStore(folder).load()
    for name, tensor in activation_set[1].acts.items():
        assert torch.equal(loaded.acts[name], tensor)
    assert torch.equal(loaded.seq, activation_set[1].seq) and torch.equal(loaded.pos, activation_set[1].pos)


# --- 7. the offload folder is Forma's own ----------------------------------------------------------------------
SPREAD = {"device_map": {"": "cpu", "blocks.1": "disk"}}


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_offload_folder_that_holds_files_is_refused_and_left_as_it_was(activation_set, tmp_path):
    from lab.hf.loading import bridge, load_hf

    model = gpt2_folder(tmp_path / "gpt2", tokenizer=True)
    for taken in (activation_set[0], model):
        before = folder_bytes(taken)
        for load in (load_hf, bridge):
            with pytest.raises(ValueError, match=rf"offload_folder {taken} is not empty") as err:
                load(model, **SPREAD, offload_folder=taken)
            assert "\n" not in str(err.value)
        assert folder_bytes(taken) == before


def test_an_offload_folder_is_made_fresh_and_cleared_when_loading_fails(tmp_path, monkeypatch):
    import accelerate

    from lab.hf.loading import load_hf

    model = gpt2_folder(tmp_path / "gpt2", tokenizer=True)
    spread = load_hf(model, **SPREAD, offload_folder=tmp_path / "new")
    assert any((tmp_path / "new").iterdir()) and spread(torch.tensor([[1, 2, 3]])).shape == (1, 3, 100)

    def fail(*args, **kwargs):
        raise RuntimeError("dispatch failed")

    monkeypatch.setattr(accelerate, "dispatch_model", fail)  # after the offloaded weights are written
    (tmp_path / "empty").mkdir()
    for offload in (tmp_path / "empty", tmp_path / "absent"):
        with pytest.raises(RuntimeError, match="dispatch failed"):
            load_hf(model, **SPREAD, offload_folder=offload)
    assert not any((tmp_path / "empty").iterdir()) and not (tmp_path / "absent").exists()


# --- 11. one line, not a traceback -------------------------------------------------------------------------------
def test_a_config_naming_a_dtype_torch_lacks_is_one_line(tmp_path, capsys):
    from lab.hf.loading import bridge, load_hf

    folder = gpt2_folder(tmp_path / "gpt2", tokenizer=True)
    config = json.loads((folder / "config.json").read_text())
    for key in ("dtype", "torch_dtype"):
        (folder / "config.json").write_text(json.dumps(config | {key: "bogus"}))
        for command in ("hooks", "trust"):
            assert main([command, str(folder)]) == 2
            assert f"{key} 'bogus' is not a torch dtype" in one_error_line(capsys.readouterr().err, command)
        for load in (load_hf, bridge):
            with pytest.raises(ValueError, match="'bogus' is not a torch dtype"):
                load(folder, dtype="auto") if load is load_hf else load(folder)


def test_a_device_the_machine_lacks_is_one_line(tmp_path):
    """cuda:N for N the number of CUDA devices here (cuda:0 without a GPU) names the device and what there is."""
    from lab.hf.loading import bridge, load_hf

    folder = gpt2_folder(tmp_path / "gpt2", tokenizer=True)
    absent = f"cuda:{torch.cuda.device_count()}"
    for load in (load_hf, bridge):
        for where in ({"device": absent}, {"device_map": {"": absent}}, {"device_map": {"": "cpu", "lm_head": absent}}):
            with pytest.raises(ValueError, match=rf"device '{absent}' is not on this machine, which has") as err:
                load(folder, **where)
            assert "\n" not in str(err.value)


READ_ONLY = """
import json, sys
from lab.cli.parser import main
from lab.hf.loading import load_hf
model, read_only, out = sys.argv[1:]
said = {"trust": main(["trust", model]), "trust --out": main(["trust", model, "--out", out])}
try:
    load_hf(model, device_map={"": "cpu", "blocks.1": "disk"}, offload_folder=read_only)
    said["offload"] = "loaded"
except ValueError as err:
    said["offload"] = str(err)
print("SAID " + json.dumps(said), flush=True)
"""


def read_only_argv(folders: list[Path], argv: list[str]) -> list[str]:
    """argv, run where `folders` cannot be written: bind-mounted read-only in a mount namespace of its own when we
    are root (to whom permission bits mean nothing), else with their write permissions taken away."""
    if os.geteuid() != 0:
        for folder in folders:
            for path in [folder, *folder.rglob("*")]:
                path.chmod(path.stat().st_mode & ~0o222)
        return argv
    mounts = " && ".join(f'mount --bind "{f}" "{f}" && mount -o remount,ro,bind "{f}" "{f}"' for f in folders)
    return ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$@"', "sh", *argv]


@pytest.mark.processes  # `forma trust` in a mount namespace of its own
def test_trust_on_a_read_only_folder_and_a_read_only_offload_folder_are_one_line(tmp_path):
    model = gpt2_folder(tmp_path / "gpt2", tokenizer=True)
    offload = tmp_path / "offload"
    offload.mkdir()
    argv = read_only_argv(
        [model, offload], [sys.executable, "-c", READ_ONLY, str(model), str(offload), str(tmp_path / "report.json")]
    )
    try:
        done = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=600)
    finally:
        for path in [model, offload, *model.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert "SAID " in done.stdout, done.stderr[-3000:]
    said = json.loads(done.stdout.split("SAID ", 1)[1].splitlines()[0])
    assert said["trust"] == 2 and said["trust --out"] == 0, done.stderr[-3000:]
    line = one_error_line(done.stderr, "trust")
    assert f"cannot write into the folder of the trust report {model}" in line and "--out FILE" in line
    assert not (model / "trust.json").exists() and json.loads((tmp_path / "report.json").read_text())["passed"]
    assert said["offload"].startswith("cannot ") and f"offload_folder {offload}" in said["offload"], said
    assert "\n" not in said["offload"]
