"""Every code example in the user guide (docs/*.md) runs as written, so the guide cannot rot.

A page's ```python blocks run in order in one namespace (a later block may use an earlier one's
names), in a fresh temporary working directory. A ```bash block runs only when the line before its
fence is `<!-- run -->`, in the same directory, between the python blocks around it; every other
bash block is shown, not run (installing, starting servers, commands that need a trained zoo model
or a GPU). docs/torchrun.md's torchrun block is launched once a session (tests/conftest.py::torchrun_demo,
read by tests/lab/train/test_train.py too), in a folder of its own whose files are copied into the page's.
"""

import re
import shutil
from pathlib import Path

import pytest

from tests.builders import DOCS, blocks, run_bash, smollm2_folder

PAGES = sorted(DOCS.glob("*.md"))
REQUIRED = [
    "quickstart",
    "model-and-hooks",
    "caching-and-memory",
    "probes",
    "patching-and-steering",
    "experiments",
    "dashboard",
    "huggingface",
    "torchrun",
    "distributed",
    "ecosystem",
]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_guide_has_every_page_and_examples_to_run():
    assert sorted(REQUIRED) == sorted(p.stem for p in PAGES if p.stem in REQUIRED)
    missing = [
        p.stem
        for p in PAGES
        if p.stem not in ("dashboard", "design", "reliability", "index", "definitions")
        and not any(lang == "python" for lang, _, _ in blocks(p))
    ]
    assert not missing, f"pages without a runnable python example: {missing}"
    assert any(lang == "bash" and "torchrun" in code for lang, code, _ in blocks(DOCS / "torchrun.md"))
    overview = [code for lang, code, _ in blocks(DOCS / "overview.md") if lang == "python"]
    assert any("run_with_cache" in code and "run_with_hooks" in code for code in overview)  # the hook API example


LINK = re.compile(r"\]\(([^)\s]+)\)")
README = DOCS.parent / "README.md"


def links(page: Path) -> list[str]:
    """The relative links of a Markdown page (no web address, no anchor), in order."""
    return [t.split("#")[0] for t in LINK.findall(page.read_text()) if not t.startswith(("http", "#", "mailto:"))]


def test_every_link_leads_to_a_file_and_every_page_is_linked_from_the_guides_index():
    """README.md and every page of docs/: a relative link names a file that exists; every page and notebook of
    docs/ is linked from docs/index.md, which the README links, its first link the quick start."""
    broken = [
        f"{page.name}: {target}"
        for page in [README, *PAGES]
        for target in links(page)
        if not (page.parent / target).exists()
    ]
    assert not broken, broken
    index = {(DOCS / target).resolve() for target in links(DOCS / "index.md")}
    guide = [*PAGES, *sorted((DOCS / "notebooks").glob("*.ipynb"))]
    unlinked = [str(p.relative_to(DOCS)) for p in guide if p.name != "index.md" and p.resolve() not in index]
    assert not unlinked, f"pages linked from nowhere: {unlinked}"
    pages = [target for target in links(README) if target.endswith(".md")]
    assert pages[0] == "docs/quickstart.md" and "docs/index.md" in pages


def test_the_readme_says_what_forma_is_in_three_sentences_and_150_words_before_its_first_command():
    text = README.read_text()
    before = text[text.index("\n") : text.index("```bash")]
    assert len(re.findall(r"\S+", before)) <= 150
    assert len(re.findall(r"[.!?](?:\s|$)", before.strip())) <= 3
    commands = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert [line.split()[0:2] for line in commands.splitlines()] == [["make", "demo"], ["make", "test"]]


def test_the_link_reader_keeps_relative_links_and_skips_web_addresses_and_anchors(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("[there](b.md) and [away](https://example.org) and [here](#top)")
    assert links(page) == ["b.md"] and not (tmp_path / "b.md").exists()


CITED_TEST = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)`")


def cited_tests(text: str) -> list[tuple[str, str]]:
    """(file, test name) of every test a page cites as `tests/FILE.py::name`; a bare `::name` is in the file
    cited last before it."""
    cited, current = [], None
    for match in CITED_TEST.finditer(text):
        current = match.group(1) or current
        if current is None:
            raise ValueError(f"`::{match.group(2)}` is cited before any test file")
        cited.append((current, match.group(2)))
    return cited


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_every_test_a_page_cites_exists(page):
    root = DOCS.parent
    missing = [
        f"{file}::{name}"
        for file, name in cited_tests(page.read_text())
        if not (root / file).is_file() or not re.search(rf"^def {name}\(", (root / file).read_text(), re.M)
    ]
    assert not missing, f"{page.name} cites tests that do not exist: {missing}"


def test_a_cited_test_that_does_not_exist_is_caught():
    assert cited_tests("`tests/test_docs.py::a` and `::b`") == [
        ("tests/test_docs.py", "a"),
        ("tests/test_docs.py", "b"),
    ]
    assert not re.search(r"^def no_such_test\(", (DOCS.parent / "tests/test_docs.py").read_text(), re.M)


# docs/real-model.md's examples read the zoo's real model, built once per checkout (tests/real/)
REAL_PAGES = ("real-model",)
PAGE_RUNS = [pytest.param(p, marks=pytest.mark.real) if p.stem in REAL_PAGES else p for p in PAGES]


@pytest.mark.parametrize("page", PAGE_RUNS, ids=[p.stem for p in PAGES])
def test_page_examples_run(page, tmp_path, monkeypatch, request):
    if page.stem in REAL_PAGES:
        smollm2_folder()
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for language, code, line in blocks(page):
        where = f"{page.name}:{line}"
        if language == "python":
            # Padded so that a traceback's line numbers are the page's own.
            exec(compile("\n" * line + code, str(page), "exec"), namespace)
        elif page.stem == "torchrun" and "torchrun" in code:
            # The session's launch of this very block (tests/conftest.py::torchrun_demo, which
            # tests/lab/train/test_train.py reads too), run in its own folder: what it wrote is copied here.
            folder, launched, done = request.getfixturevalue("torchrun_demo")
            assert code == launched
            assert done.returncode == 0, f"{where} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
            shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
        else:
            done = run_bash(code, tmp_path)
            assert done.returncode == 0, f"{where} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def ecosystem_rows() -> list[list[str]]:
    """The cells of docs/ecosystem.md's table (client, version tested, what works, the tests), header and rule
    left out; a row that does not split into exactly four cells is an error, not a row skipped."""
    lines = (DOCS / "ecosystem.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| client |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    lines = lines[start:end]  # the first table: the clients'
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines[2:]]
    assert lines and all(len(row) == 4 for row in rows), [row[0] for row in rows if len(row) != 4]
    return rows


def pins(constraints: Path) -> dict[str, str]:
    return dict(
        line.split("==") for line in constraints.read_text().splitlines() if "==" in line and not line.startswith("#")
    )


def test_the_ecosystem_table_names_installed_versions_and_real_tests():
    """Each version is the one pinned and installed (SAELens's, with its transformer-lens, from
    constraints-sae.txt, Inseq's, with its typeguard, from constraints-inseq.txt, and circuit-tracer's from
    constraints-ct.txt: each has its own environment), and each test the table names exists under that name."""
    from importlib.metadata import version

    root = DOCS.parent
    main, sae = pins(root / "constraints.txt"), pins(root / "constraints-sae.txt")
    inseq, ct = pins(root / "constraints-inseq.txt"), pins(root / "constraints-ct.txt")
    rows = ecosystem_rows()
    assert {row[0] for row in rows} == {
        "transformer-lens",
        "sae-lens",
        "nnsight",
        "tuned-lens",
        "captum",
        "inseq",
        "circuitsvis",
        "circuit-tracer",
    }
    for client, tested, _, tests in rows:
        versions = re.findall(r"(\d+\.\d+\.\d+)", tested)
        if client == "sae-lens":
            assert versions == [sae["sae-lens"], sae["transformer-lens"]], tested
        elif client == "inseq":
            assert versions == [inseq["inseq"], inseq["typeguard"]], tested
        elif client == "circuit-tracer":
            assert versions == [ct["circuit-tracer"], ct["transformers"], ct["transformer-lens"]], tested
        elif "SAE environment" in tested:  # a client tested in .venv-sae, at the version pinned there
            assert versions == [sae[client]], (client, tested)
        else:
            assert versions == [main[client]] == [version(client)], (client, tested)
        named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", tests)
        assert named and len(named) == tests.count("::"), tests
        for path, name in named:
            assert re.search(rf"^def {name}\(", (root / path).read_text(), flags=re.M), f"{path}::{name}"


def test_the_attribution_graphs_example_runs_twice_in_one_folder(tmp_path, monkeypatch):
    """docs/attribution-graphs.md's example, run twice in the folder a reader runs it in: the second run works as the
    first did (its harvest and transcoders go to a folder of their own), and nothing lands in the reader's folder."""
    monkeypatch.chdir(tmp_path)
    page = DOCS / "attribution-graphs.md"
    for _ in range(2):
        namespace = {"__name__": "docs_attribution_graphs"}
        for language, code, line in blocks(page):
            if language == "python":
                exec(compile("\n" * line + code, str(page), "exec"), namespace)
    assert list(tmp_path.iterdir()) == []


def test_the_top_level_names_are_listed_once_with_their_homes():
    """docs/model-and-hooks.md's table of `from lab import …` is lab.__all__, each row naming the module the name
    is loaded from (lab.HOMES), and each name is that module's own."""
    import importlib

    import lab

    text = (DOCS / "model-and-hooks.md").read_text()
    section = text.split("## The top-level names", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| `([\w.]+)`", section, re.M))
    assert rows == lab.HOMES and sorted(rows) == sorted(lab.__all__)
    for name, home in rows.items():
        assert getattr(lab, name) is getattr(importlib.import_module(home), name)
