"""Methods against the truth: interpretability methods graded on worlds whose law and mechanism are known exactly.

No toolkit can tell its user whether its methods are right by comparing them with each other; a world whose true
next-token law and mechanism are known can. The run trains small models on each of five worlds (lab.data), one
per training seed (the profile's `seeds`), and grades every method that applies there, each grade a mean over
held-out prompts with a bootstrap 95% interval and a control — one that knows nothing and must score at chance, or
the same method where the mechanism is absent, which it must beat (lab.metrics.grades, lab.analysis.grading); the
table combines the seeds (experiments.scoreboard.seeds: the mean, and an interval covering every seed's interval,
so the spread between trained models as well as over prompts):

    world                      its law                               the ground truth of its mechanism
    order-2 Markov chain       p(x_{t+1} | the last two tokens)      the two last positions
    Mess3 (Shai et al. 2024)   η_t T^(a) 1, by forward filtering     the belief state η_t at every position
    induction (repeated span)  x_{t+1} = x_{t+1−m} inside the repeat every lawful copy source (the position after
                                                                     each earlier occurrence), or its one-source prompts
    facts (Kalai & Vempala)    the person's value                    the name's two words
    long induction             the induction world's law, 32 tokens  its heads: the copy written by the second
                                                                     layer's, read through its keys from the first's

    1. Lenses, every layer (Markov, Mess3, induction): the logit lens, the tuned lens (Belrose et al. 2023, fitted
       by Forma) and the Jacobian lens (Gurnee et al. 2026; summed over later positions as the reference fits it,
       and its same-position variant), each graded by KL(p ‖ P^(l)) — the ground-truth lens — and KL(P_θ ‖ P^(l))
       against the best prompt-blind law; the check a lens can fail: its gain over another prompt's reading, which
       random logits or a prompt-blind lens do not have.
    2. Probes (Mess3, facts): linear probes from each layer's residual stream and all of them side by side to the
       belief state (R²) and to the fact's value (accuracy), beside shuffled targets, an untrained model of the same
       shape and Hewitt & Liang's control task (selectivity); the belief probe beside the lookups of the last k
       tokens (k = 1 … 6, a finite memory), the value probe beside the model's own logit-lens reading at each
       readout (the model recalls every fact, so its final stream holds the answer); the belief simplex of Shai et
       al.'s Fig. 1, true beside read.
    3. Input attribution (Markov, induction, facts) of the prediction after a prompt's last token: gradient,
       gradient × input, integrated gradients and occlusion through Captum on Forma's hooks, attention weights and
       rollout, attribution patching at the embedding, and the attribution graph (lab.analysis.graphs, over top-k
       transcoders trained on the world's model: each position's share of the tokens' path influence); graded by
       AUROC and the share of the mass on the relevant positions, and by Spearman ρ with the model's own exhaustive
       causal effects (every position resampled to every token), beside the trivial baselines (recency, the last
       token, uniform, random); controls: the same method on an untrained model and on a model of the same shape
       trained on another world (CONTROL_WORLDS), the graph over untrained transcoders (with both replacement
       scores). A method finds the mechanism only where it beats the best baseline and its control by its interval.
    4. Heads (long induction): the induction and previous-token detectors against every head's Shapley value over
       all sets of heads ablated together, along the path each kind works on (what a head writes to the
       prediction; what the later keys read), with the margin by which the heads a detector flags lead the others;
       and attribution patching (induction) against the exhaustive patching sweep.

Every row of the table (results.json "table", scoreboard.parquet) is method × world × readout × grade with its
interval, its control's interval, chance, and whether the control is at chance; the points the belief simplex
and the attribution-patching figures draw are tables of their own (belief_simplex.parquet,
attribution_patching_points.parquet). `headlines(results)` says which
method reads the truth where, and why not where the run cannot say. Figures: lenses, attribution, belief_simplex,
probes, heads, attribution_patching. The worlds and seeds train and are graded independently, shared out to
`cfg.workers` processes (lab.parallel); results do not depend on how many. Each seed's own rows are in
scoreboard_seeds.parquet (a `seed` column).

The real-model track (`forma run scoreboard --model smollm2`, runs/scoreboard_real/; experiments.scoreboard.real)
grades the input-attribution methods of 3. the same way on a pretrained model, on three tasks whose relevant
positions are known by construction — induction on repeated random word pieces (the copy source), indirect-object
identification (the indirect object's name), the capital facts of lab/data/questions.json (the subject's tokens) —
each on the prompts the model answers; controls the same method on an untrained model of its shape and the graph over
untrained transcoders; the causal effects resample each position to a few random word pieces, not to every token.
Its rows are the table's (the world the task, the readout its truth). Sizes: REAL_QUICK (6 prompts a task, the graph
on 2) and REAL_DEFAULT (12, the graph on 3) in config; each method runs on the model and its untrained copy, so on
two shared cores quick takes minutes and the default several times that (results.json "seconds" per task).

Where each part lives: `config` (Config, the profiles, the worlds, the seed streams), `per_world` (each world's
training and grades), `real` (the real-model track), `summary` (headlines) and `figures`; `run` is here.
"""

import dataclasses
import time
from pathlib import Path
from typing import Any

from experiments.scoreboard.config import Config
from experiments.scoreboard.figures import write_figures
from experiments.scoreboard.per_world import facts_part, long_induction_part, source_part
from experiments.scoreboard.real import load_real, real_headlines, run_real
from experiments.scoreboard.seeds import combine_seeds, per_seed_rows, training_seeds
from experiments.scoreboard.summary import headlines as toy_headlines
from lab.configs import torch_threads
from lab.parallel import run_tasks
from lab.runs import save_table

WORLDS = ("markov", "mess3", "induction", "facts", "long_induction")  # the table's order


def _tasks(profile: Any, seeds: list[int], folders: dict[int, Path]) -> list[tuple[Any, ...]]:
    """Every world's part once per training seed (each task's seed second to last), the longest parts first;
    every tensor is small, so each part runs on one intra-op thread."""
    tasks: list[tuple[Any, ...]] = []
    for world in ("induction", "facts", "long_induction", "markov", "mess3"):
        for seed in seeds:
            if world == "facts":
                tasks.append((facts_part, profile, seed, folders[seed]))
            elif world == "long_induction":
                tasks.append((long_induction_part, profile, seed, folders[seed]))
            else:
                tasks.append((source_part, world, profile, seed, folders[seed]))
    return tasks


def read_inputs(cfg: Config) -> tuple[Any, Any, str] | None:
    """The real-model track's pretrained model and its transcoder set, loaded before `forma run` makes the run
    folder; None for the toy worlds."""
    return load_real(cfg.model) if cfg.real_track else None


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What a run shows: the toy worlds' claims (experiments.scoreboard.summary), or the real-model track's."""
    return real_headlines(results) if "graph" in results else toy_headlines(results)


def run(cfg: Config, out: Path, inputs: tuple[Any, Any, str] | None = None) -> dict[str, Any]:
    """Train and grade on every world once per training seed (in `cfg.workers` processes), then the table (each
    grade combined over the seeds, experiments.scoreboard.seeds), the headlines and the figures. The first seed's
    models are in out/models, the others' in out/seeds/<seed>/models. With cfg.model, the real-model track instead
    (experiments.scoreboard.real: `inputs`, that model and its transcoders loaded)."""
    out = Path(out)
    if cfg.real_track:
        inputs = load_real(cfg.model) if inputs is None else inputs
        out.mkdir(parents=True, exist_ok=True)
        return run_real(inputs, cfg.model, cfg.real_profile, cfg.seed, out, cfg.corpus)
    clock = time.perf_counter()
    profile = cfg.profile
    seeds = training_seeds(cfg.seed, profile.seeds)
    folders = {seed: out if k == 0 else out / "seeds" / str(seed) for k, seed in enumerate(seeds)}
    tasks = _tasks(profile, seeds, folders)
    with torch_threads(1):
        parts = run_tasks(tasks, workers=cfg.workers, threads=1)
    by_seed: dict[int, dict[str, Any]] = {seed: {} for seed in seeds}
    for task, part in zip(tasks, parts):
        by_seed[task[-2]][part["world"]] = part
    tables = {seed: [r for name in WORLDS for r in worlds[name].pop("rows")] for seed, worlds in by_seed.items()}
    table = combine_seeds(tables)
    save_table(table, out, "scoreboard")
    save_table(per_seed_rows(tables), out, "scoreboard_seeds")
    worlds = by_seed[seeds[0]]
    for seed in seeds[1:]:  # what the figures draw comes from the first seed's models
        by_seed[seed]["mess3"].pop("simplex")
        by_seed[seed]["induction"]["attribution_patching"].pop("points")
    simplex = worlds["mess3"].pop("simplex")
    points = worlds["induction"]["attribution_patching"].pop("points")
    save_table(
        [
            {"sweep": sweep, "estimate": a, "exhaustive": e}
            for sweep, pair in points.items()
            for a, e in zip(pair["estimate"], pair["exhaustive"])
        ],
        out,
        "attribution_patching_points",
    )
    results: dict[str, Any] = {
        "profile": dataclasses.asdict(profile),
        "seeds": seeds,
        "table": table,
        "worlds": worlds,
        "seed_worlds": {str(seed): by_seed[seed] for seed in seeds[1:]},
        "seconds": {name: part.pop("seconds") for name, part in worlds.items()},
    }
    results["headlines"] = toy_headlines(results)
    began = time.perf_counter()
    results["figures"] = write_figures(out, results, simplex, points)
    results["seconds"]["figures"] = time.perf_counter() - began
    results["seconds"]["total"] = time.perf_counter() - clock
    return results
