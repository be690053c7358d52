"""The training loop: the schedule against its formula, exact resumption, clear checkpoint errors,
crash-safe checkpoints, the batch streams, and DDP under torchrun against one process."""

import dataclasses
import json
import math
import os
import re
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lab.train
from lab import HookedTransformer, ModelConfig
from lab.configs import torch_threads
from lab.data.sources import MarkovSource
from lab.train.batches import IGNORE, Batch, SequenceBatches, TokenStream
from lab.train.config import TrainConfig
from lab.train.entry import DEMO_MODEL, DEMO_TRAIN, demo_markov
from lab.train.loop import TrainingDiverged, TrainingInterrupted, estimate_loss, get_batch, get_lr, train
from tests.builders import USER_THREADS

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (tests/conftest.py::one_thread)

# 20 tiny steps: warmup then cosine, one eval every 5 steps.
SHORT = DEMO_TRAIN.replace(steps=20, batch_size=8, seq_len=16, warmup_steps=4, eval_interval=5, eval_batches=2)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


# --- config and schedule ------------------------------------------------------------------------
def test_train_config_validates_each_field_and_round_trips():
    cfg = TrainConfig(lr=1, steps=50, warmup_steps=5)
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert isinstance(cfg.lr, float)
    for bad, field in [
        (dict(steps=0), "steps"),
        (dict(lr=-1.0), "lr"),
        (dict(min_lr=0.1, lr=0.01), "min_lr"),
        (dict(beta2=1.0), "beta2"),
        (dict(seq_len=1), "seq_len"),
        (dict(batch_size=True), "batch_size"),
        (dict(warmup_steps=20, steps=10), "warmup_steps"),
        (dict(grad_clip=math.nan), "grad_clip"),
        (dict(device="gpu7"), "device"),
    ]:
        with pytest.raises(ValueError, match=f"TrainConfig.{field}"):
            TrainConfig(**bad)
    with pytest.raises(ValueError, match=r"unknown keys \['learning_rate'\]"):
        TrainConfig.from_dict({"learning_rate": 1e-3})


def test_get_lr_is_linear_warmup_then_cosine_to_the_floor():
    cfg = TrainConfig(steps=110, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    assert get_lr(0, cfg) == pytest.approx(1e-4)  # lr · 1/10
    assert get_lr(4, cfg) == pytest.approx(5e-4)
    assert get_lr(9, cfg) == pytest.approx(1e-3)  # warmup ends at the peak
    assert get_lr(10, cfg) == pytest.approx(1e-3)  # cosine starts at the peak
    # progress = (35 − 10) / 100 = 1/4: min + ½(lr − min)(1 + cos(π/4))
    assert get_lr(35, cfg) == pytest.approx(1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi / 4)))
    assert get_lr(60, cfg) == pytest.approx(5.5e-4)  # halfway: the midpoint of lr and min_lr
    assert get_lr(110, cfg) == pytest.approx(1e-4)  # the floor once the run is over
    assert get_lr(0, TrainConfig(steps=5, warmup_steps=0, lr=2e-3)) == pytest.approx(2e-3)


# --- data ---------------------------------------------------------------------------------------
def test_token_stream_windows_are_deterministic_and_never_cross_rows():
    rows = torch.arange(6 * 40).reshape(6, 40)  # every token says where it came from
    data = TokenStream(rows, rows[:2])
    batch = data.get_batch("train", 3, 16, 10, seed=7)
    assert torch.equal(batch.tokens, data.get_batch("train", 3, 16, 10, seed=7).tokens)
    assert not torch.equal(batch.tokens, data.get_batch("train", 4, 16, 10, seed=7).tokens)
    assert not torch.equal(batch.tokens, data.get_batch("train", 3, 16, 10, seed=8).tokens)
    assert torch.equal(batch.targets, batch.tokens[:, 1:])
    assert (batch.tokens.diff(dim=1) == 1).all()  # contiguous
    assert (batch.tokens[:, 0] // 40 == batch.tokens[:, -1] // 40).all()  # within one row
    assert set((data.get_batch("val", 0, 16, 10, seed=0).tokens // 40).flatten().tolist()) <= {0, 1}
    stream = TokenStream(torch.arange(100), torch.arange(20))  # 1-D: one long stream
    assert stream.get_batch("train", 0, 4, 8, seed=0).tokens.shape == (4, 8)
    with pytest.raises(ValueError, match="fewer than seq_len"):
        stream.get_batch("val", 0, 4, 32, seed=0)
    with pytest.raises(ValueError, match="integer token ids"):
        TokenStream(torch.rand(10), torch.arange(10))


def test_sequence_batches_visit_every_document_once_per_epoch_and_honour_the_mask():
    docs = torch.arange(10)[:, None] * 100 + torch.arange(6)  # document i holds 100i .. 100i+5
    mask = torch.ones(10, 6, dtype=torch.bool)
    mask[:, :3] = False  # a 3-token prompt that is conditioned on but not trained on
    data = SequenceBatches(docs, docs[:4], mask=mask)
    seen = torch.cat([data.get_batch("train", i, 5, 6, seed=1).tokens[:, 0] // 100 for i in range(4)])
    assert sorted(seen[:10].tolist()) == list(range(10)) == sorted(seen[10:].tolist())  # two epochs
    assert seen[:10].tolist() != seen[10:].tolist()  # reshuffled between epochs
    batch = data.get_batch("train", 0, 5, 6, seed=1)
    assert (batch.targets[:, :2] == IGNORE).all()  # predictions of tokens 1 and 2 are not scored
    assert torch.equal(batch.targets[:, 2:], batch.tokens[:, 3:])
    local, n_scored = get_batch(data, "train", 0, TrainConfig(batch_size=4, seq_len=6), 1, 2, torch.device("cpu"))
    assert local.tokens.shape == (2, 6) and n_scored == 4 * 3  # rank 1's half; the global count
    with pytest.raises(ValueError, match="seq_len is 8"):
        data.get_batch("train", 0, 5, 8, seed=1)


def test_ranks_split_the_global_batch_into_disjoint_contiguous_halves():
    _, data = demo_markov()
    cfg = SHORT
    whole = data.get_batch("train", 5, cfg.batch_size, cfg.seq_len, cfg.seed)
    halves = [get_batch(data, "train", 5, cfg, rank, 2, torch.device("cpu"))[0] for rank in (0, 1)]
    assert torch.equal(torch.cat([h.tokens for h in halves]), whole.tokens)


def test_rank_losses_average_to_the_global_mean_gradient_even_with_uneven_masks():
    # What DDP computes — the mean over ranks of ∇(Σ_rank loss · world / n_global) — must equal the
    # gradient of the mean loss over the whole global batch, also when the ranks score unequal counts.
    torch.manual_seed(0)
    docs = torch.randint(0, 16, (4, 8))
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[:2, :6] = False  # rank 0's documents score 2 predictions each, rank 1's score 7
    data = SequenceBatches(docs, docs, mask=mask)
    cfg = TrainConfig(batch_size=4, seq_len=8)
    model = HookedTransformer(DEMO_MODEL, seed=0)

    def gradient(world: int, rank: int) -> torch.Tensor:
        model.zero_grad()
        batch, n_scored = get_batch(data, "train", 0, cfg, rank, world, torch.device("cpu"))
        (lab.train.loop.summed_loss(model(batch.tokens), batch.targets) * (world / n_scored)).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    averaged = (gradient(2, 0) + gradient(2, 1)) / 2
    torch.testing.assert_close(averaged, gradient(1, 0), atol=1e-7, rtol=1e-5)


# --- training -----------------------------------------------------------------------------------
def test_loss_falls_towards_the_entropy_rate_on_a_markov_stream(tmp_path):
    from lab.data.sources import MarkovSource

    model, data = demo_markov()
    cfg = DEMO_TRAIN.replace(steps=40, eval_interval=20)
    before = estimate_loss(model, data, cfg)
    assert before == pytest.approx(math.log(16), abs=0.1)  # an untrained model is near uniform
    result = train(model, cfg, data, tmp_path, progress=False)
    entropy_rate = MarkovSource(16, order=1, seed=0).entropy_rate()
    assert result.step == 40 and len(result.history) == 40
    assert result.best_val_loss_nats < before - 0.3
    assert result.best_val_loss_nats < entropy_rate + 0.25  # no model can beat the entropy rate by much
    assert result.best_val_loss_nats > entropy_rate - 0.05
    assert not model.training


def test_metrics_jsonl_has_one_parsable_line_per_step(tmp_path):
    model, data = demo_markov()
    result = train(model, SHORT, data, tmp_path, progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records == result.history
    assert [r["step"] for r in records] == list(range(1, 21))
    for r in records:
        assert r["tokens_seen"] == r["step"] * SHORT.batch_size * SHORT.seq_len
        assert r["lr"] == pytest.approx(get_lr(r["step"] - 1, SHORT))
        assert math.isfinite(r["train_loss_nats"]) and r["elapsed_s"] >= 0
        assert ("val_loss_nats" in r) == (r["step"] % 5 == 0)
    assert result.best_val_loss_nats == min(r["val_loss_nats"] for r in records if "val_loss_nats" in r)
    state = json.loads((tmp_path / "checkpoint" / "train_state.json").read_text())
    assert state["step"] == 20 and TrainConfig.from_dict(state["train_config"]) == SHORT
    assert HookedTransformer.load(tmp_path / "checkpoint").cfg == DEMO_MODEL


def test_training_without_a_folder_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, data = demo_markov()
    result = train(model, SHORT.replace(steps=3, warmup_steps=1), data, progress=False)
    assert result.step == 3 and len(result.history) == 3 and list(tmp_path.iterdir()) == []


def test_resuming_gives_the_same_weights_as_an_uninterrupted_run(tmp_path):
    """On the module's one thread, where SHORT's tiny tensors train fastest; resuming at the thread count a user gets,
    and at another, is held at the markov recipe's sizes
    (test_the_same_seed_gives_the_same_bits_at_any_thread_count)."""
    model, data = demo_markov()
    straight = train(model, SHORT, data, tmp_path / "straight", progress=False)
    expected = weights(model)

    interrupted, _ = demo_markov()
    # Step 7 is between evaluations (every 5): stopping there must not add one to the records.
    half = train(interrupted, SHORT, data, tmp_path / "resumed", progress=False, stop_after=7)
    assert half.step == 7
    fresh = HookedTransformer(DEMO_MODEL, seed=123)  # different init: the weights must come from the checkpoint
    resumed = train(fresh, SHORT, data, tmp_path / "resumed", resume=True, progress=False)
    assert resumed.step == 20
    assert max_difference(weights(fresh), expected) <= 1e-7
    assert all(torch.equal(weights(fresh)[k], expected[k]) for k in expected)  # in fact bit-identical

    def timeless(history):
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in history]

    assert timeless(resumed.history) == timeless(straight.history)
    assert resumed.best_val_loss_nats == straight.best_val_loss_nats


# The markov recipe's sizes (models/markov/model.toml: d_model 64, d_mlp 512, batches of 128 × 16 tokens), where
# torch's CPU kernels split their work among threads; at SHORT's sizes every kernel runs on one thread anyway.
RECIPE_MODEL = ModelConfig(
    d_vocab=32, d_model=64, n_layers=2, n_heads=4, d_mlp=512, n_ctx=64, positions="rotary", mlp="gelu"
)
RECIPE_TRAIN = TrainConfig(
    steps=4, batch_size=128, seq_len=16, lr=5e-3, min_lr=5e-4, warmup_steps=2, eval_interval=2, eval_batches=1
)


def test_the_same_seed_gives_the_same_bits_at_any_thread_count(tmp_path, user_threads):
    """At the markov recipe's sizes, training gives the same weights bit for bit twice at the thread count a
    user gets, at one thread, two and three; and a run stopped at the user's count and resumed at another ends
    on the same bits as the uninterrupted one."""
    source = MarkovSource(32, order=2, seed=0)
    data = SequenceBatches(
        torch.from_numpy(source.sample(1024, 16, seed=1)), torch.from_numpy(source.sample(128, 16, seed=2))
    )

    def trained(threads: int, out: Path | None = None, **how) -> dict[str, torch.Tensor]:
        model = HookedTransformer(RECIPE_MODEL, seed=123 if how.get("resume") else 0)
        with torch_threads(threads):
            train(model, RECIPE_TRAIN, data, out, progress=False, **how)
        return weights(model)

    reference = trained(USER_THREADS)
    runs = {f"again at {USER_THREADS}": trained(USER_THREADS)}
    runs |= {f"at {n}": trained(n) for n in (1, 2, 3) if n != USER_THREADS}
    other = 1 if USER_THREADS > 1 else 2
    trained(USER_THREADS, tmp_path, stop_after=2)
    runs[f"stopped at step 2 at {USER_THREADS}, resumed at {other}"] = trained(other, tmp_path, resume=True)
    differing = {run: [k for k in reference if not torch.equal(w[k], reference[k])] for run, w in runs.items()}
    assert not any(differing.values()), "; ".join(
        f"{run}: {len(names)} tensors differ ({', '.join(names[:3])}, …)" for run, names in differing.items() if names
    )


class OpsAtThreadCounts:
    """A dispatch mode that runs every aten op once more at each other thread count of `counts`, on copies of its
    inputs, and records in `differing` the ops whose results (or, for an in-place op, whose changed inputs)
    differ from those at `counts[0]`: op name → the largest |Δ| seen."""

    UNINITIALISED = ("empty", "new_empty", "empty_like", "new_empty_strided", "empty_strided")

    def __init__(self, counts: tuple[int, ...]):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves, tree_map

        self.differing: dict[str, float] = {}
        self.seen: set[str] = set()
        outer = self

        def tensors(tree) -> list[torch.Tensor]:
            return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = func.overloadpacket.__name__
                outer.seen.add(name)
                others = []
                for n in counts[1:]:
                    copies = tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, (args, kwargs))
                    with torch_threads(n):
                        others.append(tensors((func(*copies[0], **copies[1]), copies)))
                with torch_threads(counts[0]):
                    out = func(*args, **kwargs)
                if name not in outer.UNINITIALISED:
                    first = tensors((out, (args, kwargs)))
                    for other in others:
                        for a, b in zip(first, other):
                            if a.shape == b.shape and not torch.equal(a, b):
                                delta = (a - b).abs().max().item()
                                outer.differing[name] = max(outer.differing.get(name, 0.0), delta)
                return out

        self.mode = Mode()


@pytest.mark.parametrize("recipe", ["markov", "facts", "pydoc", "dates"])
def test_every_op_of_a_training_step_gives_the_same_bits_at_one_two_and_three_threads(recipe):
    """Each zoo recipe's model (its default [model] table, its [train] batch) through one training step —
    forward, loss, backward, gradient clip, AdamW — with every op run at one, two and three threads on the same
    inputs: none differs in a single bit. (Indexing's backward and LayerNorm's fused backward did, which is why
    the embedding is F.embedding and LayerNorm's gain and bias stand outside the fused kernel in training.)"""
    from lab.model.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
    from lab.train.loop import make_optimizer, summed_loss
    from lab.zoo.recipes import load_recipe

    tables = load_recipe(recipe)
    table = dict(tables["model"])
    cfg = TrainConfig.from_dict({"seq_len": table["n_ctx"]} | tables["train"])
    generator = torch.Generator().manual_seed(0)
    if table.pop("kind", "decoder_only") == "encoder_decoder":
        model = EncoderDecoder(EncoderDecoderConfig.from_dict(table | {"d_vocab_src": 64, "d_vocab_tgt": 16}), seed=0)
        tokens = torch.randint(0, 16, (cfg.batch_size, 12), generator=generator)
        inputs = (torch.randint(0, 64, (cfg.batch_size, 9), generator=generator), tokens)
    else:
        vocab = {"markov": 32, "facts": 367, "pydoc": 4096}[recipe]  # as each default build's vocabulary
        model = HookedTransformer(ModelConfig.from_dict(table | {"d_vocab": vocab}), seed=0)
        tokens = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len), generator=generator)
        inputs = (tokens,)
    optimizer = make_optimizer(model.train(), cfg)
    checked = OpsAtThreadCounts((1, 2, 3))
    with checked.mode:
        summed_loss(model(*inputs), tokens[:, 1:]).div(tokens[:, 1:].numel()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
    assert {"mm", "native_layer_norm_backward" if recipe != "pydoc" else "mul", "_foreach_mul_"} <= checked.seen, (
        checked.seen
    )
    assert checked.differing == {}


@pytest.mark.parametrize("d_model", [64, 100])
def test_layer_norm_gives_the_same_bits_whether_or_not_its_gain_and_bias_take_gradients(d_model):
    """While its gain and bias take gradients LayerNorm applies them outside the fused kernel; the forward is the
    fused kernel's with them inside, bit for bit (so training and evaluation compute one function)."""
    from lab.model.norms import LayerNorm

    norm = LayerNorm(ModelConfig(d_vocab=8, d_model=d_model, n_layers=1, n_heads=4 if d_model == 64 else 5, n_ctx=16))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.w.copy_(1 + torch.randn(d_model, generator=generator))
        norm.b.copy_(torch.randn(d_model, generator=generator))
    x = 3 * torch.randn(128, 16, d_model, generator=generator) + 1
    trained = norm(x)
    assert trained.grad_fn is not None and "addcmul" in type(trained.grad_fn).__name__.lower()
    with torch.no_grad():
        assert torch.equal(trained, norm(x))


def test_resuming_with_another_config_names_each_difference(tmp_path):
    model, data = demo_markov()
    cfg = SHORT.replace(lr=1e-3, min_lr=1e-4)
    train(model, cfg, data, tmp_path, progress=False, stop_after=3)
    with pytest.raises(
        ValueError,
        match=r"resume: the checkpoint in .* was made with other settings: config differs in lr "
        r"\(checkpoint 0\.001, now 0\.002\)",
    ):
        train(model, cfg.replace(lr=2e-3), data, tmp_path, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"seed \(checkpoint 0, now 1\)"):
        train(model, cfg.replace(lr=2e-3, seed=1), data, tmp_path, resume=True, progress=False)
    relu = HookedTransformer(DEMO_MODEL.replace(mlp="relu"))
    with pytest.raises(ValueError, match=r"model config differs in mlp \(checkpoint 'gelu', now 'relu'\)"):
        train(relu, cfg, data, tmp_path, resume=True, progress=False)


def test_a_missing_or_damaged_checkpoint_is_a_clear_error(tmp_path):
    model, data = demo_markov()
    with pytest.raises(FileNotFoundError, match="no checkpoint at .* to resume from"):
        train(model, SHORT, data, tmp_path / "empty", resume=True, progress=False)
    with pytest.raises(ValueError, match="resume=True needs the out_dir"):
        train(model, SHORT, data, None, resume=True, progress=False)
    train(model, SHORT, data, tmp_path / "run", progress=False, stop_after=2)
    checkpoint = tmp_path / "run" / "checkpoint"
    files = {name: (checkpoint / name).read_bytes() for name in lab.train.checkpoint.CHECKPOINT_FILES}

    def damaged(name: str, content: bytes | None):
        for n, data_ in files.items():
            (checkpoint / n).write_bytes(data_)
        if content is None:
            (checkpoint / name).unlink()
        else:
            (checkpoint / name).write_bytes(content)
        return lambda: train(demo_markov()[0], SHORT, data, tmp_path / "run", resume=True, progress=False)

    with pytest.raises(FileNotFoundError, match="incomplete: missing optimizer.safetensors"):
        damaged("optimizer.safetensors", None)()
    with pytest.raises(ValueError, match="malformed or truncated checkpoint file .*optimizer.safetensors"):
        damaged("optimizer.safetensors", files["optimizer.safetensors"][:100])()
    with pytest.raises(ValueError, match="malformed or truncated checkpoint file .*model.safetensors"):
        damaged("model.safetensors", files["model.safetensors"][:-64])()
    with pytest.raises(ValueError, match="malformed JSON in .*train_state.json, line 1 column 11"):
        damaged("train_state.json", b'{"step": 2')()
    with pytest.raises(ValueError, match=r"missing \['best_val_loss_nats'"):
        damaged("train_state.json", b'{"step": 2}')()
    damaged("train_state.json", files["train_state.json"])()  # intact again: resumes


def test_a_checkpoint_whose_values_are_wrong_is_refused_naming_its_file_and_nothing_is_loaded(tmp_path):
    """Files that parse but hold what no save writes: each one line naming the file (not a KeyError, TypeError or
    RuntimeError from deep inside torch), and the model is left as it was."""
    from safetensors.torch import save_file

    model, data = demo_markov()
    train(model, SHORT, data, tmp_path / "run", progress=False, stop_after=2)
    checkpoint = tmp_path / "run" / "checkpoint"
    files = {name: (checkpoint / name).read_bytes() for name in lab.train.checkpoint.CHECKPOINT_FILES}
    state = json.loads(files["train_state.json"])
    optimizer = load_file(str(checkpoint / "optimizer.safetensors"))
    nan = dict(optimizer, **{"0.exp_avg": torch.full_like(optimizer["0.exp_avg"], math.nan)})
    cases = {
        "train_state.json": [
            (json.dumps(state | {"step": "2"}), r"step '2' is not one of the run's 0 … 20 steps"),
            (json.dumps(state | {"step": 21}), r"step 21 is not one of the run's 0 … 20 steps"),
            (json.dumps(state | {"elapsed_s": None}), r"elapsed_s None is not a number ≥ 0"),
            (json.dumps(state | {"train_config": []}), r"train_config is not an object"),
            ("[" * 5000 + "]" * 5000, r"nests deeper than 64 levels"),
        ],
        "rng_state.safetensors": [({"torch_cpu": torch.zeros(7, dtype=torch.uint8)}, r"no 'torch_cpu' RNG state")],
        "optimizer.safetensors": [(nan, r"0.exp_avg holds values that are not finite")],
    }
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for name, changes in cases.items():
        for content, said in changes:
            for n, data_ in files.items():
                (checkpoint / n).write_bytes(data_)
            if isinstance(content, dict):
                save_file(content, str(checkpoint / name))
            else:
                (checkpoint / name).write_text(content)
            with pytest.raises(ValueError, match=re.escape(str(checkpoint / name)) + ".*" + said):
                train(model, SHORT, data, tmp_path / "run", resume=True, progress=False)
            assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), (name, said)


def test_a_crash_while_checkpointing_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    model, data = demo_markov()
    cfg = SHORT.replace(steps=10, checkpoint_interval=5)
    calls = []
    real = lab.train.checkpoint._rng_tensors

    def crash_on_second_save():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run is killed halfway through writing checkpoint 2
        return real()

    monkeypatch.setattr(lab.train.checkpoint, "_rng_tensors", crash_on_second_save)
    with pytest.raises(KeyboardInterrupt):
        train(model, cfg, data, tmp_path, progress=False)
    monkeypatch.undo()
    assert json.loads((tmp_path / "checkpoint" / "train_state.json").read_text())["step"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "metrics.jsonl"]  # no half folder

    # A crash between moving the old checkpoint aside and renaming the new one in: the old one is used.
    (tmp_path / "checkpoint").rename(tmp_path / ".checkpoint.old")
    result = train(demo_markov()[0], cfg, data, tmp_path, resume=True, progress=False)
    assert result.step == 10 and [r["step"] for r in result.history] == list(range(1, 11))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 11))  # steps 6..10 not doubled
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "metrics.jsonl"]


class SignalWhileDrawing:
    """The batches of `data`, with `signum` sent to this process while training batch `index` is drawn
    (that is, during step index + 1), as a Ctrl-C or a `kill -TERM` would arrive."""

    def __init__(self, data, signum: int, index: int) -> None:
        self.data, self.signum, self.index = data, signum, index

    def get_batch(self, split, index, batch_size, seq_len, seed):
        if split == "train" and index == self.index:
            os.kill(os.getpid(), self.signum)
        return self.data.get_batch(split, index, batch_size, seq_len, seed)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_training_after_the_step_in_flight_with_a_checkpoint(tmp_path, signum):
    model, data = demo_markov()
    train(model, SHORT, data, tmp_path / "straight", progress=False)
    expected = weights(model)
    handler = signal.getsignal(signum)
    with pytest.raises(TrainingInterrupted) as stop:
        train(demo_markov()[0], SHORT, SignalWhileDrawing(data, signum, 6), tmp_path / "run", progress=False)
    assert (stop.value.signum, stop.value.step) == (signum, 7)
    assert str(stop.value) == (
        f"interrupted by {signal.Signals(signum).name} at step 7/20; "
        f"checkpoint saved in {tmp_path / 'run' / 'checkpoint'}"
    )
    assert json.loads((tmp_path / "run" / "checkpoint" / "train_state.json").read_text())["step"] == 7
    assert signal.getsignal(signum) is handler  # the caller's handler is back
    resumed = demo_markov()[0]
    train(resumed, SHORT, data, tmp_path / "run", resume=True, progress=False)
    assert all(torch.equal(weights(resumed)[k], expected[k]) for k in expected)


def test_a_diverging_run_names_the_step_and_lr_and_keeps_the_checkpoint_from_before(tmp_path):
    model, data = demo_markov()
    cfg = SHORT.replace(lr=1e30, min_lr=0.0, checkpoint_interval=1)  # the first update overflows the weights
    with pytest.raises(
        TrainingDiverged,
        match=r"^training diverged at step \d+: train loss is (nan|inf) "
        r"\(lr [\d.e+]+\); try a lower lr or a tighter grad_clip; the checkpoint of step \d+ "
        r"is kept in .*checkpoint$",
    ) as diverged:
        train(model, cfg, data, tmp_path, progress=False)
    step, kept = map(int, re.findall(r"step (\d+)", str(diverged.value)))
    assert kept == step - 1 >= 1
    state = json.loads((tmp_path / "checkpoint" / "train_state.json").read_text())
    assert state["step"] == kept and math.isfinite(state["train_loss_nats"])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, step))  # nothing of the diverged step is written


def test_checkpoints_come_every_n_steps_and_every_so_many_seconds(tmp_path, monkeypatch):
    model, data = demo_markov()
    saved = []
    real = lab.train.checkpoint.save_checkpoint
    monkeypatch.setattr(lab.train.loop, "save_checkpoint", lambda *args: saved.append(args[-1].step) or real(*args))
    for cfg, steps in [
        (SHORT.replace(checkpoint_interval=6, checkpoint_every_s=0), [6, 12, 18, 20]),
        (SHORT.replace(checkpoint_every_s=1e-9), list(range(1, 21))),  # every step is "due"
        (SHORT.replace(checkpoint_every_s=0), [20]),
    ]:
        saved.clear()
        train(model, cfg, data, tmp_path, progress=False)
        assert saved == steps, cfg
    # How often to save does not shape the run: a resumption may change it (and the device).
    train(model, SHORT.replace(checkpoint_interval=4), data, tmp_path, progress=False, stop_after=8)
    assert train(model, SHORT.replace(checkpoint_every_s=5.0), data, tmp_path, resume=True, progress=False).step == 20


def test_a_fresh_start_replaces_an_earlier_run(tmp_path):
    model, data = demo_markov()
    train(model, SHORT.replace(steps=6, warmup_steps=1), data, tmp_path, progress=False)
    result = train(demo_markov()[0], SHORT.replace(steps=3, warmup_steps=1), data, tmp_path, progress=False)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3 == result.step
    assert json.loads((tmp_path / "checkpoint" / "train_state.json").read_text())["step"] == 3


def test_bad_runs_are_refused_before_training(tmp_path):
    model, data = demo_markov()
    with pytest.raises(ValueError, match="seq_len = 128 is longer than the model's n_ctx = 64"):
        train(model, SHORT.replace(seq_len=128), data, progress=False)
    with pytest.raises(TypeError, match="get_batch"):
        train(model, SHORT, [[1, 2, 3]], progress=False)
    with pytest.raises(ValueError, match="stop_after"):
        train(model, SHORT, data, progress=False, stop_after=21)

    class Wrong:
        def get_batch(self, split, index, batch_size, seq_len, seed):
            tokens = torch.zeros(batch_size, seq_len + 1, dtype=torch.long)
            return Batch(tokens, tokens[:, 1:])

    with pytest.raises(ValueError, match=r"Wrong.get_batch gave tokens \(8, 17\)"):
        train(model, SHORT, Wrong(), progress=False)


# --- DDP ----------------------------------------------------------------------------------------
def demo_argv(code: str) -> list[str]:
    """The arguments of `python -m lab.train` in a shell command `torchrun … -m lab.train ARGS`."""
    words = code.replace("\\\n", " ").split()
    return words[words.index("lab.train") + 1 :]


def demo_config(argv: list[str]) -> TrainConfig:
    """The TrainConfig that `python -m lab.train --demo-markov ARGV` trains with: DEMO_TRAIN with the fields
    ARGV sets (one flag per field, as lab/train/entry.py::main makes them)."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {}
    for flag, value in zip(argv, argv[1:] + [""]):
        name = flag.removeprefix("--").replace("-", "_")
        if flag.startswith("--") and name in fields:
            given[name] = type(getattr(DEMO_TRAIN, name))(value)
    return DEMO_TRAIN.replace(**given)


def test_two_ranks_under_torchrun_match_one_process(torchrun_demo, tmp_path):
    """docs/torchrun.md's two-rank launch (tests/conftest.py::torchrun_demo, the launch the page's example reads)
    against the same training in this process."""
    folder, code, done = torchrun_demo
    argv = demo_argv(code)
    assert "--demo-markov" in argv and "--save-rank-weights" in argv and "--resume" not in argv, argv
    cfg = demo_config(argv)
    out = folder / argv[argv.index("--out") + 1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["world_size"] == 2
    rank0, rank1 = (load_file(str(out / f"rank{r}.safetensors")) for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)  # DDP keeps the replicas identical

    model, data = demo_markov()
    single = train(model, cfg, data, tmp_path / "single", progress=False)
    assert max_difference(rank0, weights(model)) <= 1e-5
    assert max_difference(weights(model), weights(demo_markov()[0])) > 1e-3  # and training did move them
    ddp_history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ddp_history] == list(range(1, cfg.steps + 1))  # only rank 0 writes
    assert len(single.history) == cfg.steps >= 2
    for a, b in zip(ddp_history, single.history):
        assert a["train_loss_nats"] == pytest.approx(b["train_loss_nats"], abs=1e-5)
    assert HookedTransformer.load(out).cfg == DEMO_MODEL


def test_pad_documents_pads_at_the_end_and_masks_what_a_loss_reads():
    from lab.train.batches import pad_documents

    ids, mask = pad_documents([[5, 6, 7], [8]], pad_id=0, length=4)
    assert ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert mask.tolist() == [[True, True, True, False], [True, False, False, False]]
    _, scored = pad_documents([[5, 6, 7], [8]], 0, 4, scored=[[False, True, True], [True]])
    assert scored.tolist() == [[False, True, True, False], [True, False, False, False]]
    with pytest.raises(ValueError, match="a document is 5 tokens, longer than the training seq_len = 4"):
        pad_documents([[1] * 5], 0, 4)
