"""Attribution graphs of a zoo model's prompts whose answer is known (`forma graphs NAME`): for smollm2, a fact
("The capital of Italy is" → " Rome"), indirect-object identification, induction on repeated random tokens, and a
two-hop fact. For each prompt, the graph (lab.analysis.graphs) within a feature budget and what holds it to the model:

    exactness       every node's input less its edges and bias; the local replacement's logits less the model's;
                    a feature removed in the frozen replacement moving every target by minus its edges
    scores          the replacement and completeness scores (lab.analysis.graphs.influence.graph_scores)
    interventions   the top features ablated in the full model against the graph's prediction, with attention and
                    norms live and frozen (lab.analysis.graphs.checks.intervention_agreement)
    top features    the features of largest influence on the logits: where each is, its edge into the answer, the
                    tokens it promotes (the graph read in words)

and one swap in the full model: the features of the fact's subject replaced by those of another subject's prompt
(Italy's by France's), which should move the answer toward the other's (" Rome" toward " Paris").
"""

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from lab.analysis.graphs.attribute import attribute, prompt_tokens, token_strings
from lab.analysis.graphs.checks import (
    feature_edit,
    frozen_ablation,
    intervention_agreement,
    node_residuals,
    replacement_logits,
)
from lab.analysis.graphs.graph import Graph
from lab.analysis.graphs.influence import graph_scores, node_influence
from lab.analysis.graphs.replacement import LocalReplacement
from lab.analysis.transcoders.measures import feature_logits
from lab.analysis.transcoders.model import Transcoders

KNOWN_MODELS = ("smollm2",)  # the zoo models whose prompts are known here (`known_prompts`)
INDUCTION_SEED, INDUCTION_LENGTH = 0, 12  # a random sequence of 12 tokens, then the same again but its last
INDUCTION_IDS = (1000, 20000)  # drawn among ordinary word pieces of smollm2's vocabulary (none special)


@dataclass(frozen=True)
class KnownPrompt:
    """A prompt whose answer is known: `answer` is the next token the model gives (checked on the model, first)."""

    name: str
    prompt: str | tuple[int, ...]
    answer: str
    note: str


@dataclass(frozen=True)
class Swap:
    """The features at the subject's position in `prompt` replaced by those at the same position in `other`."""

    prompt: str
    other: str
    answer: str
    other_answer: str


def induction_ids(seed: int = INDUCTION_SEED, length: int = INDUCTION_LENGTH) -> tuple[int, ...]:
    """A random sequence, then the same again without its last token: the answer is that token (the copy)."""
    drawn = torch.randint(*INDUCTION_IDS, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    return tuple(drawn + drawn[:-1])


def known_prompts(model: Any) -> list[KnownPrompt]:
    """The four prompts of smollm2's graphs, their answers as the model's tokens."""
    copy = induction_ids()
    return [
        KnownPrompt("capital", "The capital of Italy is", " Rome", "a fact: the subject's features carry it"),
        KnownPrompt(
            "ioi",
            "When Mary and John went to the store, John gave a drink to",
            " Mary",
            "indirect-object identification: the name that is not repeated",
        ),
        KnownPrompt(
            "induction",
            copy,
            token_strings(model, torch.tensor([copy[INDUCTION_LENGTH - 1]]))[0],
            f"induction: {INDUCTION_LENGTH} random tokens, then again; the answer is the copy of the last",
        ),
        KnownPrompt(
            "two_hop",
            "The capital of the country whose currency is the yen is",
            " Tokyo",
            "two hops: the yen → Japan → Tokyo (the model may name the country first)",
        ),
    ]


SWAP = Swap("The capital of Italy is", "The capital of France is", " Rome", " Paris")


def single_token(model: Any, text: str) -> int:
    ids = model.to_tokens(text, prepend_bos=False)[0]
    if ids.numel() != 1:
        raise ValueError(f"{text!r} is {ids.numel()} tokens for this model, not one")
    return int(ids[0])


def graph_record(
    model: Any, transcoders: Transcoders, known: KnownPrompt, max_feature_nodes: int, top: int
) -> tuple[Graph, dict[str, Any]]:
    """The graph of one known prompt and the checks of it (see the module's docstring)."""
    start = time.perf_counter()
    tokens = prompt_tokens(model, list(known.prompt) if isinstance(known.prompt, tuple) else known.prompt)
    graph = attribute(model, transcoders, tokens, max_feature_nodes=max_feature_nodes)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        logits = model(tokens[None])[0].float()
    answer = single_token(model, known.answer)
    rank = int((logits[-1] > logits[-1, answer]).sum())
    residuals = node_residuals(graph).abs()
    scale = graph.inputs.abs().max().clamp_min(1e-30)
    strongest = int(graph.adjacency[-graph.n_logits :, : graph.n_features].abs().sum(0).argmax())
    moved = frozen_ablation(model, transcoders, graph, strongest)
    edges = graph.adjacency[:, strongest].clone()
    edges[graph.n_features : graph.n_nodes - graph.n_logits] = 0  # sources: not targets
    return graph, {
        **{k: v for k, v in asdict(known).items() if k != "prompt"},
        "prompt": graph.meta["prompt"],
        "tokens": int(tokens.numel()),
        "answer_rank": rank,
        "answer_probability": float(logits[-1].softmax(-1)[answer]),
        "top_logits": graph.meta["logit_strings"],
        "answer_in_graph": answer in graph.logit_tokens.tolist(),
        "active_features": int(graph.meta["n_active_features"]),
        "feature_nodes": int(graph.n_features),
        "seconds": seconds,
        "node_residual_max": float(residuals.max()),
        "node_residual_relative": float(residuals.max() / scale),
        "replacement_logits_max_error": float((replacement_logits(model, transcoders, tokens) - logits).abs().max()),
        "frozen_ablation_max_error": float((moved + edges).abs().max()),
        **{f"{k}_score": v for k, v in graph_scores(graph).items()},
        "top_features": top_features(model, transcoders, graph, answer, top),
        "agreement": {
            "live": _agreement(intervention_agreement(model, transcoders, graph, top=top)),
            "frozen": _agreement(
                intervention_agreement(model, transcoders, graph, top=top, freeze=("attention", "norms"))
            ),
        },
    }


def top_features(model: Any, transcoders: Transcoders, graph: Graph, answer: int, n: int) -> list[dict[str, Any]]:
    """The graph read in words: its `n` features of largest influence on the logits (over every path), each with
    where it is (layer, position, the token there), its activation there and at every position of the prompt, its
    direct edge into the answer's logit (None
    when the answer is not a logit node) and the tokens its decoder promotes most (through the final norm)."""
    influence = node_influence(graph)[: graph.n_features]
    strings = token_strings(model, graph.tokens)
    logits = graph.logit_tokens.tolist()
    chosen = influence.topk(min(n, graph.n_features)).indices.tolist()
    hooks = {int(graph.features[i, 0]): transcoders.cfg.hook("input", int(graph.features[i, 0])) for i in chosen}
    with torch.no_grad():
        _, cache = model.run_with_cache(graph.tokens[None], names_filter=list(hooks.values()))
    rows = []
    for i in chosen:
        layer, pos, feature = (int(v) for v in graph.features[i])
        every = transcoders.activate(transcoders.encode(cache[hooks[layer]][0].float(), layer), layer)[:, feature]
        promoted, _ = feature_logits(model, transcoders, layer, feature, k=5, final_norm=True)
        edge = graph.adjacency[graph.logit_index(logits.index(answer)), i] if answer in logits else None
        rows.append(
            {
                "node": graph.node(i)["id"],
                "layer": layer,
                "position": pos,
                "token": strings[pos],
                "feature": feature,
                "activation": float(graph.activations[i]),
                "activation_by_position": every.tolist(),
                "influence": float(influence[i]),
                "edge_to_answer": None if edge is None else float(edge),
                "promotes": token_strings(model, torch.tensor([t for t, _ in promoted])),
            }
        )
    return rows


def _agreement(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("correlation", "sign_agreement", "pairs", "non_finite", "direct_correlation", "direct_sign_agreement")
    return {"features": result["features"], **{k: result[k] for k in keys}}


def swap_record(model: Any, transcoders: Transcoders, swap: Swap) -> dict[str, Any]:
    """Every active feature of `swap.prompt` at the position where the two prompts differ (the subject) removed and
    every one of `swap.other` there added, in the full model (attention, norms and MLPs live): the logit difference
    answer − other_answer before, after, and on the other prompt, and the share of the way it moved."""
    tokens = [prompt_tokens(model, p) for p in (swap.prompt, swap.other)]
    a, b = tokens
    if a.shape != b.shape or int((a != b).sum()) != 1:
        raise ValueError(f"{swap.prompt!r} and {swap.other!r} must be as many tokens and differ in one")
    pos = int((a != b).nonzero()[0])
    hooks, counts = [], []
    for prompt, sign in zip(tokens, (-1.0, 1.0)):  # the prompt's features removed, the other's added
        replacement = LocalReplacement(model, transcoders, prompt)
        here = (replacement.features[:, 1] == pos).nonzero().flatten().tolist()
        counts.append(len(here))
        for i in here:
            layer, _, feature = (int(v) for v in replacement.features[i])
            hooks += feature_edit(transcoders, layer, pos, feature, sign * float(replacement.activations[i]))
    ids = [single_token(model, t) for t in (swap.answer, swap.other_answer)]

    def difference(prompt: Tensor, edits: list) -> float:
        with torch.no_grad(), model.hooks(fwd_hooks=edits):
            logits = model(prompt[None])[0, -1].float()
        return float(logits[ids[0]] - logits[ids[1]])

    before, after, other = difference(a, []), difference(a, hooks), difference(b, [])
    return {
        **asdict(swap),
        "subject": token_strings(model, a[pos : pos + 1])[0],
        "other_subject": token_strings(model, b[pos : pos + 1])[0],
        "features_removed": counts[0],
        "features_added": counts[1],
        "difference_before": before,
        "difference_after": after,
        "difference_other": other,
        "moved_share": (before - after) / (before - other) if before != other else float("nan"),
    }


def graphs_report(
    model: Any, transcoders: Transcoders, *, max_feature_nodes: int = 256, top: int = 5, progress: Any = None
) -> tuple[list[Graph], dict[str, Any]]:
    """Every known prompt's graph and record, and the swap's record (see the module's docstring)."""
    graphs, records = [], []
    for known in known_prompts(model):
        if progress is not None:
            progress(f"graph of {known.name}")
        graph, record = graph_record(model, transcoders, known, max_feature_nodes, top)
        graphs.append(graph)
        records.append(record)
    if progress is not None:
        progress("the swap")
    report = {
        "format": "forma-graphs/1",
        "transcoders": transcoders.cfg.to_dict(),
        "max_feature_nodes": max_feature_nodes,
        "top": top,
        "prompts": records,
        "swap": swap_record(model, transcoders, SWAP),
    }
    return graphs, report


def report_lines(report: dict[str, Any]) -> list[str]:
    """The report as a table a terminal shows: a row per prompt, then the swap in a sentence."""
    lines = [
        f"{'prompt':<10} {'answer':<10} {'rank':>4} {'features':>13} {'|residual|':>10} {'|Δlogits|':>9} "
        f"{'repl.':>5} {'compl.':>6} {'live r':>6} {'frozen r':>8} {'overflow':>8} {'s':>5}"
    ]
    for r in report["prompts"]:
        live, frozen = r["agreement"]["live"]["correlation"], r["agreement"]["frozen"]["correlation"]
        # features whose ablation drove the model non-finite, live / frozen (left out of the correlations)
        overflow = f"{r['agreement']['live']['non_finite']}/{r['agreement']['frozen']['non_finite']}"
        lines.append(
            f"{r['name']:<10} {r['answer']!r:<10} {r['answer_rank']:>4} "
            f"{r['feature_nodes']:>5}/{r['active_features']:<7} {r['node_residual_max']:>10.1e} "
            f"{r['replacement_logits_max_error']:>9.1e} {r['replacement_score']:>5.2f} "
            f"{r['completeness_score']:>6.2f} {live:>6.2f} {frozen:>8.2f} {overflow:>8} {r['seconds']:>5.0f}"
        )
    s = report["swap"]
    lines.append(
        f"swap: {s['subject']!r}'s {s['features_removed']} features for {s['other_subject']!r}'s "
        f"{s['features_added']} in {s['prompt']!r}: logit {s['answer']!r} − {s['other_answer']!r} "
        f"{s['difference_before']:.2f} → {s['difference_after']:.2f} ({s['difference_other']:.2f} on "
        f"{s['other']!r}; {s['moved_share']:.0%} of the way)"
    )
    return lines
