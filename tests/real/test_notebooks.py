"""docs/notebooks/: three Jupyter notebooks on the zoo's real language model, smollm2 (a first look inside, an IOI
circuit, a fact being recalled). Committed without outputs; each says in words what it shows and asserts it; run by
nbmake in a subprocess against the built zoo, each one's wall time recorded in
docs/measured/notebooks.json."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lab.files import atomic_write_text
from tests.builders import smollm2_folder

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "docs" / "notebooks"
MEASURED = ROOT / "docs" / "measured" / "notebooks.json"
NAMES = ("first_look.ipynb", "ioi_circuit.ipynb", "fact_recall.ipynb")
LIMIT_S = 600  # nbmake's guard against a hung kernel, not a speed claim: the times are measured and recorded


def cells(name: str) -> list[dict]:
    return json.loads((NOTEBOOKS / name).read_text())["cells"]


def code(name: str) -> str:
    return "\n".join("".join(cell["source"]) for cell in cells(name) if cell["cell_type"] == "code")


def test_the_notebooks_are_these_three():
    assert sorted(path.name for path in NOTEBOOKS.glob("*.ipynb")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_a_committed_notebook_holds_no_outputs_or_execution_counts(name):
    for cell in cells(name):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, "".join(cell["source"])[:80]


@pytest.mark.parametrize("name", NAMES)
def test_each_notebook_says_what_it_shows_loads_smollm2_by_name_and_asserts_it(name):
    first = cells(name)[0]
    assert first["cell_type"] == "markdown" and "".join(first["source"]).startswith("# ")
    assert "What it shows, and checks" in "".join(first["source"])
    assert 'HookedTransformer.from_pretrained("smollm2")' in code(name)
    assert code(name).count("assert ") >= 2


def test_the_notebooks_are_linked_from_the_quick_start():
    page = (ROOT / "docs" / "quickstart.md").read_text()
    for name in NAMES:
        assert f"(notebooks/{name})" in page, name


def wall_times(junit: Path) -> dict[str, float]:
    """Each notebook's wall time (s), as nbmake's junit report gives its test case (the kernel's start included)."""
    return {case.get("name"): float(case.get("time")) for case in ET.parse(junit).iter("testcase")}


@pytest.mark.real
@pytest.mark.processes
def test_the_notebooks_run_on_smollm2_and_their_times_are_recorded(tmp_path):
    """nbmake as CI runs it (`python -m pytest --nbmake docs/notebooks`), the zoo being the checkout's, with
    smollm2 built in it; each notebook's wall time is recorded (a measured figure, never a timed assertion)."""
    zoo = smollm2_folder().parent
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = os.environ | {"FORMA_ZOO_DIR": str(zoo), "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    junit = tmp_path / "notebooks.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbmake"]
    command += [f"--nbmake-timeout={LIMIT_S}", f"--junitxml={junit}", str(NOTEBOOKS)]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=len(NAMES) * LIMIT_S)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    times = wall_times(junit)
    assert sorted(times) == sorted(NAMES)
    record = {
        "command": "python -m pytest --nbmake docs/notebooks",
        "cores": os.cpu_count(),
        "limit_s": LIMIT_S,
        "wall_s": {name.removesuffix(".ipynb"): round(times[name], 1) for name in NAMES},
    }
    atomic_write_text(MEASURED, json.dumps(record, indent=1) + "\n")
