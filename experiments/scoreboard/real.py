"""The scoreboard's real-model track (`forma run scoreboard --model smollm2`, runs/scoreboard_real/): the input
attribution methods the toy worlds grade, graded the same way on a pretrained model, on three tasks whose relevant
positions are known by construction:

    task                          prompt                                             relevant positions
    induction (repeated tokens)   BOS, s_1 … s_n (distinct random word pieces),      the copy source: the position
                                  then s_1 … s_{n−1}; the answer s_n                 after the earlier s_{n−1}
    indirect object (IOI)         "When Mary and John went to the store, John gave   the indirect object's name
                                  a drink to" → " Mary" (names, places, objects       (one token)
                                  single tokens after a space; both name orders)
    capitals                      "The capital of X is" → the capital's first        the subject's tokens
                                  token (lab/data/questions.json's capital facts)

Each task keeps the prompts the model answers (its top token is the answer), and results.json says how many were
tried and kept. The grades are lab.analysis.grading.grade_input_attribution's — AUROC and the mass share on the
relevant positions, and Spearman ρ with the model's causal effects — beside the same trivial baselines (recency,
the last token, uniform, random), each method's control the same method on an untrained model of smollm2's shape;
the attribution graph over the model's own transcoder set (its folder's transcoders/topk, within a feature budget,
on the first of each task's prompts) against untrained transcoders of the same shape. The causal effects are not
exhaustive here: each position is resampled to the same few random word pieces (the profile's `effect_tokens`),
not to all 49,152 tokens. Rows are the toy track's (method × world × readout × grade, experiments.scoreboard's
table), the world the task, the readout its truth (config.REAL_TASKS).
"""

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from experiments import peak_rss_gb
from experiments.scoreboard.config import REAL_TASKS, RealProfile
from experiments.scoreboard.figures import write_real_figures
from experiments.scoreboard.per_world import row
from experiments.scoreboard.real_lenses import head_rows, lens_rows
from experiments.scoreboard.summary import attribution_headline, graph_headline
from lab.analysis.grading import UNTRAINED_MODEL, grade_input_attribution
from lab.analysis.input_attribution import METHODS
from lab.analysis.probes.readouts import random_model
from lab.data.questions import load_questions
from lab.folders import model_folder
from lab.load import load_model
from lab.model.transformer import HookedTransformer
from lab.progress import bar
from lab.runs import save_table
from lab.zoo.graphs import INDUCTION_IDS, single_token
from lab.zoo.transcoders import open_set, transcoder_sets

GRAPH_SET = "topk"  # the model's default transcoder set (`forma transcoders smollm2`)
IOI_TEMPLATE = "When {a} and {b} went to the {place}, {subject} gave a {thing} to"
IOI_NAMES = ("Mary", "John", "Alice", "Bob", "Tom", "James", "Anna", "Sarah", "David", "Michael", "Emma", "Paul")
IOI_PLACES = ("store", "park", "school", "market", "beach", "office", "library", "station")
IOI_THINGS = ("drink", "book", "gift", "ball", "letter", "ring", "pen", "cake")
CAPITAL_PROMPT = "The capital of {subject} is"


@dataclasses.dataclass
class Task:
    """A task's prompts (one length), the positions each one's answer reads, the answers, and how many prompts were
    tried and how many of those the model answers (`kept`; the first `prompts` of them are graded)."""

    tokens: Tensor  # [batch, pos]
    relevant: Tensor  # [batch, pos] bool
    answers: Tensor  # [batch]
    tried: int
    kept: int


def _bos(model: HookedTransformer) -> list[int]:
    bos = getattr(model.tokenizer, "bos_token_id", None)
    return [] if bos is None else [int(bos)]


def induction_prompts(model: HookedTransformer, n: int, span: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """n prompts: BOS, `span` distinct random word pieces, then the same again without the last; the answer is the
    last piece, and the relevant position is its earlier copy (the position after the earlier occurrence of the
    prompt's last token)."""
    rng = np.random.default_rng(seed)
    start = _bos(model)
    rows, answers = [], []
    for _ in range(n):
        drawn = rng.choice(np.arange(*INDUCTION_IDS), size=span, replace=False).tolist()
        rows.append(start + drawn + drawn[:-1])
        answers.append(drawn[-1])
    tokens = torch.tensor(rows)
    relevant = torch.zeros_like(tokens, dtype=torch.bool)
    relevant[:, len(start) + span - 1] = True
    return tokens, relevant, torch.tensor(answers)


def single_tokens(model: HookedTransformer, words: tuple[str, ...]) -> list[str]:
    """The words that are one token after a space for this model's tokenizer."""
    kept = []
    for word in words:
        try:
            single_token(model, f" {word}")
        except ValueError:
            continue
        kept.append(word)
    return kept


def ioi_prompts(model: HookedTransformer, n: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """n IOI prompts (`IOI_TEMPLATE`, the indirect object named first or second), from the names, places and things
    that are single tokens; the relevant position is the indirect object's name, the answer that name."""
    names, places, things = (single_tokens(model, words) for words in (IOI_NAMES, IOI_PLACES, IOI_THINGS))
    if len(names) < 2 or not places or not things:
        raise ValueError("the model's tokenizer has too few single-token names, places or things for IOI prompts")
    rng = np.random.default_rng(seed)
    rows, relevant, answers = [], [], []
    for k in range(n):
        io, s = rng.choice(names, size=2, replace=False)
        a, b = (io, s) if k % 2 == 0 else (s, io)
        text = IOI_TEMPLATE.format(a=a, b=b, place=rng.choice(places), subject=s, thing=rng.choice(things))
        ids = model.to_tokens(text)[0]
        io_id = single_token(model, f" {io}")
        rows.append(ids)
        relevant.append(ids == io_id)
        answers.append(io_id)
    return torch.stack(rows), torch.stack(relevant), torch.tensor(answers)


def capital_prompt(model: HookedTransformer, subject: str) -> tuple[Tensor, Tensor]:
    """The prompt "The capital of X is" as tokens, and its subject's positions: those the subject's words add to
    "The capital of" (a ValueError where the tokenizer merges them across the boundary)."""
    before = model.to_tokens(CAPITAL_PROMPT.split(" {subject}")[0])[0]
    through = model.to_tokens(CAPITAL_PROMPT.split(" is")[0].format(subject=subject))[0]
    tokens = model.to_tokens(CAPITAL_PROMPT.format(subject=subject))[0]
    if not (torch.equal(tokens[: len(through)], through) and torch.equal(through[: len(before)], before)):
        raise ValueError(f"the tokenizer merges {subject!r} with the words around it")
    relevant = torch.zeros_like(tokens, dtype=torch.bool)
    relevant[len(before) : len(through)] = True
    return tokens, relevant


def capital_prompts(model: HookedTransformer, candidates: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """Up to `candidates` capital questions of the question set, of the commonest prompt length (so that they batch),
    in an order drawn from `seed`: their prompts, subjects' positions and the answers' first tokens."""
    built = []
    for question in load_questions(form="short", kind="capital"):
        try:
            tokens, relevant = capital_prompt(model, question.subject)
        except ValueError:
            continue
        built.append((tokens, relevant, int(model.to_tokens(f" {question.answer}", prepend_bos=False)[0, 0])))
    lengths = [len(t) for t, _, _ in built]
    common = max(set(lengths), key=lambda n: (lengths.count(n), -n))
    chosen = [b for b in built if len(b[0]) == common]
    order = np.random.default_rng(seed).permutation(len(chosen))[:candidates]
    chosen = [chosen[i] for i in order]
    return (
        torch.stack([t for t, _, _ in chosen]),
        torch.stack([r for _, r, _ in chosen]),
        torch.tensor([a for _, _, a in chosen]),
    )


@torch.inference_mode()
def answered(model: HookedTransformer, tokens: Tensor, answers: Tensor, rows: int = 16) -> Tensor:
    """Which prompts the model answers: its top next token after the last is the answer."""
    top = torch.cat([model(tokens[i : i + rows])[:, -1].argmax(-1) for i in range(0, len(tokens), rows)])
    return top == answers


def build_task(model: HookedTransformer, name: str, profile: RealProfile, seed: int) -> Task:
    """The task's prompts (three times `profile.prompts` tried; the capitals: `profile.capital_candidates`), of which
    the first `profile.prompts` the model answers are kept."""
    task_seed = int(np.random.SeedSequence([seed, list(REAL_TASKS).index(name)]).generate_state(1)[0])
    if name == "induction":
        tokens, relevant, answers = induction_prompts(model, 3 * profile.prompts, profile.induction_span, task_seed)
    elif name == "ioi":
        tokens, relevant, answers = ioi_prompts(model, 3 * profile.prompts, task_seed)
    else:
        tokens, relevant, answers = capital_prompts(model, profile.capital_candidates, task_seed)
    right = answered(model, tokens, answers)
    keep = torch.nonzero(right)[:, 0][: profile.prompts]
    return Task(tokens[keep], relevant[keep], answers[keep], len(tokens), int(right.sum()))


def effect_tokens(profile: RealProfile, seed: int) -> Tensor:
    """The random word pieces every position is resampled to for the causal effects."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, len(REAL_TASKS)]).generate_state(1)[0])
    return torch.from_numpy(rng.choice(np.arange(*INDUCTION_IDS), size=profile.effect_tokens, replace=False))


def grade_task(
    model: HookedTransformer,
    untrained: HookedTransformer,
    transcoders: Any,
    name: str,
    task: Task,
    profile: RealProfile,
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every method and baseline on the task's prompts against its untrained copy; the attribution graph on the
    first `profile.graph_prompts` against untrained transcoders. The table's rows and the task's summary."""
    world, readout = REAL_TASKS[name]
    values = effect_tokens(profile, seed)
    common = {"n_boot": profile.n_boot, "seed": seed, "effect_values": values}
    graded = grade_input_attribution(
        model,
        task.tokens,
        task.relevant,
        METHODS,
        target=task.answers,
        ig_steps=profile.ig_steps,
        controls={UNTRAINED_MODEL: untrained},
        **common,
    )
    rows = [row(method, world, readout, grade) for method, grades in graded.grades.items() for grade in grades.values()]
    summary: dict[str, Any] = {
        "world": world,
        "readout": readout,
        "tried": task.tried,
        "answered": task.kept,
        "prompts": int(task.tokens.shape[0]),
        "length": int(task.tokens.shape[1]),
        "effect_tokens": values.tolist(),
        "tokens": task.tokens.tolist(),
        "relevant": task.relevant.tolist(),
        "example": {m: s[0].tolist() for m, s in graded.scores.items()},
    }
    graphs = min(profile.graph_prompts, int(task.tokens.shape[0]))
    if transcoders is not None and graphs > 0:
        graph = grade_input_attribution(
            model,
            task.tokens[:graphs],
            task.relevant[:graphs],
            (),
            transcoders=transcoders,
            graph_features=profile.graph_features,
            controls={},
            baselines=(),
            **common,
        )
        rows += [row("attribution_graph", world, readout, g) for g in graph.grades["attribution_graph"].values()]
        rows += [row("attribution_graph", world, readout, g) for g in graph.replacement.values()]
        summary["graph_prompts"] = graphs
    return rows, summary


def load_real(name: str) -> tuple[HookedTransformer, Any, str]:
    """The pretrained model, its default transcoder set (None, with why, where the model's folder has none) and
    what was done about the graph."""
    folder = model_folder(name)
    if GRAPH_SET in transcoder_sets(folder):
        model, transcoders = open_set(folder, GRAPH_SET, every_layer=True)
        return model, transcoders, f"over {folder.name}'s transcoder set {GRAPH_SET!r}"
    model = load_model(name).eval()
    return model, None, f"left out: {folder.name} has no transcoder set {GRAPH_SET!r} (`forma transcoders`)"


def run_real(
    inputs: tuple[HookedTransformer, Any, str],
    name: str,
    profile: RealProfile,
    seed: int,
    out: Path,
    corpus: str | Path | None = None,
) -> dict:
    """The real-model track into `out`: each task's prompts, every method graded on them, the head detectors and
    (over `corpus`) the lenses, the table (scoreboard.parquet) and the headlines (results.json's dict)."""
    clock, load = time.perf_counter(), os.getloadavg()[0]
    model, transcoders, graph = inputs
    untrained = random_model(model, seed=seed + 1)
    rows: list[dict[str, Any]] = []
    tasks, seconds = {}, {}
    with bar(len(profile.tasks), "tasks graded", unit="task") as counter:
        for task_name in profile.tasks:
            began = time.perf_counter()
            task = build_task(model, task_name, profile, seed)
            more, tasks[task_name] = grade_task(model, untrained, transcoders, task_name, task, profile, seed)
            rows += more
            seconds[task_name] = time.perf_counter() - began
            counter.update()
    parts, more = lens_and_head_rows(model, profile, corpus, seconds)
    table = rows + more  # the one place the track's parts join the table
    save_table(table, out, "scoreboard")
    results: dict[str, Any] = {
        "model": name,
        "profile": dataclasses.asdict(profile),
        "graph": graph,
        "lenses": parts,
        "table": table,
        "worlds": {REAL_TASKS[t][0]: tasks[t] for t in profile.tasks},
        "seconds": seconds | {"total": time.perf_counter() - clock},
        "load_average": load,
        "peak_rss_gb": peak_rss_gb(),
    }
    results["headlines"] = real_headlines(results)
    results["figures"] = write_real_figures(out, results)
    return results


def lens_and_head_rows(
    model: HookedTransformer, profile: RealProfile, corpus: str | Path | None, seconds: dict[str, float]
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The head detectors' rows and, over `corpus`, the lenses' (experiments.scoreboard.real_lenses), with what was
    graded or why not; each part's time in `seconds`."""
    if profile.lenses is None:
        return {"heads": "not graded (the profile has no lens sizes)", "lenses": "not graded"}, []
    began = time.perf_counter()
    rows = head_rows(model, profile.lenses)
    seconds["heads"] = time.perf_counter() - began
    if corpus is None:
        why = "left out: no corpus given (`forma corpus real --out DIR`, then --corpus DIR)"
        return {"heads": "graded", "lenses": why}, rows
    began = time.perf_counter()
    rows += lens_rows(model, corpus, profile.lenses)
    seconds["lenses"] = time.perf_counter() - began
    return {"heads": "graded", "lenses": f"graded on the corpus in {corpus}"}, rows


def real_headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per task, which methods beat the best trivial baseline and their control (summary.attribution_headline), and
    whether the graph owes its grades to the transcoders (summary.graph_headline), where it was graded."""
    out = []
    for world, task in results["worlds"].items():
        out.append(attribution_headline(results, world, task["readout"]))
        if task.get("graph_prompts", 0) >= 2:  # one prompt has no interval to judge the graph by
            out.append(graph_headline(results, world, task["readout"]))
    return out
