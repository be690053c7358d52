"""experiments.REGISTRY is the one list of experiments: every experiment module is in it, each entry has its
module and its dashboard page, and the CLI, the dashboard and the dashboard benchmark read their lists from it."""

import ast
import pkgutil
import re
import sys

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
        assert set(entry.options) == fields & {"model", "mmlu", "qa", "corpus", "workers"}, entry.name
        assert {"seed", "quick"} <= fields, entry.name


def test_the_registry_names_each_experiment_once():
    names = experiments.experiment_names()
    assert len(names) == len(set(names))
    with pytest.raises(ValueError, match="unknown experiment 'nope'; experiments: kl, "):
        experiments.experiment("nope")


def guide() -> str:
    """docs/design.md's "Add an experiment" section: the experiments' contract."""
    text = (REPO / "docs" / "design.md").read_text()
    return text[text.index("\n## Add an experiment\n") :]


def guide_blocks() -> list[str]:
    return re.findall(r"```(?:python|py)\n(.*?)```", guide(), flags=re.S)


def test_the_experiments_page_lists_the_registry_and_points_to_the_one_contract():
    """docs/experiments.md names the registered experiments, in the registry's order, and leaves the contract to
    docs/design.md's guide; the registry's module points there too."""
    text = (REPO / "docs" / "experiments.md").read_text()
    paragraph = text[text.index("The experiments measure") : text.index("The ones\ninstalled here")]
    assert re.findall(r"`(\w+)` —", paragraph) == experiments.experiment_names()
    assert '"Add an\nexperiment"' in text or '"Add an experiment"' in text
    assert "Add an experiment" in experiments.__doc__
    assert all(f"`{attr}`" in guide() for attr in experiments.CONTRACT)


def test_the_add_an_experiment_guide_makes_an_experiment_forma_runs(tmp_path, monkeypatch, capsys, request):
    """The guide's files, written exactly as docs/design.md shows them, and its REGISTRY entry make an experiment
    that `experiments.load` loads, `forma run --help` lists, the dashboard gives a page, and `forma run` runs into
    a finished run folder whose headlines are the package's `headlines`. Before the entry it is refused, and so is
    the same code as a plain module."""
    from lab.cli.parser import build_parser, main
    from lab.runs import read_results

    files, entry = {}, None
    for block in guide_blocks():
        first, _, rest = block.partition("\n")
        if first.startswith("# experiments/") or first.startswith("# dashboards/"):
            files[first.removeprefix("# ")] = rest
        elif first.startswith("Experiment("):
            call = ast.parse(first.rstrip(",")).body[0].value
            entry = experiments.Experiment(*map(ast.literal_eval, call.args))
    assert set(files) == {"experiments/toy/__init__.py", "dashboards/toy.py"} and entry is not None
    package = tmp_path / "experiments" / "toy"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(files["experiments/toy/__init__.py"])
    compile(files["dashboards/toy.py"], "dashboards/toy.py", "exec")  # the page: Python, run by the dashboard
    monkeypatch.setattr(experiments, "__path__", [*experiments.__path__, str(tmp_path / "experiments")])
    request.addfinalizer(lambda: [sys.modules.pop(f"experiments.{n}", None) for n in ("toy", "toy2")])
    with pytest.raises(ValueError, match="unknown experiment 'toy'"):
        experiments.load("toy")

    monkeypatch.setattr(experiments, "REGISTRY", (*experiments.REGISTRY, entry))
    module = experiments.load("toy")
    assert set(experiments.CONTRACT) <= set(vars(module))
    assert ("toy", entry.nav) in pages()
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    assert "toy" in next(a for a in run._actions if a.dest == "name").choices
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "toy" in capsys.readouterr().out

    assert main(["run", "toy", "--quick", "--out", str(tmp_path / "run")]) == 0
    results = read_results(tmp_path / "run")
    assert results["headlines"] == module.headlines(results) and results["headlines"][0]["supported"] in (True, False)
    assert main(["run", "toy", "--workers", "2"]) == 2
    assert "takes no --workers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "toy", "--help"])
    assert "--quick in toy (default → quick):\n  draws: 10000 → 100\n" in capsys.readouterr().out

    # The same code as a plain module experiments/toy2.py is refused: an experiment is a package.
    (tmp_path / "experiments" / "toy2.py").write_text(files["experiments/toy/__init__.py"])
    monkeypatch.setattr(experiments, "REGISTRY", (*experiments.REGISTRY, experiments.Experiment("toy2", "T", "T")))
    with pytest.raises(TypeError, match="must be a package experiments/toy2/"):
        experiments.load("toy2")


def test_every_experiment_declares_its_quick_profile_in_its_config_module(monkeypatch):
    """Each experiment's Config is a ProfileConfig whose profiles are declared in its config.py (DEFAULT and QUICK,
    REAL_DEFAULT and REAL_QUICK with a real-model track); where a pair's entries are the Config's fields (FIELDS),
    Config() holds DEFAULT's values and Config(quick=True) QUICK's. A package whose Config is not a ProfileConfig
    is refused."""
    import dataclasses
    import importlib

    for name in experiments.experiment_names():
        config_module = importlib.import_module(f"experiments.{name}.config")
        Config = experiments.load(name).Config
        assert Config is config_module.Config and issubclass(Config, experiments.ProfileConfig)
        assert Config.PROFILES == (config_module.DEFAULT, config_module.QUICK)
        real = experiments.experiment(name).options and "model" in experiments.experiment(name).options
        if real:
            assert Config.REAL_PROFILES == (config_module.REAL_DEFAULT, config_module.REAL_QUICK)
        for profiles, fields in zip((Config.PROFILES, Config.REAL_PROFILES), Config.FIELDS):
            for entry in dataclasses.fields(profiles[0]) if fields else ():
                for quick, profile in enumerate(profiles):
                    assert getattr(Config(quick=bool(quick)), entry.name) == getattr(profile, entry.name), entry.name
    module = experiments.load("equations")
    monkeypatch.setattr(module, "Config", dataclasses.make_dataclass("Config", [("seed", int, 0), ("quick", bool, 0)]))
    with pytest.raises(TypeError, match="a Config that is a ProfileConfig"):
        experiments.load("equations")


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
    from lab.cli.parser import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]
    name = next(a for a in run._actions if a.dest == "name")
    assert list(name.choices) == experiments.experiment_names()


def test_a_real_model_track_runs_into_its_own_folder_beside_the_toy_worlds():
    """A Config whose real_track is true (`forma run NAME --model smollm2`) names runs/NAME_real/; any other, and a
    Config without the attribute, runs/NAME/."""

    class Real:
        real_track = True

    class Toy:
        real_track = False

    assert experiments.run_name("kl", Real()) == "kl_real"
    assert experiments.run_name("kl", Toy()) == "kl"
    assert experiments.run_name("kl", object()) == "kl"


def test_a_run_folders_name_says_the_command_that_makes_it():
    """runs/NAME/ is made by `forma run NAME`, runs/NAME_real/ by `forma run NAME --model smollm2` (what a page says
    to run again); the names a run's folder can have are the ones run_name gives."""
    for name in experiments.experiment_names():
        assert experiments.run_command(name) == f"forma run {name}"
        assert experiments.run_command(experiments.real_run_name(name)) == f"forma run {name} --model smollm2"
    assert experiments.run_name("kl", type("Real", (), {"real_track": True})()) == experiments.real_run_name("kl")
