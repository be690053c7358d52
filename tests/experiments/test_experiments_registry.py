"""experiments.REGISTRY is the one list of experiments: every experiment module is in it, each entry has its
module and its dashboard page, and the CLI, the dashboard and the dashboard benchmark read their lists from it."""

import pkgutil

import pytest

import experiments
from dashboards.pages import page_file, pages
from tests.builders import REPO


def test_every_experiment_module_is_registered_and_every_entry_has_a_module_and_a_page():
    modules = sorted(info.name for info in pkgutil.iter_modules(experiments.__path__) if not info.name.startswith("_"))
    assert sorted(experiments.experiment_names()) == modules
    for entry in experiments.REGISTRY:
        assert (REPO / "dashboards" / f"{entry.name}.py").is_file(), entry.name
        assert entry.title and entry.nav


def test_the_registrys_options_are_each_experiments_config_fields():
    """`forma run` refuses an option an experiment does not take from the registry, before torch loads: the
    registry's options are exactly the run options among the experiment's Config fields."""
    import dataclasses

    for entry in experiments.REGISTRY:
        fields = {f.name for f in dataclasses.fields(experiments.load(entry.name).Config)}
        assert set(entry.options) == fields & {"model", "mmlu", "qa", "workers"}, entry.name
        assert {"seed", "quick"} <= fields, entry.name


def test_the_registry_names_each_experiment_once():
    names = experiments.experiment_names()
    assert len(names) == len(set(names))
    with pytest.raises(ValueError, match="unknown experiment 'nope'; experiments: kl, "):
        experiments.experiment("nope")


def test_the_experiments_page_states_the_contract_the_registry_holds(tmp_path, monkeypatch):
    """docs/experiments.md names every registered experiment, and what it says a new one takes is what it takes: a
    module with Config and run is refused until REGISTRY names it, and then loads."""
    text = (REPO / "docs" / "experiments.md").read_text()
    assert all(f"`{name}`" in text for name in experiments.experiment_names())
    assert "`experiments.REGISTRY`" in text and "`dashboards/NAME.py`" in text
    (tmp_path / "toy.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass Config:\n"
        "    seed: int = 0\n\ndef run(cfg, out):\n    return {}\n"
    )
    monkeypatch.setattr(experiments, "__path__", [*experiments.__path__, str(tmp_path)])
    with pytest.raises(ValueError, match="unknown experiment 'toy'"):
        experiments.load("toy")
    monkeypatch.setattr(experiments, "REGISTRY", (*experiments.REGISTRY, experiments.Experiment("toy", "Toy", "Toy")))
    assert experiments.load("toy").run(experiments.load("toy").Config(), tmp_path) == {}


def test_the_dashboard_shows_a_page_per_registered_experiment_in_the_registrys_order():
    listed = [name for name, _ in pages()]
    assert [n for n in listed if n in experiments.experiment_names()] == experiments.experiment_names()
    assert {title for name, title in pages() if name in experiments.experiment_names()} == {
        e.nav for e in experiments.REGISTRY
    }
    assert all(page_file(name).is_file() for name in listed)
    assert "from dashboards.pages import" in (REPO / "dashboards" / "app.py").read_text()


def test_the_dashboard_benchmark_and_the_cli_take_the_registrys_list():
    from benchmarks.dashboard import PAGES

    assert set(experiments.experiment_names()) <= set(PAGES)
    from lab.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]
    name = next(a for a in run._actions if a.dest == "name")
    assert list(name.choices) == experiments.experiment_names()
