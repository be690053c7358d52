"""Hallucination on arbitrary facts: the Kalai–Vempala bound, measured exactly, and what moves it.

Kalai & Vempala (arXiv 2311.14648) prove that a calibrated model must hallucinate arbitrary facts at about
the rate of facts seen once in training; Miao & Kearns (arXiv 2502.08666) moved that rate with the Pareto
shape γ of fact popularity and lowered hallucination by repeating a few examples. Definitions and traps:
docs/definitions.md §2; the formulas are the pure functions of `lab.metrics.hallucination`.

The world (`lab.data.facts.FactWorld`): persons with two-word names drawn from a first × last name grid,
one arbitrary value each for one attribute, popularity ∝ max(1, ⌊Pareto(γ)⌋), and n i.i.d. training draws
with replacement. The default attribute is FactWorld's generic one, `code`, with 336 single-token values
code_0 … code_335 (as many as birthdays have); `attribute="birthday"` gives "Month day" values (12 × 28,
two tokens each) and runs through the same code. A document is the bare factoid "<bos> First Last code
code_17": a fixed number of words after <bos>. The bare form's final "." (and an <eos>) carry no
information and are left out on purpose: with them, the probability of a complete document needs the
model run once more at every one of the |Y| ≈ 6.7 million leaves; without them, every document has the
same length, the model's distribution over documents is exactly its distribution over these strings, and

    g(First Last a v₁…v_k) = P(First) · P(Last | First) · P(a | First Last) · Π_t P(v_t | …, v_<t)

is computed for every well-formed factoid by enumeration — every first × last name pair, persons or not
(a pair that is no person is a subject the model can invent: its factoids are hallucinations) — with
shared prefixes: one forward pass over "<bos> First" for all first names, the KV cache expanded to all
pairs for "Last a", and, for values of k > 1 tokens, expanded again for each distinct value prefix
(the 12 months of a birthday). Single-token values keep that to one position per name pair, which is
what lets the default profile measure 35 checkpoints exactly within its budget. Nothing is
renormalised: the mass on strings that are not factoids (a non-name first word, a value token where the
attribute belongs, …) is the malformed rate, computed separately as the sum of the probability that
leaks out of the grammar at each position, so g(F) + g(H) + malformed = 1 is a check, not an identity.
Documents drawn at T = 1 from the full softmax and judged by `FactWorld.classify_bare` must agree within
3 standard errors.

What runs:
* sweep: for each γ, a model trained for max(epochs) epochs in stages (`lab.train.loop.train` with
  stop_after/resume, one stage per epoch), with the held-out NLL after each epoch; at the listed epochs and at
  the held-out optimum every quantity of the bound is measured (`measurement`). The held-out documents are independent
  i.i.d. draws from p (the expected loss on new draws is what picks the optimum), not unseen facts: most of them
  repeat facts that training holds too, and each γ's `heldout_draws` counts how many.
* upweighting: from the held-out optimum at γ = upweight_gamma, the same number of optimizer steps
  (matched compute) on: the full data (control); full + 5% of the examples ×10; full + 15% ×10; the 5%
  block ×10 alone; full + 5% of the monofact examples ×10 (`upweighting_conditions`). Which examples
  land in a block moves g(H) by a point or two, so each condition — the control too — is trained `upweight_draws`
  times (draw d: its own blocks and batch-order seed seed + d) and reported as the mean, with the spread.
* singleton: Kalai, Nachum, Vempala & Zhang 2025 (arXiv 2509.04664, Thm. 2) with prompt = "First Last a"
  for a person and answer = the value, read off the same models' conditionals.

What a run shows is `headlines(results)` (results.json "headlines"), each supported only by a test that can fail
at the run's size: g(H) against MF across γ by Spearman's ρ with its exact one-sided permutation p-value (at each
γ's held-out optimum, and at every listed epoch at once; only with ≥ 3 γ in the regime where MF rises with γ, and
1/n! is the smallest p of n γ values), both sides of the bound where its right side is positive ("bound vacuous"
where it is negative at every check: it then holds whatever the model does), the enumeration against sampled
documents, each upweighting condition against its matched control and their miscalibration by exact one-sided
permutation tests over the draws (the control's draws give its run-to-run spread), and the singleton variant
(vacuous at these N). A γ whose world puts ≥ MAX_FACT_PROBABILITY_FLAG of p on one fact is flagged: the theorem
assumes a bounded largest fact probability. The quick profile (QUICK) is the same experiment at a smaller size, with the
world's draws per person as in the default (n_train/n_persons = 1.25), so that MF rises with γ there too,
and enough upweighting steps for the repeated blocks to act.

Artefacts in `out`: checkpoints.parquet (one row per γ and checkpoint), calibration_bins.parquet (per
γ, checkpoint and binning: bin edges, g mass, p mass, |B| and the bin's share of the coarsened TV),
train_counts.parquet (per γ and fact: person, value, p and the training count), heldout.parquet,
upweighting.parquet, singleton.parquet, and plotly figures.

The real-model track (`forma run hallucination --model smollm2`, Config.real_track, into runs/hallucination_real/):
SmolLM2-135M-Instruct fine-tuned on a biography corpus of invented persons whose monofact rate is set by design
(`biographies`), at several rates, with g(H), Mis and MF − Mis measured at each (`real`, whose docstring says how).

Where each part lives: `config` (Config, its profiles and the constants), `setting` (the world as token ids, the model),
`enumeration` (g by enumeration, sampled documents, the held-out NLL), `measurement` (everything measured at one
checkpoint), `training` (the sweep over γ and the upweighting conditions: lab.parallel's tasks), `summary`
(acceptance and headlines) and `figures`; Config, run and every name other code imports are here, in
`experiments.hallucination` itself.
"""

import dataclasses
import tempfile
import time
from pathlib import Path

# Every name the experiment had as one module, where it lives now: tests, dashboards and docs import them from here.
from experiments.hallucination.config import MAX_FACT_PROBABILITY_FLAG, Config
from experiments.hallucination.figures import write_figures
from experiments.hallucination.real import real_headlines, run_real
from experiments.hallucination.setting import Setting
from experiments.hallucination.summary import acceptance
from experiments.hallucination.summary import headlines as toy_headlines
from experiments.hallucination.training import SweepRun, summarise_upweighting, sweep_gamma, upweighting_tasks
from lab.configs import torch_threads
from lab.metrics.hallucination import missing_mass, monofact_rate
from lab.parallel import run_tasks
from lab.runs import save_table


# --------------------------------------------------------------------------------------------
# The experiment
# --------------------------------------------------------------------------------------------
def _train(cfg: Config) -> tuple[list[SweepRun], SweepRun, list[dict], bool]:
    """Every γ's sweep and the upweighting draws: (runs, the upweighting base, its draws, whether the base is
    a run of its own, outside the sweep)."""
    with torch_threads(cfg.threads), tempfile.TemporaryDirectory(prefix="hallucination-") as tmp:
        # Every γ trains alone, and every upweighting condition from the optimum of upweight_gamma's run (its
        # own run when that γ is not swept): cfg.workers processes share them out, results independent of it.
        tasks = [(sweep_gamma, cfg, gamma, Path(tmp) / f"gamma-{gamma}") for gamma in cfg.gammas]
        if cfg.upweight_gamma in cfg.gammas:
            base_index = cfg.gammas.index(cfg.upweight_gamma)
        else:
            base_index = len(tasks)
            tasks.append(
                (
                    sweep_gamma,
                    dataclasses.replace(cfg, epochs=(cfg.epochs[-1],)),
                    cfg.upweight_gamma,
                    Path(tmp) / "upweight-base",
                )
            )
        done = run_tasks(
            tasks,
            workers=cfg.workers,
            then={base_index: lambda base: upweighting_tasks(cfg, base)},
            threads=cfg.threads,
        )
    return done[: len(cfg.gammas)], done[base_index], done[len(tasks) :], base_index == len(cfg.gammas)


def _sweep_row(gamma: float, r: SweepRun) -> dict:
    """One γ's line of results["sweep"]: its world's monofact rate and missing mass, and its checkpoints."""
    world = r.setting.world
    return {
        "gamma": gamma,
        "monofact_rate": monofact_rate(world.train_counts),
        "missing_mass": missing_mass(world.p, world.train_counts),
        "n_distinct_facts_seen": int((world.train_counts > 0).sum()),
        "max_fact_probability": float(world.p.max()),
        "max_fact_probability_flagged": bool(world.p.max() >= MAX_FACT_PROBABILITY_FLAG),
        "heldout_optimum_epoch": r.optimum_epoch,
        "heldout": r.heldout,
        "heldout_draws": r.setting.heldout_draws,
        "checkpoints": r.checkpoints,
    }


def _world_summary(cfg: Config, setting: Setting) -> dict:
    """results["world"]: the sizes of the world and of its documents."""
    world = setting.world
    n_hall = setting.n_factoids - len(world.facts)
    return {
        "n_facts": len(world.facts),
        "n_factoids": setting.n_factoids,
        "n_train": cfg.n_train,
        "n_hallucinations": n_hall,
        "n_persons": cfg.n_persons,
        "n_first_names": cfg.n_first_names,
        "n_last_names": cfg.n_last_names,
        "n_name_pairs": cfg.n_first_names * cfg.n_last_names,
        "attribute": cfg.attribute,
        "n_values": setting.shape[2],
        "facts_per_hallucination": len(world.facts) / n_hall,
        "kv_term_delta_0_01": 3 * len(world.facts) / n_hall / 0.01,
        "document": f"<bos> First Last {cfg.attribute} "
        + " ".join(f"v{t + 1}" for t in range(setting.value_ids.shape[1])),
        "n_heldout": cfg.n_heldout,
        "d_vocab": setting.tokenizer.get_vocab_size(),
    }


def _save_tables(out: Path, cfg: Config, sweep: list[dict], runs: list[SweepRun], upweighting_draws: list[dict]):
    """The run's parquet tables (the module docstring lists them)."""
    save_table(
        [
            {
                "gamma": s["gamma"],
                "monofact_rate": s["monofact_rate"],
                **{k: v for k, v in c.items() if k != "malformed_by_position"},
            }
            for s in sweep
            for c in s["checkpoints"]
        ],
        out,
        "checkpoints",
    )
    save_table([{"gamma": g, **b} for g, r in zip(cfg.gammas, runs) for b in r.bins], out, "calibration_bins")
    save_table([{"gamma": g, **h} for g, r in zip(cfg.gammas, runs) for h in r.heldout], out, "heldout")
    save_table([{"gamma": g, **s} for g, r in zip(cfg.gammas, runs) for s in r.singleton], out, "singleton")
    save_table(
        [{k: v for k, v in u.items() if k != "malformed_by_position"} for u in upweighting_draws], out, "upweighting"
    )
    counts_rows = []
    for gamma, r in zip(cfg.gammas, runs):
        w = r.setting.world
        for index, fact in enumerate(w.facts):
            person = w.persons[fact.person_index]
            counts_rows.append(
                {
                    "gamma": gamma,
                    "fact": index,
                    "first": person.first,
                    "last": person.last,
                    "value": fact.value,
                    "p": float(w.p[index]),
                    "count": int(w.train_counts[index]),
                }
            )
    save_table(counts_rows, out, "train_counts")


def headlines(results: dict) -> list[dict]:
    """The run's headlines: the real-model track's (`real.real_headlines`) for a run of it, else the toy world's."""
    return real_headlines(results) if results.get("real_track") else toy_headlines(results)


def run(cfg: Config, out: Path) -> dict:
    """The real-model track when cfg.real_track (experiments.hallucination.real); else the sweep, upweighting and
    singleton variant; tables and figures into `out`; results.json's dict."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.real_track:
        return run_real(cfg, out)
    timing: dict[str, float] = {}
    start = time.perf_counter()
    runs, base, upweighting_draws, base_apart = _train(cfg)
    for gamma, r in zip(cfg.gammas, runs):
        timing[f"sweep_gamma_{gamma}_s"] = r.seconds
    timing["upweighting_s"] = sum(row.pop("seconds") for row in upweighting_draws) + (
        base.seconds if base_apart else 0.0
    )
    upweighting = summarise_upweighting(upweighting_draws)

    sweep = [_sweep_row(gamma, r) for gamma, r in zip(cfg.gammas, runs)]
    optimum = next(s for s in base.singleton if s["checkpoint"] == "optimum")
    results = {
        "world": _world_summary(cfg, runs[0].setting),
        "sweep": sweep,
        "upweighting": upweighting,
        "singleton": {
            "gamma": cfg.upweight_gamma,
            "checkpoint": "optimum",
            "epoch": base.optimum_epoch,
            **{k: v for k, v in optimum.items() if k not in ("checkpoint", "epoch")},
            "note": f"prompt = a person's 'First Last {cfg.attribute}', answer = the value; μ = p. Prompts are "
            "facts here, so the singleton rate equals the monofact rate.",
        },
    }
    results["acceptance"] = acceptance(sweep, upweighting, cfg)
    results["config"] = {
        "upweight_shares": list(cfg.upweight_shares),
        "gammas": list(cfg.gammas),
        "epochs": list(cfg.epochs),
        "max_fact_probability_flag": MAX_FACT_PROBABILITY_FLAG,
    }
    results["headlines"] = headlines(results)

    _save_tables(out, cfg, sweep, runs, upweighting_draws)
    write_figures(out, sweep, runs, upweighting, cfg)
    # Each part's own time (in its worker), and the run's wall time: with workers > 1 the parts overlap.
    timing["total_s"] = time.perf_counter() - start
    results["timing"] = timing
    return results
