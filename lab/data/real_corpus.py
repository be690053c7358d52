"""A corpus of real English and some code, offline, tokenized for the zoo's real model (smollm2).

Sources, all installed by `make venv` at the versions constraints.txt pins, nothing fetched:

    python-stdlib   the running interpreter's standard library (PSF-2.0, its LICENSE.txt): each module's
                    docstrings (English), the reference manual's sections in `pydoc_data.topics` (English) and
                    each module's source (code; NOT_CODE's left out); test suites and IDLE skipped
    PACKAGES        each package's long description (its README, English) and each module's docstrings
                    (English); the license is the one the package's own metadata names (`package_license`);
                    test suites and folders of vendored third-party code skipped

A document is one module's docstrings, one module's source, one reference section or one README. A docstring
seen before (the same cleaned text, in another module) is dropped, so that no docstring is in two modules' prose.
Each document falls into train or held-out by a seeded hash of its group: a module's docstrings and its source
(which holds them too) are one group, so a held-out module is held out as prose and as code (`is_held_out`).
Each split is one stream of smollm2's token ids (uint16), every document followed by `<|endoftext|>`, written
with a JSON manifest naming every document's source, license, split, offset and tokens (`write_corpus`). The
same inputs give the same bytes.
"""

import ast
import hashlib
import json
import platform
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import numpy as np

from lab.data.stdlib_corpus import clean_docstring, docstrings_of, keep_docstring, stdlib_sources
from lab.files import atomic_write, atomic_write_text
from lab.outside_files import read_json_object

FORMAT = "forma-corpus/1"
STDLIB = "python-stdlib"
STDLIB_LICENSE = "PSF-2.0"  # the PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2 of the stdlib's LICENSE.txt
# Hand-written prose about numerical code: the packages' docstrings and READMEs (Forma depends on each; torch pulls
# networkx in). Their order is the order of de-duplication: a docstring seen in an earlier package is dropped later.
PACKAGES = ("numpy", "scipy", "pandas", "scikit-learn", "networkx", "torch")
# Folders of third-party code a package bundles under other licenses than its own: skipped
VENDORED_DIRS = frozenset({"_vendor", "vendor", "vendored", "externals", "third_party", "_thirdparty"})
VENDORED_DIRS |= {"array_api_compat", "array_api_extra", "_array_api_compat_vendor", "_pep440", "vendored_templates"}
SKIPPED_PACKAGE_DIRS = frozenset({"test", "tests", "testing", "__pycache__"}) | VENDORED_DIRS
ENGLISH, CODE = "english", "code"
SPLITS = ("train", "held_out")
SEPARATOR = "<|endoftext|>"  # after every document, as in SmolLM2's pretraining corpus
DTYPE = np.uint16  # smollm2's 49,152 ids fit
# Standard-library modules whose source is no code to read: the codecs' generated character tables, and the
# reference manual's text as a dict literal (in the corpus already, as English)
NOT_CODE = ("encodings/", "pydoc_data/")
MIN_CODE_CHARS = 200  # an empty __init__.py or a one-line re-export is no code to read
ENCODE_BATCH = 64  # documents encoded at once: Encoding objects are large, the ids are kept as arrays


@dataclass(frozen=True)
class Document:
    id: str  # unique: "numpy:docs:numpy/linalg/_linalg.py", "python-stdlib:code:json/decoder.py"
    group: str  # what the split hashes: "numpy:numpy/linalg/_linalg.py" (a module's prose and code together)
    source: str  # "python-stdlib" or a package's name
    version: str
    license: str
    kind: str  # ENGLISH or CODE
    text: str


def package_license(dist: metadata.Distribution) -> str:
    """The license a distribution's metadata names: its License-Expression (SPDX), else its OSI license
    classifiers, else a one-line License field. A ValueError when it names none (such a package is no source)."""
    meta = dist.metadata
    if meta.get("License-Expression"):
        return meta["License-Expression"].strip()
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License :: ")]
    if classifiers:
        return " OR ".join(classifiers)
    field = (meta.get("License") or "").strip()
    if field and "\n" not in field and len(field) <= 80:
        return field
    raise ValueError(f"{meta['Name']} {dist.version}: its metadata names no license; it cannot be a corpus source")


def _module_documents(
    source: str, version: str, license: str, relpath: str, data: bytes, code: bool
) -> Iterator[tuple[tuple[str, ...], Document]]:
    """(parts, document) for one module: its docstrings (the parts de-duplication weighs one by one; the document's
    text is joined from those kept), then its source (one part)."""
    try:
        tree = ast.parse(data)
        text = data.decode("utf-8")
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return  # e.g. lib2to3's test data written in Python 2
    group = f"{source}:{relpath}"
    docs = [doc for doc in map(clean_docstring, docstrings_of(tree)) if keep_docstring(doc)]
    if docs:
        yield tuple(docs), Document(f"{source}:docs:{relpath}", group, source, version, license, ENGLISH, "")
    if code and len(text.strip()) >= MIN_CODE_CHARS:
        yield (text,), Document(f"{source}:code:{relpath}", group, source, version, license, CODE, text)


def stdlib_documents(
    prefixes: tuple[str, ...] = ("",), reference: bool = True, code: bool = True
) -> Iterator[tuple[tuple[str, ...], Document]]:
    """(parts, document) of the standard library: modules whose path (relative to the stdlib, '/'-separated) starts
    with one of `prefixes` (their source too when `code`, but for NOT_CODE), then the reference manual's sections
    when `reference`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    version = platform.python_version()
    for path in stdlib_sources(root):
        relpath = path.relative_to(root).as_posix()
        if relpath.startswith(prefixes):
            data = path.read_bytes()
            yield from _module_documents(
                STDLIB, version, STDLIB_LICENSE, relpath, data, code and not relpath.startswith(NOT_CODE)
            )
    if reference:
        for name in sorted(topics):
            text = clean_docstring(topics[name])
            doc_id = f"{STDLIB}:reference:{name}"
            yield (text,), Document(doc_id, doc_id, STDLIB, version, STDLIB_LICENSE, ENGLISH, text)


def _package_modules(dist: metadata.Distribution) -> list[tuple[str, Path]]:
    """(path in the distribution, file) of its .py files in sorted order, test suites and vendored code skipped."""
    files = sorted(str(f) for f in dist.files or () if str(f).endswith(".py"))
    kept = [f for f in files if not SKIPPED_PACKAGE_DIRS.intersection(f.split("/")[:-1])]
    return [(f, Path(dist.locate_file(f))) for f in kept]


def package_documents(name: str) -> Iterator[tuple[tuple[str, ...], Document]]:
    """(parts, document) of an installed package: its long description (README), then its modules' docstrings."""
    dist = metadata.distribution(name)
    license = package_license(dist)
    readme = clean_docstring(dist.metadata.get_payload() or dist.metadata.get("Description") or "")
    if keep_docstring(readme):
        doc_id = f"{name}:readme"
        yield (readme,), Document(doc_id, doc_id, name, dist.version, license, ENGLISH, readme)
    for relpath, path in _package_modules(dist):
        yield from _module_documents(name, dist.version, license, relpath, path.read_bytes(), code=False)


def distinct(pairs: Iterable[tuple[tuple[str, ...], Document]]) -> list[Document]:
    """The documents with every part seen before dropped: a module's docstrings are re-joined from those not seen
    earlier (a docstring copied across modules is kept once); a source, a README or a section (one part) is dropped
    whole when its text was seen. The first occurrence wins, so the order of `pairs` decides."""
    seen: set[str] = set()
    documents = []
    for parts, doc in pairs:
        fresh = []
        for part in parts:
            if part not in seen:
                seen.add(part)
                fresh.append(part)
        text = "\n\n".join(fresh)
        if keep_docstring(text) or (doc.kind == CODE and text):
            documents.append(Document(**{**doc.__dict__, "text": text}))
    return documents


def collect_documents(
    packages: tuple[str, ...] = PACKAGES, stdlib_prefixes: tuple[str, ...] = ("",), reference: bool = True
) -> list[Document]:
    """The corpus's documents in a fixed order (the standard library, then each package in order), de-duplicated.
    A slice for tests: fewer packages, stdlib modules under some prefixes only (`()`: none), no reference."""

    def pairs() -> Iterator[tuple[tuple[str, ...], Document]]:
        if stdlib_prefixes or reference:
            yield from stdlib_documents(stdlib_prefixes, reference)
        for name in packages:
            yield from package_documents(name)

    return distinct(pairs())


def is_held_out(group: str, seed: int, fraction: float) -> bool:
    """A stable coin per document group: the first 8 bytes of BLAKE2b("seed:group") as a uniform number in [0, 1),
    below `fraction`. A document's side depends on its group and the seed alone, never on its position."""
    digest = hashlib.blake2b(f"{seed}:{group}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def encode_documents(documents: list[Document], tokenizer: Any) -> list[np.ndarray]:
    """Each document's token ids (no special tokens added) followed by SEPARATOR's id, as DTYPE arrays."""
    separator = tokenizer.token_to_id(SEPARATOR)
    if separator is None:
        raise ValueError(f"the tokenizer has no {SEPARATOR} token to end each document with")
    if tokenizer.get_vocab_size() > np.iinfo(DTYPE).max + 1:
        raise ValueError(f"the tokenizer's {tokenizer.get_vocab_size():,} ids do not fit {np.dtype(DTYPE).name}")
    arrays = []
    for start in range(0, len(documents), ENCODE_BATCH):
        batch = [doc.text for doc in documents[start : start + ENCODE_BATCH]]
        for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
            arrays.append(np.array([*encoding.ids, separator], dtype=DTYPE))
    return arrays


def _sources(documents: list[Document], rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per source: its version, license, and its documents and tokens (each kind)."""
    sources: dict[str, dict[str, Any]] = {}
    for doc, row in zip(documents, rows):
        fresh = {"version": doc.version, "license": doc.license, "documents": 0, "english_tokens": 0, "code_tokens": 0}
        entry = sources.setdefault(doc.source, fresh)
        entry["documents"] += 1
        entry[f"{doc.kind}_tokens"] += row["tokens"]
    return sources


def _split_totals(rows: list[dict[str, Any]], split: str) -> dict[str, Any]:
    mine = [row for row in rows if row["split"] == split]
    totals = {"file": f"{split}.npy", "documents": len(mine), "tokens": sum(row["tokens"] for row in mine)}
    for kind in (ENGLISH, CODE):
        totals[f"{kind}_tokens"] = sum(row["tokens"] for row in mine if row["kind"] == kind)
    return totals


def corpus_manifest(
    documents: list[Document], arrays: list[np.ndarray], seed: int, fraction: float, tokenizer_info: dict[str, Any]
) -> dict[str, Any]:
    """The manifest: how the corpus was made, totals per split and per source, and one row per document (its id,
    group, source, license, kind, split, offset in its split's file and tokens, the separator included)."""
    offsets = dict.fromkeys(SPLITS, 0)
    rows = []
    for doc, ids in zip(documents, arrays):
        split = "held_out" if is_held_out(doc.group, seed, fraction) else "train"
        rows.append(
            {
                "id": doc.id,
                "group": doc.group,
                "source": doc.source,
                "license": doc.license,
                "kind": doc.kind,
                "split": split,
                "offset": offsets[split],
                "tokens": len(ids),
            }
        )
        offsets[split] += len(ids)
    return {
        "format": FORMAT,
        "tokenizer": tokenizer_info,
        "dtype": np.dtype(DTYPE).name,
        "separator": SEPARATOR,
        "seed": seed,
        "held_out_fraction": fraction,
        "splits": {split: _split_totals(rows, split) for split in SPLITS},
        "sources": _sources(documents, rows),
        "documents": rows,
    }


def write_corpus(
    out: str | Path,
    documents: list[Document],
    tokenizer: Any,
    *,
    seed: int = 0,
    fraction: float = 0.05,
    tokenizer_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokenize `documents`, split them by group (`is_held_out`) and write out/train.npy, out/held_out.npy (one
    stream of ids each) and out/manifest.json, each atomically. Returns the manifest."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the held-out fraction must be between 0 and 1, got {fraction}")
    arrays = encode_documents(documents, tokenizer)
    manifest = corpus_manifest(documents, arrays, seed, fraction, tokenizer_info or {})
    out = Path(out)
    for split in SPLITS:
        ids = [a for a, row in zip(arrays, manifest["documents"]) if row["split"] == split]
        stream = np.concatenate(ids) if ids else np.zeros(0, dtype=DTYPE)
        atomic_write(out / f"{split}.npy", lambda tmp, stream=stream: np.save(tmp, stream), size=stream.nbytes)
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest


def summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest without its rows, with the corpus's totals: what docs/measured records."""
    kept = {key: value for key, value in manifest.items() if key != "documents"}
    splits = manifest["splits"].values()
    for field in ("documents", "tokens", f"{ENGLISH}_tokens", f"{CODE}_tokens"):
        kept[field] = sum(split[field] for split in splits)
    kept["code_share"] = kept[f"{CODE}_tokens"] / kept["tokens"] if kept["tokens"] else 0.0
    return kept


def check_corpus(folder: str | Path) -> Path:
    """`folder` as a corpus `write_corpus` wrote (its manifest.json of FORMAT, and each split's stream readable), or
    a ValueError in one line saying what it lacks."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder: give the folder `forma corpus real --out DIR` wrote")
    path = folder / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{folder} holds no manifest.json: not a corpus `forma corpus real --out DIR` wrote")
    manifest = read_json_object(path, folder, what="corpus manifest")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} manifest: not a corpus `forma corpus real --out DIR` wrote")
    for split in SPLITS:
        if not (folder / f"{split}.npy").is_file():
            raise ValueError(f"{folder} holds no {split}.npy: an unfinished corpus; write it again")
        read_split(folder, split)
    return folder


def read_split(folder: str | Path, split: str) -> np.ndarray:
    """One split's token stream, memory-mapped (never unpickled); a ValueError for a file of another shape or dtype."""
    if split not in SPLITS:
        raise ValueError(f"no split {split!r}: {', '.join(SPLITS)}")
    path = Path(folder) / f"{split}.npy"
    stream = np.load(path, mmap_mode="r", allow_pickle=False)
    if stream.dtype != DTYPE or stream.ndim != 1:
        raise ValueError(f"{path} holds {stream.dtype} {list(stream.shape)}, not one {np.dtype(DTYPE).name} stream")
    return stream
