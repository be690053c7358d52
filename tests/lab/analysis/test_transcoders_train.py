"""lab.analysis.transcoders.train: the data order, the step, bitwise resumption, and training that learns."""

import json

import pytest
import torch

from lab.analysis.activations.store import save_activations
from lab.analysis.transcoders.measures import reconstruction_measures
from lab.analysis.transcoders.model import TranscoderConfig, Transcoders
from lab.analysis.transcoders.stream import ActivationStream
from lab.analysis.transcoders.train import DataOrder, TranscoderTraining, train_transcoders
from tests.builders import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def harvest(tmp_path_factory):
    model = tiny_model(mlp="relu")
    cfg = TranscoderConfig(d_model=32, n_layers=3, d_features=96)
    tokens = torch.randint(0, 50, (48, 16), generator=torch.Generator().manual_seed(0))
    store = save_activations(
        model,
        tokens,
        cfg.hooks(),
        tmp_path_factory.mktemp("h") / "h",
        positions="all",
        batch_size=8,
        shard_mb=0.1,
        progress=False,
    )
    assert len(store.index["shards"]) > 2
    return store, cfg


def test_an_epoch_reads_every_row_once_and_a_resumed_order_is_the_same(harvest):
    store, cfg = harvest
    order = DataOrder(store, cfg, batch_size=48, seed=3)
    assert len(store) % 48 == 0
    batches = order.batches()
    rows = torch.cat([next(batches)[1][:, 0] for _ in range(len(store) // 48)])  # one epoch, layer 0's inputs
    everything = torch.cat(
        [store.shard(i, cfg.hooks()).acts[cfg.hook("input", 0)] for i in range(len(store.index["shards"]))]
    )
    key = torch.arange(32, dtype=torch.float32)  # rows compared as sets: sorted by a generic projection
    assert torch.equal(rows[(rows @ key).argsort()], everything[(everything @ key).argsort()])
    assert not torch.equal(rows, everything)  # shuffled
    again = order.batches(start=7)
    step, x, y = next(again)
    fresh = order.batches()
    for _ in range(7):
        next(fresh)
    step2, x2, y2 = next(fresh)
    assert step == step2 == 7 and torch.equal(x, x2) and torch.equal(y, y2)


@pytest.mark.parametrize("activation", ["relu", "topk", "jumprelu"])
def test_training_learns(harvest, tmp_path, activation):
    store, cfg = harvest
    cfg = cfg.replace(activation=activation, k=12 if activation == "topk" else 0)
    sparsity = {"relu": 1e-3, "topk": 0.0, "jumprelu": 1e-4}[activation]
    before = reconstruction_measures(Transcoders(cfg), store)
    tc = train_transcoders(
        store, cfg, TranscoderTraining(steps=150, batch_size=64, lr=3e-3, sparsity=sparsity), tmp_path / "tc"
    )
    after = reconstruction_measures(tc, store)
    assert max(after["fvu"]) < 0.5 * min(before["fvu"])
    assert (tmp_path / "tc" / "training.json").is_file() and not (tmp_path / "tc" / "checkpoint").exists()


def test_a_resumed_run_is_bitwise_the_uninterrupted_one_and_the_same_seed_repeats(harvest, tmp_path):
    store, cfg = harvest
    cfg = cfg.replace(cross_layer=True, activation="jumprelu")
    training = TranscoderTraining(steps=40, batch_size=64, lr=3e-3, sparsity=1e-4, checkpoint_interval=15)
    whole = train_transcoders(store, cfg, training, tmp_path / "whole").state_tensors()
    train_transcoders(store, cfg, training, tmp_path / "parts", stop_after=23)
    assert (tmp_path / "parts" / "checkpoint" / "state.json").is_file()
    resumed = train_transcoders(store, cfg, training, tmp_path / "parts", resume=True).state_tensors()
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
    with pytest.raises(ValueError, match="differs from the checkpoint's in lr"):
        train_transcoders(store, cfg, training, tmp_path / "other", stop_after=5)
        train_transcoders(store, cfg, training.replace(lr=1e-3), tmp_path / "other", resume=True)


def test_a_subset_of_layers_resumes_bitwise_from_the_harvest_of_every_layer(harvest, tmp_path):
    """Transcoders of layers (0, 2) read those layers' hooks of a harvest of every layer, and their checkpoint (whose
    config names the layers, as JSON lists them) resumes into the uninterrupted run's bits."""
    store, cfg = harvest
    cfg = cfg.replace(n_layers=2, layers=(0, 2))
    training = TranscoderTraining(steps=12, batch_size=64, lr=3e-3, checkpoint_interval=5)
    whole = train_transcoders(store, cfg, training, tmp_path / "whole").state_tensors()
    train_transcoders(store, cfg, training, tmp_path / "parts", stop_after=7)
    resumed = train_transcoders(store, cfg, training, tmp_path / "parts", resume=True).state_tensors()
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)
    _, x, _ = next(DataOrder(store, cfg, batch_size=4, seed=0).batches())
    _, x_all, _ = next(DataOrder(store, cfg.replace(n_layers=3, layers=None), batch_size=4, seed=0).batches())
    assert torch.equal(x, x_all[:, [0, 2]])


def test_a_checkpoint_whose_state_is_of_the_wrong_types_is_one_line_naming_it(harvest, tmp_path):
    """A state.json that parses but holds no objects where the configs go, a step that is not a whole number, or
    a history of something else: a ValueError naming the file (not an AttributeError from inside the loader)."""
    store, cfg = harvest
    training = TranscoderTraining(steps=6, batch_size=64, lr=3e-3)
    train_transcoders(store, cfg, training, tmp_path, stop_after=3)
    path = tmp_path / "checkpoint" / "state.json"
    state = json.loads(path.read_text())
    for change in ({"training": [1]}, {"store": "x"}, {"step": 3.0}, {"history": [1, 2]}, {"step": 7}):
        path.write_text(json.dumps(state | change))
        with pytest.raises(ValueError, match=f"^{path}"):
            train_transcoders(store, cfg, training, tmp_path, resume=True)
    path.write_text(json.dumps(state))
    train_transcoders(store, cfg, training, tmp_path, resume=True)  # intact again: resumes


def test_a_harvest_without_the_hooks_is_one_clear_line(harvest, tmp_path):
    store, cfg = harvest
    with pytest.raises(ValueError, match="holds no 'blocks.0.hook_resid_pre'"):
        train_transcoders(
            store, cfg.replace(input_hook="blocks.{layer}.hook_resid_pre"), TranscoderTraining(steps=2), tmp_path
        )
    with pytest.raises(FileNotFoundError, match="no transcoder checkpoint"):
        train_transcoders(store, cfg, TranscoderTraining(steps=2), tmp_path / "none", resume=True)


@pytest.mark.parametrize("world", [2, 3])
def test_a_ranks_slice_of_each_batch_reads_only_the_shards_it_lies_in(harvest, monkeypatch, world):
    """A data-parallel rank's reader (part: its contiguous slice of each batch) gives that slice of the whole
    batch, bit for bit, from any start, and reads only the shards its rows lie in, once per visit: fewer than the
    whole batches' reader."""
    store, cfg = harvest
    batch, start, steps = 100, 5, 12  # slices that cross shard boundaries, over more than an epoch
    whole = DataOrder(store, cfg, batch_size=batch, seed=3)
    expected = [next(batches) for batches in [whole.batches(start)] for _ in range(steps)]
    owner = [  # (epoch, shard) of every row of the endless sequence, spelled out
        (epoch, shard)
        for epoch in range(3)
        for shard in whole.shard_order(epoch)
        for _ in range(int(store.index["shards"][shard]["rows"]))
    ]
    real, read, hooks = store.shard, [], []
    monkeypatch.setattr(store, "shard", lambda i, names=None: read.append(i) or hooks.append(names) or real(i, names))
    all_read = []
    for rank in range(world):
        mine = slice(rank * batch // world, (rank + 1) * batch // world)
        order = DataOrder(store, cfg, batch_size=batch, seed=3, part=mine).batches(start)
        read.clear()
        for (step, x, y), (step2, x2, y2) in zip([next(order) for _ in range(steps)], expected):
            assert step == step2 and torch.equal(x, x2[mine]) and torch.equal(y, y2[mine])
        visits = [owner[s * batch + i] for s in range(start, start + steps) for i in range(mine.start, mine.stop)]
        assert read == [shard for i, (epoch, shard) in enumerate(visits) if i == 0 or visits[i - 1] != (epoch, shard)]
        all_read.append(len(read))
    read.clear()
    for _ in zip(range(steps), whole.batches(start)):
        pass
    assert max(all_read) < len(read)
    hooks.clear()  # a module-parallel rank's reader: its layers' hooks alone, of whole batches
    for (_, x, y), (_, x2, y2) in zip(DataOrder(store, cfg, batch, 3, layers=[1]).batches(start), expected[:2]):
        assert torch.equal(x, x2[:, 1:2]) and torch.equal(y, y2[:, 1:2])
    assert hooks and all(names == [cfg.hook("input", 1), cfg.hook("output", 1)] for names in hooks)


def test_a_checkpoint_at_or_past_the_last_step_finishes_the_write_or_says_why(harvest, tmp_path):
    """A checkpoint whose step is the training's last: the resumed run writes the set from it (nothing to train).
    One past it (or not a step at all) cannot be the run's: refused naming its step, and nothing said written."""
    store, cfg = harvest
    training = TranscoderTraining(steps=6, batch_size=32)
    train_transcoders(store, cfg, training, tmp_path / "tc", stop_after=4)
    state = tmp_path / "tc" / "checkpoint" / "state.json"
    meta = json.loads(state.read_text())
    for step in (7, 10**6, -1, "6"):
        state.write_text(json.dumps(meta | {"step": step}))
        with pytest.raises(ValueError, match=f"its step {step!r} is not one of the training's 0 … 6 steps"):
            train_transcoders(store, cfg, training, tmp_path / "tc", resume=True)
        assert not (tmp_path / "tc" / "transcoders.safetensors").exists()
    state.write_text(json.dumps(meta | {"step": 6}))
    done = train_transcoders(store, cfg, training, tmp_path / "tc", resume=True)
    assert torch.equal(Transcoders.load(tmp_path / "tc").W_enc, done.W_enc)
    assert json.loads((tmp_path / "tc" / "training.json").read_text())["steps"] == 6


@pytest.fixture(scope="module")
def stream():
    """Rows streamed from a tiny model over one token stream, windows of 16 tokens."""
    tokens = torch.randint(0, 50, (4000,), generator=torch.Generator().manual_seed(1))
    return ActivationStream(tiny_model(mlp="relu"), tokens, 16, describe="random ids")


def test_a_streamed_batch_is_the_models_activations_and_a_function_of_the_step_alone(stream):
    """Batch `step` is every position of the windows drawn with (seed, step), run through the model; from any
    start the same bits; a rank's slice runs only its windows and is its part of the batch."""
    cfg = TranscoderConfig(d_model=32, n_layers=2, d_features=64, layers=(0, 2))
    order = stream.order(cfg, 40, 3, [0, 1], slice(None))
    batches = order.batches()
    for _ in range(5):
        next(batches)
    step, x, y = next(batches)
    again = next(order.batches(start=5))
    assert step == again[0] == 5 and torch.equal(x, again[1]) and torch.equal(y, again[2])
    windows = stream.windows(5, 40, 3)
    assert windows.shape == (3, 16)  # ⌈40 / 16⌉
    _, cache = stream.model.run_with_cache(windows, names_filter=cfg.hooks())
    assert x.shape == (40, 2, 32)
    assert torch.allclose(x[:, 1], cache["blocks.2.ln2.hook_normalized"].reshape(48, 32)[:40], atol=1e-6)
    assert torch.allclose(y[:, 0], cache["blocks.0.hook_mlp_out"].reshape(48, 32)[:40], atol=1e-6)
    halves = [stream.batch(5, cfg, 40, 3, [0, 1], part)[0] for part in (slice(0, 20), slice(20, 40))]
    assert torch.allclose(torch.cat(halves), x, atol=1e-6)
    assert not torch.equal(next(stream.order(cfg, 40, 4, [0, 1], slice(None)).batches(start=5))[1], x)  # seed


def test_a_streamed_run_resumes_bitwise_and_the_same_seed_repeats(stream, tmp_path):
    cfg = TranscoderConfig(d_model=32, n_layers=3, d_features=48, activation="topk", k=6)
    training = TranscoderTraining(steps=10, batch_size=48, lr=3e-3, checkpoint_interval=4)
    whole = train_transcoders(stream, cfg, training, tmp_path / "whole").state_tensors()
    again = train_transcoders(stream, cfg, training, tmp_path / "again").state_tensors()
    train_transcoders(stream, cfg, training, tmp_path / "parts", stop_after=6)
    resumed = train_transcoders(stream, cfg, training, tmp_path / "parts", resume=True).state_tensors()
    assert all(torch.equal(whole[name], again[name]) and torch.equal(whole[name], resumed[name]) for name in whole)
    other = ActivationStream(stream.model, stream.tokens[1:], 16, describe="random ids")
    train_transcoders(stream, cfg, training, tmp_path / "other", stop_after=3)
    with pytest.raises(ValueError, match="the activation store differs from the checkpoint's in sha256, shape"):
        train_transcoders(other, cfg, training, tmp_path / "other", resume=True)
