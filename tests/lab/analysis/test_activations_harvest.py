"""lab.analysis.activations.harvest in one process: a corpus file read as sequences, a harvest in parts whose rows
are bit for bit those of one save_activations over the whole corpus, and a rerun that resumes, checks its arguments
and its tokens, and refuses what it cannot continue. (Under torchrun with 2 gloo ranks, killed and rerun:
tests/lab/cli/test_cli_datasets.py.)"""

import re

import numpy as np
import pytest
import torch

from lab import HookedTransformer
from lab.analysis.activations.harvest import harvest, read_corpus, split_corpus
from lab.analysis.activations.store import ActivationStore, save_activations
from lab.data.tokenizers import word_level
from tests.builders import VOCAB, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

HOOKS = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"]


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    return HookedTransformer(tiny_config(n_ctx=16), seed=0).eval()


@pytest.fixture(scope="module")
def corpus() -> torch.Tensor:
    return torch.randint(0, VOCAB, (22, 8), generator=torch.Generator().manual_seed(3))


def folder_bytes(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_corpus_file_is_read_as_sequences_of_token_ids(tmp_path, model):
    stream = np.arange(100, dtype=np.int32) % VOCAB
    np.save(tmp_path / "stream.npy", stream)
    ids = read_corpus(tmp_path / "stream.npy", model, seq_len=8)
    assert ids.shape == (12, 8) and np.array_equal(ids.reshape(-1), stream[:96])  # the remainder is dropped
    assert read_corpus(tmp_path / "stream.npy", model, seq_len=8, tokens=20).shape == (2, 8)
    assert read_corpus(tmp_path / "stream.npy", model).shape == (6, 16)  # min(128, n_ctx = 16)
    np.save(tmp_path / "rows.npy", stream[:96].reshape(12, 8).astype(np.int64))
    assert np.array_equal(read_corpus(tmp_path / "rows.npy", model), ids)
    tokenizer = word_level(["a", "b", "c"])
    worded = HookedTransformer(tiny_config(n_ctx=16, d_vocab=tokenizer.get_vocab_size()), tokenizer=tokenizer)
    (tmp_path / "text.txt").write_text("a b c " * 5)
    assert read_corpus(tmp_path / "text.txt", worded, seq_len=5).tolist() == [
        [4, 5, 6, 4, 5],
        [6, 4, 5, 6, 4],
        [5, 6, 4, 5, 6],
    ]
    for path, options, message in [
        (tmp_path / "stream.npy", {"seq_len": 8, "tokens": 7}, "7 tokens fill 0 sequences: ask for at least one"),
        (tmp_path / "stream.npy", {"seq_len": 8, "tokens": 200}, "holds 100 tokens"),
        (tmp_path / "stream.npy", {"seq_len": 17}, "1 … n_ctx = 16"),
        (tmp_path / "rows.npy", {"seq_len": 4}, "holds sequences of 8 tokens, not the 4 asked for"),
        (tmp_path / "text.txt", {}, "the model has no tokenizer"),
        (tmp_path / "corpus.csv", {}, "a .txt (text) or a .npy (token ids) file"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            read_corpus(path, model, **options)
    np.save(tmp_path / "floats.npy", np.zeros(10))
    with pytest.raises(ValueError, match="integer array"):
        read_corpus(tmp_path / "floats.npy", model)


def test_a_text_corpus_is_split_whole_and_what_is_left_over_is_counted(tmp_path):
    """A text longer than the model's context is encoded whole (never cut to n_ctx, as to_tokens cuts a prompt),
    split into sequences of seq_len, and the tokens that fill no sequence are counted for the caller to report."""
    tokenizer = word_level(["a", "b", "c"])
    worded = HookedTransformer(tiny_config(n_ctx=16, d_vocab=tokenizer.get_vocab_size()), tokenizer=tokenizer)
    (tmp_path / "text.txt").write_text("a b c " * 30)  # 90 tokens, over five contexts
    ids, left_over = split_corpus(tmp_path / "text.txt", worded)
    assert ids.shape == (5, 16) and left_over == 10
    assert ids.reshape(-1).tolist() == ([4, 5, 6] * 30)[:80]
    assert split_corpus(tmp_path / "text.txt", worded, seq_len=7, tokens=50)[0].shape == (7, 7)
    assert split_corpus(tmp_path / "text.txt", worded, seq_len=7, tokens=50)[1] == 1
    assert split_corpus(tmp_path / "text.txt", worded, seq_len=9)[1] == 0
    with pytest.raises(ValueError, match=re.escape("holds 90 tokens (5 sequences of 16); 200 tokens fill 12")):
        split_corpus(tmp_path / "text.txt", worded, tokens=200)


def test_a_harvest_in_parts_holds_the_rows_of_one_harvest_bit_for_bit(tmp_path, model, corpus):
    """Parts of whole batches (22 sequences, batches of 4 — the last of 2 — in 5 parts), each its own set of several
    shards with rows' seq counted in the corpus, merged: the rows, seq and pos of one save_activations over the
    whole corpus."""
    store = harvest(model, corpus, HOOKS, tmp_path / "parts", batch_size=4, parts=5, shard_mb=0.01, progress=False)
    whole = save_activations(model, corpus, HOOKS, tmp_path / "whole", "all", batch_size=4, progress=False)
    assert [p["n_sequences"] for p in store.index["parts"]] == [4, 4, 4, 4, 6]  # 6 batches in 5 parts
    assert len(store.index["shards"]) > len(store.index["parts"])  # parts of several shards
    ours, theirs = store.load(), whole.load()
    assert ours.acts.keys() == theirs.acts.keys()
    for name in HOOKS:
        assert torch.equal(ours[name], theirs[name])
    assert torch.equal(ours.seq, theirs.seq) and torch.equal(ours.pos, theirs.pos)
    assert store.index["hooks"] == whole.index["hooks"] and store.index["n_rows"] == len(whole) == 22 * 8
    last = harvest(model, corpus, HOOKS[0], tmp_path / "last", "last", batch_size=4, progress=False)
    assert torch.equal(last.load().seq, torch.arange(22)) and torch.equal(last.load().pos, torch.full((22,), 7))


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("at", [3, 6, 11])
def test_a_harvest_interrupted_anywhere_resumes_to_the_same_bytes(tmp_path, model, corpus, at):
    """Interrupted at the at-th batch (inside a part, after some shards: 22 sequences, batches of 2, parts of 2
    batches, shards of ~1 batch), then rerun: the parts done are kept as they are, the one begun goes on from its
    last recorded shard, and the folder ends up byte for byte the uninterrupted one's."""
    options = {"batch_size": 2, "parts": 6, "shard_mb": 0.005, "progress": False}
    harvest(model, corpus, HOOKS, tmp_path / "whole", **options)
    calls = [0]

    def interrupt(module, args):
        calls[0] += 1
        if calls[0] == at:
            raise Interrupted

    handle = model.blocks[0].register_forward_pre_hook(interrupt)
    try:
        with pytest.raises(Interrupted):
            harvest(model, corpus, HOOKS, tmp_path / "cut", **options)
    finally:
        handle.remove()
    out = tmp_path / "cut"
    assert not (out / "index.json").exists() and (out / "part-00000" / "index.json").is_file()
    kept = (out / "part-00000" / "shard-00000.safetensors").stat().st_mtime_ns
    (out / ".index.json.x1y2.tmp").write_text("what a killed write leaves")
    store = harvest(model, corpus, HOOKS, out, **options)
    assert folder_bytes(out) == folder_bytes(tmp_path / "whole")
    assert (out / "part-00000" / "shard-00000.safetensors").stat().st_mtime_ns == kept  # kept, not redone
    assert len(store) == 22 * 8


def test_a_rerun_refuses_other_arguments_other_tokens_and_a_finished_harvest(tmp_path, model, corpus):
    options = {"batch_size": 4, "progress": False}
    harvest(model, corpus, HOOKS, tmp_path / "h", **options)
    with pytest.raises(FileExistsError, match="already holds a complete harvest"):
        harvest(model, corpus, HOOKS, tmp_path / "h", **options)
    (tmp_path / "h" / "index.json").unlink()  # as if killed before the merge
    with pytest.raises(ValueError, match=r"begun with other arguments \(batch_size: 4 then, 2 now\)"):
        harvest(model, corpus, HOOKS, tmp_path / "h", batch_size=2, progress=False)
    with pytest.raises(ValueError, match=r"\(hooks: "):
        harvest(model, corpus, HOOKS[:1], tmp_path / "h", **options)
    changed = corpus.clone()
    changed[5, 3] = (changed[5, 3] + 1) % VOCAB
    with pytest.raises(
        ValueError,
        match=r"part-00001 was harvested from other token ids than the corpus's "
        r"sequences 4…7",
    ):
        harvest(model, changed, HOOKS, tmp_path / "h", **options)
    store = harvest(model, changed, HOOKS, tmp_path / "h", overwrite=True, **options)
    fresh = save_activations(model, changed, HOOKS, tmp_path / "fresh", "all", batch_size=4, progress=False)
    assert torch.equal(ActivationStore(tmp_path / "h").load()[HOOKS[1]], fresh.load()[HOOKS[1]]) and len(store)
    with pytest.raises(TypeError, match="not a predicate"):
        harvest(model, corpus, HOOKS, tmp_path / "p", lambda t: t == 0, **options)
