"""Atomic file writes: readers see the old file or the new one, never half of either."""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

TEMPORARY_SUFFIX = ".tmp"


def is_temporary(path: str | Path) -> bool:
    """Whether `path` is one of atomic_write's temporaries (.<name>.<random>.tmp): a file that was never
    renamed into place — what a write killed half-way leaves — and so never mistaken for a finished one."""
    name = Path(path).name
    return name.startswith(".") and name.endswith(TEMPORARY_SUFFIX)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[Path], Any]) -> None:
    """Call write(tmp) on a temporary file beside `path`, then rename it into place.

    The file gets the permissions an ordinary `open()` would give it (0666 less the umask);
    on any error the temporary file is removed and `path` is left as it was. An OSError of creating the temporary
    file, or one that names no file (a write on a full disk), is raised again naming `path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    except OSError as err:  # a read-only or full file system: name the file that was to be written
        raise OSError(err.errno, err.strerror, str(path)) from err
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None and err.errno is not None:
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


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
