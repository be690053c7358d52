"""The scoreboard's independent parts, one per world, each a module-level function lab.parallel.run_tasks can hand
to a worker: train the world's model, then grade every method that applies there. Each returns its table rows
(`row`), what its figures draw, and its seconds."""

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.scoreboard.config import (
    CONTROL_WORLDS,
    FACTS_WORLD,
    LENSES,
    LONG_INDUCTION_D_MODEL,
    LONG_INDUCTION_LENGTH,
    LOOKUP,
    Profile,
    lookup_readout,
    sample_seed,
    world_spec,
)
from lab.analysis.activations.store import save_activations
from lab.analysis.grading import (
    UNTRAINED_MODEL,
    grade_attribution_patching,
    grade_belief_probes,
    grade_head_detectors,
    grade_input_attribution,
    grade_lens,
    grade_value_probes,
)
from lab.analysis.heads import HEAD_KINDS
from lab.analysis.input_attribution import METHODS
from lab.analysis.jacobian_lens import fit_jacobian_lens
from lab.analysis.lens import logit_lens
from lab.analysis.probes.readouts import random_model
from lab.analysis.transcoders.model import TranscoderConfig, Transcoders
from lab.analysis.transcoders.train import TranscoderTraining, train_transcoders
from lab.analysis.tuned_lens import fit_tuned_lens
from lab.data.facts import FactWorld, FactWorldConfig
from lab.data.sources import source_from_dict
from lab.data.tokenizers import word_level
from lab.metrics.discrimination import Metric
from lab.metrics.grades import Grade
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer
from lab.runs import write_json
from lab.train.batches import SequenceBatches, pad_documents
from lab.train.config import TrainConfig
from lab.train.loop import train

ATTRIBUTION_LENGTH = {"markov": 10, "induction": 12}  # prompt lengths: the prediction after the last token
# The truths attribution is graded against, the scoreboard's "readout" of its rows: the prediction after the last
# token; on the induction world, every lawful copy source of the world's own draws, and the draws whose last
# prediction has one source only (InductionSource.sample_unique_source).
TRUTHS = {"markov": ("last prediction",), "induction": ("all sources", "unique source"), "facts": ("last prediction",)}


def row(method: str, world: str, readout: str, grade: Grade | Metric, name: str | None = None) -> dict[str, Any]:
    """One line of the scoreboard table: method × world × readout (a layer, or "last prediction") × grade."""
    if isinstance(grade, Grade):
        fields = grade.row()
    else:
        fields = {
            "grade": name,
            "value": grade.value,
            "low": grade.low,
            "high": grade.high,
            "why_no_interval": grade.why_no_interval,
            "better": "higher",
            "n": None,
            "chance": None,
            "control": None,
            "control_low": None,
            "control_high": None,
            "control_at_chance": None,
            "control_means": None,
            "beats_control": None,
        }
    if name is not None:
        fields["grade"] = name
    return {"method": method, "world": world, "readout": readout, **fields}


def model_config(profile: Profile, d_vocab: int, n_ctx: int) -> ModelConfig:
    return ModelConfig(
        d_vocab=d_vocab,
        d_model=profile.d_model,
        n_layers=profile.n_layers,
        n_heads=profile.n_heads,
        n_ctx=n_ctx,
        d_mlp=4 * profile.d_model,
        positions="learned",
        norm="layernorm",
        mlp="gelu",
    )


def train_model(
    cfg: ModelConfig,
    profile: Profile,
    steps: int,
    seed: int,
    data: SequenceBatches,
    seq_len: int,
    tokenizer: Any = None,
) -> tuple[HookedTransformer, dict[str, Any]]:
    """A model trained on the world's sequences. Its unembedding bias is held at zero (every Hugging Face causal-LM
    head lacks one), so `lab.hf.convert.to_hf` exports it for the peers' checks."""
    model = HookedTransformer(cfg, seed=seed, tokenizer=tokenizer)
    model.b_U.requires_grad_(False)
    train_cfg = TrainConfig(
        steps=steps,
        batch_size=profile.batch_size,
        seq_len=seq_len,
        lr=profile.lr,
        min_lr=profile.lr / 10,
        warmup_steps=min(100, steps // 10),
        eval_interval=steps,
        eval_batches=2,
        checkpoint_every_s=0.0,
        seed=seed,
    )
    result = train(model, train_cfg, data, progress=False)
    return model.eval(), {
        "train": train_cfg.to_dict(),
        "final_train_loss_nats": result.train_loss_nats,
        "n_params": cfg.n_params(),
        **cfg.to_dict(),
    }


def source_sequences(
    source: Any, profile: Profile, steps: int, seed: int, world: str, seq_len: int | None = None
) -> SequenceBatches:
    """Fresh training sequences (of the profile's length unless `seq_len`), one per batch row of the whole
    schedule, and a small validation draw."""
    seq_len = profile.seq_len if seq_len is None else seq_len
    train_tokens = source.sample(steps * profile.batch_size, seq_len, seed=sample_seed(seed, world, "train"))
    val_tokens = source.sample(64, seq_len, seed=sample_seed(seed, world, "val"))
    return SequenceBatches(torch.from_numpy(train_tokens), torch.from_numpy(val_tokens))


def lens_part(
    model: HookedTransformer,
    world: str,
    held_out: torch.Tensor,
    p: np.ndarray,
    fit: torch.Tensor,
    profile: Profile,
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The logit, tuned and Jacobian lenses (the reference's, summed over later positions, and the same-position
    variant), fitted on `fit` and graded on `held_out` (positions 0 … L − 2, those the model was trained to predict
    from), every layer."""
    seconds = {}
    clock = time.perf_counter()
    tuned = fit_tuned_lens(model, fit)
    seconds["tuned_fit"] = time.perf_counter() - clock
    clock = time.perf_counter()
    jacobian = fit_jacobian_lens(model, fit)
    seconds["jacobian_fit"] = time.perf_counter() - clock
    clock = time.perf_counter()
    same = fit_jacobian_lens(model, fit, targets="same")
    seconds["same_position_jacobian_fit"] = time.perf_counter() - clock
    lenses = dict(zip(LENSES, (logit_lens, tuned.log_probs, jacobian.log_probs, same.log_probs)))
    valid = np.arange(held_out.shape[1]) < held_out.shape[1] - 1
    labels = [f"resid_pre {layer}" for layer in range(model.cfg.n_layers)] + ["output"]
    rows, curves = [], {}
    for name, lens in lenses.items():
        graded = grade_lens(model, held_out, p, lens, valid=valid, n_boot=profile.n_boot, seed=seed)
        curves[name] = [
            {
                "layer": label,
                **{
                    f"{k}_{f}": v
                    for k, g in layer.items()
                    for f, v in (("value", g.value.value), ("low", g.value.low), ("high", g.value.high))
                },
            }
            for label, layer in zip(labels, graded)
        ]
        for label, layer in zip(labels, graded):
            rows += [row(f"{name} lens", world, label, grade) for grade in layer.values()]
    extra = {
        "tuned_train_kl_nats": tuned.train_kl_nats,
        "tuned_evaluations": tuned.evaluations,
        "jacobian_prompts": jacobian.n_prompts,
        "fit_prompts": int(fit.shape[0]),
        "seconds": seconds,
    }
    return rows, {"curves": curves, **extra}


def fit_transcoders(
    model: HookedTransformer, tokens: torch.Tensor, profile: Profile, seed: int, out: Path, pad_id: int | None = None
) -> Transcoders:
    """Top-k transcoders (lab.analysis.transcoders, k = 16) for the model's attribution graphs, trained on a harvest
    of every position of `tokens` (the world's own text; `pad_id`'s positions left out) and kept in `out`."""
    cfg = TranscoderConfig(
        d_model=model.cfg.d_model,
        n_layers=model.cfg.n_layers,
        d_features=profile.transcoder_features,
        activation="topk",
        k=16,
        seed=seed,
    )
    training = TranscoderTraining(steps=profile.transcoder_steps, batch_size=512, lr=2e-3, seed=seed)
    with tempfile.TemporaryDirectory() as harvest:
        store = save_activations(model, tokens, cfg.hooks(), harvest, positions="all", pad_id=pad_id, progress=False)
        return train_transcoders(store, cfg, training, out).eval()


def control_models(
    model: HookedTransformer, world: str, profile: Profile, seed: int, out: Path
) -> dict[str, HookedTransformer]:
    """The models the attribution methods are run on beside the world's own, named as the table says them: one of
    the same shape never trained, and one trained (`profile.control_steps`) on `CONTROL_WORLDS[world]`, a world
    with another mechanism and the same vocabulary (kept in out/models/WORLD/control)."""
    spec = CONTROL_WORLDS[world] | ({"vocab_size": model.cfg.d_vocab} if world == "facts" else {})
    other = source_from_dict(spec)
    length = model.cfg.n_ctx
    data = SequenceBatches(
        torch.from_numpy(
            other.sample(profile.control_steps * profile.batch_size, length, seed=sample_seed(seed, world, "control"))
        ),
        torch.from_numpy(other.sample(64, length, seed=sample_seed(seed, world, "control") + 1)),  # loss only
    )
    trained, _ = train_model(model.cfg, profile, profile.control_steps, seed, data, length, model.tokenizer)
    trained.save(out / "models" / world / "control")
    write_json(out / "models" / world / "control" / "world.json", {"source": other.to_dict()})
    return {UNTRAINED_MODEL: random_model(model, seed=seed + 1), control_name(world): trained}


def control_name(world: str) -> str:
    """The other-world control's name in the table: the world its model was trained on."""
    return f"a model trained on another world ({CONTROL_WORLDS[world]['kind']})"


def attribution_part(
    model: HookedTransformer,
    world: str,
    readout: str,
    prompts: torch.Tensor,
    relevant: torch.Tensor,
    transcoders: Transcoders,
    controls: dict[str, HookedTransformer],
    profile: Profile,
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every input-attribution method, the attribution graph and the trivial baselines on the prediction after
    each prompt's last token, graded against the relevant positions (`readout` names the truth) and the model's
    exhaustive causal effects, each against the same method on the `controls` models (the graph: on untrained
    transcoders, with both replacement scores)."""
    graded = grade_input_attribution(
        model,
        prompts,
        relevant,
        METHODS,
        n_boot=profile.n_boot,
        seed=seed,
        ig_steps=profile.ig_steps,
        transcoders=transcoders,
        controls=controls,
    )
    rows = [row(method, world, readout, grade) for method, grades in graded.grades.items() for grade in grades.values()]
    rows += [row("attribution_graph", world, readout, grade) for grade in graded.replacement.values()]
    summary = {
        method: {name: grade.row() for name, grade in grades.items()}
        | {"controls": {what: {k: g.row() for k, g in by.items()} for what, by in graded.controls[method].items()}}
        for method, grades in graded.grades.items()
    }
    summary["attribution_graph"] |= {name: grade.row() for name, grade in graded.replacement.items()}
    return rows, {
        "readout": readout,
        "prompts": int(prompts.shape[0]),
        "length": int(prompts.shape[1]),
        "relevant_per_prompt": float(relevant.float().sum(1).mean()),
        "several_sources": float((relevant.sum(1) > 1).float().mean()),
        "baselines": list(graded.baselines),
        "methods": summary,
        "tokens": prompts.tolist(),  # every prompt and its truth: a method of one's own is graded on the same ones
        "relevant": relevant.tolist(),
        "example": {
            "tokens": prompts[0].tolist(),
            "relevant": relevant[0].tolist(),
            "effects": graded.effects[0].tolist(),
            "scores": {m: s[0].tolist() for m, s in graded.scores.items()},
        },
    }


def source_attribution(
    model: HookedTransformer, world: str, source: Any, fit: torch.Tensor, profile: Profile, seed: int, out: Path
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, float]]:
    """Attribution on the Markov or induction world, against each of its truths (`TRUTHS`): the world's own draws
    (every lawful source marked) and, on the induction world, its draws with one source. Returns the rows, the
    results' blocks ("attribution", "attribution_unique_source") and the seconds."""
    clock = time.perf_counter()
    length = ATTRIBUTION_LENGTH[world]
    transcoders = fit_transcoders(model, fit, profile, seed, out / "models" / world / "transcoders")
    controls = control_models(model, world, profile, seed, out)
    seconds = {"transcoders_and_controls": time.perf_counter() - clock}
    clock = time.perf_counter()
    rows, blocks = [], {}
    for readout in TRUTHS[world]:
        if readout == "unique source":
            draws = source.sample_unique_source(
                profile.attribution_prompts, length, seed=sample_seed(seed, world, readout)
            )
        else:
            draws = source.sample(profile.attribution_prompts, length, seed=sample_seed(seed, world, "attribution"))
        relevant = torch.from_numpy(source.relevant_positions(draws)[:, -1])
        more, block = attribution_part(
            model, world, readout, torch.from_numpy(draws), relevant, transcoders, controls, profile, seed
        )
        rows += more
        blocks["attribution_unique_source" if readout == "unique source" else "attribution"] = block
    seconds["attribution"] = time.perf_counter() - clock
    return rows, blocks, seconds


def _model_kl(model: HookedTransformer, tokens: torch.Tensor, p: np.ndarray) -> float:
    """KL(p ‖ P_θ) averaged over positions 0 … L − 2 of the held-out tokens."""
    with torch.inference_mode():
        log_q = model(tokens).double().log_softmax(-1)[:, :-1].numpy()
    truth = p[:, :-1]
    return float(np.where(truth > 0, truth * (np.log(np.where(truth > 0, truth, 1.0)) - log_q), 0.0).sum(-1).mean())


def source_part(world: str, profile: Profile, seed: int, out: Path) -> dict[str, Any]:
    """Markov, Mess3 or induction world: train, then the lenses; attribution where the law reads a few positions
    (Markov, induction); belief probes on Mess3; attribution patching on induction."""
    clock = time.perf_counter()
    source = source_from_dict(world_spec(world))
    steps = profile.steps[world]
    cfg = model_config(profile, source.vocab_size, profile.seq_len)
    model, record = train_model(
        cfg, profile, steps, seed, source_sequences(source, profile, steps, seed, world), profile.seq_len
    )
    model.save(out / "models" / world)
    write_json(out / "models" / world / "world.json", {"source": source.to_dict()})
    seconds = {"train": time.perf_counter() - clock}
    held_out_np = source.sample(profile.eval_prompts, profile.seq_len, seed=sample_seed(seed, world, "eval"))
    held_out, p = torch.from_numpy(held_out_np), source.conditionals(held_out_np)
    fit = torch.from_numpy(source.sample(profile.fit_prompts, profile.seq_len, seed=sample_seed(seed, world, "fit")))
    result: dict[str, Any] = {
        "world": world,
        "source": source.to_dict(),
        "model": record,
        "held_out_kl_nats": _model_kl(model, held_out, p),
    }
    clock = time.perf_counter()
    rows, result["lenses"] = lens_part(model, world, held_out, p, fit, profile, seed)
    seconds["lenses"] = time.perf_counter() - clock
    if world in ATTRIBUTION_LENGTH:
        more, blocks, spent = source_attribution(model, world, source, fit, profile, seed, out)
        rows += more
        result |= blocks
        seconds |= spent
    if world == "mess3":
        clock = time.perf_counter()
        more, result["probes"], simplex = belief_part(model, held_out, source.beliefs(held_out_np), profile, seed)
        rows += more
        result["simplex"] = simplex
        seconds["probes"] = time.perf_counter() - clock
    if world == "induction":
        clock = time.perf_counter()
        more, result["attribution_patching"] = patching_part(model, source, profile, seed)
        rows += more
        seconds["patching"] = time.perf_counter() - clock
    result["rows"] = rows
    result["seconds"] = seconds
    return result


def belief_part(
    model: HookedTransformer, held_out: torch.Tensor, beliefs: np.ndarray, profile: Profile, seed: int
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Probes from every readout to the Mess3 belief state beside the lookups of the last k tokens (rows "last k
    tokens" of the method LOOKUP), and the figure of Shai et al. (their Fig. 1): the true beliefs in the simplex
    beside the probe's reading of the residual stream (all layers), on test prompts."""
    graded = grade_belief_probes(model, held_out, beliefs, n_boot=profile.n_boot, seed=seed)
    rows, summary = [], {}
    metrics = {
        "r2_untrained": "r2 untrained",
        "r2_control_task": "r2 control task",
        "selectivity": "selectivity",
        "r2_beyond_token_untrained": "r2 beyond the token untrained",
    }
    for readout, grades in graded.items():
        rows.append(row("linear probe", "mess3", readout, grades["r2"], "r2 belief state"))
        rows.append(row("linear probe", "mess3", readout, grades["r2_beyond_token"], "r2 beyond the token"))
        for name, label in metrics.items():
            rows.append(row("linear probe", "mess3", readout, grades[name], label))
        summary[readout] = {
            "r2": grades["r2"].row(),
            "r2_beyond_token": grades["r2_beyond_token"].row(),
            **{name: dict(zip(("value", "low", "high"), grades[name][:3])) for name in metrics},
        }
    chosen = graded["all layers"]
    for k, lookup in chosen["r2_last_k"].items():  # the finite-memory baselines, the same for every readout
        rows.append(row(LOOKUP, "mess3", lookup_readout(k), lookup, "r2 belief state"))
    summary["last_k_tokens"] = {
        str(k): dict(zip(("value", "low", "high"), m[:3])) for k, m in chosen["r2_last_k"].items()
    }
    true = beliefs.reshape(-1, beliefs.shape[-1])[chosen["test_rows"]]
    simplex = {"true": true.tolist(), "predicted": chosen["test_predictions"].tolist()}
    return rows, summary, simplex


def long_induction_part(profile: Profile, seed: int, out: Path) -> dict[str, Any]:
    """The heads' world (config.LONG_INDUCTION_WORLD): train a model of width LONG_INDUCTION_D_MODEL (the width at
    which it forms induction heads), then grade the head detectors (`heads_part`)."""
    clock = time.perf_counter()
    world = "long_induction"
    source = source_from_dict(world_spec(world))
    steps, length = profile.steps[world], LONG_INDUCTION_LENGTH
    cfg = model_config(dataclasses.replace(profile, d_model=LONG_INDUCTION_D_MODEL), source.vocab_size, length)
    model, record = train_model(
        cfg, profile, steps, seed, source_sequences(source, profile, steps, seed, world, length), length
    )
    model.save(out / "models" / world)
    write_json(out / "models" / world / "world.json", {"source": source.to_dict()})
    seconds = {"train": time.perf_counter() - clock}
    held_out = source.sample(profile.eval_prompts, length, seed=sample_seed(seed, world, "eval"))
    clock = time.perf_counter()
    rows, heads = heads_part(model, source, held_out, profile, seed)
    seconds["heads"] = time.perf_counter() - clock
    return {
        "world": world,
        "source": source.to_dict(),
        "model": record,
        "heads": heads,
        "rows": rows,
        "seconds": seconds,
    }


def heads_part(
    model: HookedTransformer, source: Any, held_out: np.ndarray, profile: Profile, seed: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Head detectors against every head's Shapley value over all sets of heads ablated together
    (lab.analysis.grading.grade_head_detectors), on the held-out prompts whose offset d is at least 3: there the
    induction pattern's keys (t − d + 1, t − 2d + 1, …) never hold the previous token, so the two kinds of head
    cannot be mistaken for each other by where they attend."""
    _, offset = source.offsets(held_out)
    kept = held_out[offset >= 3]
    scored = torch.from_numpy(source.copy_positions(kept))
    heads = grade_head_detectors(model, torch.from_numpy(kept), scored, n_boot=profile.n_boot, seed=seed)
    rows = [row("head detectors", "long_induction", "every head", grade) for grade in heads["grades"].values()]
    summary = {
        "grades": {k: g.row() for k, g in heads["grades"].items()},
        "prompts": len(kept),
        "overlap": {"all prompts": _overlap(held_out), "graded prompts": _overlap(kept)},
        "values": {k: v.tolist() for k, v in heads["values"].items()},
        "scores": {k: v.tolist() for k, v in heads["scores"].items()},
        "leads": {kind: _lead(heads, kind) for kind in heads["values"]},
    }
    return rows, summary


def _overlap(tokens: np.ndarray) -> float:
    """The share of the induction pattern's queries whose keys include the previous token (where an induction
    head and a previous-token head attend alike)."""
    induction = HEAD_KINDS["induction"](torch.from_numpy(tokens))
    queries = induction.any(-1)
    both = (induction & HEAD_KINDS["previous_token"](torch.from_numpy(tokens))).any(-1)
    return float(both.sum() / queries.sum())


def _lead(heads: dict[str, Any], kind: str) -> dict[str, Any]:
    """The detector's best head and the next by score, and the best head and the next by Shapley value on the
    detector's path: whether the detector's first head is the path's, and by how much each leads."""
    scores, values = np.asarray(heads["scores"][kind]).ravel(), np.asarray(heads["values"][kind]).ravel()
    by_score, by_value = np.argsort(-scores), np.argsort(-values)
    return {
        "detector_head": int(by_score[0]),
        "detector_margin": float(scores[by_score[0]] - scores[by_score[1]]),
        "value_head": int(by_value[0]),
        "value_margin": float(values[by_value[0]] - values[by_value[1]]),
    }


def patching_part(
    model: HookedTransformer, source: Any, profile: Profile, seed: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Attribution patching against the exhaustive patching sweep when the copied token is swapped for one the
    prompt does not hold."""
    length = ATTRIBUTION_LENGTH["induction"]
    clean = source.sample(profile.patching_prompts, length, seed=sample_seed(seed, "induction", "patching"))
    _, offset = source.offsets(clean)
    copied = length - offset  # the position whose token comes next: j + 1 = t + 1 − d with t = length − 1
    rng = np.random.default_rng(sample_seed(seed, "induction", "patching"))
    corrupted = clean.copy()
    wrong = np.empty(len(clean), dtype=np.int64)
    for b in range(len(clean)):
        unseen = np.setdiff1d(np.arange(source.vocab_size), clean[b])
        wrong[b] = rng.choice(unseen)
        corrupted[b, copied[b]] = wrong[b]
    answer = clean[np.arange(len(clean)), copied]
    patching = grade_attribution_patching(
        model,
        torch.from_numpy(clean),
        torch.from_numpy(corrupted),
        torch.from_numpy(answer),
        torch.from_numpy(wrong),
        n_boot=profile.n_boot,
        seed=seed,
    )
    rows = [
        row("attribution patching", "induction", grade.name.removeprefix("pearson_"), grade, "pearson r")
        for grade in patching["grades"].values()
    ]
    first = patching["pairs"]
    patching_summary = {
        "grades": {k: g.row() for k, g in patching["grades"].items()},
        "prompts": len(clean),
        "points": {
            sweep: {
                "estimate": np.concatenate([a for a, _ in pairs]).tolist(),
                "exhaustive": np.concatenate([e for _, e in pairs]).tolist(),
            }
            for sweep, pairs in first.items()
        },
    }
    return rows, patching_summary


def _cloze_prompts(world: FactWorld, tokenizer: Any, template: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Every fact's cloze in one template: its tokens, the name's two positions (marked relevant) and the value's id."""
    clozes = [world.cloze(fact, template) for fact in world.facts]
    tokens = torch.tensor([tokenizer.encode(" ".join(["<bos>", *c.words])).ids for c in clozes])
    relevant = torch.zeros_like(tokens, dtype=torch.bool)
    for i, c in enumerate(clozes):
        relevant[i, [1 + c.name_positions[0], 1 + c.name_positions[1]]] = True
    values = np.array([tokenizer.token_to_id(c.value) for c in clozes])
    return tokens, relevant, values


def _value_probes(
    model: HookedTransformer,
    world: FactWorld,
    by_template: list[tuple[torch.Tensor, torch.Tensor, np.ndarray]],
    profile: Profile,
    seed: int,
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """Probes from the residual stream to the value, on both templates' clozes (grouped by person), graded at each
    readout beside the model's own logit-lens reading there: the scoreboard rows appended to `rows`, the summary
    block returned."""
    persons = np.array([fact.person_index for fact in world.facts])
    graded = grade_value_probes(
        model,
        [t for t, _, _ in by_template],
        np.concatenate([v for _, _, v in by_template]),
        np.concatenate([persons, persons]),
        n_boot=profile.n_boot,
        seed=seed,
        labels_are_tokens=True,
    )
    metrics = (
        "accuracy_untrained",
        "accuracy_control_task",
        "selectivity",
        "accuracy_logit_lens",
        "accuracy_beyond_lens",
    )
    summary = {}
    for readout, grades in graded.items():
        rows.append(row("linear probe", "facts", readout, grades["accuracy"], "accuracy fact value"))
        for name in metrics:
            rows.append(row("linear probe", "facts", readout, grades[name], name.replace("_", " ")))
        summary[readout] = {
            "accuracy": grades["accuracy"].row(),
            **{name: dict(zip(("value", "low", "high"), grades[name][:3])) for name in metrics},
        }
    return summary


def facts_part(profile: Profile, seed: int, out: Path) -> dict[str, Any]:
    """The fact world: train on its template statements, then input attribution of the value (the name's two words
    are the relevant positions) and probes from the residual stream to the value."""
    clock = time.perf_counter()
    world = FactWorld(FactWorldConfig.from_dict(FACTS_WORLD))
    tokenizer = word_level(world.word_vocabulary())
    pad = tokenizer.token_to_id("<pad>")
    seq_len = 12

    def encode(docs: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_documents([tokenizer.encode(f"<bos> {d} <eos>").ids for d in docs], pad, seq_len)

    ids, mask = encode(world.documents(form="template", seed=sample_seed(seed, "facts", "train")))
    val_ids, val_mask = encode(
        world.documents(
            form="template", seed=sample_seed(seed, "facts", "val"), fact_indices=world.heldout_fact_indices(256)
        )
    )
    steps = profile.steps["facts"]
    cfg = model_config(profile, tokenizer.get_vocab_size(), seq_len)
    model, record = train_model(
        cfg, profile, steps, seed, SequenceBatches(ids, val_ids, mask, val_mask), seq_len, tokenizer
    )
    model.save(out / "models" / "facts")
    seconds = {"train": time.perf_counter() - clock}

    by_template = [_cloze_prompts(world, tokenizer, template) for template in range(2)]
    with torch.inference_mode():
        recall = [float((model(t)[:, -1].argmax(-1).numpy() == v).mean()) for t, _, v in by_template]
    result: dict[str, Any] = {
        "world": "facts",
        "summary": world.summary(),
        "model": record,
        "recall_by_template": recall,
    }
    # Attribution on the first template ("The team of First Last is"): the name sits in the middle.
    clock = time.perf_counter()
    tokens, relevant, _ = by_template[0]
    rng = np.random.default_rng(sample_seed(seed, "facts", "attribution"))
    chosen = np.sort(rng.choice(len(tokens), size=min(profile.attribution_prompts, len(tokens)), replace=False))
    transcoders = fit_transcoders(
        model, ids[: profile.fit_prompts], profile, seed, out / "models" / "facts" / "transcoders", pad_id=pad
    )
    controls = control_models(model, "facts", profile, seed, out)
    seconds["transcoders_and_controls"] = time.perf_counter() - clock
    clock = time.perf_counter()
    rows, result["attribution"] = attribution_part(
        model, "facts", "last prediction", tokens[chosen], relevant[chosen], transcoders, controls, profile, seed
    )
    seconds["attribution"] = time.perf_counter() - clock
    clock = time.perf_counter()
    result["probes"] = _value_probes(model, world, by_template, profile, seed, rows)
    seconds["probes"] = time.perf_counter() - clock
    result["rows"] = rows
    result["seconds"] = seconds
    return result
