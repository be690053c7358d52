"""`forma harvest` and `forma patch` under hostile and ordinary inputs, in process: an --out holding a file of the
user's is refused and left as it was (Forma's manifest, .forma-folder.json, lists what it wrote); a second writer
is refused while the first holds the folder's lock, a stale lock is taken over; nothing is cut silently (a text
corpus harvested whole, what is left over reported; a prompt longer than the context refused naming its line);
every refusal one line and exit 2 (a FIFO corpus, a .npy corpus of ids outside the vocabulary, a CSV cell past
the csv module's limit, a shard size past what memory holds, a part file that is not safetensors, a hook name
mistyped) — and a refused command never blocks the corrected one; a run killed after its last file landed is
tidied by the same command again, which says the folder is complete."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lab import HookedTransformer
from lab.cli.parser import main
from lab.data.tokenizers import word_level
from lab.files import LOCK_FILE, OWNER_FILE, folder_lock
from tests.builders import one_error_line, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["Mary", "John", "Alice", "Bob", "When", "and", "went", "to", "the", "store", ",", "gave", "a", "drink"]
HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny saved model with a word-level tokenizer and a context of 16 tokens."""
    tokenizer = word_level(WORDS)
    model = HookedTransformer(tiny_config(d_vocab=tokenizer.get_vocab_size(), n_ctx=16), seed=0, tokenizer=tokenizer)
    return model.save(tmp_path_factory.mktemp("model") / "tiny")


def pair(start: str = "When ") -> dict[str, str]:
    return {
        "clean": f"{start}Mary and John went to the store , John gave a drink to",
        "corrupted": f"{start}Mary and John went to the store , Bob gave a drink to",
        "answer": "Mary",
        "wrong": "John",
    }


def write_pairs(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def harvest(model_dir: Path, corpus: Path, out: Path, *more: str) -> list[str]:
    return ["harvest", str(model_dir), "--hook", HOOK, "--corpus", str(corpus), "--out", str(out), "--no-progress"] + [
        *more
    ]


def patch(model_dir: Path, pairs: Path, out: Path, *more: str) -> list[str]:
    return ["patch", str(model_dir), "--pairs", str(pairs), "--sweep", "head", "--out", str(out), "--no-progress"] + [
        *more
    ]


def text_corpus(tmp_path: Path, words: int = 90) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(WORDS[i % len(WORDS)] for i in range(words)))
    return path


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2, argv
    return one_error_line(capsys.readouterr().err, argv[0])


# --------------------------------------------------------------------------------------------
# Nothing of the user's is touched
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["harvest", "patch"])
def test_an_out_holding_a_users_files_is_refused_and_left_as_it_was(tmp_path, model_dir, capsys, command):
    """A folder `part-old/` and a file `.notes.tmp` (the names of what Forma writes, and of its temporaries) that
    Forma did not write: refused in one line without --overwrite; with it, written beside them, never removed."""
    out = tmp_path / "out"
    (out / "part-old").mkdir(parents=True)
    (out / "part-old" / "f").write_text("x")
    (out / ".notes.tmp").write_text("mine")
    (out / "parts").mkdir()
    (out / "parts" / "keep.txt").write_text("mine too")
    users = tree(out)
    argv = (
        harvest(model_dir, text_corpus(tmp_path), out)
        if command == "harvest"
        else patch(model_dir, write_pairs(tmp_path / "pairs.jsonl", [pair()]), out)
    )
    line = refused(argv, capsys)
    assert "which Forma did not write there" in line and "--overwrite" in line, line
    assert tree(out) == users and not (out / OWNER_FILE).exists()
    if command == "harvest":  # `parts` is a name a sweep writes, not a harvest: the harvest may go beside it
        assert main(argv + ["--overwrite"]) == 0
    else:  # a sweep writes parts/: a user's folder of that name is its, once --overwrite says so
        assert main(argv + ["--overwrite"]) == 0
    capsys.readouterr()
    assert {k: v for k, v in tree(out).items() if k in users} == users
    assert not (out / LOCK_FILE).exists()
    assert "which Forma did not write there" in refused(argv, capsys)  # still the user's, still refused


def test_forma_s_own_folder_resumes_and_is_not_a_users(tmp_path, model_dir, capsys):
    """A harvest's folder is refused to a patching sweep (its manifest says whose it is), and rerun as a harvest it
    is complete; a manifest Forma cannot read is refused, not overwritten."""
    out = tmp_path / "out"
    corpus = text_corpus(tmp_path)
    assert main(harvest(model_dir, corpus, out)) == 0
    capsys.readouterr()
    assert "already holds a complete harvest" in refused(harvest(model_dir, corpus, out), capsys)
    line = refused(patch(model_dir, write_pairs(tmp_path / "pairs.jsonl", [pair()]), out), capsys)
    assert "holds a harvest" in line and "not a patching sweep" in line, line
    (out / OWNER_FILE).write_text("{")
    before = tree(out)
    assert "cannot be read" in refused(harvest(model_dir, corpus, out, "--overwrite"), capsys)
    assert tree(out) == before


def test_a_second_writer_is_refused_while_the_lock_is_held_and_a_stale_one_is_taken(tmp_path, model_dir, capsys):
    out, corpus = tmp_path / "out", text_corpus(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        out.mkdir()
        (out / LOCK_FILE).write_text(json.dumps({"pid": holder.pid, "host": os.uname().nodename}))
        line = refused(harvest(model_dir, corpus, out), capsys)
        assert f"being written by another harvest (pid {holder.pid} on" in line, line
    finally:
        holder.kill()
        holder.wait()
    assert main(harvest(model_dir, corpus, out)) == 0  # its holder has ended: stale, taken over
    assert not (out / LOCK_FILE).exists()
    with folder_lock(tmp_path / "sweep", "patching sweep"):  # held by this process: a second writer waits
        with pytest.raises(ValueError, match=f"pid {os.getpid()}"):
            with folder_lock(tmp_path / "sweep", "patching sweep"):
                pass
    assert not (tmp_path / "sweep" / LOCK_FILE).exists()


@pytest.mark.parametrize("command", ["harvest", "patch"])
def test_a_run_killed_after_its_last_file_landed_is_tidied_by_the_rerun_which_says_it_is_complete(
    tmp_path, model_dir, capsys, command
):
    """Killed after index.json or sweep.json landed but before its tidying: a write's temporary folder and the dead
    writer's lock are left. The same command again takes the stale lock, removes what its manifest lists as
    killed writes', and says in one line that the folder is complete: the folder is then the uninterrupted run's."""
    out = tmp_path / "out"
    argv = (
        harvest(model_dir, text_corpus(tmp_path), out)
        if command == "harvest"
        else patch(model_dir, write_pairs(tmp_path / "pairs.jsonl", [pair(), pair("")]), out)
    )
    assert main(argv) == 0
    capsys.readouterr()
    whole = tree(out)
    last = "index.json" if command == "harvest" else "sweep.json"
    (out / f".{last}.k3j9x2.tmp").mkdir()
    (out / f".{last}.k3j9x2.tmp" / last).write_text('{"half')
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / LOCK_FILE).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    assert f"already holds a complete {'harvest' if command == 'harvest' else 'sweep'}" in refused(argv, capsys)
    assert tree(out) == whole and sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [OWNER_FILE]


# --------------------------------------------------------------------------------------------
# Nothing cut silently
# --------------------------------------------------------------------------------------------
def test_a_text_corpus_is_harvested_whole_and_what_is_left_over_is_said(tmp_path, model_dir, capsys):
    """90 words in a context of 16: five sequences of 16 (not one cut to the context), 10 tokens left over."""
    assert main(harvest(model_dir, text_corpus(tmp_path), tmp_path / "out")) == 0
    said = capsys.readouterr().out
    assert "from 5 sequences of 16 tokens" in said and "10 tokens left over, fewer than a sequence" in said, said
    assert main(harvest(model_dir, text_corpus(tmp_path, 96), tmp_path / "whole", "--seq-len", "8")) == 0
    assert "left over" not in capsys.readouterr().out


def test_a_prompt_longer_than_the_context_is_refused_naming_its_line(tmp_path, model_dir, capsys):
    """Cut to the context, the clean and the corrupted prompt of a long pair would be the same prompt."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", [pair(), pair("When " * 4)])
    line = refused(patch(model_dir, pairs, tmp_path / "out"), capsys)
    assert "pairs.jsonl:2: the clean prompt is 17 tokens, more than the model's context n_ctx = 16" in line, line
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------
# One line and exit 2, and the corrected command runs
# --------------------------------------------------------------------------------------------
def test_a_fifo_named_as_the_corpus_is_refused_at_once(tmp_path, model_dir, capsys):
    os.mkfifo(tmp_path / "corpus.npy")
    line = refused(harvest(model_dir, tmp_path / "corpus.npy", tmp_path / "out"), capsys)
    assert "is a FIFO (named pipe), not a regular file" in line, line


@pytest.mark.parametrize(
    "ids, said",
    [
        ([[3, 4, 5, 6]] * 2 + [[3, 4, 99, 6]], "token id 99 is out of range: ids must lie in [0, d_vocab) = [0, 18)"),
        ([3, 4, -1, 6] * 8, "token id -1 is out of range"),
        ([[3] * 20] * 2, "holds sequences of 20 tokens; the model reads 1 … 16"),
        (None, "not a .npy array of token ids"),  # an empty file
    ],
)
def test_a_npy_corpus_outside_the_vocabulary_or_the_context_is_refused_naming_it_before_anything_is_written(
    tmp_path, model_dir, capsys, ids, said
):
    """Token ids the model would refuse only mid-harvest (naming no file), sequences wider than the context, an
    empty file: one line naming the corpus, and nothing written."""
    import numpy as np

    corpus = tmp_path / "corpus.npy"
    if ids is None:
        corpus.write_bytes(b"")
    else:
        np.save(corpus, np.array(ids, dtype=np.int64))
    line = refused(harvest(model_dir, corpus, tmp_path / "out"), capsys)
    assert str(corpus) in line and said in line, line
    assert not (tmp_path / "out").exists()


def test_a_csv_cell_past_the_csv_modules_limit_is_one_line(tmp_path, model_dir, capsys):
    rows = [pair(), pair() | {"clean": "Mary " * 30_000}]
    text = "clean,corrupted,answer,wrong\n" + "".join(",".join(r.values()) + "\n" for r in rows)
    (tmp_path / "pairs.csv").write_text(text)
    line = refused(patch(model_dir, tmp_path / "pairs.csv", tmp_path / "out"), capsys)
    assert "pairs.csv, line 3: a cell is longer than the 131,072 characters" in line, line


def test_a_shard_size_past_memory_or_a_mistyped_hook_is_refused_before_anything_is_written(tmp_path, model_dir, capsys):
    out, corpus = tmp_path / "out", text_corpus(tmp_path)
    line = refused(harvest(model_dir, corpus, out, "--shard-mb", "1e12"), capsys)
    assert "the shard size must be a number of MB > 0 and at most 4,096" in line, line
    argv = harvest(model_dir, corpus, out)
    argv[argv.index(HOOK)] = "blocks.0.hook_resid_pots"
    assert "blocks.0.hook_resid_pots" in refused(argv, capsys)
    assert not out.exists() or tree(out) == {}
    assert main(harvest(model_dir, corpus, out)) == 0  # the corrected command is not blocked by a plan


def test_a_part_file_that_is_not_safetensors_is_one_line(tmp_path, model_dir, capsys):
    out, pairs = tmp_path / "out", write_pairs(tmp_path / "pairs.jsonl", [pair(), pair("")])
    assert main(patch(model_dir, pairs, out)) == 0
    (out / "sweep.json").unlink()
    (out / "parts" / "part-00000.safetensors").write_text("not safetensors")
    line = refused(patch(model_dir, pairs, out), capsys)
    assert "part-00000.safetensors is not a part of this sweep" in line and "--overwrite" in line, line
    assert main(patch(model_dir, pairs, out, "--overwrite")) == 0


@pytest.mark.parametrize("command", ["harvest", "patch"])
def test_a_full_disk_is_one_line_saying_what_was_needed_and_where_and_the_rerun_continues(
    tmp_path, model_dir, capsys, monkeypatch, command
):
    """safetensors reports a full disk with its own error (not an OSError): one line naming the file, the bytes
    it needed and those free; the same command, once there is room, finishes."""
    from safetensors import SafetensorError

    import lab.analysis.activations.store as store
    import lab.analysis.sweeps as sweeps

    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 10)
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, message: "No space left on device" })')

    monkeypatch.setattr(store if command == "harvest" else sweeps, "save_file", full)
    out = tmp_path / "out"
    argv = (
        harvest(model_dir, text_corpus(tmp_path), out)
        if command == "harvest"
        else patch(model_dir, write_pairs(tmp_path / "pairs.jsonl", [pair()]), out)
    )
    line = refused(argv, capsys)
    assert "No space left on device: writing it needs " in line and " free there" in line, line
    assert ".safetensors" in line and str(out) in line, line
    monkeypatch.undo()
    assert main(argv) == 0


# --------------------------------------------------------------------------------------------
# Clean leftovers: what a write killed inside safetensors leaves is removed by the next run, and nothing else
# --------------------------------------------------------------------------------------------
KILLED_WRITE = """
import resource, signal, sys
import torch
from safetensors.torch import save_file
from lab.files import atomic_write
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # (Python ignores it, and a write past the limit fails instead)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))  # past 64 KiB a write is killed (SIGXFSZ)
atomic_write(sys.argv[1], lambda path: save_file({"x": torch.zeros(1 << 18)}, str(path)))
"""


def killed_write(target: Path) -> Path:
    """Kill a process while safetensors writes `target` through atomic_write (SIGXFSZ at 64 KiB of 1 MiB: no
    handler runs, as with kill -9) and return what it left: Forma's temporary folder beside `target`, holding
    safetensors' own `.tmpXXXXXX` half-written."""
    before = set(target.parent.iterdir()) if target.parent.is_dir() else set()
    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(target)], env=env, capture_output=True)
    assert done.returncode == -signal.SIGXFSZ, done.stderr.decode()[-2000:]
    (left,) = set(target.parent.iterdir()) - before
    assert left.name.startswith(f".{target.name}.") and left.name.endswith(".tmp") and left.is_dir(), left
    (inside,) = left.iterdir()
    assert inside.name.startswith(".tmp") and inside.stat().st_size <= 1 << 16, inside  # safetensors' own, cut short
    return left


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*") if p.name.endswith(".tmp") or p.name.startswith(".tmp")]


@pytest.mark.parametrize("command", ["harvest", "patch"])
def test_a_write_killed_inside_safetensors_is_cleaned_by_the_rerun_and_a_users_file_kept(
    tmp_path, model_dir, capsys, command
):
    """The run killed while it wrote its last file (the harvest's index, a part's shard; the sweep's table): the
    same command again finishes and removes the killed writes' temporaries; a user's file named like safetensors'
    temporary is refused without --overwrite and kept with it."""
    out = tmp_path / "out"
    argv = (
        harvest(model_dir, text_corpus(tmp_path), out)
        if command == "harvest"
        else patch(model_dir, write_pairs(tmp_path / "pairs.jsonl", [pair()]), out)
    )
    assert main(argv) == 0
    capsys.readouterr()
    last = out / ("index.json" if command == "harvest" else "sweep.json")
    last.unlink()  # killed before its last file: unfinished
    if command == "harvest":
        killed_write(out / "index.json")
        killed_write(out / "part-00000" / "shard-00001.safetensors")
    else:
        killed_write(out / "head.safetensors")
        killed_write(out / "parts" / "part-00000.safetensors")
    assert main(argv) == 0 and last.is_file()
    capsys.readouterr()
    assert temporaries(out) == []
    (out / ".tmpAbC123").write_text("the user's")  # not Forma's: its name is safetensors', no manifest lists it
    assert ".tmpAbC123" in refused(argv, capsys)
    assert main(argv + ["--overwrite"]) == 0
    assert (out / ".tmpAbC123").read_text() == "the user's"


def test_a_transcoder_sets_killed_writes_are_removed_and_nothing_else(tmp_path):
    """build_transcoders begins by removing the temporaries of its own files' killed writes (by their names) from
    the set's folder; a file of the user's, even one named like a temporary, stays."""
    from lab.zoo.transcoders import remove_leftovers

    out = tmp_path / "transcoders" / "topk"
    for name in ("transcoders.safetensors", "contexts.safetensors"):
        killed_write(out / name)
    mine = {".tmpAbC123": "safetensors' name", ".notes.md.x.tmp": "a temporary's name", "notes.md": "plain"}
    for name, text in mine.items():
        (out / name).write_text(text)
    remove_leftovers(out)
    assert {p.name: p.read_text() for p in out.iterdir()} == mine
