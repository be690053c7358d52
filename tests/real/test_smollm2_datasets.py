"""smollm2 over datasets: the two pairs files Forma ships (lab/data/pairs/, lab.data.pairs) read for its tokenizer,
`forma patch` and `forma harvest` run on it as a user runs them, and the model loaded over a device map with a
200 MB in-memory budget (the rest offloaded to disk) giving the plain load's logits."""

import json
from pathlib import Path
from pydoc_data.topics import topics

import pytest
import torch

from benchmarks import real_harvest_memory
from lab.analysis.activations.store import ActivationStore
from lab.analysis.sweeps import load_sweep, read_pairs
from lab.cli.parser import main
from lab.data.pairs import SHIPPED_DIR, write_pairs
from lab.data.questions import load_questions
from lab.hf.loading import load_hf
from lab.load import load_model
from tests.builders import REPO, smollm2_folder

pytestmark = pytest.mark.real

FILES = {name: SHIPPED_DIR / f"{name}.jsonl" for name in ("ioi", "capitals")}
BUDGET_BYTES = 200 * 10**6  # the in-memory budget of the device-map load: 200 MB


@pytest.fixture(scope="module")
def folder():
    return smollm2_folder()


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def subset(path: Path, lines: list[int], into: Path) -> Path:
    """The given lines of a shipped pairs file, as a pairs file of their own (a sweep of all of them is minutes)."""
    text = path.read_text(encoding="utf-8").splitlines(keepends=True)
    into.write_text("".join(text[i] for i in lines), encoding="utf-8")
    return into


def encode(model):
    return lambda text: model.tokenizer(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("name", FILES)
def test_the_shipped_pairs_read_for_smollm2_with_one_token_answers(model, name):
    """Each file holds at least 50 pairs; every answer and wrong answer is one token of smollm2's tokenizer and
    they differ; clean and corrupted prompts are as many tokens long (read_pairs refuses them otherwise)."""
    pairs = read_pairs(FILES[name], model)
    assert len(pairs) >= 50
    for pair, row in zip(pairs, rows(FILES[name]), strict=True):
        assert pair.answer != pair.wrong
        assert model.tokenizer.decode([pair.answer]) == row["answer"]
        assert model.tokenizer.decode([pair.wrong]) == row["wrong"]
        assert pair.clean.shape == pair.corrupted.shape and not torch.equal(pair.clean, pair.corrupted)


def test_the_capitals_are_the_question_sets_and_those_of_more_than_one_token_are_dropped(model):
    """Every capital pair is a fact of the shipped question set (its question id kept); a capital of the question
    set missing from the file is one that smollm2 spells with more than one token, one that is its country's own
    name (copied from the prompt, not recalled), or one whose country no other kept country matches in tokens."""
    facts = {q.id: q for q in load_questions("short", "capital")}
    shipped = rows(FILES["capitals"])
    for row in shipped:
        fact, other = facts[row["question"]], facts[row["corrupted_question"]]
        assert (row["answer"], row["wrong"]) == (" " + fact.answer, " " + other.answer)
        assert row["clean"] == f"The capital of {fact.subject} is"
        assert row["corrupted"] == f"The capital of {other.subject} is"
    kept = {row["question"] for row in shipped}
    dropped = [q for q in facts.values() if q.id not in kept]
    assert dropped and len(kept) >= 25
    tokens = encode(model)
    one = [q for q in facts.values() if len(tokens(" " + q.answer)) == 1 and q.answer != q.subject]
    for q in dropped:
        # R1, R4, or R2: no other such country whose prompt is as many tokens long
        alone = all(len(tokens(" " + o.subject)) != len(tokens(" " + q.subject)) for o in one if o is not q)
        assert len(tokens(" " + q.answer)) > 1 or q.answer == q.subject or alone, q.id
    assert sum(len(tokens(" " + q.answer)) > 1 for q in dropped) >= 100


def test_the_shipped_pairs_are_what_the_builder_writes_from_its_seed(model, tmp_path):
    written = write_pairs(encode(model), tmp_path)
    for name, path in FILES.items():
        assert written[name].read_bytes() == path.read_bytes(), name
    again = write_pairs(encode(model), tmp_path / "other-seed", seed=1)
    assert again["ioi"].read_bytes() != FILES["ioi"].read_bytes()


def differing(table, pair: int, tokens: list[torch.Tensor]) -> int:
    """The one position where a pair's clean and corrupted prompts differ (the subject, or IOI's repeated name)."""
    (where,) = (tokens[0] != tokens[1]).nonzero()[:, 0].tolist()
    assert int(table.lengths[pair]) == len(tokens[0])
    return where


def patch(pairs: Path, out: Path) -> dict:
    """`forma patch smollm2 --pairs FILE --sweep resid_pre --direction noise`: each cell of the clean run's residual
    stream replaced by the corrupted run's, one (layer, position) at a time."""
    argv = ["patch", "smollm2", "--pairs", str(pairs), "--sweep", "resid_pre", "--direction", "noise"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    return load_sweep(out)


def test_forma_patch_on_the_capitals_recalls_the_fact_from_the_subject_then_the_last_position(model, tmp_path):
    """On three capitals of the shipped set: the clean prompt prefers its capital, the corrupted one the other's;
    noising the subject's residual stream at an early layer moves the answer nearly all the way to the corrupted
    one, and at the last layer no longer does — by then the fact has moved to the last position, whose noising
    moves it there instead (Meng et al. 2022, ROME, §2: recall read at the subject, then carried forward). Positions
    before the subject hold the same tokens in both prompts: noising them changes nothing."""
    pairs = subset(FILES["capitals"], [0, 2, 36], tmp_path / "capitals.jsonl")
    table = patch(pairs, tmp_path / "sweep")["resid_pre"]
    read = read_pairs(pairs, model)
    assert table.values.shape == (3, model.cfg.n_layers, 6)
    for i, pair in enumerate(read):
        clean, corrupted = float(table.clean[i]), float(table.corrupted[i])
        assert clean > 2 and corrupted < -2, (clean, corrupted)
        subject, last = differing(table, i, [pair.clean, pair.corrupted]), len(pair.clean) - 1
        moved = (clean - table.values[i]) / (clean - corrupted)  # 0: the clean answer, 1: the corrupted one
        assert moved[0, subject] > 0.9 and moved[: model.cfg.n_layers // 3, subject].min() > 0.8
        assert moved[-1, subject] < 0.2 and moved[-1, last] > 0.8
        assert moved[:, :subject].abs().max() < 1e-3


def test_forma_patch_on_the_ioi_pairs_finds_the_repeated_name_then_the_last_position(model, tmp_path):
    """On an IOI pair of the shipped set (one: its 16 positions × 30 layers take the better part of a minute): the
    clean prompt prefers the indirect object; noising the repeated subject's residual stream in the early layers
    turns it to the subject, and at the last layer only the last position's does (Wang et al. 2022, §3: the
    S-inhibition and name-mover heads read S2, then write at END)."""
    pairs = subset(FILES["ioi"], [0], tmp_path / "ioi.jsonl")
    table = patch(pairs, tmp_path / "sweep")["resid_pre"]
    (pair,) = read_pairs(pairs, model)
    clean, corrupted = float(table.clean[0]), float(table.corrupted[0])
    assert clean > 0 > corrupted
    s2, last = differing(table, 0, [pair.clean, pair.corrupted]), len(pair.clean) - 1
    moved = (clean - table.values[0]) / (clean - corrupted)
    assert moved[: model.cfg.n_layers // 3, s2].min() > 0.9
    assert moved[-1, s2] < 0.2 and moved[-1, last] > 0.8
    assert moved[:, :s2].abs().max() < 1e-3


def test_forma_harvest_on_smollm2_writes_the_hooks_activations(model, tmp_path):
    """`forma harvest smollm2` over a text corpus (the reference manual's sections pydoc ships): the rows it stores
    are the model's own activations at those hooks on the same token ids."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(topics[key] for key in sorted(topics))[:20_000], encoding="utf-8")
    hooks = ["blocks.0.hook_resid_post", "blocks.2.attn.hook_z"]
    argv = ["harvest", "smollm2", "--hook", *hooks, "--corpus", str(corpus), "--seq-len", "32", "--tokens", "256"]
    assert main([*argv, "--out", str(tmp_path / "acts"), "--no-progress"]) == 0
    store = ActivationStore(tmp_path / "acts")
    assert len(store) == 8 * 32 and store.names == hooks
    tokens = model.to_tokens(corpus.read_text(encoding="utf-8"), prepend_bos=False, truncate=False)[0, :256]
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens.view(8, 32), names_filter=hooks)
    for hook in hooks:
        stored = store.load(hook)[hook]
        assert stored.shape == (256, *cache[hook].shape[2:])
        assert torch.allclose(stored, cache[hook].flatten(0, 1), atol=1e-5), hook


def test_a_device_map_with_a_200_mb_budget_gives_the_plain_loads_logits(folder, model, tmp_path):
    """load_hf(device_map="auto", max_memory={"cpu": 200 MB}, offload_folder=...): the embedding (tied to the
    unembedding) and the blocks that fit stay in memory, within the budget; the rest are on disk in the offload
    folder, read in around their forward pass; the logits are the plain load's."""
    off = tmp_path / "offload"
    spread = load_hf(folder, device_map="auto", max_memory={"cpu": BUDGET_BYTES}, offload_folder=off)
    places = spread.hf_device_map
    on_disk = [name for name, place in places.items() if place == "disk"]
    assert places["embed"] == "cpu" and len(on_disk) >= model.cfg.n_layers // 2
    in_memory = sum(
        p.numel() * p.element_size()
        for name, place in places.items()
        if place != "disk"
        for p in spread.get_submodule(name).parameters()
    )
    assert in_memory <= BUDGET_BYTES
    assert sum(f.stat().st_size for f in off.rglob("*") if f.is_file()) >= 0.5 * sum(
        p.numel() * p.element_size() for p in model.parameters()
    )
    prompts = ["The capital of France is", "When Mary and John went to the store, John gave a drink to"]
    with torch.inference_mode():
        for text in prompts:
            tokens = model.to_tokens(text)
            assert (spread(tokens) - model(tokens)).abs().max().item() <= 1e-5, text


def test_forma_harvest_holds_memory_flat_on_a_corpus_four_times_as_long():
    """benchmarks.real_harvest_memory at small sizes: the harvest's peak above the loaded model grows by less than
    its bound from a corpus to one 4× as long, though holding the rows in memory would add more than that."""
    figures = real_harvest_memory.compare(4096)
    assert figures["short"]["exit_code"] == figures["long"]["exit_code"] == 0
    assert figures["long"]["rows"] == 4 * figures["short"]["rows"] == 4 * 4096
    assert figures["long"]["shards"] > figures["short"]["shards"]
    assert figures["rows_in_memory_would_add_bytes"] > figures["growth_bound_bytes"]
    assert figures["flat"], figures


def test_the_distributed_page_counts_the_shipped_pairs_as_they_are():
    page = (REPO / "docs" / "distributed.md").read_text(encoding="utf-8")
    assert f"`lab/data/pairs/ioi.jsonl`, {len(rows(FILES['ioi']))} indirect-object pairs" in page
    assert f"`lab/data/pairs/capitals.jsonl`, {len(rows(FILES['capitals']))} pairs" in page
