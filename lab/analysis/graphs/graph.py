"""An attribution graph: nodes, the dense matrix of direct edges between them, each target node's input and bias, and
the supernodes a person grouped by hand; saved as a folder (graph.safetensors + graph.json, nothing pickled) and
exported in circuit-tracer's graph JSON, which its viewer and Neuronpedia read.

Nodes are ordered as circuit-tracer orders them: the active features (by layer, position, feature), the error nodes
(layer-major: layer · n_pos + pos), the token embeddings (by position), the logits (most probable first).
`adjacency[t, s]` is the direct edge from node s into node t; only features and logits have inputs. Node ids are
circuit-tracer's: feature `{layer}_{feature}_{pos}`, token `E_{token}_{pos}`, logit `{n_layers + 1}_{token}_{pos}`;
but an error node is `err_{layer}_{pos}`, since circuit-tracer's `0_{layer}_{pos}` is also the id of layer 0's feature
`layer` at that position (its viewer tells the two apart by feature_type; supernodes and links need unique ids).
"""

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from lab.files import atomic_write, atomic_write_text, is_owned_temporary, remove_temporary
from lab.outside_files import InputError, read_json, regular_file

GRAPH_FORMAT = "forma-attribution-graph/1"
TENSORS_FILE = "graph.safetensors"
META_FILE = "graph.json"
GRAPHS_DIR = "graphs"  # a transcoder set's folder keeps the graphs made with it here, one folder per prompt
TENSOR_NAMES = ("tokens", "features", "activations", "logit_tokens", "logit_probs", "adjacency", "inputs", "bias")


@dataclass
class Graph:
    """The direct-effect graph of one prompt's local replacement model."""

    tokens: Tensor  # [n_pos] token ids of the prompt
    features: Tensor  # [n_features, 3]: (layer, pos, feature) of each active feature
    activations: Tensor  # [n_features]
    logit_tokens: Tensor  # [n_logits] the target tokens at the last position
    logit_probs: Tensor  # [n_logits] their probabilities
    adjacency: Tensor  # [n_nodes, n_nodes]: adjacency[target, source]
    inputs: Tensor  # [n_nodes]: a feature's pre-activation, a logit's value less the mean logit; 0 for sources
    bias: Tensor  # [n_nodes]: the input with every source zero (attention, norm and decoder biases, positions)
    n_layers: int
    meta: dict[str, Any] = field(default_factory=dict)  # prompt text, token strings, model and transcoders, timings
    supernodes: list[dict[str, Any]] = field(default_factory=list)  # [{"name": str, "nodes": [node ids]}]

    @property
    def n_pos(self) -> int:
        return int(self.tokens.numel())

    @property
    def n_features(self) -> int:
        return int(len(self.features))

    @property
    def n_logits(self) -> int:
        return int(self.logit_tokens.numel())

    @property
    def n_nodes(self) -> int:
        return int(self.adjacency.shape[0])

    def error_index(self, layer: int, pos: int) -> int:
        return self.n_features + layer * self.n_pos + pos

    def token_index(self, pos: int) -> int:
        return self.n_features + self.n_layers * self.n_pos + pos

    def logit_index(self, k: int) -> int:
        return self.n_nodes - self.n_logits + k

    def kinds(self) -> list[str]:
        """'feature', 'error', 'token' or 'logit' for every node, in order."""
        return (
            ["feature"] * self.n_features
            + ["error"] * (self.n_layers * self.n_pos)
            + ["token"] * self.n_pos
            + ["logit"] * self.n_logits
        )

    def node(self, index: int) -> dict[str, Any]:
        """One node as a record: id, kind, layer (tokens −1, logits n_layers), position, and its feature or token."""
        n_err = self.n_layers * self.n_pos
        if index < self.n_features:
            layer, pos, feature = (int(v) for v in self.features[index])
            return {
                "id": f"{layer}_{feature}_{pos}",
                "kind": "feature",
                "layer": layer,
                "pos": pos,
                "feature": feature,
                "activation": float(self.activations[index]),
            }
        if index < self.n_features + n_err:
            layer, pos = divmod(index - self.n_features, self.n_pos)
            return {"id": f"err_{layer}_{pos}", "kind": "error", "layer": layer, "pos": pos}
        if index < self.n_features + n_err + self.n_pos:
            pos = index - self.n_features - n_err
            token = int(self.tokens[pos])
            return {"id": f"E_{token}_{pos}", "kind": "token", "layer": -1, "pos": pos, "token": token}
        k = index - (self.n_nodes - self.n_logits)
        token = int(self.logit_tokens[k])
        return {
            "id": f"{self.n_layers + 1}_{token}_{self.n_pos - 1}",
            "kind": "logit",
            "layer": self.n_layers,
            "pos": self.n_pos - 1,
            "token": token,
            "probability": float(self.logit_probs[k]),
        }

    def node_ids(self) -> list[str]:
        return [self.node(i)["id"] for i in range(self.n_nodes)]

    # --- files --------------------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """graph.safetensors and graph.json in `directory`, each written atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {name: getattr(self, name).detach().cpu().contiguous() for name in TENSOR_NAMES}
        atomic_write(directory / TENSORS_FILE, lambda path: save_file(tensors, str(path)))
        self.save_supernodes(directory)
        return directory

    def save_supernodes(self, directory: str | Path) -> None:
        """graph.json alone (meta and supernodes): what the dashboard rewrites when a person groups nodes. What
        killed writes of the graph's two files left in `directory` goes first (by its names; nothing else)."""
        check_supernodes(self.supernodes, set(self.node_ids()))
        for path in Path(directory).glob(".*"):
            if is_owned_temporary(path, {TENSORS_FILE, META_FILE}):
                remove_temporary(path)
        meta = {"format": GRAPH_FORMAT, "n_layers": self.n_layers, "meta": self.meta, "supernodes": self.supernodes}
        atomic_write_text(Path(directory) / META_FILE, json.dumps(meta, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> "Graph":
        """The graph saved in `directory`: FileNotFoundError when it holds no graph.json (no graph there yet, or
        a save killed after the tensors, which are written first: nothing of a person's is lost by making it
        anew), an InputError naming what is wrong for anything else — graph.json without the tensors too, since it
        holds a person's supernodes, which a caller must not save a new graph over."""
        directory = Path(directory)
        if not os.path.lexists(directory / META_FILE):
            raise FileNotFoundError(f"{directory} holds no {META_FILE}: not an attribution graph folder")
        if not os.path.lexists(directory / TENSORS_FILE):
            raise InputError(f"{directory} holds {META_FILE} but no {TENSORS_FILE}: the graph is incomplete")
        path = directory / META_FILE
        meta = read_json(path, directory, what="graph description")
        if not isinstance(meta, dict) or meta.get("format") != GRAPH_FORMAT:
            raise InputError(f"{path} is not a {GRAPH_FORMAT} file")
        if type(meta.get("n_layers")) is not int or meta["n_layers"] < 0 or not isinstance(meta.get("meta", {}), dict):
            raise InputError(
                f"{path}: n_layers must be a whole number ≥ 0 and meta an object, got "
                f"{meta.get('n_layers')!r} and a {type(meta.get('meta', {})).__name__}"
            )
        try:
            tensors = load_file(str(regular_file(directory / TENSORS_FILE, directory, what="graph's tensors")))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"malformed or truncated {directory / TENSORS_FILE}: {err}") from err
        missing = [name for name in TENSOR_NAMES if name not in tensors]
        if missing:
            raise ValueError(f"{directory / TENSORS_FILE} lacks {missing}")
        graph = cls(
            **{name: tensors[name] for name in TENSOR_NAMES},
            n_layers=meta["n_layers"],
            meta=meta.get("meta", {}),
            supernodes=meta.get("supernodes", []),
        )
        problem = check_tensors(graph)
        if problem:
            raise InputError(
                f"{directory / TENSORS_FILE} does not fit graph.json's n_layers {graph.n_layers}: {problem}"
            )
        try:
            check_supernodes(graph.supernodes, set(graph.node_ids()))
        except ValueError as err:
            raise InputError(f"{path}: {err}") from None
        return graph


def check_tensors(graph: Graph) -> str | None:
    """What is wrong with a graph's tensors, read from a file, against its n_layers and each other (None: nothing):
    the shapes the node order implies (n_features + n_layers · n_pos + n_pos + n_logits nodes), features' layers and
    positions within the graph, and finite numbers."""
    t = {name: getattr(graph, name) for name in TENSOR_NAMES}
    if graph.n_layers < 1:
        return "a graph has at least one layer"
    for name, dims in (("tokens", 1), ("features", 2), ("activations", 1), ("logit_tokens", 1), ("logit_probs", 1)):
        if t[name].dim() != dims:
            return f"{name} has {t[name].dim()} dimensions, not {dims}"
    if any(t[name].is_floating_point() or t[name].is_complex() for name in ("tokens", "features", "logit_tokens")):
        return "tokens, features and logit_tokens hold whole numbers"
    n_pos, n_features, n_logits = t["tokens"].numel(), len(t["features"]), t["logit_tokens"].numel()
    n_nodes = n_features + graph.n_layers * n_pos + n_pos + n_logits
    shapes = {
        "features": (n_features, 3),
        "activations": (n_features,),
        "logit_probs": (n_logits,),
        "adjacency": (n_nodes, n_nodes),
        "inputs": (n_nodes,),
        "bias": (n_nodes,),
    }
    for name, shape in shapes.items():
        if tuple(t[name].shape) != shape:
            return f"{name} has shape {tuple(t[name].shape)}, not {shape}"
    if n_pos < 1 or n_logits < 1:
        return "a graph has at least one position and one logit"
    if n_features and not (
        t["features"][:, 0].ge(0).all()
        and t["features"][:, 0].lt(graph.n_layers).all()
        and t["features"][:, 1].ge(0).all()
        and t["features"][:, 1].lt(n_pos).all()
        and t["features"][:, 2].ge(0).all()
    ):
        return f"a feature lies outside the graph's {graph.n_layers} layers and {n_pos} positions"
    for name in ("activations", "logit_probs", "adjacency", "inputs", "bias"):
        if not t[name].is_floating_point() or not torch.isfinite(t[name]).all():
            return f"{name} holds values that are not finite numbers (NaN or infinite)"
    return None


def graph_folder(transcoders_folder: str | Path, tokens: Tensor) -> Path:
    """Where the graph of `tokens` made with the transcoders in `transcoders_folder` is kept: graphs/<a SHA-256 of
    the token ids>, so that the same prompt finds its graph (and its supernodes) again."""
    digest = hashlib.sha256(torch.as_tensor(tokens).reshape(-1).to(torch.int64).numpy().tobytes()).hexdigest()
    return Path(transcoders_folder) / GRAPHS_DIR / digest[:16]


def check_supernodes(supernodes: Any, ids: set[str]) -> None:
    """Supernodes are [{"name": non-empty str, "nodes": [ids of this graph's nodes]}] with distinct names."""
    if not isinstance(supernodes, list):
        raise ValueError(f"supernodes must be a list of {{'name', 'nodes'}} records, got {type(supernodes).__name__}")
    names = set()
    for s in supernodes:
        if not (
            isinstance(s, dict)
            and isinstance(s.get("name"), str)
            and s["name"].strip()
            and isinstance(s.get("nodes"), list)
            and s["nodes"]
            and all(isinstance(n, str) for n in s["nodes"])
        ):
            raise ValueError(f"a supernode needs a name and a non-empty list of node ids, got {s!r}")
        if s["name"] in names:
            raise ValueError(f"two supernodes are named {s['name']!r}")
        names.add(s["name"])
        unknown = [n for n in s["nodes"] if n not in ids]
        if unknown:
            raise ValueError(f"supernode {s['name']!r} names nodes this graph does not hold: {unknown[:3]}")


def to_circuit_tracer(
    graph: Graph,
    node_mask: Tensor,
    edge_mask: Tensor,
    cumulative: Tensor,
    *,
    slug: str,
    scan: str,
    token_strings: list[str] | None = None,
    node_threshold: float = 0.8,
) -> dict[str, Any]:
    """The pruned graph as circuit-tracer's graph JSON (`create_graph_files`'s Model: metadata, qParams, nodes,
    links), supernodes in qParams as [name, *node ids]."""
    strings = token_strings or [str(int(t)) for t in graph.tokens]
    nodes = {
        index: _tracer_node(graph, index, float(cumulative[index]))
        for index in torch.nonzero(node_mask).flatten().tolist()
    }
    targets, sources = torch.nonzero(edge_mask, as_tuple=True)
    links = [
        {"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": float(graph.adjacency[t, s])}
        for t, s in zip(targets.tolist(), sources.tolist())
        if s in nodes and t in nodes
    ]
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    used = [n for n in nodes.values() if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")]
    return {
        "metadata": {
            "slug": slug,
            "scan": scan,
            "transcoder_list": [],
            "prompt_tokens": strings,
            "prompt": graph.meta.get("prompt", "".join(strings)),
            "node_threshold": node_threshold,
            "schema_version": 1,
        },
        "qParams": {
            "pinnedIds": [],
            "supernodes": [[s["name"], *s["nodes"]] for s in graph.supernodes],
            "linkType": "both",
            "clickedId": "",
            "sg_pos": "",
        },
        "nodes": used,
        "links": links,
    }


def _tracer_node(graph: Graph, index: int, influence: float) -> dict[str, Any]:
    """Node `index` of the graph as circuit-tracer's graph JSON writes a node of its kind (feature, error, token
    or logit)."""
    n = graph.node(index)
    base = {
        "node_id": n["id"],
        "layer": str(n["layer"]),
        "ctx_idx": n["pos"],
        "run_idx": 0,
        "reverse_ctx_idx": 0,
        "token_prob": 0.0,
        "is_target_logit": False,
        "clerp": "",
        "influence": influence,
        "activation": None,
    }
    if n["kind"] == "feature":
        layer, feature = n["layer"], n["feature"]
        base |= {
            "feature": (layer + feature) * (layer + feature + 1) // 2 + feature,
            "feature_type": "cross layer transcoder",
            "jsNodeId": f"{layer}_{feature}-0",
            "activation": n["activation"],
        }
    elif n["kind"] == "error":
        base |= {
            "feature": -1,
            "feature_type": "mlp reconstruction error",
            "jsNodeId": f"{n['layer']}_{n['pos']}-0",
        }
    elif n["kind"] == "token":
        base |= {
            "feature": n["pos"],
            "layer": "E",
            "feature_type": "embedding",
            "jsNodeId": f"E_{n['token']}-{n['pos']}",
        }
    else:
        k = index - (graph.n_nodes - graph.n_logits)
        base |= {
            "feature": n["token"],
            "layer": str(graph.n_layers + 1),
            "feature_type": "logit",
            "token_prob": n["probability"],
            "is_target_logit": k == 0,
            "jsNodeId": f"L_{n['token']}-{n['pos']}",
            "influence": None,
            "clerp": f'Output "{graph.meta.get("logit_strings", [""] * graph.n_logits)[k]}" (p={n["probability"]:.3f})',
        }
    return base
