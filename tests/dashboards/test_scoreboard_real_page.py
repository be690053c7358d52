"""The scoreboard page shows the real-model track (runs/scoreboard_real/) below the toy worlds' run: the newest run
`forma run scoreboard --model M --corpus DIR` wrote, its headlines, what it graded and what it left out (the
attribution graph, the head detectors, the lenses), each part's seconds and the load it ran under, and its table —
the attribution methods', the lenses' and the head detectors' rows — with the methods and tasks to choose, as the toy
table has them; with no such run, how to make one.

The run is written by Forma's own code through `forma run`, on a tiny random model (a folder given as --model) and a
slice of the real corpus in a small BPE's ids, at a test's sizes (the real profiles patched, as `forma run` reads
them). smollm2 answers the induction prompts it is graded on; a random model answers none, so the test takes every
prompt it tries as answered (experiments.scoreboard.real.answered)."""

import json
import re

import pytest

from dashboards.display import short
from experiments.scoreboard.real_lenses import WORLD
from lab.runs import run_and_record, save_table
from tests.builders import page, real_track_run, rendered, texts, tiny_real_profile, tiny_real_track

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def real_run(empty, monkeypatch):
    """`forma run scoreboard --model <a tiny model's folder> --corpus <a corpus slice> --quick` into the empty clone's
    runs/ (no transcoder set: the graph is left out): the run folder it wrote (runs/scoreboard_real/<stamp>/)."""
    return real_track_run(*tiny_real_track(empty), tiny_real_profile(), monkeypatch)


def real_table(at):
    """The real-model track's table as the page shows it (the last table: the toy run's, if any, comes first)."""
    frame = at.table[-1].value
    return frame.map(rendered).rename(columns=rendered), [rendered(i) for i in frame.index]


def test_the_page_shows_the_real_tracks_run_its_rows_and_what_it_left_out(real_run):
    results = json.loads((real_run / "results.json").read_text())
    at = page("scoreboard").run()
    assert not at.exception, at.exception
    assert not [w.value for w in at.warning]  # every part of the run is shown, none refused
    assert "On a real language model" in [h.value for h in at.header]
    # what a reader sees: Markdown rendered (the page escapes the run's words), plain text as it is
    said = rendered(" ".join(str(e.value) for e in [*at.markdown, *at.caption, *at.info])) + texts(at)
    assert real_run.name in said and results["model"] in said  # the run it shows, and the model it graded
    for headline in results["headlines"]:
        assert (headline["sentence"] if headline["supported"] else headline["why_not"]) in said
    # what it graded and what it left out: the graph (no transcoder set), the head detectors, the lenses
    assert results["graph"].startswith("left out") and results["graph"] in said
    assert results["lenses"]["heads"] in said and results["lenses"]["lenses"] in said
    tasks = next(t.value for t in at.table if rendered(t.value.index.name) == "task")
    task = results["worlds"]["repeated_tokens"]
    assert [rendered(i) for i in tasks.index] == ["repeated tokens"]
    counts = [int(rendered(v)) for v in tasks.iloc[0][1:5]]  # tried, answered, graded, tokens a prompt
    assert counts == [task[k] for k in ("tried", "answered", "prompts", "length")]
    # the seconds of each part, and the load it ran under
    assert {"induction", "heads", "lenses", "total"} <= set(results["seconds"])
    seconds = next(t.value for t in at.table if list(t.value.columns) == ["seconds"])
    shown = [rendered(v) for v in seconds["seconds"]]
    assert shown == [short(v) for v in results["seconds"].values()]  # as every number is shown: SIGNIFICANT digits
    assert short(results["load_average"]) in said and short(results["peak_rss_gb"]) in said
    # every row of the run's table, the lenses' and the head detectors' among the attribution methods'
    table, methods = real_table(at)
    assert len(table) == len(results["table"])
    assert {"gradient × input", "logit lens", "tuned lens", "Jacobian lens", "head detectors"} <= set(methods)
    assert {"repeated tokens", WORLD} == set(table["world"])
    keys = {v for v in [*methods, *table.columns, *table.to_numpy().ravel()] if re.search(r"[a-z]_[a-z]", str(v))}
    assert not keys, keys  # every method, task, readout and grade in words (lab.names), as on the toy table
    assert f"fig-scoreboard_real-{real_run.name}-attribution" in {chart.key for chart in at.get("plotly_chart")}


def test_a_real_track_run_made_before_the_lenses_says_they_are_not_recorded(real_run):
    """A run made before the real track graded the lenses and head detectors has no "lenses" (the runs of
    December 2026's first smollm2 runs): the page says so, and shows the rest."""
    path = real_run / "results.json"
    results = json.loads(path.read_text())
    del results["lenses"]
    path.write_text(json.dumps(results))
    at = page("scoreboard").run()
    assert not at.exception and not at.warning, (at.exception, [w.value for w in at.warning])
    assert texts(at).count("not recorded: the run was made before the real track graded them") == 2
    assert len(real_table(at)[0]) == len(results["table"])


def test_a_real_track_results_json_of_another_shape_says_the_command_that_makes_it_again(real_run):
    path = real_run / "results.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"seconds": "soon"}))
    (real_run / "scoreboard.parquet").write_text("not a table")
    at = page("scoreboard").run()
    assert not at.exception, at.exception
    said = rendered(" ".join(w.value for w in at.warning))
    assert str(path) in said and "scoreboard.parquet" in said, said
    assert said.count("forma run scoreboard --model smollm2") == 2 and "scoreboard_real --quick" not in said, said


def test_the_real_tracks_methods_and_tasks_filter_its_table(real_run):
    at = page("scoreboard").run()
    at.multiselect(key="scoreboard_real_methods").set_value(["head detectors"]).run()
    assert not at.exception, at.exception
    table, methods = real_table(at)
    assert set(methods) == {"head detectors"} and len(table) == 4  # two grades of each of two detectors
    at.multiselect(key="scoreboard_real_methods").set_value(["gradient", "logit lens"])
    at.multiselect(key="scoreboard_real_worlds").set_value(["repeated tokens"]).run()
    table, methods = real_table(at)
    assert set(methods) == {"gradient"} and set(table["world"]) == {"repeated tokens"}


def test_beside_a_toy_run_each_track_keeps_its_own_table_and_filters(real_run):
    """A toy run (here: a stand-in with five of the real run's rows, as run_and_record writes it) above the real
    track's: two tables, each filtered by its own widgets, no key shared."""
    rows = json.loads((real_run / "results.json").read_text())["table"][:5]

    def toy(config, folder):
        save_table(rows, folder, "scoreboard")
        return {"table": rows, "headlines": [], "worlds": {}}

    run_and_record("scoreboard", {"seed": 0, "quick": True}, toy)
    at = page("scoreboard").run()
    assert not at.exception, at.exception
    at.multiselect(key="scoreboard_real_methods").set_value(["head detectors"]).run()
    assert not at.exception, at.exception
    scoreboards = [t.value for t in at.table if "world" in t.value.columns]
    assert [len(t) for t in scoreboards] == [5, 4]  # the toy table whole, the real one filtered
    assert len(at.multiselect(key="scoreboard_methods").value) == len({r["method"] for r in rows})


def test_with_no_real_track_run_the_page_says_how_to_make_one(empty):
    at = page("scoreboard").run()
    assert not at.exception, at.exception
    assert "On a real language model" in [h.value for h in at.header]
    assert "forma run scoreboard --model smollm2 --quick" in texts(at)
