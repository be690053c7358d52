"""Harvesting activations for probe and SAE datasets: a harvest runs only the blocks up to its hook, holds one
shard buffer however long the data, resumes after a kill bitwise as if never interrupted, and linear probes fit
from the shards give the probe the in-memory fit gives."""

import json
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from lab import HookedTransformer
from lab.analysis.activations import store as activations_store
from lab.analysis.activations.collect import collect_activations, stream_activations
from lab.analysis.activations.store import ActivationStore, save_activations
from lab.analysis.probes.probe import fit_probe, fit_probes
from tests.builders import REPO, VOCAB, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def deep() -> HookedTransformer:
    return HookedTransformer(tiny_config(n_layers=3), seed=0).eval()


@pytest.fixture
def data() -> torch.Tensor:
    return torch.randint(0, VOCAB, (24, 12), generator=torch.Generator().manual_seed(5))


def block_calls(model: HookedTransformer) -> tuple[list[int], list]:
    counts = [0] * len(model.blocks)
    handles = [
        block.register_forward_pre_hook(lambda module, args, i=i: counts.__setitem__(i, counts[i] + 1))
        for i, block in enumerate(model.blocks)
    ]
    return counts, handles


def shard_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("shard-*.safetensors"))}


HOOK = "blocks.1.attn.hook_z"
HARVEST = dict(positions="all", batch_size=2, shard_mb=0.02, progress=False)


# --- computing only up to the hook ------------------------------------------------------------------
def test_a_harvest_runs_no_block_after_its_hooks_layer(deep, data, tmp_path):
    counts, handles = block_calls(deep)
    try:
        save_activations(deep, data, HOOK, tmp_path / "z", **HARVEST)
        assert counts == [12, 12, 0]  # 12 batches through blocks 0 and 1; block 2 and the unembedding never run
        save_activations(deep, data, "blocks.0.hook_resid_post", tmp_path / "r", **HARVEST)
        assert counts == [24, 12, 0]
    finally:
        for h in handles:
            h.remove()


# --- one copy of every position's activation ------------------------------------------------------
def cached_rows(model, data, names, batch_size):
    """run_with_cache(names_filter=names)'s activations at every position, each [rows, *shape] in (sequence,
    position) order (the same hooks attached: a hook on the pattern switches attention to its explicit path)."""
    caches = [model.run_with_cache(batch, names_filter=names)[1] for batch in data.split(batch_size)]
    return {
        name: torch.cat([c[name].movedim(2 if name.endswith("hook_pattern") else 1, 1).flatten(0, 1) for c in caches])
        for name in names
    }


@pytest.mark.parametrize(
    "hooks, stop_early",
    [
        (["blocks.1.hook_resid_post"], True),
        ([HOOK, "blocks.0.attn.hook_pattern", "blocks.1.hook_mlp_out"], True),
        (["blocks.0.hook_resid_post", HOOK], False),
    ],
    ids=["one hook", "three hooks", "the pass goes on"],
)
def test_a_harvest_of_every_position_holds_the_activations_bit_for_bit(deep, data, tmp_path, hooks, stop_early):
    store = save_activations(deep, data, hooks, tmp_path / "all", **HARVEST, stop_early=stop_early).load()
    cached = cached_rows(deep, data, hooks, HARVEST["batch_size"])
    for name in hooks:
        assert torch.equal(store[name], cached[name]), name


def test_the_last_hook_of_a_pass_hands_its_activation_over_without_a_copy(deep, data):
    """Every position of the hook that ends the pass: its rows are the activation itself (the shard buffer's copy
    is the only one); a hook the pass runs on after is copied, since the pass may still write into it."""
    seen = {}
    record = lambda x, hook: seen.__setitem__(hook.name, x.untyped_storage().data_ptr())  # noqa: E731
    names = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    with deep.hooks(fwd_hooks=[(name, record) for name in names]):  # fire before the harvest's own hooks
        part = next(stream_activations(deep, data, names, "all", batch_size=2, progress=False))
    assert part[names[1]].untyped_storage().data_ptr() == seen[names[1]]
    assert part[names[0]].untyped_storage().data_ptr() != seen[names[0]]


def test_rows_are_not_changed_by_what_the_pass_does_after_their_hook(deep, data):
    """blocks.0.hook_resid_post is the tensor blocks.1.hook_resid_pre sees: a later hook writing into it in place
    leaves the rows collected before it as they were."""
    name = "blocks.0.hook_resid_post"
    clean = collect_activations(deep, data, name, "all", batch_size=2, progress=False)[name]
    with deep.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: x.mul_(0))]):
        rows = collect_activations(deep, data, name, "all", batch_size=2, progress=False, stop_early=False)[name]
    assert torch.equal(rows, clean) and bool(clean.abs().sum() > 0)


# --- bounded memory -------------------------------------------------------------------------------
def test_the_writer_holds_one_shard_buffer_and_no_earlier_batch(deep, data, tmp_path, monkeypatch):
    seen_buffers, earlier = set(), []
    add = activations_store._ShardWriter.add

    def watched(writer, part, end):  # reference counting frees a batch as soon as nothing holds it
        assert all(ref() is None for ref in earlier), "an earlier batch's activations are still alive"
        earlier[:] = [weakref.ref(t) for t in part.acts.values()]
        add(writer, part, end)
        seen_buffers.add(tuple(b.data_ptr() for b in writer.buffers.values()))
        assert sum(b.numel() * b.element_size() for b in writer.buffers.values()) <= writer.limit

    monkeypatch.setattr(activations_store._ShardWriter, "add", watched)
    store = save_activations(deep, data, HOOK, tmp_path / "z", **HARVEST)
    assert len(store.index["shards"]) >= 3
    assert len(seen_buffers) == 1  # one buffer, allocated once and refilled for every shard


def test_a_harvest_hands_freed_memory_back_once_per_shard_and_a_stream_after_every_batch(
    deep, data, tmp_path, monkeypatch
):
    from lab.analysis.activations import collect

    calls = []
    for module in (collect, activations_store):
        monkeypatch.setattr(module, "release_freed_memory", lambda: calls.append(1))
    store = save_activations(deep, data, HOOK, tmp_path / "z", **HARVEST)
    assert len(calls) == len(store.index["shards"]) < len(data) // HARVEST["batch_size"]
    calls.clear()
    parts = list(stream_activations(deep, data, HOOK, "all", batch_size=2, progress=False))
    assert len(calls) == len(parts) == 12


# --- resumable ------------------------------------------------------------------------------------
class Interrupt(Exception):
    pass


def interrupt_at_batch(model, k):
    calls = [0]

    def hook(module, args):
        calls[0] += 1
        if calls[0] == k:
            raise Interrupt

    return model.blocks[0].register_forward_pre_hook(hook)


def test_a_harvest_interrupted_after_some_shards_resumes_bitwise(deep, data, tmp_path):
    whole = save_activations(deep, data, HOOK, tmp_path / "whole", **HARVEST)
    assert len(whole.index["shards"]) >= 4

    handle = interrupt_at_batch(deep, 9)
    try:
        with pytest.raises(Interrupt):
            save_activations(deep, data, HOOK, tmp_path / "resumed", **HARVEST)
    finally:
        handle.remove()
    folder = tmp_path / "resumed"
    progress = json.loads((folder / "progress.json").read_text())
    done = progress["shards"]
    assert 0 < len(done) < len(whole.index["shards"]) and not (folder / "index.json").exists()
    assert sorted(p.name for p in folder.glob("shard-*")) == [s["file"] for s in done]
    with pytest.raises(FileNotFoundError, match="not a complete activation set"):
        ActivationStore(folder)

    counts, handles = block_calls(deep)
    try:
        resumed = save_activations(deep, data, HOOK, folder, **HARVEST)
    finally:
        for h in handles:
            h.remove()
    assert counts[0] == 12 - done[-1]["sequences"] // 2  # only the batches after the last recorded shard ran
    assert shard_bytes(folder) == shard_bytes(tmp_path / "whole")
    assert resumed.index == whole.index and not (folder / "progress.json").exists()


def test_a_resume_refuses_other_arguments_or_other_data(deep, data, tmp_path):
    handle = interrupt_at_batch(deep, 9)
    try:
        with pytest.raises(Interrupt):
            save_activations(deep, data, HOOK, tmp_path, **HARVEST)
    finally:
        handle.remove()
    with pytest.raises(ValueError, match=r"other arguments \(batch_size: 2 then, 4 now\)"):
        save_activations(deep, data, HOOK, tmp_path, **HARVEST | {"batch_size": 4})
    other = data.clone()
    other[0, 0] = (other[0, 0] + 1) % VOCAB
    with pytest.raises(ValueError, match="sequences differ"):
        save_activations(deep, other, HOOK, tmp_path, **HARVEST)
    with pytest.raises(ValueError, match="not the same data"):
        save_activations(deep, data[:3], HOOK, tmp_path, **HARVEST)
    fresh = save_activations(deep, other, HOOK, tmp_path, **HARVEST, overwrite=True)
    assert fresh.index["n_sequences"] == len(other)


def test_an_unrecorded_shard_and_a_half_written_temporary_are_never_listed(deep, data, tmp_path):
    whole = save_activations(deep, data, HOOK, tmp_path / "whole", **HARVEST)
    handle = interrupt_at_batch(deep, 9)
    try:
        with pytest.raises(Interrupt):
            save_activations(deep, data, HOOK, tmp_path / "killed", **HARVEST)
    finally:
        handle.remove()
    folder = tmp_path / "killed"
    n_done = len(json.loads((folder / "progress.json").read_text())["shards"])
    # What a kill leaves: a shard renamed into place but not yet recorded, and a temporary cut off mid-write.
    (folder / f"shard-{n_done:05d}.safetensors").write_bytes(b"renamed before progress.json was updated")
    (folder / f".shard-{n_done + 1:05d}.safetensors.x1y2.tmp").write_bytes(b"half a shard")
    resumed = save_activations(deep, data, HOOK, folder, **HARVEST)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["index.json", *shard_bytes(tmp_path / "whole")])
    assert shard_bytes(folder) == shard_bytes(tmp_path / "whole") and resumed.index == whole.index


KILLED = """
import os, signal, sys, torch
from lab import HookedTransformer
from lab.analysis.activations.store import save_activations
from tests.builders import VOCAB, tiny_config
model = HookedTransformer(tiny_config(n_layers=3), seed=0).eval()
data = torch.randint(0, VOCAB, (24, 12), generator=torch.Generator().manual_seed(5))
torch.set_num_threads(1)  # as the test process, so that its resumed shards are bitwise comparable
calls = [0]
def kill(module, args):
    calls[0] += 1
    if calls[0] == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
model.blocks[0].register_forward_pre_hook(kill)
save_activations(model, data, "blocks.1.attn.hook_z", sys.argv[1], positions="all", batch_size=2, shard_mb=0.02,
                 progress=False)
"""


@pytest.mark.slow
def test_a_harvest_killed_mid_run_resumes_bitwise(deep, data, tmp_path):
    """SIGKILL in the middle of a harvest (no exception handler runs), then the same call here finishes it."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    killed = subprocess.run(
        [sys.executable, "-c", KILLED, str(tmp_path / "killed"), "10"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (tmp_path / "killed" / "index.json").exists()
    assert json.loads((tmp_path / "killed" / "progress.json").read_text())["shards"]
    resumed = save_activations(deep, data, HOOK, tmp_path / "killed", **HARVEST)
    whole = save_activations(deep, data, HOOK, tmp_path / "whole", **HARVEST)
    assert shard_bytes(tmp_path / "killed") == shard_bytes(tmp_path / "whole") and resumed.index == whole.index


# --- probes out of core -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def probe_store(tmp_path_factory):
    """160 sequences × the last 4 positions of a tiny model's resid_post (d_model 64), in shards of ~60 rows."""
    model = HookedTransformer(tiny_config(), seed=1).eval()
    tokens = torch.randint(0, VOCAB, (160, 8), generator=torch.Generator().manual_seed(0))
    folder = tmp_path_factory.mktemp("probe-store")
    return save_activations(
        model,
        tokens,
        ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"],
        folder,
        [-4, -3, -2, -1],
        batch_size=8,
        shard_mb=0.03,
        progress=False,
    )


def labels(X: torch.Tensor, n_classes: int, seed: int = 0) -> np.ndarray:
    """Labels read off a planted direction of X (plus noise), so that probes have something to find."""
    g = torch.Generator().manual_seed(seed)
    flat = X.reshape(len(X), -1).double()
    score = (flat - flat.mean(0)) @ torch.randn(flat.shape[1], generator=g, dtype=torch.float64)
    score = score / score.std() + 0.5 * torch.randn(len(X), generator=g, dtype=torch.float64)
    edges = torch.quantile(score, torch.linspace(0, 1, n_classes + 1, dtype=torch.float64)[1:-1])
    return torch.bucketize(score, edges).numpy()


def same_probe(streamed, memory, tol):
    assert streamed.regularization == memory.regularization
    assert streamed.cv_loss.keys() == memory.cv_loss.keys()
    assert all(abs(streamed.cv_loss[g] - memory.cv_loss[g]) <= tol for g in memory.cv_loss)
    assert torch.allclose(streamed.test_scores, memory.test_scores, atol=tol, rtol=0)
    assert torch.allclose(streamed.weight, memory.weight, atol=tol * memory.weight.abs().max(), rtol=0)
    assert streamed.feature_rank == memory.feature_rank and streamed.n_features == memory.n_features
    for name, m in memory.metrics.items():
        assert streamed.metrics[name].value == pytest.approx(m.value, abs=tol), name


@pytest.mark.parametrize(
    "kind, n_classes",
    [("ridge", 0), ("logistic", 2), pytest.param("logistic", 3, marks=pytest.mark.slow)],
    ids=["ridge", "binary", "three-class"],
)
def test_a_linear_probe_fitted_from_the_shards_is_the_in_memory_probe(probe_store, monkeypatch, kind, n_classes):
    name = "blocks.0.hook_resid_post"
    X = probe_store.load(name)[name]
    y = labels(X, max(n_classes, 2)).astype(float if kind == "ridge" else int)
    if kind == "ridge":
        y = y + 0.1 * np.arange(len(y)) % 1.0  # a real-valued target
    groups = probe_store.load(name).seq.numpy()  # the 4 positions of a sequence are one group
    grid = (1e-2, 1e-1, 1.0) if kind == "logistic" else (1.0, 10.0, 100.0)
    memory = fit_probe(X, y, kind, groups=groups, grid=grid, n_bootstrap=20)

    def no_load(*args, **kwargs):
        raise AssertionError("the store was loaded into memory")

    monkeypatch.setattr(ActivationStore, "load", no_load)
    streamed = fit_probe(probe_store[name], y, kind, groups=groups, grid=grid, n_bootstrap=20)
    assert len(probe_store.index["shards"]) >= 10
    same_probe(streamed, memory, 1e-5)


@pytest.mark.slow
def test_above_the_newton_limit_both_fits_take_lbfgs_steps_to_the_same_probe(probe_store, monkeypatch):
    """Wide features or many classes: L-BFGS on the same objective, the streamed one summing its gradient."""
    from lab.analysis.probes import fitting  # where every logistic fit reads NEWTON_MAX_PARAMS

    name = "blocks.0.hook_resid_post"
    loaded = probe_store.load(name)
    y = labels(loaded[name], 2, seed=2)
    monkeypatch.setattr(fitting, "NEWTON_MAX_PARAMS", 8)
    memory = fit_probe(loaded[name], y, "logistic", groups=loaded.seq.numpy(), grid=(0.1,), n_bootstrap=10)
    streamed = fit_probe(probe_store[name], y, "logistic", groups=loaded.seq.numpy(), grid=(0.1,), n_bootstrap=10)
    same_probe(streamed, memory, 1e-5)


def test_probes_on_every_hook_of_a_store_and_wide_rows(probe_store):
    """fit_probes takes the store itself; attention's [head, d_head] rows flatten as in memory."""
    loaded = probe_store.load()
    y = labels(loaded["blocks.1.attn.hook_z"], 2, seed=1)
    groups = loaded.seq.numpy()
    memory = fit_probes(loaded, y, "logistic", groups=groups, grid=(0.1,), n_bootstrap=10)
    streamed = fit_probes(probe_store, y, "logistic", groups=groups, grid=(0.1,), n_bootstrap=10)
    assert streamed.keys() == memory.keys()
    for name in memory:
        same_probe(streamed[name], memory[name], 1e-5)


def test_out_of_core_probes_refuse_what_they_cannot_do(probe_store):
    y = np.arange(len(probe_store)) % 2
    with pytest.raises(ValueError, match="holds 2 hooks"):
        fit_probe(probe_store, y, "logistic")
    with pytest.raises(ValueError, match="MLP probe is fitted in memory"):
        fit_probe(probe_store["blocks.0.hook_resid_post"], y, "mlp")
    with pytest.raises(KeyError, match="holds no"):
        probe_store["blocks.5.hook_resid_post"]
