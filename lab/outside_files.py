"""Reading files that come from outside Forma, through one door.

Every file Forma reads that someone else may have written or changed — a model folder's config.json, weights and
tokenizer, a CSV of questions, a run folder's results, figures and tables, an activation set's index and shards —
is checked here before a byte of it is parsed:

- it is a regular file: a FIFO named `results.json` would block its reader for ever, and a device or a folder is
  no file. It is opened without blocking, and the check is made on the open descriptor;
- when it belongs to a folder, it resolves inside that folder: a link, or a name with `..`, that leads out of it
  is refused (a link that stays inside, as a zoo model's files do, is followed);
- it is at most `max_bytes` long, checked before reading;
- text is UTF-8 (a leading byte-order mark is dropped), and a byte that is not is named by line;
- JSON nests at most MAX_DEPTH levels (a results.json of ten thousand brackets would otherwise end its reader
  in a RecursionError), and a malformed one is named by line and column;
- a CSV's cells are at most the csv module's limit long, named by line.

Every refusal is an `InputError`, a ValueError whose message is one line that names the file and what is wrong.
This module imports only the standard library, so that the model package can read its folders through it.
"""

import codecs
import csv
import io
import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 * 2**20  # a run's results or figure, a config, an index: far above any Forma writes
MAX_TEXT_BYTES = 2**30  # a tokenizer.json or a CSV: other readers bound these by memory (`read_csv`)
MAX_DEPTH = 64  # JSON nesting: a plotly figure nests about 8 deep, a results.json about 6
CSV_CELL_LIMIT = csv.field_size_limit()  # the csv module's limit on one cell, in characters (131,072)


class InputError(ValueError):
    """A file from outside that Forma will not read: one line naming the file and what is wrong with it."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).splitlines()))  # one line, whatever the parts held


def size_text(n: float) -> str:
    """A byte count as a reader wants it: 812 bytes, 3.2 MiB, 1.5 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n):,} bytes"


def _kind(mode: int) -> str:
    return (
        "a folder"
        if stat.S_ISDIR(mode)
        else "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "not a regular file"
    )


def inside(path: str | Path, folder: str | Path) -> Path:
    """`path` after checking that it resolves (links followed) inside `folder`; an InputError when it leads out."""
    path, folder = Path(path), Path(folder)
    real, root = os.path.realpath(path), os.path.realpath(folder)
    if os.path.commonpath([real, root]) != root:
        how = "is a link that leads" if path.is_symlink() else "leads"
        raise InputError(
            f"{path} {how} outside {folder} (to {real}): Forma reads only files inside the folder they belong to"
        )
    return path


def regular_file(
    path: str | Path, folder: str | Path | None = None, max_bytes: int | None = None, what: str = "file"
) -> Path:
    """`path`, after checking that it exists, is a regular file (links followed), lies inside `folder` when one is
    given, and is at most `max_bytes` long: for a file that another library will open (safetensors, tokenizers,
    transformers, pandas). FileNotFoundError when there is none; InputError for the rest."""
    path = Path(path)
    if folder is not None:
        inside(path, folder)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"no {what} at {path}") from None
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror or err}") from err
    _check(path, info, max_bytes, what)
    return path


def _check(path: Path, info: os.stat_result, max_bytes: int | None, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{path} is {_kind(info.st_mode)}, not a regular file: Forma reads its {what} only from one")
    if max_bytes is not None and info.st_size > max_bytes:
        raise InputError(
            f"{path} is {size_text(info.st_size)}, more than the {size_text(max_bytes)} Forma reads for a {what}"
        )


def read_bytes(
    path: str | Path, folder: str | Path | None = None, max_bytes: int = MAX_TEXT_BYTES, what: str = "file"
) -> bytes:
    """The bytes of a regular file inside `folder` (when given), at most `max_bytes` of them. It is opened without
    blocking and checked on the descriptor, so a FIFO put in its place is refused, never waited on."""
    path = Path(path)
    if folder is not None:
        inside(path, folder)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"no {what} at {path}") from None
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror or err}") from err
    try:
        _check(path, os.fstat(fd), max_bytes, what)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        os.set_blocking(fd, True)
        try:
            data = handle.read(max_bytes + 1)
        except OSError as err:
            raise InputError(f"cannot read {path}: {err.strerror or err}") from err
    if len(data) > max_bytes:  # it grew while being read
        raise InputError(f"{path} is more than the {size_text(max_bytes)} Forma reads for a {what}")
    return data


def decode(data: bytes, path: str | Path) -> str:
    """UTF-8 text, a leading byte-order mark dropped; an InputError naming the line of a byte that is not UTF-8."""
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise InputError(
            f"{path}, line {line}: not UTF-8 (byte {data[err.start]:#04x} at column {column}); save the file as UTF-8"
        ) from None


def read_text(
    path: str | Path, folder: str | Path | None = None, max_bytes: int = MAX_TEXT_BYTES, what: str = "file"
) -> str:
    """A regular file's UTF-8 text (`read_bytes`, then `decode`)."""
    return decode(read_bytes(path, folder, max_bytes, what), path)


def parse_json(text: str, source: str | Path, max_depth: int = MAX_DEPTH) -> Any:
    """JSON text (NaN and Infinity allowed, as Forma writes them) nested at most `max_depth` deep; an InputError
    naming `source` and the line and column of what is malformed."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"malformed JSON in {source}, line {err.lineno} column {err.colno}: {err.msg}") from None
    except RecursionError:
        raise InputError(f"{source} nests deeper than {max_depth} levels") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise InputError(f"malformed JSON in {source}: {err}") from None
    if depth(value, max_depth) > max_depth:
        raise InputError(f"{source} nests deeper than {max_depth} levels")
    return value


def depth(value: Any, stop: int = MAX_DEPTH) -> int:
    """How deep lists and dicts nest in `value` (a scalar: 0), counted without recursion; stops past `stop`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > stop:
                return deepest
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def read_json(
    path: str | Path,
    folder: str | Path | None = None,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_DEPTH,
    what: str = "JSON file",
) -> Any:
    """A regular file's JSON (`read_text`, then `parse_json`)."""
    return parse_json(read_text(path, folder, max_bytes, what), path, max_depth)


def read_json_object(
    path: str | Path, folder: str | Path | None = None, max_bytes: int = MAX_JSON_BYTES, what: str = "JSON file"
) -> dict[str, Any]:
    """`read_json`, which must hold a JSON object."""
    value = read_json(path, folder, max_bytes, what=what)
    if not isinstance(value, dict):
        raise InputError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def read_csv(path: str | Path, max_bytes: int = MAX_TEXT_BYTES, what: str = "CSV file") -> list[tuple[int, list[str]]]:
    """[(the line its row starts on, the row's cells)] of a UTF-8 CSV file (a byte-order mark dropped; a cell may
    hold line breaks when quoted). An InputError naming the line of a byte that is not UTF-8, of a cell longer
    than the csv module's limit, or of a quote left open."""
    text = read_text(path, None, max_bytes, what)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows, start = [], 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return rows
        except csv.Error as err:
            if "field larger than field limit" in str(err):
                raise InputError(
                    f"{path}, line {start}: a cell is longer than the {CSV_CELL_LIMIT:,} characters the "
                    "csv module reads"
                ) from None
            raise InputError(f"{path}, line {start}: not a CSV row ({err})") from None
        rows.append((start, row))
        start = reader.line_num + 1
