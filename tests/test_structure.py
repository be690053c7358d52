"""How Forma's modules depend on each other (docs/design.md, "How the pieces depend on each other").

The graph is read from the source with `ast`: every `import` and `from … import`, at the top of a module or
inside a function, of lab/, experiments/, dashboards/ and benchmarks/. An edge A → B says A imports B (a
`from pkg import name` whose name is a submodule is an edge to that submodule). Circles are the strongly
connected components of more than one module.

Names: no `_private` name is imported from another module (what two modules share is public in its home), and
no module but a package's `__init__` re-exports what it imports (a `noqa: F401` import): a name has one home.

`python tests/test_structure.py` prints the figures (circles, imports made inside functions, lines per folder, the
largest modules, the model core's lines): lines are counted, not gated.
"""

import ast
import functools
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("lab", "experiments", "dashboards", "benchmarks")
# What lab/model may import from the rest of lab: the modules beneath it, which import only the standard
# library and each other (config validation, atomic writes, the zoo's folders and the door to loading by name,
# the one door every file from outside is read through). Everything else in lab is above the model.
BENEATH_MODEL = ("lab.configs", "lab.files", "lab.outside_files")
# The model's third-party packages: the equations' (torch, einops, jaxtyping) and TransformerLens's hook machinery;
# safetensors and tokenizers only for a model folder's files (weights, tokenizer.json), in the one module that reads
# and writes them.
MODEL_PACKAGES = {"torch", "einops", "jaxtyping", "transformer_lens"}
CHECKPOINT_PACKAGES = {"lab.model.checkpoint": {"safetensors", "tokenizers"}}
MODEL_CORE = ("lab/model/config.py", "lab/model/components.py", "lab/model/transformer.py")


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once a session (the gates below each walk every file)."""
    return ast.parse(path.read_text(), str(path))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every Python module of the four folders, by dotted name."""
    return {module_name(p): p for folder in FOLDERS for p in sorted((REPO / folder).rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, bool]]:
    """(imported module, made inside a function) for every import statement of the module."""
    tree = syntax_tree(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(id(child) for child in ast.walk(node) if child is not node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in dict.fromkeys(targets):
            yield target, id(node) in inside


def graph() -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    """(edges between the folders' own modules, [(module, imported lab module)] for imports made inside a function)."""
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    in_function = []
    for name, path in known.items():
        for target, inside in imports(name, path, known):
            while target and target not in known:  # `import lab.model.x.y` of a name: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                edges[name].add(target)
                if inside and target.split(".")[0] == "lab":
                    in_function.append((name, target))
    return edges, in_function


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_circle():
    assert circles(graph()[0]) == []


def test_the_model_package_imports_nothing_above_it():
    """lab/model is the ground floor: torch, einops, jaxtyping, transformer_lens, safetensors and the standard
    library, and of lab only lab.model itself and the stdlib-only modules beneath it."""
    edges, _ = graph()
    upward = sorted(
        (name, target)
        for name, targets in edges.items()
        if name.startswith("lab.model")
        for target in targets
        if target.split(".")[0] == "lab" and not target.startswith("lab.model") and target not in BENEATH_MODEL
    )
    assert upward == []
    for name in BENEATH_MODEL:
        assert edges[name] <= set(BENEATH_MODEL), (
            f"{name} is beneath lab/model and must import only the standard library (and the modules beneath lab/model)"
        )


# The seam: the library (the model, Hugging Face, data, training, analysis, metrics and the plumbing they need) and
# the product above it (the zoo, run folders, headlines, jobs, measured numbers, trust, the CLI, the experiments,
# the dashboard and the benchmarks). Arrows go one way: the product imports the library, never the reverse.
LIBRARY_PACKAGES = ("lab.model", "lab.hf", "lab.data", "lab.train", "lab.analysis", "lab.metrics")
LIBRARY_PLUMBING = (
    "lab",
    "lab.configs",
    "lab.distributed",
    "lab.files",
    "lab.freed_memory",
    "lab.outside_files",
    "lab.names",
    "lab.parallel",
    "lab.progress",
    "lab.thread_invariant",
)


def in_library(module: str) -> bool:
    return module in LIBRARY_PLUMBING or any(module == p or module.startswith(p + ".") for p in LIBRARY_PACKAGES)


def test_the_library_imports_nothing_of_the_product():
    """No module of the library imports one of the product's, at its top or inside a function: a user who wants
    the hooked transformer, its analyses and its metrics gets none of the zoo, run folders or CLI with them."""
    edges, _ = graph()
    crossing = sorted(
        (name, target)
        for name, targets in edges.items()
        if name.split(".")[0] == "lab" and in_library(name)
        for target in targets
        if target.split(".")[0] in FOLDERS and not in_library(target)
    )
    assert crossing == [], "the library reaches into the product"


def test_the_model_package_needs_only_torch_einops_jaxtyping_and_transformer_lens():
    """Beyond the standard library, lab/model imports those four (and a model folder's formats in checkpoint.py
    alone)."""
    known = modules()
    outside = {}
    for name, path in known.items():
        if name.startswith("lab.model"):
            roots = {target.split(".")[0] for target, _ in imports(name, path, known)}
            third_party = roots - {"lab", *sys.stdlib_module_names}
            extra = third_party - MODEL_PACKAGES - CHECKPOINT_PACKAGES.get(name, set())
            if extra:
                outside[name] = sorted(extra)
    assert outside == {}


def python_files() -> Iterator[Path]:
    """The four folders' modules and the tests."""
    yield from modules().values()
    yield from sorted((REPO / "tests").rglob("*.py"))


def from_imports(path: Path) -> Iterator[tuple[ast.ImportFrom, str]]:
    """Every `from … import …` of a file, with the module it names made absolute."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(syntax_tree(path)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node, base


def private_imports() -> set[tuple[str, str, str]]:
    """(importing file, module, name) for every `_name` (not a dunder) imported from another of Forma's modules."""
    return {
        (str(path.relative_to(REPO)), module, alias.name)
        for path in python_files()
        for node, module in from_imports(path)
        for alias in node.names
        if alias.name.startswith("_")
        and not alias.name.startswith("__")
        and module.split(".")[0] in (*FOLDERS, "tests")
    }


CONTRACT_NAMES = {"Config", "run", "headlines"}  # what an experiment's package offers: `forma run` loads it for them


def unused_in_init(path: Path) -> set[str]:
    """The names a package's __init__ imports from Forma's own packages and does not use itself: offered again, a
    second path. lab's own __init__ (the short public API, loaded lazily from each name's home) imports none, and an
    experiment's package offers its contract (Config, run, headlines), which `forma run` loads it for."""
    tree = syntax_tree(path)
    used = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        used |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    relative = path.relative_to(REPO)
    allowed = CONTRACT_NAMES if len(relative.parts) == 3 and relative.parts[0] == "experiments" else set()
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] in FOLDERS)
        for alias in node.names
    }
    return imported - used - allowed


def reexports() -> set[tuple[str, str]]:
    """(file, module) for every `from module import …  # noqa: F401` outside a package's __init__, for every
    import of a module made of nothing but imports and `__all__` (a facade: a second path to names whose home is
    elsewhere), and (file, name) for every name a package's __init__ imports only to offer it again."""
    found = set()
    for path in python_files():
        if path.name == "__init__.py":
            found |= {(str(path.relative_to(REPO)), name) for name in unused_in_init(path)}
            continue
        lines = path.read_text().splitlines()
        facade = _only_imports(syntax_tree(path))
        for node, module in from_imports(path):
            if facade or any("noqa: F401" in line for line in lines[node.lineno - 1 : node.end_lineno]):
                found.add((str(path.relative_to(REPO)), module))
    return found


def _only_imports(tree: ast.Module) -> bool:
    """Whether a module's body is a docstring, imports and an `__all__`, nothing else, with an import in it."""
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    exports = [
        n for n in body if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"]
    ]
    imports = [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
    return bool(imports) and len(imports) + len(exports) == len(body)


def test_no_private_name_is_imported_from_another_module():
    """What two modules share is public in its home: no `from a.b import _name` in lab, experiments, dashboards,
    benchmarks or tests."""
    assert private_imports() == set(), "make the name public where it is defined"


def test_no_module_but_a_package_init_re_exports():
    """A name has one import path: outside a package's __init__, nothing is imported only to be offered again,
    marked `noqa: F401` to be offered again."""
    assert reexports() == set(), "import the name from its home instead"


def standard_library_imports_in_functions() -> set[tuple[str, int]]:
    """(file, line) of every import of a standard-library module inside a function of the four folders: the
    standard library costs nothing to import, so a module imports it once, at its top, where a reader looks."""
    found = set()
    for path in modules().values():
        for function in ast.walk(syntax_tree(path)):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(function):
                    if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
                        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                        if any(name.split(".")[0] in sys.stdlib_module_names for name in names):
                            found.add((str(path.relative_to(REPO)), node.lineno))
    return found


def test_the_standard_library_is_imported_at_the_top_of_a_module():
    assert standard_library_imports_in_functions() == set(), "import these at the top of the module"


def test_the_name_gates_see_what_they_gate(tmp_path, monkeypatch):
    """A private import (relative ones resolved) and a noqa'd re-export are found; a dunder and an __init__ are not."""
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "a.py").write_text(
        "from .b import _hidden, __version__\nfrom lab.c import d  # noqa: F401\n\n\ndef a():\n    return _hidden\n"
    )
    (tmp_path / "lab" / "__init__.py").write_text("from lab.a import e  # noqa: F401\n")
    (tmp_path / "lab" / "m").mkdir()
    (tmp_path / "lab" / "m" / "__init__.py").write_text("from lab.m.n import kept, offered\n\nkept()\n")
    (tmp_path / "lab" / "f.py").write_text("import os\n\n\ndef f():\n    import json\n    from . import a\n")
    (tmp_path / "lab" / "g.py").write_text('"""A facade."""\n\nfrom lab.h import i\n\n__all__ = ["i"]\n')
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert private_imports() == {("lab/a.py", "lab.b", "_hidden")}
    assert reexports() == {
        ("lab/a.py", "lab.c"),
        ("lab/g.py", "lab.h"),
        ("lab/__init__.py", "e"),
        ("lab/m/__init__.py", "offered"),
    }
    assert standard_library_imports_in_functions() == {("lab/f.py", 5)}


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True)


def test_make_lint_runs_ruff_and_make_test_runs_lint():
    """`make lint` is ruff as pyproject.toml sets it; `make test` (CI's command) runs it before the suite."""
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^lint:.*\n\t\$\(BIN\)/ruff check \.\n\t\$\(BIN\)/ruff format --check \.$", makefile, re.M)
    assert "lint" in re.search(r"^test:(.*)$", makefile, re.M).group(1).split()
    assert "make test" in (REPO / ".ci" / "run").read_text()
    result = ruff("check", "--quiet", ".")
    assert result.returncode == 0, result.stdout + result.stderr
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_install_says_each_stage_and_prints_no_expected_conflict():
    """`make venv` prints a line per stage ("[install] 1/3 …"), its pip quiet; the environments that sit beside .venv
    (.venv-sae, .venv-ct, .venv-inseq) install with --no-warn-conflicts, since pip's check of their whole path finds
    .venv's own versions and would print that expected outcome as an error in red."""
    makefile = (REPO / "Makefile").read_text()
    installs = re.findall(r"^\t@?(\S+) -m pip install (.*)$", makefile, re.M)
    assert installs and all(args.startswith("-q") for _, args in installs), installs
    layered = [args for python, args in installs if python != "$(BIN)/python"]
    assert len(layered) == 3 and all("--no-warn-conflicts" in args for args in layered), layered
    recipe = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    stages = re.findall(r'^\t@echo "\[install\] ([0-9])/([0-9]) ', recipe, re.M)
    assert stages and stages == [(str(i), str(len(stages))) for i in range(1, len(stages) + 1)], recipe


def test_no_file_is_let_off_a_lint_rule():
    """pyproject.toml lets one thing off, everywhere alike: a package's __init__ offers what it imports (F401). No
    single file is excused from a rule (put the file right instead)."""
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]["per-file-ignores"]
    assert table == {"__init__.py": ["F401"]}


# Every file from outside is read through lab.outside_files (a regular file inside its folder, of bounded size and
# nesting, refused in one line that names it). What reads a file any other way is listed here, with why it may: a
# file of the machine's, one Forma itself wrote and reads back, or one another library opens after
# lab.outside_files checked it.
DIRECT_READS = {
    ("lab.model.memory_check", "read_text"): "/proc/meminfo and the cgroup's limits: the machine's own files",
    ("lab.model.checkpoint", "load_file"): "model.safetensors, opened by safetensors after regular_file",
    ("lab.hf.folder", "safe_open"): "each weights shard, opened by safetensors after regular_file",
    ("lab.analysis.activations.store", "safe_open"): "each activation shard, after regular_file (and its checksum)",
    ("lab.analysis.activations.verify", "safe_open"): "an activation shard's header, after regular_file",
    ("lab.analysis.activations.verify", "open"): "a shard's bytes for its checksum, after regular_file",
    ("lab.analysis.activations.harvest", "read_text"): "the index of a part the harvest's own ranks wrote",
    ("lab.analysis.activations.harvest", "loads"): "the index of a part the harvest's own ranks wrote",
    ("lab.analysis.graphs.graph", "load_file"): "a graph's tensors, opened by safetensors after regular_file",
    ("lab.analysis.sweeps", "load_file"): "the parts its own ranks wrote, and a sweep's tables after regular_file",
    ("lab.zoo.transcoders", "load_file"): "top contexts, opened by safetensors after regular_file",
    ("lab.analysis.transcoders.model", "load_file"): "transcoders' weights, opened by safetensors after regular_file",
    ("lab.distributed", "read_text"): "the plan a job recorded in its own folder",
    ("lab.distributed", "loads"): "what ranks send each other (JSON in memory, never unpickled) and the plan a job "
    "recorded",
    ("lab.runs", "read_parquet"): "a run's table, opened by pandas after regular_file",
    ("experiments.monitor.readouts", "safe_open"): "a run's readouts, opened by safetensors after regular_file",
    ("experiments.monitor.real", "load_file"): "the parts a run kept in its own folder, after regular_file",
    ("lab.train.checkpoint", "load_file"): "a checkpoint's tensors, opened by safetensors after regular_file",
    ("lab.zoo.builds", "read_text"): "the recipe a build recorded in its own folder",
    ("lab.hf.gguf", "open"): "a pretrained model's source file for its SHA-256, after its kind and size are checked",
    ("lab.zoo.builds", "loads"): "the recipe a build recorded in its own folder",
    ("lab.parallel", "read_text"): "the progress files its own workers write in its own temporary folder",
    ("lab.parallel", "loads"): "the progress files its own workers write in its own temporary folder",
    ("lab.cli.demo", "read_text"): "the log of a job the demo started",
    ("lab.data.stdlib_corpus", "read_text"): "the corpus cache Forma wrote",
    ("lab.data.stdlib_corpus", "read_bytes"): "the standard library's own source files",
    ("lab.data.real_corpus", "read_bytes"): "the standard library's and the installed packages' own source files",
    ("lab.measured", "read_text"): "the repository's documents and docs/measured/",
    ("lab.measured", "loads"): "the repository's documents and docs/measured/",
    ("lab.analysis.activations.store", "loads"): "its own arguments, round-tripped through JSON in memory",
}


def direct_reads() -> set[tuple[str, str]]:
    """(module, call) for every call of lab/, experiments/ and dashboards/ that reads a file, or parses JSON, other
    than through lab.outside_files: Path.read_text / read_bytes, json.load(s), open, safe_open, load_file, from_file,
    read_parquet."""
    import ast

    found = set()
    for name, path in modules().items():
        if name == "lab.outside_files" or not name.startswith(("lab", "experiments", "dashboards")):
            continue
        for node in ast.walk(syntax_tree(path)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("open", "safe_open", "load_file"):
                found.add((name, func.id))
            elif isinstance(func, ast.Attribute):
                owner = func.value.id if isinstance(func.value, ast.Name) else None
                if func.attr in ("read_text", "read_bytes", "from_file", "read_parquet", "load_file", "safe_open") or (
                    owner == "json" and func.attr in ("load", "loads")
                ):
                    found.add((name, func.attr))  # (lab.outside_files' own readers are called by name, not on a Path)
    return found


def test_files_from_outside_are_read_through_lab_inputs():
    """No module reads a file or parses JSON itself but those listed in DIRECT_READS, each with its reason; and the
    list names nothing that no longer reads (so it stays the list of what it says)."""
    found = direct_reads()
    assert sorted(found - DIRECT_READS.keys()) == []
    assert sorted(DIRECT_READS.keys() - found) == []


def test_dashboard_pages_read_files_through_labs_readers_only():
    """A page opens no file itself: run folders, tables, figures, metrics and model folders are read by lab."""
    opened = {
        path.name: word
        for path in sorted((REPO / "dashboards").glob("*.py"))
        for word in ("read_text(", "json.loads(", "read_parquet(", "open(", "read_bytes(")
        if word in path.read_text()
    }
    assert opened == {}


def test_the_graph_sees_imports_inside_functions(tmp_path):
    """The reader counts what it is meant to: a top-level and an in-function import, relative ones resolved."""
    path = tmp_path / "m.py"
    path.write_text("import lab.files\n\ndef f():\n    from lab.model import transformer\n    from . import x\n")
    known = {"lab.model": Path(), "lab.model.transformer": Path(), "lab.files": Path(), "lab.x": Path()}
    assert sorted(imports("lab.m", path, known)) == [
        ("lab.files", False),
        ("lab.model.transformer", True),
        ("lab.x", True),
    ]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def process_modules() -> set[str]:
    """conftest's PROCESS_MODULES, read from its source (a test imports nothing from conftest)."""
    tree = ast.parse((REPO / "tests" / "conftest.py").read_text())
    (value,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["PROCESS_MODULES"]
    ]
    return ast.literal_eval(value)


def test_files_under_tests_import_only_builders_and_helpers_never_a_test_file_or_conftest():
    """What two test files share lives in tests/builders.py (builders) or a conftest.py (fixtures, which pytest
    hands over by name): no module under tests/ imports from a test file (test_*.py) or from a conftest, at the top
    or inside a function."""
    found = set()
    for path in sorted((REPO / "tests").rglob("*.py")):
        for _, module in from_imports(path):
            leaf = module.rpartition(".")[2]
            if module.startswith("tests.") and (leaf.startswith("test_") or leaf == "conftest"):
                found.add((str(path.relative_to(REPO)), module))
        for node in ast.walk(syntax_tree(path)):
            if isinstance(node, ast.Import):
                found |= {
                    (str(path.relative_to(REPO)), alias.name)
                    for alias in node.names
                    if alias.name.startswith("tests.")
                    and alias.name.rpartition(".")[2].startswith(("test_", "conftest"))
                }
    assert found == set(), "move what they share to tests/builders.py or a conftest.py"


def test_the_testing_page_maps_the_suite_as_it_is():
    """docs/testing.md names every file under tests/ (but the packages' empty __init__.py), every file it names
    exists, every `make` target it names is one of the Makefile's, and every module whose tests conftest marks
    `processes` is among the page's."""
    page = (REPO / "docs" / "testing.md").read_text()
    files = {str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("*.py") if path.name != "__init__.py"}
    named = set(re.findall(r"tests/[\w/]+\.py", page))
    assert files - named == set(), "name these on docs/testing.md"
    assert named - files == set(), "docs/testing.md names files that are not there"
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    assert set(re.findall(r"`make ([\w-]+)`", page)) - targets == set()
    assert {f"tests/{path}" for path in process_modules()} <= named


def figures() -> dict[str, object]:
    edges, in_function = graph()
    lines = {
        folder: sum(len(p.read_text().splitlines()) for p in (REPO / folder).rglob("*.py"))
        for folder in (*FOLDERS, "lab/model", "tests")
    }
    count = {path: len(path.read_text().splitlines()) for path in modules().values()}
    largest = sorted(count, key=count.get, reverse=True)[:5]
    return {
        "circles": circles(edges),
        "in_function_lab_imports": len(in_function),
        "in_function_lab_imports_in_lab": sum(name.startswith("lab") for name, _ in in_function),
        "private_imports": len(private_imports()),
        "reexports": len(reexports()),
        "lines": lines,
        "largest": [f"{path.relative_to(REPO)} ({count[path]} lines)" for path in largest],
        "model_core_lines": sum(len((REPO / path).read_text().splitlines()) for path in MODEL_CORE),
    }


if __name__ == "__main__":
    print(json.dumps(figures(), indent=2))


def test_each_architecture_variant_is_named_by_the_config_and_built_by_its_table_alike():
    """A variant's name lives in ModelConfig's Literal (what check_fields and TOML accept) and in its component
    table (what builds it); the two name the same set, so neither can gain a name the other lacks."""
    import typing

    from lab.model.components import BLOCKS
    from lab.model.config import ModelConfig
    from lab.model.embeddings import POSITIONS
    from lab.model.mlp import MLPS
    from lab.model.norms import NORMS

    hints = typing.get_type_hints(ModelConfig)
    for field, table in (("positions", POSITIONS), ("norm", NORMS), ("mlp", MLPS), ("block", BLOCKS)):
        assert sorted(typing.get_args(hints[field])) == sorted(table), field


CATCH_ALL_NAMES = ("common", "parts", "helpers", "utils", "util", "misc")  # a module named for no idea


def test_no_module_is_named_for_no_idea():
    """A module's name says what is in it: none is called common, parts, helpers, utils or misc."""
    named = [str(p.relative_to(REPO)) for p in python_files() if p.stem in CATCH_ALL_NAMES]
    assert named == [], "name the module for the idea it holds"
