"""The scoreboard's real-model track grades the attribution graph over the model folder's own transcoder set `topk`
(experiments.scoreboard.real: GRAPH_SET, opened by load_real; grade_task's graph on each task's first graph_prompts;
real_headlines' graph headline where a task has two graph prompts or more), each grade beside the same graph over
untrained transcoders of the same shape.

Made as a user makes it, at a test's size: a tiny random model saved as a folder, its set `topk` trained on a slice of
the real corpus by the function `forma transcoders` calls (preset, build_transcoders: the command itself takes a zoo
name, not a folder), then `forma run scoreboard --model <folder> --corpus <slice>` with the real profiles patched (as
`forma run` reads them) and every prompt taken as answered (a random model answers none)."""

import json

import pandas as pd
import pytest

from experiments.scoreboard.real import GRAPH_SET
from experiments.scoreboard.summary import graph_headline
from lab.analysis.grading import UNTRAINED_TRANSCODERS
from lab.zoo.transcoders import build_transcoders, preset
from tests.builders import real_track_run, tiny_real_profile, tiny_real_track

pytestmark = pytest.mark.usefixtures("one_thread")

GRAPH_PROMPTS = 2  # the fewest a graph headline is judged on (one prompt has no interval)
GRAPH_GRADES = {"auroc", "relevant_mass", "rank_correlation", "replacement_score"}  # + each one's control


@pytest.fixture
def graph_run(empty, monkeypatch):
    """The run folder of `forma run scoreboard --model <folder> --corpus <slice> --quick` over a folder whose
    transcoder set `topk` was trained on the slice (a few steps, a few features)."""
    folder, corpus = tiny_real_track(empty)
    cfg, training = preset(GRAPH_SET, folder, d_features=32, steps=4)
    build_transcoders(folder, cfg, training, GRAPH_SET, n_windows=32, window=16, eval_windows=4, corpus=corpus)
    return real_track_run(folder, corpus, tiny_real_profile(graph_prompts=GRAPH_PROMPTS), monkeypatch)


def test_the_real_track_grades_the_graph_over_the_folders_transcoder_set_against_untrained_ones(graph_run):
    results = json.loads((graph_run / "results.json").read_text())
    assert results["graph"] == "over tiny's transcoder set 'topk'"
    graphed = {world: task for world, task in results["worlds"].items() if task.get("graph_prompts")}
    assert set(graphed) == set(results["worlds"]) == {"repeated_tokens"}  # every task the profile grades
    table = pd.read_parquet(graph_run / "scoreboard.parquet")
    assert len(table) == len(results["table"])
    for world, task in graphed.items():
        assert task["graph_prompts"] == GRAPH_PROMPTS
        rows = [
            r
            for r in results["table"]
            if r["method"] == "attribution_graph" and r["world"] == world and r["readout"] == task["readout"]
        ]
        assert {r["grade"] for r in rows} == GRAPH_GRADES and len(rows) == len(GRAPH_GRADES)
        for r in rows:  # each grade on the graph's prompts, beside the same graph over untrained transcoders
            assert r["control_means"] == UNTRAINED_TRANSCODERS, r
            assert r["n"] == GRAPH_PROMPTS and r["value"] is not None and r["control"] is not None, r
            assert r["low"] is not None and r["control_low"] is not None, r  # two prompts: an interval for each
        shown = table[(table["method"] == "attribution_graph") & (table["world"] == world)]
        assert set(shown["grade"]) == GRAPH_GRADES  # the table the page reads holds them too
        # the graph's headline, worded by summary.graph_headline, among the run's
        expected = graph_headline(results, world, task["readout"])
        said = {h["name"]: h for h in results["headlines"]}
        assert expected["name"] in said, [h["name"] for h in results["headlines"]]
        assert said[expected["name"]]["sentence"] == expected["sentence"]
        assert said[expected["name"]]["supported"] == expected["supported"]
