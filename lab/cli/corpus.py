"""`forma corpus real`: the corpus of real English and code (lab.data.real_corpus), tokenized for smollm2."""

import argparse
import hashlib
import json
import time
from pathlib import Path

CORPORA = ("real",)
TOKENIZER_MODEL = "smollm2"  # the zoo's real model: its tokenizer.json, written by `forma build smollm2`
DEFAULT_HELD_OUT = 0.05
ENTRIES = ["train.npy", "held_out.npy", "manifest.json"]


def smollm2_tokenizer() -> tuple[object, dict]:
    """smollm2's tokenizer (a FileNotFoundError naming `forma build smollm2` when it is not built) and what the
    manifest records of it: the model, the file's SHA-256 and the vocabulary's size."""
    from lab.folders import zoo_model_dir
    from lab.model.checkpoint import TOKENIZER_FILE, read_tokenizer
    from lab.outside_files import read_bytes

    folder = zoo_model_dir(TOKENIZER_MODEL)
    path = folder / TOKENIZER_FILE
    tokenizer = read_tokenizer(path, folder)
    digest = hashlib.sha256(read_bytes(path, folder, what="tokenizer")).hexdigest()
    return tokenizer, {"model": TOKENIZER_MODEL, "sha256": digest, "vocab_size": tokenizer.get_vocab_size()}


def digests(out: Path) -> dict[str, str]:
    """The SHA-256 of each file the corpus writes into `out`."""
    from lab.outside_files import read_bytes

    return {entry: hashlib.sha256(read_bytes(out / entry, out)).hexdigest() for entry in ENTRIES}


def measured_path(name: str) -> Path:
    from lab.measured import MEASURED_DIR, REPO

    return REPO / MEASURED_DIR / "corpus" / f"{name}.json"


def check_record(out: Path, name: str) -> list[str]:
    """The files in `out` whose bytes differ from the recorded corpus's (docs/measured/corpus/NAME.json)."""
    from lab.outside_files import read_json_object

    record = read_json_object(measured_path(name), what="corpus record")
    return [entry for entry, digest in digests(out).items() if record.get("sha256", {}).get(entry) != digest]


def record_measured(out: Path, summary: dict, name: str, seconds: float, cpu_seconds: float) -> Path:
    """docs/measured/corpus/NAME.json: the corpus's summary, its files' SHA-256 (another machine's build can be
    compared byte for byte) and the seconds its build took (wall and CPU: on a shared machine the wall time says
    more of the neighbours than of the build); docs/corpus.md's numbers are rewritten from it."""
    from lab.files import atomic_write_text
    from lab.measured import REPO, rewrite_document

    target = measured_path(name)
    summary = {**summary, "sha256": digests(out)}
    atomic_write_text(
        target,
        json.dumps(
            {**summary, "build_seconds": round(seconds, 1), "build_cpu_seconds": round(cpu_seconds, 1)}, indent=2
        )
        + "\n",
    )
    rewrite_document(REPO / "docs" / "corpus.md", REPO)
    return target


def cmd_corpus(args: argparse.Namespace) -> int:
    """Build the real corpus into DIR: the Python standard library's docstrings, reference manual and source
    (PSF-2.0) and the docstrings and READMEs of numpy, scipy, pandas, scikit-learn, networkx and torch (each under
    the license its metadata names), at the versions installed (constraints.txt pins them), tokenized by smollm2's
    tokenizer (`forma build smollm2` first). Writes DIR/train.npy and DIR/held_out.npy (uint16 token streams, each
    document followed by <|endoftext|>) and DIR/manifest.json (every document's source, license, split, offset
    and tokens). Documents are held out by a seeded hash of their module, never by position; the same inputs
    write the same bytes. --record also writes the totals and the files' SHA-256 to docs/measured/corpus/NAME.json;
    --check compares the files with that record instead (exit 1 when any differs). docs/corpus.md names the
    sources and licenses."""
    from lab.data.real_corpus import collect_documents, summary, write_corpus
    from lab.files import claim_folder, folder_lock

    if (args.record or args.check) and (args.seed, args.held_out) != (0, DEFAULT_HELD_OUT):
        flag = "--record" if args.record else "--check"
        raise ValueError(f"{flag} is for the default corpus: --seed 0 and --held-out {DEFAULT_HELD_OUT}")
    tokenizer, info = smollm2_tokenizer()
    out = Path(args.out)
    claim_folder(out, "corpus", ENTRIES, overwrite=args.overwrite)
    start, cpu_start = time.perf_counter(), time.process_time()
    with folder_lock(out, "corpus"):
        documents = collect_documents()
        manifest = write_corpus(out, documents, tokenizer, seed=args.seed, fraction=args.held_out, tokenizer_info=info)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    totals = summary(manifest)
    train, held_out = manifest["splits"]["train"], manifest["splits"]["held_out"]
    print(
        f"wrote {totals['tokens']:,} tokens of {totals['documents']:,} documents to {out} in {seconds:.0f} s: "
        f"train {train['tokens']:,}, held-out {held_out['tokens']:,}; code {totals['code_share']:.1%}"
    )
    if args.record:
        print(f"recorded {record_measured(out, totals, args.name, seconds, cpu_seconds)}")
    if args.check:
        differ = check_record(out, args.name)
        print(
            f"{out}: "
            + (
                f"differs from {measured_path(args.name)} in {', '.join(differ)}"
                if differ
                else f"the same bytes as {measured_path(args.name)}"
            )
        )
        return 1 if differ else 0
    return 0
