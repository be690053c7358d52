"""Attribution graphs of real prompts on smollm2 (`forma graphs smollm2`, lab/zoo/graphs.py), over a quick
transcoder set for all 30 layers trained on a slice of the real corpus: the four prompts whose answer is known
(a fact, indirect-object identification, induction on repeated random tokens, a two-hop fact) are answered by the
model as stated; each graph is exact against the model whatever the transcoders (node inputs equal edges plus
bias, the local replacement's logits equal the model's, a feature removed in the frozen replacement moves every
target by minus its edge); the scores and the interventions' agreement, live and frozen, are reported; the swap
of Italy's features for France's in the full model is measured; and the report is what the command prints."""

import json
import math

import pytest
import torch
from streamlit.testing.v1 import AppTest

from dashboards.pages import page_file
from lab.analysis.graphs.attribute import attribute, token_strings
from lab.analysis.graphs.checks import node_residuals
from lab.analysis.graphs.graph import GRAPHS_DIR, Graph, to_circuit_tracer
from lab.analysis.graphs.influence import node_influence, prune
from lab.analysis.transcoders.measures import feature_logits
from lab.analysis.transcoders.model import model_fingerprint
from lab.cli.parser import GRAPH_MODELS, main
from lab.load import load_model
from lab.measured import REPO
from lab.zoo.graphs import INDUCTION_LENGTH, KNOWN_MODELS, induction_ids, known_prompts, single_token
from lab.zoo.transcoders import GRAPHS_REPORT, open_set, preset
from tests.builders import smollm2_folder

pytestmark = pytest.mark.real

# every layer (no --layers), few features and steps: the graph's exactness does not depend on how well they fit
QUICK_SET = ["--features", "128", "--steps", "10", "--windows", "8", "--held-out-windows", "4"]
BUDGET = ["--max-feature-nodes", "48", "--top", "3"]


@pytest.fixture(scope="module")
def report(zoo, corpus, tmp_path_factory):
    """`forma transcoders smollm2` (all layers, quick) then `forma graphs smollm2`, as a user runs them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FORMA_ZOO_DIR", str(zoo.parent))
        argv = ["transcoders", "smollm2", "--corpus", str(corpus), *QUICK_SET, "--no-progress", "--overwrite"]
        assert main(argv) == 0
        assert main(["graphs", "smollm2", *BUDGET]) == 0
    path = zoo / "transcoders" / "topk" / GRAPHS_REPORT
    return json.loads(path.read_text())


def test_the_known_prompts_are_answered_by_the_model_as_stated(report):
    """The model's own next token is each prompt's answer (the two-hop fact may name the country first: its answer
    is among the graph's logit nodes)."""
    by_name = {r["name"]: r for r in report["prompts"]}
    assert list(by_name) == ["capital", "ioi", "induction", "two_hop"]
    for name in ("capital", "ioi", "induction"):
        assert by_name[name]["answer_rank"] == 0, by_name[name]
    assert by_name["capital"]["answer"] == " Rome" and by_name["ioi"]["answer"] == " Mary"
    assert by_name["two_hop"]["answer_rank"] <= 2 and by_name["two_hop"]["answer_in_graph"], by_name["two_hop"]
    assert by_name["induction"]["tokens"] == 2 * INDUCTION_LENGTH - 1


def test_every_graph_is_exact_against_the_model(report):
    """Node inputs equal their edges plus bias, the local replacement reproduces the model's logits, and a feature
    removed in the frozen replacement moves every target by minus its edge — to float round-off, on every prompt,
    within the feature budget (the rest folded into the error nodes)."""
    for r in report["prompts"]:
        assert r["feature_nodes"] == min(48, r["active_features"]), r
        assert r["node_residual_relative"] < 1e-5, r
        assert r["replacement_logits_max_error"] < 1e-3, r
        assert r["frozen_ablation_max_error"] < 1e-3, r
        assert 0 <= r["replacement_score"] <= 1 and 0 <= r["completeness_score"] <= 1, r


def test_the_interventions_are_reported_live_and_frozen(report):
    for r in report["prompts"]:
        for mode in ("live", "frozen"):
            agreement = r["agreement"][mode]
            assert len(agreement["features"]) == 3 and 0 <= agreement["non_finite"] <= 3, (r["name"], mode)
            if agreement["non_finite"] < 3:  # a feature whose ablation overflows the model is counted apart
                assert agreement["pairs"] > 0, (r["name"], mode)
                assert -1 <= agreement["correlation"] <= 1 and 0 <= agreement["sign_agreement"] <= 1
    swap = report["swap"]
    assert (swap["subject"], swap["other_subject"]) == (" Italy", " France")
    assert swap["features_removed"] > 0 and swap["features_added"] > 0
    # on the prompts themselves: smollm2 prefers " Rome" to " Paris" for Italy and the reverse for France
    assert swap["difference_before"] > 0 > swap["difference_other"]
    assert math.isfinite(swap["moved_share"]) and swap["difference_after"] != swap["difference_before"]


def test_the_command_prints_the_report_and_refuses_a_partial_set(zoo, report, monkeypatch, capsys):
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo.parent))
    with pytest.raises(SystemExit):
        main(["graphs", "markov"])  # no prompts are known for it
    assert "invalid choice: 'markov'" in capsys.readouterr().err
    assert main(["graphs", "smollm2", "--kind", "relu"]) == 2
    assert "has no transcoder set 'relu' (it has: topk)" in capsys.readouterr().err
    assert GRAPH_MODELS == KNOWN_MODELS


def test_the_residual_check_fails_a_graph_whose_edges_are_perturbed(zoo, report):
    """The exactness check is not vacuous: one edge moved by a hundredth of the largest input fails it."""
    model, transcoders = open_set(zoo, "topk", every_layer=True)
    copy = induction_ids()
    assert copy[-1] == copy[INDUCTION_LENGTH - 2] and len(known_prompts(model)) == 4
    graph = attribute(model, transcoders, "The capital of Italy is", max_feature_nodes=16)
    assert float(node_residuals(graph).abs().max()) < 1e-4 * float(graph.inputs.abs().max())
    graph.adjacency[-1, 0] += 0.01 * float(graph.inputs.abs().max())
    assert float(node_residuals(graph).abs().max()) > 1e-3 * float(graph.inputs.abs().max())


def test_the_top_features_are_the_graphs_most_influential_with_their_edge_into_the_answer(zoo, report):
    """The graph read in words: the record's top features are the graph's features of largest influence, in order,
    each at its layer and position with the token there, its edge into " Rome"'s logit and the tokens it promotes."""
    model, transcoders = open_set(zoo, "topk", every_layer=True)
    (record,) = [r for r in report["prompts"] if r["name"] == "capital"]
    graph = attribute(model, transcoders, "The capital of Italy is", max_feature_nodes=48)
    influence = node_influence(graph)[: graph.n_features]
    order = influence.topk(3).indices.tolist()
    assert [f["node"] for f in record["top_features"]] == [graph.node(i)["id"] for i in order]
    rome = graph.logit_tokens.tolist().index(single_token(model, " Rome"))
    for f, i in zip(record["top_features"], order, strict=True):
        assert f["influence"] == pytest.approx(float(influence[i]))
        assert f["edge_to_answer"] == pytest.approx(float(graph.adjacency[graph.logit_index(rome), i]), abs=1e-6)
        assert f["token"] == token_strings(model, graph.tokens)[f["position"]]
        promoted, _ = feature_logits(model, transcoders, f["layer"], f["feature"], k=5, final_norm=True)
        assert f["promotes"] == token_strings(model, torch.tensor([t for t, _ in promoted]))
        hook = transcoders.cfg.hook("input", f["layer"])
        _, cache = model.run_with_cache(graph.tokens[None], names_filter=[hook])
        every = transcoders.activate(transcoders.encode(cache[hook][0].float(), f["layer"]), f["layer"])
        assert f["activation_by_position"] == pytest.approx(every[:, f["feature"]].tolist(), rel=1e-4, abs=1e-4)
        assert f["activation_by_position"][f["position"]] == pytest.approx(f["activation"], rel=1e-4, abs=1e-4)
    assert report["set"]["quality"]["layers"] == list(range(30)) and report["set"]["training"]["steps"] == 10


def test_the_recorded_graphs_are_of_the_default_set_on_smollm2s_weights():
    """docs/measured/graphs/smollm2.json (docs/attribution-graphs.md's walkthrough reads it) is `forma graphs smollm2`
    over the set `forma transcoders smollm2` trains by default, on these weights, at the command's defaults; and
    docs/measured/transcoders/smollm2.json (that set's quality and time) is of the same set."""
    record = json.loads((REPO / "docs" / "measured" / "graphs" / "smollm2.json").read_text(encoding="utf-8"))
    folder = smollm2_folder()
    cfg, training = preset("topk", folder)
    assert record["transcoders"] == json.loads(json.dumps(cfg.to_dict()))
    assert record["set"]["training"] == json.loads(json.dumps(training.to_dict()))
    assert record["set"]["source"]["model"] == model_fingerprint(load_model(folder))
    assert (record["max_feature_nodes"], record["top"]) == (256, 5)
    assert [r["name"] for r in record["prompts"]] == ["capital", "ioi", "induction", "two_hop"]
    trained = json.loads((REPO / "docs" / "measured" / "transcoders" / "smollm2.json").read_text(encoding="utf-8"))
    assert trained["quality"] == record["set"]["quality"]  # the set the graphs were made with, and its time
    assert trained["command"] == "forma transcoders smollm2 --corpus corpora/real"


def test_the_first_words_features_fire_at_every_position_most_at_the_first():
    """What the walkthrough reads in the recorded graphs: the layer-11 features that lead the fact's graph fire at
    every position of the prompt but <|im_start|>, most strongly at its first word (each top feature's activations
    by position are the transcoders' own:
    `test_the_top_features_are_the_graphs_most_influential_with_their_edge_into_the_answer`)."""
    record = json.loads((REPO / "docs" / "measured" / "graphs" / "smollm2.json").read_text(encoding="utf-8"))
    (capital,) = [r for r in record["prompts"] if r["name"] == "capital"]
    leads = [f for f in capital["top_features"] if f["layer"] == 11 and f["position"] == 1]
    assert len(leads) == 3
    for f in leads:
        acts = f["activation_by_position"]
        assert acts[0] == 0 and min(acts[1:]) > 0 and max(acts) == acts[1], f
        assert acts[1] == pytest.approx(f["activation"], rel=1e-4), f


def test_the_recorded_graphs_lead_with_the_first_words_features():
    """The recorded graphs of the fact, IOI and the two-hop fact share their four features of most influence, all at
    the prompt's first word: three of layer 11 (the first of them in each) and one of layer 2; the fact's three of
    layer 11 have edges into the answer of both signs."""
    record = json.loads((REPO / "docs" / "measured" / "graphs" / "smollm2.json").read_text(encoding="utf-8"))
    by_name = {r["name"]: r for r in record["prompts"]}
    leads = {
        name: {(f["layer"], f["feature"], f["position"]) for f in by_name[name]["top_features"][:4]}
        for name in ("capital", "ioi", "two_hop")
    }
    assert leads["capital"] == leads["ioi"] == leads["two_hop"], leads
    assert sorted(layer for layer, _, _ in leads["capital"]) == [2, 11, 11, 11]
    assert {pos for _, _, pos in leads["capital"]} == {1}
    assert all(by_name[name]["top_features"][0]["layer"] == 11 for name in leads)
    edges = [f["edge_to_answer"] for f in by_name["capital"]["top_features"] if f["layer"] == 11 and f["position"] == 1]
    assert min(edges) < 0 < max(edges)


def test_the_graphs_page_draws_smollm2s_graph_keeps_a_supernode_and_exports(zoo, report, tmp_path, monkeypatch):
    """The dashboard's Attribution graphs page on smollm2 opens on "The capital of Italy is", draws its graph
    (every active feature a node, pruned by influence), keeps a supernode of two kept nodes with the graph, offers
    circuit-tracer's JSON, and the export carries the supernode."""
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo.parent))
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    at = AppTest.from_file(str(page_file("graphs")), default_timeout=600)
    at.run()
    assert not at.exception, at.exception
    assert at.text_input(key="graph_prompt").value == "The capital of Italy is"
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    # the quick set explains little (FVU near 1): the pruned graph may keep error nodes rather than its features
    assert {"token", "logit"} <= {trace.get("name") for trace in spec["data"]}
    (saved,) = (zoo / "transcoders" / "topk" / GRAPHS_DIR).iterdir()
    features = [i for i in at.multiselect(key="supernode_nodes").options if not i.startswith("E_")]
    at.multiselect(key="supernode_nodes").select(features[0]).select(features[1])
    at.text_input(key="supernode_name").input("Italy")
    at.button(key="supernode_save").click().run()
    assert not at.exception, at.exception
    graph = Graph.load(saved)
    assert graph.supernodes == [{"name": "Italy", "nodes": features[:2]}]
    assert at.get("download_button")  # the circuit-tracer export
    pruned = prune(graph)
    data = to_circuit_tracer(
        graph, pruned.node_mask, pruned.edge_mask, pruned.cumulative, slug="smollm2-topk", scan="forma-smollm2-topk"
    )
    assert data["qParams"]["supernodes"] == [["Italy", *features[:2]]]
    assert data["metadata"]["prompt"].endswith("The capital of Italy is")
    assert data["links"] and {n["feature_type"] for n in data["nodes"]} >= {"embedding", "logit"}


def test_the_cross_layer_record_is_of_the_clt_preset_on_smollm2s_weights():
    """docs/measured/transcoders/smollm2_clt.json (docs/attribution-graphs.md cites it) is the quality.json of the
    `--kind clt` preset at the sizes its command names, a cross-layer set of every layer measured on held-out
    documents, harvested within the disk budget."""
    record = json.loads((REPO / "docs" / "measured" / "transcoders" / "smollm2_clt.json").read_text(encoding="utf-8"))
    assert record["command"] == (
        "forma transcoders smollm2 --corpus corpora/real --kind clt --features 256 --steps 300 --windows 512"
    )
    cfg, training = preset("clt", smollm2_folder(), d_features=256, steps=300)
    quality = record["quality"]
    assert quality["transcoders"] == json.loads(json.dumps(cfg.to_dict())) and cfg.cross_layer
    assert quality["training"] == json.loads(json.dumps(training.to_dict()))
    assert quality["layers"] == list(range(30)) and quality["loss"]["replaced_layers"] == list(range(30))
    assert quality["route"]["route"] == "harvest" and quality["train_rows"] == 512 * 64
    assert 0 < quality["loss"]["recovered"] < 1


def test_the_cross_layer_graphs_are_exact_and_replace_more_than_the_per_layer_ones():
    """docs/measured/graphs/smollm2_clt.json is `forma graphs smollm2 --kind clt` over the recorded cross-layer set,
    and what docs/attribution-graphs.md says of it beside the per-layer set's graphs holds at every prompt: exact,
    fewer active features, a higher replacement score and live agreement, no frozen ablation overflowing."""
    record = json.loads((REPO / "docs" / "measured" / "graphs" / "smollm2_clt.json").read_text(encoding="utf-8"))
    trained = json.loads((REPO / "docs" / "measured" / "transcoders" / "smollm2_clt.json").read_text(encoding="utf-8"))
    per_layer = json.loads((REPO / "docs" / "measured" / "graphs" / "smollm2.json").read_text(encoding="utf-8"))
    assert record["set"]["quality"] == trained["quality"] and record["transcoders"]["cross_layer"]
    assert record["set"]["source"]["model"] == model_fingerprint(load_model(smollm2_folder()))
    assert (
        (record["max_feature_nodes"], record["top"]) == (per_layer["max_feature_nodes"], per_layer["top"]) == (256, 5)
    )
    theirs = {r["name"]: r for r in per_layer["prompts"]}
    for ours in record["prompts"]:
        other = theirs[ours["name"]]
        assert ours["node_residual_relative"] < 1e-5 and ours["replacement_logits_max_error"] < 1e-3, ours["name"]
        assert ours["active_features"] < other["active_features"]
        assert ours["replacement_score"] > other["replacement_score"]
        assert ours["agreement"]["live"]["correlation"] > other["agreement"]["live"]["correlation"]
        assert ours["agreement"]["frozen"]["non_finite"] == 0 < other["agreement"]["frozen"]["non_finite"]
        assert other["agreement"]["frozen"]["non_finite"] >= record["top"] - 1
