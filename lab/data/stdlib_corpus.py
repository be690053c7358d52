"""Real English on every machine: the Python standard library's own documentation, and a BPE for it.

The corpus is the docstrings of every module, class and function in the standard library (the
running interpreter's `sysconfig.get_paths()["stdlib"]`, test suites and IDLE skipped), followed by
the Python reference-manual sections shipped with it in `pydoc_data.topics`. No download, the same
bytes on every machine with the same Python version. (On CPython 3.11 the docstrings alone come to
about 1.6 MB; the reference topics add about 0.5 MB.)

The tokenizer is byte-level BPE (Sennrich et al. 2016, in GPT-2's byte-level form, Radford et al.
2019): start from the 256 bytes and repeatedly merge the most frequent adjacent pair until the
vocabulary reaches `vocab_size`. Byte level means every string round-trips exactly.
"""

import ast
import hashlib
import inspect
import os
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from pydoc_data.topics import topics  # the reference manual's sections, shipped with the standard library

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

DOC_SEPARATOR = "\n\n\n"  # two blank lines between documents; none occurs inside one (collapsed)
END_OF_TEXT = "<|endoftext|>"
MIN_DOC_CHARS = 40
MIN_ASCII_SHARE = 0.98  # "mostly ASCII": at most 2% of a document's characters outside ASCII
SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "__pycache__"})

_STATEMENT_FIELDS = ("body", "handlers", "orelse", "finalbody", "cases")
_BLANK_RUNS = re.compile(r"\n[ \t]*(\n[ \t]*)+\n")


def stdlib_sources(root: Path) -> Iterator[Path]:
    """`.py` files under the stdlib root in sorted order, skipping test suites, IDLE, site-packages."""
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory) / name


def docstrings_of(tree: ast.Module) -> Iterator[str]:
    """Docstrings of the module and every class/function in it, in source order.

    Recurses through statement blocks only (bodies, else/finally blocks, except handlers and match
    cases), never into expressions, which is where almost all of a syntax tree's nodes are.
    """
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield docstring
        children: list[ast.AST] = []
        for field in _STATEMENT_FIELDS:
            children.extend(getattr(node, field, ()))
        stack.extend(reversed(children))


def clean_docstring(doc: str) -> str:
    """inspect.cleandoc, then runs of blank lines collapsed to one so DOC_SEPARATOR stays unique."""
    return _BLANK_RUNS.sub("\n\n", inspect.cleandoc(doc)).strip()


def keep_docstring(doc: str) -> bool:
    """Long enough (MIN_DOC_CHARS) and mostly ASCII (MIN_ASCII_SHARE): English prose, not a table of symbols."""
    if len(doc) < MIN_DOC_CHARS:
        return False
    ascii_chars = len(doc.encode("ascii", errors="ignore"))
    return ascii_chars >= MIN_ASCII_SHARE * len(doc)


def _reference_topics() -> list[str]:
    """The reference-manual sections of `pydoc_data.topics`, sorted by topic name."""
    return [topics[key] for key in sorted(topics)]


def collect_documents(include_reference_topics: bool = True) -> list[str]:
    """The cleaned, exactly de-duplicated documents in deterministic order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    raw: list[str] = []
    for path in stdlib_sources(root):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue  # e.g. lib2to3 test data written in Python 2
        raw.extend(docstrings_of(tree))
    if include_reference_topics:
        raw.extend(_reference_topics())
    documents: dict[str, None] = {}  # ordered set: first occurrence wins
    for doc in raw:
        cleaned = clean_docstring(doc)
        if keep_docstring(cleaned):
            documents.setdefault(cleaned, None)
    return list(documents)


def stdlib_docstrings(
    min_bytes: int = 2_000_000, cache: Path | str | None = None, include_reference_topics: bool = True
) -> str:
    """The corpus as one string, documents joined by DOC_SEPARATOR.

    With `cache`, a file there is read instead of recomputing (name it after the Python version if
    several interpreters share it); otherwise the result is written there. Raises RuntimeError when
    the corpus is shorter than `min_bytes` UTF-8 bytes.
    """
    cache_path = Path(cache) if cache is not None else None
    if cache_path is not None and cache_path.is_file():
        text = cache_path.read_text(encoding="utf-8")
    else:
        text = DOC_SEPARATOR.join(collect_documents(include_reference_topics))
    size = len(text.encode("utf-8"))
    if size < min_bytes:
        raise RuntimeError(
            f"stdlib_docstrings: only {size:,} bytes of documentation under "
            f"{sysconfig.get_paths()['stdlib']} (needed {min_bytes:,}); lower "
            f"min_bytes or use a Python with a fuller standard library"
        )
    if cache_path is not None and not cache_path.is_file():
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        partial = cache_path.with_name(cache_path.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(cache_path)  # atomic: a reader never sees half a cache
    return text


def split_documents(text: str) -> list[str]:
    return [doc for doc in text.split(DOC_SEPARATOR) if doc]


def _held_out(doc: str, fraction: float) -> bool:
    """Stable per-document coin: the first 8 bytes of BLAKE2b(doc) as a uniform number in [0, 1)."""
    digest = hashlib.blake2b(doc.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def split_text(text: str, held_out_fraction: float = 0.05) -> tuple[str, str]:
    """(train, held_out) by whole documents. A document's side depends only on its own bytes, so the
    split is deterministic and stays put when other documents are added or removed."""
    if not 0.0 <= held_out_fraction <= 1.0:
        raise ValueError(f"held_out_fraction must be in [0, 1], got {held_out_fraction}")
    train, held_out = [], []
    for doc in split_documents(text):
        (held_out if _held_out(doc, held_out_fraction) else train).append(doc)
    return DOC_SEPARATOR.join(train), DOC_SEPARATOR.join(held_out)


def train_bpe(text: str, vocab_size: int = 4096, path: Path | str | None = None) -> Tokenizer:
    """Byte-level BPE trained on `text` (one training sequence per document), saved to `path` as
    tokenizer.json when given (a directory gets `path/tokenizer.json`)."""
    if vocab_size < 257:
        raise ValueError(f"vocab_size must be at least 257 (256 bytes + {END_OF_TEXT}), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(split_documents(text), trainer=trainer)
    if path is not None:
        target = Path(path)
        if target.is_dir() or target.suffix != ".json":
            target = target / "tokenizer.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(target))
    return tokenizer
