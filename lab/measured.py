"""Measured numbers in the documents: every figure cites the tracked file it comes from.

The reference measurements are tracked files under `docs/measured/`:

    docs/measured/cards/<model>.json                 card.json of `forma build <model>` (default recipe)
    docs/measured/runs/<experiment>.json             results.json of `forma run <experiment>` (default profile)
    docs/measured/runs/<experiment>.provenance.json  that run's provenance.json (seed, commit, wall time)
    docs/measured/graphs/<model>.json                `forma graphs <model> --out` over its default transcoder set
    docs/measured/transcoders/<model>.json           that set's quality.json, with its run's time and memory
    docs/measured/{graphs,transcoders}/<model>_clt.json   the same for its cross-layer set (`--kind clt`)

`forma cards` copies them in (`record_card`, `record_run`: a quick card, a quick run or an unfinished run
is refused) and rewrites every marked number in README.md, models/*/MODEL.md and docs/*.md from its file
(`rewrite_document`). A number is written inside a marker, two HTML comments that GitHub does not show:

    <!-- measured docs/measured/cards/markov.json val_kl_complete_contexts_nats .3f -->0.061<!-- /measured -->

naming the file (relative to the repository root; any tracked JSON, e.g. benchmarks/results/walltime.json),
the field and a Python format spec (`.3f`, `,d`, `.1%`, `,.0f`; `s` for a string such as a sample). A field is a dotted
path: a word is a key
of an object, an integer (negative from the end) an index into a list, and `key=value` the one object of a
list whose `key` is `value`, e.g. `checkpoints.-1.kl_nats` or `headlines.name=final_kl.value`.
`check_document` lists every marker whose text differs from its file or that cites a missing file or
field, and every bare measured-looking number in a "measured" region (`bare_numbers`): a section whose
heading starts with "Measured", and every table of README.md and of a MODEL.md.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.files import atomic_write_text
from lab.outside_files import read_json_object

REPO = Path(__file__).resolve().parents[1]
MEASURED_DIR = Path("docs") / "measured"
# A marker cites a .json file (so a page may show the syntax itself, with FILE FIELD FORMAT, unparsed).
MARKER = re.compile(
    r"<!-- measured (?P<file>\S+\.json) (?P<field>\S+) (?P<format>\S+) -->(?P<text>.*?)<!-- /measured -->", flags=re.S
)
# What a measured number looks like: a decimal fraction (not a dotted version such as 2.13.0), a number
# with thousands separators, or a number with a unit Forma measures in.
MEASURED_LOOKING = re.compile(
    r"(?<![\w.])(?:\d+\.\d+(?![\d.])|\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?\s?(?:s|ms|%|nats?|bits?|MB|GB|minutes?)\b)"
)
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
FENCE = re.compile(r"^```.*?^```\s*$", flags=re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a document: where, and what."""

    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


# --------------------------------------------------------------------------------------------
# Markers
# --------------------------------------------------------------------------------------------
def resolve(data: Any, field: str) -> Any:
    """The value at a dotted `field` path (module docstring); KeyError naming the first part not found."""
    value = data
    for part in field.split("."):
        if isinstance(value, list):
            if "=" in part:
                key, wanted = part.split("=", 1)
                matches = [v for v in value if isinstance(v, dict) and str(v.get(key)) == wanted]
                if len(matches) != 1:
                    raise KeyError(f"{len(matches)} entries with {key} = {wanted!r} (need exactly one) in {field!r}")
                value = matches[0]
                continue
            try:
                value = value[int(part)]
            except (ValueError, IndexError):
                raise KeyError(f"no list entry {part!r} in {field!r}") from None
        elif isinstance(value, dict):
            if part not in value:
                raise KeyError(f"no field {part!r} in {field!r}")
            value = value[part]
        else:
            raise KeyError(f"{field!r} goes past a plain value at {part!r}")
    return value


def format_value(value: Any, spec: str) -> str:
    """`value` in the format `spec` (`s` for a string field, such as a generated sample); ValueError for a
    value that is neither a number nor a string, or a spec that does not apply."""
    if spec == "s" and isinstance(value, str):
        return " ".join(value.split())  # one line: a sample's newlines would break the sentence around it
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"the field holds {value!r}, not a number")
    try:
        return format(value, spec)
    except ValueError as err:
        raise ValueError(f"format {spec!r} does not apply to {value!r}: {err}") from None


def _load(path: Path, cache: dict[Path, Any]) -> Any:
    if path not in cache:
        if not path.is_file():
            raise FileNotFoundError(f"no file {path}")
        try:
            cache[path] = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"malformed JSON in {path}: {err}") from None
    return cache[path]


def expected_text(match: re.Match[str], root: Path, cache: dict[Path, Any] | None = None) -> str:
    """What a marker's text must be: its field of its file, in its format."""
    data = _load(root / match["file"], {} if cache is None else cache)
    return format_value(resolve(data, match["field"]), match["format"])


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def marker_problems(path: Path, root: Path = REPO) -> list[Problem]:
    """Every marker of `path` whose text is not its file's number, or whose file or field is missing."""
    text = Path(path).read_text()
    cache: dict[Path, Any] = {}
    problems = []
    for match in MARKER.finditer(text):
        where = _line(text, match.start())
        try:
            wanted = expected_text(match, root, cache)
        except (FileNotFoundError, KeyError, ValueError) as err:
            problems.append(Problem(path, where, f"{match['file']} {match['field']}: {err.args[0]}"))
            continue
        if match["text"] != wanted:
            problems.append(
                Problem(path, where, f"reads {match['text']!r} but {match['file']} {match['field']} gives {wanted!r}")
            )
    return problems


def rewrite_document(path: Path, root: Path = REPO) -> bool:
    """Replace every marker's text by its file's number (atomically); True if the document changed. A marker
    whose file or field is missing keeps its text (`marker_problems` reports it)."""
    path = Path(path)
    text = path.read_text()
    cache: dict[Path, Any] = {}

    def fill(match: re.Match[str]) -> str:
        try:
            wanted = expected_text(match, root, cache)
        except (FileNotFoundError, KeyError, ValueError):
            return match.group(0)
        return match.group(0).replace(f"-->{match['text']}<!--", f"-->{wanted}<!--", 1)

    new = MARKER.sub(fill, text)
    if new != text:
        atomic_write_text(path, new)
    return new != text


# --------------------------------------------------------------------------------------------
# Bare numbers in measured regions
# --------------------------------------------------------------------------------------------
def measured_regions(path: Path, text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line in a measured region: a section whose heading starts with
    "Measured" (down to the next heading of the same or a higher level), and in README.md or a
    MODEL.md every table row. Fenced code blocks are never measured regions."""
    blanked = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keep the line numbers
    tables_count = Path(path).name in ("README.md", "MODEL.md")
    lines = blanked.split("\n")
    out, inside = [], None  # inside: the heading level of the measured section we are in
    for number, line in enumerate(lines, start=1):
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            if inside is not None and level <= inside:
                inside = None
            if heading.group(2).strip().lower().startswith("measured"):
                inside = level
            continue
        if inside is not None or (tables_count and line.lstrip().startswith("|")):
            out.append((number, line))
    return out


def bare_numbers(path: Path) -> list[Problem]:
    """Measured-looking numbers (MEASURED_LOOKING) in a measured region that are not inside a marker
    (or inline code)."""
    path = Path(path)
    text = path.read_text()
    problems = []
    for number, line in measured_regions(path, text):
        stripped = INLINE_CODE.sub("", MARKER.sub("", line))
        stripped = re.sub(r"<!--.*?-->", "", stripped)
        for found in MEASURED_LOOKING.finditer(stripped):
            problems.append(
                Problem(
                    path,
                    number,
                    f"bare measured-looking number {found.group(0)!r}: write it "
                    f"inside a <!-- measured FILE FIELD FORMAT --> marker",
                )
            )
    return problems


def documents(root: Path = REPO) -> list[Path]:
    """The documents whose numbers are generated: README.md, models/*/MODEL.md, docs/*.md."""
    return sorted([root / "README.md", *root.glob("models/*/MODEL.md"), *root.glob("docs/*.md")])


def check_document(path: Path, root: Path = REPO) -> list[Problem]:
    return marker_problems(path, root) + bare_numbers(path)


# --------------------------------------------------------------------------------------------
# Recording reference measurements
# --------------------------------------------------------------------------------------------
def _read(path: Path, what: str) -> Any:
    """A card's or a run's JSON, through lab.outside_files (a regular file inside its folder, bounded); errors
    name `what`."""
    try:
        return read_json_object(path, path.parent)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: no file {path}") from None
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None


def record_card(model_dir: Path, root: Path = REPO) -> Path:
    """Copy a trained model's card.json to docs/measured/cards/<name>.json; a quick card is refused."""
    model_dir = Path(model_dir)
    card = _read(model_dir / "card.json", f"model {model_dir.name}")
    if card.get("quick") is not False:
        raise ValueError(
            f"{model_dir / 'card.json'} is from `forma build {card.get('name', model_dir.name)} --quick` "
            f"(or does not say): the documents cite default-recipe cards only; run "
            f"`forma build {card.get('name', model_dir.name)}`"
        )
    name = card.get("name") or model_dir.name
    target = root / MEASURED_DIR / "cards" / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, json.dumps(card, indent=2, allow_nan=True) + "\n")
    return target


def record_run(run_dir: Path, root: Path = REPO) -> Path:
    """Copy a finished default-profile run's results.json (and its provenance.json beside it) to
    docs/measured/runs/<experiment>.json; a quick run or an unfinished one is refused."""
    run_dir = Path(run_dir)
    if not (run_dir / "results.json").is_file():
        raise ValueError(f"{run_dir} holds no results.json: the run did not finish (or this is no run folder)")
    provenance = _read(run_dir / "provenance.json", f"run {run_dir}")
    config = _read(run_dir / "config.json", f"run {run_dir}")
    if "wall_time_s" not in provenance or "finished_utc" not in provenance:
        raise ValueError(f"{run_dir / 'provenance.json'} has no wall time: the run did not finish")
    experiment = provenance.get("experiment")
    if not isinstance(experiment, str) or not experiment:
        raise ValueError(f"{run_dir / 'provenance.json'} does not name its experiment")
    if config.get("quick") is not False:
        raise ValueError(
            f"{run_dir} is a quick run of {experiment} (config.json quick = {config.get('quick')!r}): "
            f"the documents cite default-profile runs only; run `forma run {experiment}`"
        )
    results = _read(run_dir / "results.json", f"run {run_dir}")
    target = root / MEASURED_DIR / "runs" / f"{experiment}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, json.dumps(results, indent=2, allow_nan=True) + "\n")
    atomic_write_text(
        target.with_name(f"{experiment}.provenance.json"),
        json.dumps(provenance | {"config": config, "run_folder": run_dir.name}, indent=2) + "\n",
    )
    return target
