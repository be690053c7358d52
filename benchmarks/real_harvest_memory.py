"""`forma harvest smollm2` holds memory flat as the corpus grows: the same command over a text corpus and over one
4× as long, each in a fresh process, run as a user runs it (lab.cli.parser.main), with the harvest's own peak measured.

The model's load peaks above anything a harvest does (the folder's weights are read, then converted), so the
process's high-water mark alone would report the load. Each child therefore wraps the harvest the command calls:
just before it, freed memory is handed back and the resident high-water mark reset (benchmarks.harvest.reset_peak);
just after, the mark is read (VmHWM), less the resident set just before. Both figures — the harvest's peak above the
loaded model, and the whole process's ru_maxrss — are written, with the tokens, rows, shards and seconds.

Flat means: the long corpus's harvest peak exceeds the short one's by less than GROWTH_BOUND_BYTES, whereas keeping
the rows in memory would add (4 − 1) × the short corpus's activation bytes (written beside the figures).

    python -m benchmarks.real_harvest_memory [--tokens 4096] [--hook blocks.0.hook_resid_post]

Writes benchmarks/results/real_harvest_memory.json.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from pydoc_data.topics import topics

from benchmarks.timing import machine, write

HOOK = "blocks.0.hook_resid_post"
SEQ_LEN = 128
BATCH = 8
SHARD_MB = 4.0
GROWTH_BOUND_BYTES = 16 * 2**20  # 4 × SHARD_MB: a harvest holds one shard's rows and a batch, whatever the corpus
REPO = Path(__file__).resolve().parents[1]


def corpus_text(characters: int) -> str:
    """Real English (the reference manual's sections pydoc ships), repeated to `characters` characters."""
    text = "\n\n".join(topics[key] for key in sorted(topics))
    return (text * (characters // len(text) + 1))[:characters]


def child(argv: list[str], result: str) -> None:
    """In this process: `forma` argv, its harvest's peak above the resident set just before it into `result`."""
    import lab.analysis.activations.harvest as harvest_module
    from benchmarks.activations import rss
    from benchmarks.harvest import peak_rss, reset_peak
    from lab.cli.parser import main

    real = harvest_module.harvest
    figures: dict = {}

    def measured(*args, **kwargs):
        reset_peak()
        before, start = rss(), time.perf_counter()
        store = real(*args, **kwargs)
        figures.update(
            harvest_peak_bytes=peak_rss() - before,
            model_rss_bytes=before,
            seconds=time.perf_counter() - start,
            rows=len(store),
            shards=len(store.index["shards"]),
        )
        return store

    harvest_module.harvest = measured
    code = main(argv)
    figures["process_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    figures["exit_code"] = code
    Path(result).write_text(json.dumps(figures))


def measure(tokens: int, hook: str = HOOK, model: str = "smollm2") -> dict:
    """`forma harvest MODEL --hook HOOK` over the first `tokens` tokens of a text corpus, in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="forma-real-harvest-") as tmp:
        corpus, result, out = Path(tmp) / "corpus.txt", Path(tmp) / "result.json", Path(tmp) / "acts"
        corpus.write_text(corpus_text(8 * tokens), encoding="utf-8")  # ≥ 1 token in 8 characters of English
        argv = ["harvest", model, "--hook", hook, "--corpus", str(corpus), "--tokens", str(tokens)]
        argv += ["--seq-len", str(SEQ_LEN), "--batch-size", str(BATCH), "--shard-mb", str(SHARD_MB)]
        argv += ["--out", str(out), "--no-progress"]
        code = f"from benchmarks.real_harvest_memory import child; child({argv!r}, {str(result)!r})"
        env = os.environ | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"forma {' '.join(argv)} failed:\n{done.stderr[-4000:]}")
        figures = json.loads(result.read_text())
        figures["bytes_written"] = sum(f.stat().st_size for f in out.rglob("*.safetensors"))
    return figures | {"tokens": tokens}


def compare(tokens: int, hook: str = HOOK) -> dict:
    """The short corpus and the one 4× as long; the growth of the harvest's peak between them."""
    short, long = measure(tokens, hook), measure(4 * tokens, hook)
    growth = long["harvest_peak_bytes"] - short["harvest_peak_bytes"]
    return {
        "hook": hook,
        "short": short,
        "long": long,
        "harvest_peak_growth_bytes": growth,
        "rows_in_memory_would_add_bytes": long["bytes_written"] - short["bytes_written"],
        "growth_bound_bytes": GROWTH_BOUND_BYTES,
        "flat": growth < GROWTH_BOUND_BYTES,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="the short corpus's tokens (the long: 4×)")
    parser.add_argument("--hook", default=HOOK)
    args = parser.parse_args()
    payload = compare(args.tokens, args.hook) | {"machine": machine()}
    path = write("real_harvest_memory", payload)
    mb = 2**20
    print(
        f"harvest peak above the loaded model: {payload['short']['harvest_peak_bytes'] / mb:.1f} MB for "
        f"{payload['short']['tokens']:,} tokens, {payload['long']['harvest_peak_bytes'] / mb:.1f} MB for "
        f"{payload['long']['tokens']:,} (rows held in memory would add "
        f"{payload['rows_in_memory_would_add_bytes'] / mb:.1f} MB); wrote {path}"
    )


if __name__ == "__main__":
    main()
