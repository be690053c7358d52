"""Builds: a zoo model trains beside the published one, in a folder of its own `models/NAME/.builds/<id>/`
marked by the link `.next`, and is switched in with one rename (`publish_build`): every published name is a link
`NAME → .current/NAME` and `.current` links to the published build, so a reader sees the previous model or
the new one, whole, at every moment and after a crash at any point. An interrupted build is continued
(`resume_build`) only from the same recipe; one build of a model runs at a time (`only_build`)."""

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lab.files import current_umask, remove_temporary
from lab.runs import write_json
from lab.train.checkpoint import RESUMABLE_CHANGES, discard_tree

BUILDS_DIR = ".builds"  # every build, complete or in progress, in a folder of its own
CURRENT_LINK = ".current"  # → .builds/<id>: the published build
NEXT_LINK = ".next"  # → .builds/<id>: the build in progress, which --resume continues
BUILD_RECIPE = "recipe.json"  # the recipe a build was started from (after the quick overrides)
BUILD_FORMAT = "forma-build/1"
LOCK_FILE = ".lock"  # held by the one `forma build NAME` building here
# What a model folder held as plain files before builds were published through links. The first
# publish moves them into a build of their own (by hard links) so that they, too, swap in one rename.
UNLINKED_NAMES = (
    "model.safetensors",
    "config.json",
    "tokenizer.json",
    "src_tokenizer.json",
    "tgt_tokenizer.json",
    "world.json",
    "card.json",
    "train",
)


logger = logging.getLogger(__name__)


def start_build(directory: Path, record: dict[str, Any]) -> Path:
    """A new, empty build folder holding its recipe, marked as the build in progress."""
    builds = directory / BUILDS_DIR
    builds.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=builds, prefix=time.strftime("%Y%m%dT%H%M%S-"))).resolve()
    staging.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; the model should not be
    write_json(staging / BUILD_RECIPE, record)
    abandoned = _target(directory / NEXT_LINK)
    _point(directory / NEXT_LINK, staging)
    if abandoned is not None and abandoned != published_build(directory):
        logger.warning(
            "%s: discarding the interrupted build in %s (`forma build %s --resume` continues one)",
            record["name"],
            abandoned,
            record["name"],
        )
        discard_tree(abandoned)
    return staging


def resume_build(directory: Path, record: dict[str, Any]) -> Path:
    """The interrupted build, after checking that it was started from the same recipe."""
    name = record["name"]
    again = f"`forma build {name}{' --quick' if record['quick'] else ''}`"
    staging = _target(directory / NEXT_LINK)
    if staging is None or not (staging / BUILD_RECIPE).is_file():
        raise FileNotFoundError(
            f"nothing to resume for {name}: {directory} holds no interrupted build "
            f"(the last one finished, or none began); run {again} to train afresh"
        )
    try:
        saved = json.loads((staging / BUILD_RECIPE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot resume {name}: malformed {staging / BUILD_RECIPE} ({err}); run {again}") from err
    if saved.get("quick") != record["quick"]:
        flag = " --quick" if saved.get("quick") else ""
        raise ValueError(
            f"cannot resume {name}: the interrupted build was started {'with' if flag else 'without'} "
            f"--quick; resume it with `forma build {name}{flag} --resume`"
        )
    changes = _recipe_changes(saved, record)
    if changes:
        raise ValueError(
            f"cannot resume {name}: the recipe differs from the interrupted build's in "
            f"{'; '.join(changes)}; run {again} to start afresh (or resume with the build's recipe)"
        )
    return staging


def _recipe_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each difference that would change what the build computes, as '[table] key (build …, now …)'."""
    changes = [
        f"{key} (build {saved.get(key)!r}, now {now.get(key)!r})"
        for key in ("format", "name")
        if saved.get(key) != now.get(key)
    ]
    for table in ("world", "model", "train"):
        before, after = saved.get(table) or {}, now.get(table) or {}
        skip = RESUMABLE_CHANGES if table == "train" else ()
        for key in dict.fromkeys([*before, *after]):
            if key not in skip and before.get(key, "<absent>") != after.get(key, "<absent>"):
                changes.append(
                    f"[{table}] {key} (build {before.get(key, '<absent>')!r}, now {after.get(key, '<absent>')!r})"
                )
    return changes


def publish_build(directory: Path, staging: Path) -> None:
    """Make the complete build `staging` the model in `directory`, with one atomic rename.

    Each published name (model.safetensors, config.json, card.json, train/, …) is a link
    `NAME → .current/NAME` and `.current` a link to one build, so switching `.current` switches every
    file at once: at any moment, and after a crash at any point, each name shows the previous build or
    the new one, complete. The previous build is kept until the next publish, for readers that
    resolved it a moment before the switch; older ones are removed."""
    _move_unlinked_into_a_build(directory)
    previous = published_build(directory)
    for leftover in list(staging.rglob(".*.tmp")):  # temporaries (folders, now) of writes a crash cut short
        remove_temporary(leftover)
    entries = sorted(entry for entry in staging.iterdir() if not entry.name.startswith("."))
    for entry in entries:  # before the switch a new name shows nothing, as before
        path = directory / entry.name
        if not path.is_symlink():
            if path.exists():
                raise ValueError(f"cannot publish {staging.name}: {path} is in the way (a file Forma did not link)")
            _point(path, directory / CURRENT_LINK / entry.name)
    _point(directory / CURRENT_LINK, staging)  # the switch
    if _target(directory / NEXT_LINK) == staging:
        (directory / NEXT_LINK).unlink()
    _tidy(directory, keep={staging, previous})


def published_build(directory: Path) -> Path | None:
    return _target(directory / CURRENT_LINK)


def _target(link: Path) -> Path | None:
    """Where a link points, when it is one and its target exists."""
    if not link.is_symlink():
        return None
    target = link.resolve()
    return target if target.exists() else None


def _point(link: Path, target: Path) -> None:
    """Make `link` a relative symlink to `target`, atomically (a new link renamed over the old one)."""
    tmp = link.with_name(f"{link.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    os.symlink(os.path.relpath(target, link.parent), tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _move_unlinked_into_a_build(directory: Path) -> None:
    """Turn a model folder's plain files (from before links) into a published build, name by name.

    The files are hard-linked into the build first and `.current` pointed at it; only then is each
    plain name replaced by its link, which shows the same content. Every step can be repeated, so a
    crash part-way is finished by the next publish."""
    unlinked = [name for name in UNLINKED_NAMES if (directory / name).exists() and not (directory / name).is_symlink()]
    if not unlinked:
        return
    current = published_build(directory)
    if current is None:
        (directory / BUILDS_DIR).mkdir(exist_ok=True)
        current = Path(tempfile.mkdtemp(dir=directory / BUILDS_DIR, prefix="unlinked-")).resolve()
        current.chmod(0o777 & ~current_umask())
        for name in unlinked:
            _link_copy(directory / name, current / name)
        _point(directory / CURRENT_LINK, current)
    for name in unlinked:
        path = directory / name
        _link_copy(path, current / name)  # again: a crash may have cut the first copy short
        if path.is_dir():  # a link cannot be renamed over a folder: move the folder aside first
            aside = directory / f".{name}.tmp-unlinked-{os.getpid()}"
            os.replace(path, aside)
            _point(path, directory / CURRENT_LINK / name)
            shutil.rmtree(aside)
        else:
            _point(path, directory / CURRENT_LINK / name)


def _link_copy(source: Path, destination: Path) -> None:
    """Hard-link a file or a folder's files to `destination`, skipping what is there (a copy if links fail)."""

    def link(src: str, dst: str) -> None:
        if os.path.lexists(dst):
            return
        try:
            os.link(src, dst)
        except OSError:  # another filesystem, or one without hard links
            tmp = f"{dst}.tmp-{os.getpid()}"
            shutil.copy2(src, tmp)
            os.replace(tmp, dst)

    if source.is_dir():
        shutil.copytree(source, destination, copy_function=link, dirs_exist_ok=True)
    else:
        link(str(source), str(destination))


def _tidy(directory: Path, keep: set[Path | None]) -> None:
    """Remove links to names the published build lacks, leftovers of crashed renames, and old builds."""
    for path in [*directory.iterdir(), *(directory / BUILDS_DIR).iterdir()]:
        if ".tmp-" not in path.name:
            continue
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
    for path in directory.iterdir():
        if path.is_symlink() and os.readlink(path).startswith(CURRENT_LINK + os.sep) and not path.exists():
            path.unlink(missing_ok=True)
    keep = keep | {_target(directory / NEXT_LINK)}
    for build_dir in (directory / BUILDS_DIR).iterdir():
        if build_dir.resolve() not in keep:
            discard_tree(build_dir)


@contextlib.contextmanager
def only_build(directory: Path, name: str) -> Iterator[None]:
    """Hold models/NAME/.lock while building: a second `forma build NAME` at the same time would
    discard the first one's build. The lock goes with the process, however it ends."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(
                f"another `forma build {name}` is building in {directory}; "
                "wait for it to finish (or stop it and --resume)"
            ) from None
        yield
    finally:
        os.close(fd)
