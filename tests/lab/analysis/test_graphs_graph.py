"""lab.analysis.graphs.graph: files, node ids, supernodes, circuit-tracer's JSON."""

import json

import pytest
import torch

from lab.analysis.graphs.attribute import attribute
from lab.analysis.graphs.graph import Graph, to_circuit_tracer
from lab.analysis.graphs.influence import prune
from tests.builders import random_transcoders, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def graph():
    model = tiny_model()
    return attribute(model, random_transcoders(model), torch.arange(3, 13))


def test_save_load_round_trip_keeps_supernodes(graph, tmp_path):
    ids = graph.node_ids()
    graph.supernodes = [{"name": "early", "nodes": ids[:2]}]
    graph.save(tmp_path / "g")
    again = Graph.load(tmp_path / "g")
    for name in ("adjacency", "features", "tokens", "inputs", "bias", "logit_tokens", "activations"):
        assert torch.equal(getattr(again, name), getattr(graph, name))
    assert again.supernodes == graph.supernodes and again.meta == json.loads(json.dumps(graph.meta))
    again.supernodes = [{"name": "late", "nodes": ids[-3:]}]
    again.save_supernodes(tmp_path / "g")
    assert Graph.load(tmp_path / "g").supernodes[0]["name"] == "late"
    graph.supernodes = []


def test_bad_supernodes_and_files_are_one_clear_line(graph, tmp_path):
    graph.supernodes = [{"name": "x", "nodes": ["no_such_node"]}]
    with pytest.raises(ValueError, match="does not hold"):
        graph.save(tmp_path / "g")
    graph.supernodes = [{"name": "", "nodes": graph.node_ids()[:1]}]
    with pytest.raises(ValueError, match="needs a name"):
        graph.save(tmp_path / "g")
    graph.supernodes = []
    with pytest.raises(FileNotFoundError, match="not an attribution graph"):
        Graph.load(tmp_path / "nothing")


def test_node_ids_follow_circuit_tracer(graph):
    ids = graph.node_ids()
    layer, pos, feature = graph.features[0].tolist()
    assert ids[0] == f"{layer}_{feature}_{pos}"
    assert ids[graph.error_index(1, 2)] == "err_1_2"
    assert ids[graph.token_index(4)] == f"E_{int(graph.tokens[4])}_4"
    assert ids[graph.logit_index(0)] == f"{graph.n_layers + 1}_{int(graph.logit_tokens[0])}_{graph.n_pos - 1}"
    assert len(set(ids)) == len(ids)


def test_the_export_holds_circuit_tracers_fields(graph):
    pruned = prune(graph)
    graph.supernodes = [{"name": "tokens", "nodes": graph.node_ids()[graph.token_index(0) : graph.token_index(2)]}]
    data = to_circuit_tracer(graph, pruned.node_mask, pruned.edge_mask, pruned.cumulative, slug="t", scan="forma")
    graph.supernodes = []
    assert set(data) == {"metadata", "qParams", "nodes", "links"}
    ids = {n["node_id"] for n in data["nodes"]}
    assert all(link["source"] in ids and link["target"] in ids for link in data["links"])
    kinds = {n["feature_type"] for n in data["nodes"]}
    assert {"embedding", "logit", "cross layer transcoder"} <= kinds
    assert data["qParams"]["supernodes"][0][0] == "tokens"
    assert sum(n["is_target_logit"] for n in data["nodes"]) == 1
    assert len(data["links"]) == int(pruned.edge_mask[pruned.node_mask][:, pruned.node_mask].sum())


@pytest.mark.parametrize(
    "change, says",
    [
        ({"n_layers": 0}, "at least one layer"),
        ({"n_layers": 7}, "adjacency has shape"),
        ({"adjacency": lambda t: t.index_fill(0, torch.tensor([0]), float("nan"))}, "not finite numbers"),
        ({"bias": lambda t: t[:-1]}, "bias has shape"),
        ({"features": lambda t: t.index_fill(1, torch.tensor([0]), 9)}, "outside the graph's 3 layers"),
        ({"features": lambda t: t.float()}, "whole numbers"),
    ],
)
def test_a_graphs_tensors_are_checked_against_its_layer_count(graph, tmp_path, change, says):
    """graph.json's n_layers fixes how many nodes the tensors hold (features, n_layers · n_pos error nodes, tokens,
    logits): a file whose tensors do not fit it, or hold NaN, is one clear line, never a graph drawn wrong."""
    from safetensors.torch import load_file, save_file

    graph.supernodes = []
    folder = graph.save(tmp_path / "g")
    if "n_layers" in change:
        meta = json.loads((folder / "graph.json").read_text())
        meta["n_layers"] = change["n_layers"]
        (folder / "graph.json").write_text(json.dumps(meta))
    else:
        tensors = load_file(str(folder / "graph.safetensors"))
        ((name, edit),) = change.items()
        tensors[name] = edit(tensors[name]).contiguous()
        save_file(tensors, str(folder / "graph.safetensors"))
    with pytest.raises(ValueError, match=says) as err:
        Graph.load(folder)
    assert "\n" not in str(err.value) and "graph.safetensors" in str(err.value)


def test_a_graphs_killed_writes_are_removed_by_its_next_save_and_nothing_else(graph, tmp_path):
    """What a write of graph.safetensors or graph.json killed half-way leaves (atomic_write's temporary folder,
    safetensors' `.tmpXXXXXX` inside) goes when the graph is saved again; a file of the user's stays."""
    graph.supernodes = []
    folder = graph.save(tmp_path / "g")
    for name in ("graph.safetensors", "graph.json"):
        (folder / f".{name}.ab12cd.tmp").mkdir()
        (folder / f".{name}.ab12cd.tmp" / ".tmpX1y2Z3").write_bytes(b"half")
    (folder / ".tmpAbC123").write_text("the user's")
    graph.save_supernodes(folder)
    assert sorted(p.name for p in folder.iterdir()) == [".tmpAbC123", "graph.json", "graph.safetensors"]
