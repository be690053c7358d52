"""Atomic file writes (readers see the old file or the new one, never half of either), and a command's folder:
the manifest of what Forma wrote there (`claim_folder`) and the lock of the process writing it (`folder_lock`)."""

import errno
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lab.outside_files import parse_json, read_json, read_text, size_text

TEMPORARY_SUFFIX = ".tmp"


def temporary_name(name: str) -> bool:
    """Whether `name` is one of atomic_write's temporary folders' (.<name>.<random>.tmp)."""
    return name.startswith(".") and name.endswith(TEMPORARY_SUFFIX)


def is_temporary(path: str | Path) -> bool:
    """Whether `path` is one of atomic_write's temporaries (.<name>.<random>.tmp), or a file in one: a file that was
    never renamed into place — what a write killed half-way leaves — and so never mistaken for a finished one."""
    path = Path(path)
    return temporary_name(path.name) or temporary_name(path.parent.name)


def remove_temporary(path: str | Path) -> bool:
    """Remove `path` if it is one of atomic_write's temporaries (by its name): its folder, with whatever a killed
    writer left inside (safetensors' own `.tmpXXXXXX`, the file half-written), or a bare file of an earlier Forma.
    A link is never followed. Returns whether it removed anything."""
    path = Path(path)
    if not temporary_name(path.name) or path.is_symlink():
        return False
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
        return True
    if path.is_file():
        path.unlink(missing_ok=True)
        return True
    return False


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[Path], Any], size: int | None = None) -> None:
    """Call write(tmp) on a file in a temporary folder beside `path` (.<name>.<random>.tmp/<name>), then rename it
    into place and remove the folder.

    A writer's own temporaries land in that folder too (safetensors writes `.tmpXXXXXX` beside the file it is
    given, then renames it): a write killed half-way leaves only the folder, whose name says it is Forma's, and the
    next run removes it (`remove_temporary`). The file gets the permissions an ordinary `open()` would give it
    (0666 less the umask); on any error the temporary folder is removed and `path` is left as it was. An OSError of
    creating the temporary folder, or one that names no file, is raised again naming `path`; a full disk, however
    the writer reports it (safetensors raises its own error), is an OSError naming `path`, the bytes it needed
    (`size`, when the caller knows it, else at least what was written) and the bytes free there.
    """
    path = Path(path)
    record_written(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX))
    except OSError as err:  # a read-only or full file system: name the file that was to be written
        raise OSError(err.errno, err.strerror, str(path)) from err
    tmp = folder / path.name
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException as err:
        written = _size(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        if (isinstance(err, OSError) and err.errno == errno.ENOSPC) or "No space left on device" in str(err):
            raise disk_full(path, size, written) from err
        if isinstance(err, OSError) and err.filename is None and err.errno is not None:
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    shutil.rmtree(folder, ignore_errors=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def disk_full(path: Path, size: int | None, written: int) -> OSError:
    """The OSError of a write of `path` that found its disk full: what it needed, and what is free there."""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    needed = f"{size_text(size)}" if size is not None else f"at least {size_text(written)}"
    there = f"; {size_text(free)} free there" if free is not None else ""
    return OSError(
        errno.ENOSPC,
        f"No space left on device: writing it needs {needed}{there}; free some space and run the same command "
        "again to continue",
        str(path),
    )


def tensors_bytes(tensors: dict[str, Any]) -> int:
    """The bytes of the tensors a safetensors file will hold (its header, a few KiB at most, aside)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def check_writable(folder: str | Path, what: str = "folder") -> None:
    """A ValueError naming `folder` when no file can be created in it (a read-only mount, no permission, not a
    folder), found by creating and removing one: permission bits alone say nothing of a read-only mount, or to root."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".forma-write-check-"):
            pass
    except OSError as err:
        raise ValueError(f"cannot write into the {what} {folder}: {err.strerror or err}") from err


def atomic_write_text(path: str | Path, text: str) -> None:
    """`text` as UTF-8 (whatever the locale), atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


# --------------------------------------------------------------------------------------------
# A command's folder (`--out`): what Forma wrote there, listed in its manifest, and who writes it now
# --------------------------------------------------------------------------------------------
OWNER_FILE = ".forma-folder.json"  # the folder's manifest: the command, and the top-level names it writes
LOCK_FILE = ".forma-lock"  # the pid and host of the process writing the folder now
OWNER_FORMAT = "forma-folder/1"
EMPTY_LOCK_S = 30.0  # a lock file still empty this long after it was made: its maker died before writing its pid


def _manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None where it has none; a ValueError for one Forma cannot read."""
    path = folder / OWNER_FILE
    if not path.exists():
        return None
    try:
        manifest = read_json(path, folder, max_bytes=2**20, what="folder manifest")
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} cannot be read ({err}); it is Forma's record of the folder") from None
    if not (
        isinstance(manifest, dict)
        and manifest.get("format") == OWNER_FORMAT
        and isinstance(manifest.get("command"), str)
        and isinstance(manifest.get("entries"), list)
        and all(isinstance(e, str) and e and "/" not in e for e in manifest["entries"])
    ):
        raise ValueError(f"{path} is not a {OWNER_FORMAT} manifest; it is Forma's record of the folder")
    return manifest


def owned(folder: str | Path) -> set[str]:
    """The top-level names of `folder` that its manifest lists as Forma's (what Forma may replace or remove)."""
    manifest = _manifest(Path(folder))
    return set(manifest["entries"]) if manifest else set()


def is_owned_temporary(path: str | Path, names: set[str]) -> bool:
    """Whether `path` is atomic_write's temporary of one of `names` (.<name>.<random>.tmp)."""
    name = Path(path).name
    return temporary_name(name) and any(name.startswith(f".{n}.") for n in names)


def claim_folder(folder: str | Path, command: str, entries: list[str], *, overwrite: bool = False) -> set[str]:
    """Check that `folder` holds nothing Forma did not write there, then record `entries` (the top-level names
    `command` writes) in its manifest, folder/.forma-folder.json. A new or empty folder is claimed; one whose manifest
    is another command's is refused; a name its manifest does not list (a file of the user's) is refused in one
    line unless `overwrite`, and then left where it is: Forma replaces and removes only what its manifest lists.
    Every rank may call it (the same bytes, written atomically). Returns the names the manifest listed before."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder: --out names the folder the {command} writes")
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []  # listed before the manifest is read
    manifest = _manifest(folder) if folder.is_dir() else None
    if manifest is not None and manifest["command"] != command:
        raise ValueError(
            f"{folder} holds a {manifest['command']} (its {OWNER_FILE} says so), not a {command}; choose another folder"
        )
    before = set(manifest["entries"]) if manifest else set()
    mine = before | {OWNER_FILE, LOCK_FILE}
    foreign = [n for n in names if n not in mine and not is_owned_temporary(n, mine)]
    if foreign and not overwrite:
        more = f" and {len(foreign) - 1:,} more" if len(foreign) > 1 else ""
        raise ValueError(
            f"{folder} holds {foreign[0]!r}{more}, which Forma did not write there (its {OWNER_FILE} does not list "
            f"it); choose a new or empty folder, or give --overwrite to write beside it (Forma removes only what it "
            "wrote)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    record = {"format": OWNER_FORMAT, "command": command, "entries": sorted(before | set(entries))}
    if manifest != record:
        atomic_write_text(folder / OWNER_FILE, json.dumps(record, indent=2) + "\n")
    return before


RECORDING_ENV = "FORMA_RECORDING"  # the folder being recorded: its manifest lists each name as it is first written


@contextmanager
def recording(folder: str | Path) -> Iterator[None]:
    """While the body runs, every top-level name Forma writes into `folder` (a claimed folder: `claim_folder`) is
    listed in its manifest before the first byte of it is written (`record_written`): a file, a subfolder a model
    or checkpoint is saved into, and so each killed write's temporary (.<name>.<random>.tmp). A command whose names
    are not known before it runs (`forma run`: its figures and tables) records them so. Worker processes inherit
    it (an environment variable)."""
    before = os.environ.get(RECORDING_ENV)
    os.environ[RECORDING_ENV] = os.path.abspath(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(RECORDING_ENV, None)
        else:
            os.environ[RECORDING_ENV] = before


def record_written(path: str | Path) -> None:
    """List `path`'s top-level name in the manifest of the folder being recorded (`recording`), if it lies inside
    it and is not listed yet; atomically. Called by every writer of Forma's (atomic_write, a checkpoint's swap)
    before it writes. Two processes adding two new names at the same instant may lose one: the next run then
    refuses that name as not Forma's, in one line, and loses nothing."""
    root = os.environ.get(RECORDING_ENV)
    if not root:
        return
    try:
        name = Path(os.path.abspath(path)).relative_to(root).parts[0]
    except (ValueError, IndexError):  # outside the folder, or the folder itself
        return
    manifest = _manifest(Path(root)) if name not in (OWNER_FILE, LOCK_FILE) else None
    if manifest is not None and name not in manifest["entries"]:
        manifest["entries"] = sorted([*manifest["entries"], name])
        atomic_write_text(Path(root) / OWNER_FILE, json.dumps(manifest, indent=2) + "\n")


def _lock_holder(path: Path) -> dict[str, Any] | None:
    """The pid and host a lock file names, or None where it is being written (or was left empty by a crash)."""
    try:
        holder = parse_json(read_text(path, path.parent, max_bytes=4096, what="lock file") or "null", path)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) else None


def _alive(holder: dict[str, Any]) -> bool:
    """Whether a lock's holder still runs: its pid on this host, else (another host's) assumed so."""
    if holder.get("host") != socket.gethostname():
        return True
    if holder["pid"] <= 0:  # no process's pid (kill would signal a group)
        return False
    try:
        os.kill(holder["pid"], 0)
    except PermissionError:  # another user's process
        return True
    except (ProcessLookupError, OverflowError):
        return False
    return True


@contextmanager
def folder_lock(folder: str | Path, what: str) -> Iterator[None]:
    """Hold folder/.forma-lock (this process's pid and host) while the body writes `folder`: a second writer is
    refused with one line naming the holder; a lock whose holder has ended (killed, crashed) is stale, and taken
    over. The lock file goes when the body ends, however it ends."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            holder = _lock_holder(path)
            fresh = holder is None and time.time() - _mtime(path) < EMPTY_LOCK_S
            if fresh or (holder is not None and _alive(holder)):
                who = f"pid {holder['pid']} on {holder.get('host')}" if holder else "a process starting now"
                raise ValueError(
                    f"{folder} is being written by another {what} ({who}; {path}); wait for it to end, or choose "
                    "another folder"
                ) from None
            path.unlink(missing_ok=True)  # stale: its holder has ended
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")
    try:
        yield
    finally:
        if (_lock_holder(path) or {}).get("pid") == os.getpid():
            path.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
