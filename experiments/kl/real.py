"""The KL decomposition on a pretrained language model (the real-model track, runs/kl_real/): text from a world
whose law is known, the model's cross-entropy split exactly into H(p) + KL(p ‖ P_θ), before and while it is
fine-tuned on that world.

The world is a first-order Markov chain over eight colour words (config.REAL_WORDS, REAL_WORLD), rendered as text
(" red blue blue gray …"). Each word is exactly one token of the model's vocabulary after a space, and a rendered
sequence encodes as its words' tokens one for one (`word_ids` and `check_rendering` refuse a tokenizer for which
either fails), so the model's next-token distribution P_θ(·|x_<t) over its whole vocabulary is a law on the
same outcomes as the chain's row p(·|x_<t), which is zero off the eight words. Per position, over the full
vocabulary (docs/definitions.md §1):

    CE_t = −Σ_x p(x) log P_θ(x) = H(p) + KL(p ‖ P_θ),

with p's zeros contributing nothing to either side: P_θ's mass off the words is not lost, it is what makes
Σ_{x∈words} P_θ(x) < 1 and so raises KL through −log P_θ(x) on the words. The run measures CE_t from the
model's log-softmax (torch's cross-entropy with probability targets), H_t and KL_t with lab.metrics.information
(KL against the softmax), all in float64 from the model's logits, and reports the largest |CE_t − H_t − KL_t|
over every held-out position: the identity holds to round-off when it is below IDENTITY_TOLERANCE_NATS. The
sampled checks of the toy track (experiments.kl.measure.summarise) come with it: the mean −log P_θ at the word
that came against the exact CE.

Each sequence starts with the model's document separator (`start_token`: SmolLM2 was pretrained on documents
joined by <|endoftext|>, so a document begins after it); the prediction made there is of the first word, whose
law is the chain's stationary π. Held-out sequences are an independent draw from the training sequences.

Fine-tuning (`finetune`) trains the last `trained_blocks` blocks, the final norm and the unembedding with
lab.train.loop.train (the embedding and every earlier block frozen), on fresh sequences, stopping at log-spaced
steps to measure; the checkpoints live in the run folder (finetune/), with the measurements made so far
(finetune/curve.json), so a run interrupted and started again on the same folder (`--out`) continues to the
same bits. Artefacts: results.json, the figure kl_real (plotly .json + offline .html).
"""

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from experiments import peak_rss_gb
from experiments.kl.config import FAMILY_Z, REAL_WORDS, REAL_WORLD, RealProfile, sample_seed
from experiments.kl.measure import Decomposition, summarise
from experiments.kl.training import log_spaced_steps
from lab.data.sources import MarkovSource
from lab.files import atomic_write_text
from lab.metrics.discrimination import bootstrap_ci
from lab.metrics.information import entropy, kl
from lab.metrics.statistics import sign
from lab.model.transformer import HookedTransformer
from lab.outside_files import read_json_object
from lab.progress import bar
from lab.runs import headline, save_figure
from lab.train.batches import SequenceBatches
from lab.train.checkpoint import CHECKPOINT_DIR, STATE_FILE, find_checkpoint, has_checkpoint, remove_checkpoints
from lab.train.config import TrainConfig
from lab.train.loop import train

IDENTITY_TOLERANCE_NATS = 1e-9  # float64 round-off on sums of ≈ 50k terms of size ≤ 30 nats is ≈ 1e-12
START_TOKEN = "<|endoftext|>"  # SmolLM2's document separator in pretraining: a document starts after it
MODEL_LABEL = {"smollm2": "SmolLM2-135M-Instruct, 4-bit GGUF dequantized"}
N_BOOT = 1000
REAL_FIGURE = "kl_real"


def word_ids(tokenizer: Any, words: tuple[str, ...] = REAL_WORDS) -> list[int]:
    """Each word's one token id; a ValueError naming the first word that is not one token, or that merges with a
    neighbour (every ordered pair must encode as its two tokens). The start token is placed by id, never as text."""
    ids = []
    for word in words:
        encoded = tokenizer.encode(word, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"the word {word!r} is {len(encoded)} tokens of this tokenizer, not one")
        ids.append(encoded[0])
    if len(set(ids)) != len(ids):
        raise ValueError("two words share a token")
    for a, first in zip(words, ids, strict=True):
        for b, second in zip(words, ids, strict=True):
            if tokenizer.encode(a + b, add_special_tokens=False) != [first, second]:
                raise ValueError(f"the words {a!r} and {b!r} do not encode as their two tokens when they meet")
    return ids


def start_token(tokenizer: Any) -> int:
    """The id of START_TOKEN, the token every sequence starts with; a ValueError if the tokenizer has none."""
    token = tokenizer.convert_tokens_to_ids(START_TOKEN)
    if not isinstance(token, int) or tokenizer.convert_ids_to_tokens(token) != START_TOKEN:
        raise ValueError(f"the tokenizer has no {START_TOKEN} token to start a document with")
    return token


def render(words: Int[Tensor, "seq pos"]) -> list[str]:
    """The chain's sequences as text: each symbol its word, joined as written."""
    return ["".join(REAL_WORDS[int(w)] for w in row) for row in words]


def check_rendering(tokenizer: Any, words: Int[Tensor, "seq pos"], ids: list[int]) -> None:
    """A ValueError unless every rendered sequence encodes as its words' tokens, one for one."""
    table = torch.tensor(ids)
    for text, row in zip(render(words), words, strict=True):
        if tokenizer.encode(text, add_special_tokens=False) != table[row].tolist():
            raise ValueError(f"the text {text[:60]!r}… does not encode as its words' tokens")


def world() -> MarkovSource:
    return MarkovSource(REAL_WORLD["vocab_size"], REAL_WORLD["order"], REAL_WORLD["concentration"], REAL_WORLD["seed"])


def word_laws(source: MarkovSource, words: Int[Tensor, "seq pos"]) -> Float[Tensor, "seq pos vocab"]:
    """p(word t | words < t) for every word t of each sequence (the first under π), float64, over the words."""
    first = torch.from_numpy(source.initial_distribution()).expand(words.shape[0], 1, -1)
    rest = torch.from_numpy(source.conditionals(words.numpy())[:, :-1])
    return torch.cat([first, rest], dim=1)


def model_tokens(words: Int[Tensor, "seq pos"], ids: list[int], start: int) -> Int[Tensor, "seq pos+1"]:
    """The model's input: the start token, then each word's token."""
    return torch.cat([torch.full((words.shape[0], 1), start), torch.tensor(ids)[words]], dim=1)


def decompose_chunk(
    logits: Float[Tensor, "seq pos vocab"],
    p_words: Float[Tensor, "seq pos words"],
    words: Int[Tensor, "seq pos"],
    ids: list[int],
) -> tuple[Decomposition, Float[Tensor, "seq pos"], Float[Tensor, "seq pos"]]:
    """The decomposition at every position over the full vocabulary, float64: (terms, CE_t − H_t − KL_t with CE_t
    from the log-softmax, P_θ's mass on the words)."""
    logits = logits.double()
    index = torch.tensor(ids)
    p = torch.zeros_like(logits)
    p[..., index] = p_words
    q = torch.softmax(logits, dim=-1)
    h, divergence = entropy(p), kl(p, q)
    ce = F.cross_entropy(logits.flatten(0, 1), p.flatten(0, 1), reduction="none").view(h.shape)
    log_q = torch.log_softmax(logits, dim=-1)
    target = index[words][..., None]
    terms = Decomposition(
        entropy=h,
        kl=divergence,
        cross_entropy=ce,
        nll_model=-log_q.gather(-1, target)[..., 0],
        nll_true=-p_words.gather(-1, words[..., None])[..., 0].log(),
    )
    return terms, ce - h - divergence, q[..., index].sum(dim=-1)


class RealHeldOut:
    """Held-out sequences of the world: the words, their laws p(word t | words < t) and the model's input tokens."""

    def __init__(self, source: MarkovSource, n: int, length: int, seed: int, ids: list[int], start: int) -> None:
        self.words = torch.from_numpy(source.sample(n, length, seed=seed))
        self.p = word_laws(source, self.words)
        self.ids = ids
        self.tokens = model_tokens(self.words, ids, start)


@torch.inference_mode()
def measure_real(model: HookedTransformer, held: RealHeldOut, batch: int = 8) -> dict[str, Any]:
    """The decomposition on every held-out position: the toy track's summary (exact H, KL, CE with standard errors
    over sequences, and the sampled checks), the identity's largest residual, the mean mass P_θ puts on the words,
    and the per-sequence mean KL (for bootstrap intervals)."""
    model.eval()
    parts, residuals, on_words = [], [], []
    for i in range(0, len(held.tokens), batch):
        logits = model(held.tokens[i : i + batch])[:, :-1]
        terms, residual, mass = decompose_chunk(logits, held.p[i : i + batch], held.words[i : i + batch], held.ids)
        parts.append(terms)
        residuals.append(residual)
        on_words.append(mass)
    terms = Decomposition(*(torch.cat([getattr(d, f) for d in parts]) for f in Decomposition.__dataclass_fields__))
    residual = torch.cat(residuals)
    return summarise(terms) | {
        "identity_max_abs_residual_nats": float(residual.abs().max()),
        "mass_on_words": float(torch.cat(on_words).mean()),
        "kl_per_sequence": terms.kl.mean(dim=1).tolist(),
    }


def identity_check(rows: list[dict[str, Any]], tolerance: float = IDENTITY_TOLERANCE_NATS) -> dict[str, Any]:
    """CE_t = H_t + KL_t at every held-out position of every measurement, to round-off."""
    worst = max(r["identity_max_abs_residual_nats"] for r in rows)
    return {"max_abs_residual_nats": worst, "tolerance_nats": tolerance, "holds": bool(worst <= tolerance)}


def kl_change(before: list[float], after: list[float], seed: int) -> dict[str, Any]:
    """KL before and after fine-tuning with bootstrap 95% intervals over held-out sequences, and their paired
    difference (the same sequences measured twice)."""
    a, b = np.asarray(before), np.asarray(after)
    first, last = bootstrap_ci(np.mean, a, n_boot=N_BOOT, seed=seed), bootstrap_ci(np.mean, b, n_boot=N_BOOT, seed=seed)
    change = bootstrap_ci(np.mean, b - a, n_boot=N_BOOT, seed=seed)
    return first.fields("kl_before_nats") | last.fields("kl_after_nats") | change.fields("kl_change_nats")


def freeze_all_but(model: HookedTransformer, trained_blocks: int) -> list[str]:
    """Leave only the last `trained_blocks` blocks, the final norm and the unembedding trainable; their names."""
    n = model.cfg.n_layers
    if not 1 <= trained_blocks <= n:
        raise ValueError(f"trained_blocks must lie in [1, {n}], got {trained_blocks}")
    keep = tuple(f"blocks.{i}." for i in range(n - trained_blocks, n)) + ("ln_final.", "unembed.")
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith(keep))
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def finetune_data(profile: RealProfile, seed: int, ids: list[int], start: int) -> tuple[TrainConfig, SequenceBatches]:
    """The schedule and its fresh sequences: one per batch row of every step, never repeated."""
    source, length = world(), profile.words_per_sequence
    cfg = TrainConfig(
        steps=profile.steps,
        batch_size=profile.batch_size,
        seq_len=length + 1,
        lr=profile.lr,
        min_lr=profile.min_lr,
        warmup_steps=profile.warmup_steps,
        eval_interval=profile.steps,
        eval_batches=1,
        # A checkpoint is the whole model (0.6 GB) with the optimizer's state: written at each measurement point and
        # on SIGINT/SIGTERM (lab.train), not on a timer as well.
        checkpoint_every_s=0.0,
        seed=seed,
    )
    train_words = source.sample(profile.steps * profile.batch_size, length, seed=sample_seed(seed, "real-train"))
    val_words = source.sample(profile.batch_size, length, seed=sample_seed(seed, "real-val"))
    return cfg, SequenceBatches(
        model_tokens(torch.from_numpy(train_words), ids, start), model_tokens(torch.from_numpy(val_words), ids, start)
    )


def read_curve(workdir: Path) -> list[dict[str, Any]]:
    """The measurements an earlier attempt on this folder finished: all of them once it marked the curve done,
    else those its newest checkpoint reaches (the one before fine-tuning only, with no checkpoint)."""
    path = workdir / "curve.json"
    if not path.is_file():
        return []
    curve = read_json_object(path, workdir)
    if curve["done"]:
        return curve["rows"]
    return [row for row in curve["rows"] if row["step"] <= checkpoint_step(workdir)]


def checkpoint_step(workdir: Path) -> int:
    """The step of the newest checkpoint in `workdir` (lab.train's), 0 without one."""
    if not has_checkpoint(workdir / CHECKPOINT_DIR):
        return 0
    folder = find_checkpoint(workdir / CHECKPOINT_DIR)
    return int(read_json_object(folder / STATE_FILE, folder)["step"])


def write_curve(workdir: Path, rows: list[dict[str, Any]], done: bool) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(workdir / "curve.json", json.dumps({"done": done, "rows": rows}) + "\n")


def finetune(
    model: HookedTransformer, held: RealHeldOut, profile: RealProfile, seed: int, start: int, workdir: Path
) -> list[dict[str, Any]]:
    """The measurement before fine-tuning (step 0) and at log-spaced steps of it, continuing what an earlier
    attempt on `workdir` left (its checkpoint and curve.json)."""
    cfg, data = finetune_data(profile, seed, held.ids, start)
    per_step = profile.batch_size * profile.words_per_sequence  # predicted words: one per word of each sequence
    rows = read_curve(workdir)
    if not rows:
        rows = [{"step": 0, "tokens_seen": 0, **measure_real(model, held)}]
        write_curve(workdir, rows, done=False)
    with bar(profile.steps, "fine-tune", initial=rows[-1]["step"]) as counter:
        for step in sorted(set(log_spaced_steps(profile.steps, profile.n_checkpoints)) | {profile.steps}):
            if step <= rows[-1]["step"]:
                continue
            resume = checkpoint_step(workdir) > 0
            train(model, cfg, data, out_dir=workdir, resume=resume, progress=False, stop_after=step)
            rows.append({"step": step, "tokens_seen": step * per_step, **measure_real(model, held)})
            write_curve(workdir, rows, done=False)
            counter.update(step - rows[-2]["step"])
            counter.set_postfix(kl=f"{rows[-1]['kl_nats']:.3f}")
    write_curve(workdir, rows, done=True)
    return rows


def load_real(name: str) -> HookedTransformer:
    """The pretrained model, once its tokenizer renders the world's words as single tokens (a ValueError else)."""
    model = HookedTransformer.from_pretrained(name).eval()
    if model.tokenizer is None:
        raise ValueError(f"the model {name!r} has no tokenizer to render the world's words with")
    word_ids(model.tokenizer)
    start_token(model.tokenizer)
    return model


def run_real(model: HookedTransformer, name: str, profile: RealProfile, seed: int, out: Path) -> dict[str, Any]:
    """The real-model track into `out`: the decomposition before fine-tuning and along it, the identity's check,
    KL before and after with bootstrap intervals, the figure and the headlines (results.json's dict)."""
    clock, load = time.perf_counter(), os.getloadavg()[0]  # the time below is this machine's, at this load
    tokenizer = model.tokenizer
    ids, start = word_ids(tokenizer), start_token(tokenizer)
    source = world()
    held = RealHeldOut(
        source, profile.eval_sequences, profile.words_per_sequence, sample_seed(seed, "real-eval"), ids, start
    )
    check_rendering(tokenizer, held.words, ids)
    trained = freeze_all_but(model, profile.trained_blocks)
    rows = finetune(model, held, profile, seed, start, out / "finetune")
    remove_checkpoints(
        out / "finetune" / CHECKPOINT_DIR
    )  # 0.6 GB of weights and optimizer state: the curve is in curve.json
    results: dict[str, Any] = {
        "model": name,
        "model_label": MODEL_LABEL.get(Path(name).name, name),  # a zoo name or its folder
        "world": REAL_WORLD
        | {
            "words": list(REAL_WORDS),
            "word_token_ids": ids,
            "start_token": START_TOKEN,
            "entropy_rate_nats": source.entropy_rate(),
            "words_per_sequence": profile.words_per_sequence,
            "eval_sequences": profile.eval_sequences,
        },
        "trained_parameters": {
            "names": trained,
            "count": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "frozen_count": sum(p.numel() for p in model.parameters() if not p.requires_grad),
        },
        "checkpoints": rows,
        "identity": identity_check(rows),
        "kl_change": kl_change(rows[0]["kl_per_sequence"], rows[-1]["kl_per_sequence"], seed),
        "peak_rss_gb": peak_rss_gb(),
        "profile": dataclasses.asdict(profile),
    }
    results["headlines"] = real_headlines(results)
    results["figures"] = [write_real_figure(out, results)]
    results["seconds"] = {"total": time.perf_counter() - clock}
    results["load_average_1min_at_start"] = load
    return results


def real_headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The real-model track's claims: the identity to round-off, KL's change over fine-tuning (bootstrap 95%
    intervals over held-out sequences), and the sampled CE against the exact one at every measurement."""
    identity, change, rows = results["identity"], results["kl_change"], results["checkpoints"]
    positions = rows[0]["prefixes"]
    text = (
        f"On {results['model_label']}, CE = H(p) + KL(p ‖ P_θ) at each of {positions} held-out positions at "
        f"{len(rows)} points of fine-tuning: the largest |CE − H − KL| is {identity['max_abs_residual_nats']:.2e} "
        f"nats (round-off: ≤ {identity['tolerance_nats']:.0e})."
    )
    out = [headline("kl_identity", text, identity["max_abs_residual_nats"], None, 0)]
    if not identity["holds"]:
        out[0] = headline(
            "kl_identity",
            text,
            identity["max_abs_residual_nats"],
            None,
            0,
            False,
            text[:-1] + ": above round-off, so the identity fails here",
        )
    before, after, delta = change["kl_before_nats"], change["kl_after_nats"], change["kl_change_nats"]
    interval = change["kl_change_nats_ci95"]
    fall = (
        f"Fine-tuning on {rows[-1]['tokens_seen']:,} words of the chain moves KL(p ‖ P_θ) from {before:.3f} "
        f"(95% {_interval(change['kl_before_nats_ci95'])}) to {after:.3f} "
        f"(95% {_interval(change['kl_after_nats_ci95'])}) nats/word, "
        f"a change of {delta:+.3f} (95% {_interval(interval)})."
    )
    if interval is None or interval[0] <= 0 <= interval[1]:
        out.append(
            headline("kl_falls_finetuning", fall, after, interval, 0, False, fall[:-1] + ": the interval includes 0")
        )
    else:
        out.append(headline("kl_falls_finetuning", fall, after, interval, sign(delta)))
    worst = max(abs(r["sampled_ce_minus_exact_in_se"]) for r in rows)
    sampled = (
        f"The sampled CE (−log P_θ at the word that came) meets the exact CE within {worst:.2f} standard errors at "
        f"every measurement (limit {FAMILY_Z:g})."
    )
    out.append(
        headline(
            "kl_sampled_meets_exact", sampled, worst, None, 0, worst <= FAMILY_Z, sampled[:-1] + ": beyond the limit"
        )
    )
    return out


def _interval(pair: list[float] | None) -> str:
    return "no interval" if pair is None else f"[{pair[0]:.3f}, {pair[1]:.3f}]"


def real_figure(results: dict[str, Any]) -> Any:
    """KL(p ‖ P_θ), H and CE on the held-out text against fine-tuning tokens (error bars: 1.96 standard errors over
    the held-out sequences)."""
    import plotly.graph_objects as go

    rows = results["checkpoints"]
    tokens = [r["tokens_seen"] for r in rows]
    figure = go.Figure()
    for key, name, se in (
        ("kl_nats", "KL(p ‖ P_θ)", "kl_se"),
        ("entropy_nats", "H(p)", "entropy_se"),
        ("cross_entropy_nats", "CE = H + KL", None),
    ):
        error = None if se is None else {"type": "data", "array": [1.96 * r[se] for r in rows]}
        figure.add_trace(go.Scatter(x=tokens, y=[r[key] for r in rows], name=name, mode="lines+markers", error_y=error))
    world = results["world"]
    figure.update_layout(
        title=f"{results['model_label']}, a Markov chain over {len(world['words'])} words: KL over fine-tuning",
        xaxis_title="fine-tuning tokens (words predicted)",
        yaxis_title="nats per word",
    )
    return figure


def write_real_figure(out: Path, results: dict[str, Any]) -> str:
    save_figure(real_figure(results), out, REAL_FIGURE)
    return REAL_FIGURE
