"""Transcoder and SAE training on 2 gloo ranks (torch.multiprocessing, one thread a rank) against one process:
data-parallel equal within float round-off, module-parallel equal bit for bit, layer by layer; a checkpoint of one
process resumed on 2 ranks; and `forma transcoders` under torchrun with rank 0 killed by SIGKILL as it writes a
checkpoint, then run again: the folder is the one-process run's, byte for byte."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from lab.analysis.activations.store import save_activations
from lab.analysis.transcoders.model import TranscoderConfig
from lab.analysis.transcoders.train import PARALLEL, TranscoderTraining, train_transcoders
from lab.cli.parser import TRANSCODER_PARALLEL, main
from lab.outside_files import InputError
from tests.builders import REPO, tiny_model

BASE = TranscoderConfig(d_model=32, n_layers=3, d_features=96)
SAE = BASE.replace(input_hook="blocks.{layer}.hook_resid_post", output_hook="blocks.{layer}.hook_resid_post")
TRAINING = TranscoderTraining(steps=24, batch_size=48, lr=3e-3, checkpoint_interval=10)
# name: (config, sparsity λ, how the 2 ranks share the training)
JOBS = {
    "ddp-relu": (BASE, 1e-3, "data"),
    "ddp-topk": (BASE.replace(activation="topk", k=12), 0.0, "data"),
    "ddp-clt": (BASE.replace(activation="jumprelu", cross_layer=True), 1e-4, "data"),
    "modules-relu": (BASE, 1e-3, "modules"),
    "modules-topk": (BASE.replace(activation="topk", k=12), 0.0, "modules"),
    "modules-jumprelu": (BASE.replace(activation="jumprelu"), 1e-4, "modules"),
    "modules-sae": (SAE.replace(activation="topk", k=8), 0.0, "modules"),
    "resumed-data": (BASE, 1e-3, "data"),
    "resumed-modules": (BASE.replace(activation="jumprelu"), 1e-4, "modules"),
}
RESUMED = [name for name in JOBS if name.startswith("resumed-")]

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, world: int, port: int, store: str, out: str) -> None:
    """One rank: join the group, train every job (the same calls as one process), write what this rank returns."""
    from safetensors.torch import save_file

    from lab.distributed import close_distributed, init_distributed

    os.environ |= {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    os.environ |= {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}  # one machine, as torchrun says
    torch.set_num_threads(1)
    init_distributed()
    try:
        try:  # a store whose last shard (in the last rank's share of the checksums) was changed
            train_transcoders(Path(store).parent / "changed", BASE, TRAINING, Path(out) / "changed")
        except InputError as err:
            (Path(out) / f"changed-rank{rank}.txt").write_text(str(err))
        for name, (cfg, sparsity, parallel) in JOBS.items():
            model = train_transcoders(
                store,
                cfg,
                TRAINING.replace(sparsity=sparsity),
                Path(out) / name,
                resume=name in RESUMED,
                log_every=5,
                parallel=parallel,
            )
            save_file(model.state_tensors(), str(Path(out) / name / f"returned-rank{rank}.safetensors"))
    finally:
        close_distributed()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread_per_module):
    """The harvest, each job trained in one process, and the same jobs on 2 ranks (one spawn for them all); the
    'resumed-' jobs begin in one process (stopped at step 12, a checkpoint at 10) and end on 2 ranks."""
    root = tmp_path_factory.mktemp("transcoders-distributed")
    tokens = torch.randint(0, 50, (40, 16), generator=torch.Generator().manual_seed(0))
    hooks = list(dict.fromkeys(BASE.hooks() + SAE.hooks()))
    store = save_activations(
        tiny_model(mlp="relu"),
        tokens,
        hooks,
        root / "harvest",
        positions="all",
        batch_size=8,
        shard_mb=0.1,
        progress=False,
    )
    assert len(store.index["shards"]) > 2 and len(store) % TRAINING.batch_size
    shutil.copytree(root / "harvest", root / "changed")
    last = root / "changed" / store.index["shards"][-1]["file"]
    last.write_bytes(last.read_bytes()[:-1] + b"\x01")
    one = {}
    for name, (cfg, sparsity, _) in JOBS.items():
        one[name] = train_transcoders(store, cfg, TRAINING.replace(sparsity=sparsity), root / "one" / name, log_every=5)
    for name in RESUMED:
        cfg, sparsity, _ = JOBS[name]
        train_transcoders(
            store, cfg, TRAINING.replace(sparsity=sparsity), root / "two" / name, stop_after=12, log_every=5
        )
    mp.start_processes(
        rank_main, args=(2, free_port(), str(root / "harvest"), str(root / "two")), nprocs=2, start_method="spawn"
    )
    return root, one


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "transcoders.safetensors"))


@pytest.mark.parametrize("name", [name for name in JOBS if name.startswith(("ddp-", "resumed-data"))])
def test_data_parallel_on_two_ranks_is_one_process_within_round_off(runs, name):
    """Every rank trains every layer on half of each batch; DDP averages the gradients. After 24 Adam steps each
    weight is one process's up to float round-off (the slices' sums are added in another order), the logged loss
    too, and both ranks return the same set. 'resumed-data': one process stopped at step 12 (its checkpoint of step
    10), finished on 2 ranks."""
    root, one = runs
    two = weights(root / "two" / name)
    for key, value in one[name].state_tensors().items():
        assert torch.allclose(two[key], value, rtol=1e-4, atol=1e-5), (key, (two[key] - value).abs().max())
    history = [json.loads((root / run / name / "training.json").read_text())["history"] for run in ("one", "two")]
    assert [r["step"] for r in history[0]] == [r["step"] for r in history[1]] == [0, 5, 10, 15, 20, 23]
    for a, b in zip(*history):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4) and a["l0"] == pytest.approx(b["l0"], rel=1e-3)
    returned = [load_file(str(root / "two" / name / f"returned-rank{r}.safetensors")) for r in (0, 1)]
    assert all(torch.equal(returned[0][k], returned[1][k]) and torch.equal(returned[0][k], two[k]) for k in two)
    assert not (root / "two" / name / "checkpoint").exists()


@pytest.mark.parametrize("name", [name for name in JOBS if name.startswith(("modules-", "resumed-modules"))])
def test_module_parallel_on_two_ranks_is_one_process_bit_for_bit(runs, name):
    """Rank 0 trains layer 0, rank 1 layers 1 and 2, each on whole batches, reading only its layers' hooks; each
    layer's weights are one process's bits, and so are the files (the weights, gathered to rank 0, and the loss
    curve). 'resumed-modules': one process stopped at step 12 (its checkpoint of step 10), finished on 2 ranks."""
    root, one = runs
    for file in ("transcoders.safetensors", "config.json", "training.json"):
        assert (root / "two" / name / file).read_bytes() == (root / "one" / name / file).read_bytes(), file
    two = weights(root / "two" / name)
    for key, value in one[name].state_tensors().items():
        assert torch.equal(two[key].view(torch.int32), value.view(torch.int32)), key
    for r in (0, 1):  # every rank returns the whole set, each layer from the rank that trained it
        returned = load_file(str(root / "two" / name / f"returned-rank{r}.safetensors"))
        assert all(torch.equal(returned[k], two[k]) for k in two)


def test_a_changed_shard_found_by_one_rank_is_the_same_line_on_every_rank(runs):
    """On 2 ranks the shards' checksums are shared out (each rank hashes half the shards, not every shard it
    reads): the last shard, changed by a byte, is in rank 1's share, and rank 0, which never hashed it, stops with
    the same line, naming the file, before any step."""
    root, _ = runs
    lines = [(root / "two" / f"changed-rank{r}.txt").read_text() for r in (0, 1)]
    assert lines[0] == lines[1]
    assert "changed/shard-" in lines[0] and "SHA-256 differs" in lines[0]
    assert not (root / "two" / "changed" / "checkpoint").exists()


def test_a_wrong_sharing_is_one_clear_line(runs, tmp_path):
    root, _ = runs
    with pytest.raises(ValueError, match="parallel must be one of data, modules, got 'layers'"):
        train_transcoders(root / "harvest", BASE, TRAINING, tmp_path, parallel="layers")
    with pytest.raises(ValueError, match="a cross-layer transcoder cannot be trained module-parallel"):
        train_transcoders(root / "harvest", BASE.replace(cross_layer=True), TRAINING, tmp_path, parallel="modules")
    assert PARALLEL == TRANSCODER_PARALLEL


# ---------------------------------------------------------------------------------------------------------------
# `forma transcoders` under torchrun, a rank killed, the command run again.

# Imported by every Python the launch starts: in rank 0, SIGKILL just before the checkpoint's second state.json is
# opened for writing (tests/fault_zygote.py's fault): checkpoint 2 half-written, checkpoint 1 complete.
SITECUSTOMIZE = """\
import os
if os.environ.get("RANK") == "0":
    from tests.fault_zygote import plant
    plant({"kill": 2, "match": "state.json", "event": "open"})
"""
COMMAND = [
    "transcoders",
    "markov",
    "--kind",
    "jumprelu",
    "--steps",
    "16",
    "--windows",
    "32",
    "--features",
    "48",
    "--checkpoint-interval",
    "5",
    "--no-progress",
]


def torchrun(args: list[str], folder: Path, killed: bool) -> subprocess.CompletedProcess:
    site = folder / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE if killed else "")
    env = os.environ | {
        "PYTHONPATH": f"{site}{os.pathsep}{REPO}",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    command = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "lab.cli",
        *args,
    ]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_forma_transcoders_on_two_ranks_killed_and_rerun_is_one_process(markov_zoo, tmp_path, capsys):
    """One process first (the reference), then 2 module-parallel ranks with rank 0 killed (SIGKILL) as it writes
    the checkpoint of step 10 (each layer gathered from its rank); torchrun ends rank 1. The same command again
    resumes from step 5's checkpoint, and every file (weights, loss curve, measures, top contexts) is the one
    process's bytes. (A data-parallel run resumes from a checkpoint as 'resumed-data' above does.)"""
    assert main(COMMAND) == 0
    reference = tmp_path / "reference"
    shutil.move(markov_zoo / "transcoders" / "jumprelu", reference)
    capsys.readouterr()

    killed = torchrun([*COMMAND, "--parallel", "modules"], tmp_path, killed=True)
    assert killed.returncode != 0 and "Signal 9 (SIGKILL) received" in killed.stderr, killed.stderr[-3000:]
    out = markov_zoo / "transcoders" / "jumprelu"
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 5 and not (out / "transcoders.safetensors").exists()
    done = torchrun([*COMMAND, "--parallel", "modules"], tmp_path, killed=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "(2 ranks, modules-parallel)" in done.stdout and "layer 1: FVU" in done.stdout
    assert sorted(p.name for p in (markov_zoo / "transcoders").iterdir()) == ["jumprelu"]  # harvests, checkpoint gone
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(p.name for p in reference.iterdir())
    for name in files:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


@pytest.mark.slow
def test_forma_transcoders_streamed_on_two_ranks_killed_and_rerun_is_one_process(markov_zoo, tmp_path, capsys):
    """Past the disk budget (no harvest: each batch streamed from the model, drawn with (seed, step)): one process,
    then 2 module-parallel ranks with rank 0 killed as it writes the checkpoint of step 10, then the same command
    again, resuming from step 5's: every file is the one process's bytes."""
    command = [*COMMAND, "--disk-budget", "0.0001"]
    assert main(command) == 0
    assert "stream: the harvests would take" in capsys.readouterr().out
    reference = tmp_path / "reference"
    shutil.move(markov_zoo / "transcoders" / "jumprelu", reference)
    killed = torchrun([*command, "--parallel", "modules"], tmp_path, killed=True)
    assert killed.returncode != 0 and "Signal 9 (SIGKILL) received" in killed.stderr, killed.stderr[-3000:]
    out = markov_zoo / "transcoders" / "jumprelu"
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 5
    done = torchrun([*command, "--parallel", "modules"], tmp_path, killed=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "(2 ranks, modules-parallel)" in done.stdout
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(p.name for p in reference.iterdir())
    for name in files:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def test_a_harvest_an_earlier_command_left_is_named_and_overwrite_starts_afresh(markov_zoo, capsys):
    """A run stopped after its harvest, then the command again with other --windows: one line, exit 2, nothing
    trained; --overwrite harvests afresh and trains."""
    from lab.analysis.transcoders.model import TranscoderConfig as Config
    from lab.zoo.transcoders import harvest_windows

    hooks = Config(d_model=32, n_layers=2, d_features=48).hooks()
    harvest_windows(markov_zoo, hooks, markov_zoo / "transcoders" / ".jumprelu.harvest", n_windows=16, window=64)
    command = [
        "transcoders",
        "markov",
        "--kind",
        "jumprelu",
        "--steps",
        "4",
        "--windows",
        "32",
        "--features",
        "48",
        "--no-progress",
    ]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "holds a harvest of 256 rows, not of these 32 windows of 16 tokens" in err and err.count("\n") == 1, err
    assert not (markov_zoo / "transcoders" / "jumprelu" / "transcoders.safetensors").exists()
    assert main([*command, "--overwrite"]) == 0
    assert (markov_zoo / "transcoders" / "jumprelu" / "transcoders.safetensors").is_file()
