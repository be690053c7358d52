"""The zoo: recipes build into loadable models, by name, with their cards; bad names are clear errors."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from lab import HookedTransformer, folders
from lab.folders import DEFAULT_ZOO_DIR, TRAINED, is_trained, zoo_names
from lab.zoo import building, builds, cards
from lab.zoo.building import build
from lab.zoo.builds import BUILDS_DIR, CURRENT_LINK, LOCK_FILE, NEXT_LINK
from lab.zoo.cards import ngram_perplexities
from lab.zoo.recipes import load_recipe
from lab.zoo.worlds import WorldData, build_world
from tests.builders import TINY_MARKOV, write_recipe

pytestmark = pytest.mark.usefixtures("one_thread")  # small models (tests/conftest.py::one_thread)


def test_the_zoo_has_the_three_recipes():
    assert {"markov", "facts", "pydoc"} <= set(zoo_names())
    for name in zoo_names(TRAINED):
        recipe = load_recipe(name, quick=True)
        assert recipe["world"]["kind"] and recipe["model"]["n_ctx"] > 0 and recipe["train"]["steps"] > 0


@pytest.fixture
def zoo_dir(tmp_path, monkeypatch):
    """A private copy of the zoo's recipes, so building never touches models/."""
    for name in zoo_names(TRAINED):
        (tmp_path / name).mkdir()
        shutil.copy(DEFAULT_ZOO_DIR / name / "model.toml", tmp_path / name / "model.toml")
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path))
    return tmp_path


def with_corpus(zoo_dir: Path, name: str, request) -> None:
    """pydoc's corpus cache in the private zoo (tests/conftest.py::stdlib_corpus), as a first build leaves it."""
    if load_recipe(name, quick=True)["world"]["kind"] == "pydoc":
        shutil.copy(request.getfixturevalue("stdlib_corpus"), zoo_dir / "pydoc" / "corpus.txt")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["markov", "facts", "pydoc"])
def test_quick_recipes_build_load_and_learn(name, zoo_dir, request):
    with_corpus(zoo_dir, name, request)
    directory = build(name, quick=True, progress=False)
    assert directory == zoo_dir / name
    model = HookedTransformer.from_pretrained(name)
    card = json.loads((directory / "card.json").read_text())
    metrics = [json.loads(line) for line in (directory / "train" / "metrics.jsonl").read_text().splitlines()]
    assert card["steps"] == load_recipe(name, quick=True)["train"]["steps"]
    assert metrics[-1]["train_loss_nats"] < metrics[0]["train_loss_nats"]
    assert (directory / "world.json").is_file()
    if name != "markov":
        assert model.tokenizer is not None
    assert card["held_out"]["how"]  # the card says how its held-out data stay out of training
    if name == "pydoc":
        assert card["val_perplexity"] > 1 and card["unigram_perplexity"] > card["bigram_perplexity"] > 1
        assert card["val_perplexity"] == pytest.approx(math.exp(card["val_loss_nats"]), rel=1e-12)  # one computation
        assert card["held_out"]["shared_documents"] == 0
        assert len(card["samples"]) == 3
    if name == "markov":
        assert card["held_out"]["equal_to_a_training_sequence"] == 0
        n_complete, n_all = card["val_complete_context_prefixes"], card["val_prefixes"]
        mixed = (
            card["val_kl_complete_contexts_nats"] * n_complete
            + card["val_kl_first_positions_nats"] * (n_all - n_complete)
        ) / n_all
        assert card["val_kl_to_truth_nats"] == pytest.approx(mixed, rel=1e-9)


def test_untrained_and_unknown_names_are_clear_errors(zoo_dir):
    with pytest.raises(FileNotFoundError, match="forma build markov"):
        HookedTransformer.from_pretrained("markov")
    with pytest.raises(ValueError, match="zoo models: dates, facts, markov, pydoc"):
        HookedTransformer.from_pretrained("gpt5")


def test_malformed_recipe_is_a_clear_error(zoo_dir):
    (zoo_dir / "markov" / "model.toml").write_text("[world\nkind = 1")
    with pytest.raises(ValueError, match="malformed recipe"):
        load_recipe("markov")


def test_ngram_baselines_on_a_deterministic_stream():
    # A stream that alternates 0, 1: the bigram model predicts almost perfectly, the unigram cannot.
    stream = torch.tensor([0, 1] * 500)
    ppl = ngram_perplexities(stream, stream[:100], d_vocab=2)
    assert abs(ppl["unigram_perplexity"] - 2.0) < 0.01
    assert ppl["bigram_perplexity"] < 1.3


MINIMAL_WORLDS = {
    "markov": 'kind = "markov"\nvocab_size = 8\nn_sequences = 8',
    "hmm": 'kind = "hmm"\nn_states = 2\nvocab_size = 8\nn_sequences = 8',
    "facts": 'kind = "facts"',
    "pydoc": 'kind = "pydoc"',
    "dates": 'kind = "dates"\nn_train = 10\nn_held_out = 5',
}


@pytest.mark.parametrize("kind", sorted(MINIMAL_WORLDS))
def test_an_unknown_world_key_is_refused_by_name_for_every_kind(zoo_dir, kind):
    write_recipe(zoo_dir, "typo", f"[world]\n{MINIMAL_WORLDS[kind]}\nsede = 1\n\n[model]\nn_ctx = 8\n")
    known = "vocab_size" if kind == "pydoc" else "seed"  # one of the kind's keys, in the list the error gives
    with pytest.raises(
        ValueError,
        match=rf"typo/model.toml: \[world\] has unknown key 'sede' for a {kind} world; "
        rf"known keys are .*{known}",
    ):
        load_recipe("typo")
    # In a quick override too, and found whichever profile is asked for.
    write_recipe(zoo_dir, "typo", f"[world]\n{MINIMAL_WORLDS[kind]}\n\n[model]\nn_ctx = 8\n\n[quick.world]\nsede = 1\n")
    with pytest.raises(ValueError, match=r"unknown key 'sede'"):
        load_recipe("typo", quick=False)


def test_missing_or_mistyped_recipe_keys_are_named(zoo_dir):
    cases = {
        '[world]\nkind = "markov"\nvocab_size = 8\nn_sequences = 8\n[model]\nd_model = 8\n': r"\[model\] needs n_ctx",
        '[world]\nkind = "markov"\nvocab_size = 8\n[model]\nn_ctx = 8\n': (
            r"\[world\] needs n_sequences for a markov world"
        ),
        '[world]\nkind = "markov"\nvocab_size = "8"\nn_sequences = 8\n[model]\nn_ctx = 8\n': (
            r"\[world\] vocab_size must be an integer, got '8'"
        ),
        '[world]\nkind = "markow"\n[model]\nn_ctx = 8\n': r"\[world\] needs kind = one of \['dates', 'facts'",
        '[world]\nkind = "markov"\nvocab_size = 8\nn_sequences = 8\n[model]\nn_ctx = 8\nkind = "rnn"\n': (
            r"\[model\] kind must be one of \['decoder_only', 'encoder_decoder'\], got 'rnn'"
        ),
    }
    for text, message in cases.items():
        write_recipe(zoo_dir, "bad", text)
        with pytest.raises(ValueError, match=message):
            load_recipe("bad")


@pytest.mark.parametrize(
    "world, message",
    [
        (
            "vocab_size = 32\norder = 12\nn_sequences = 8",
            r"32\^13 = 36,893,488,147,419,103,232 entries .* exceeds the limit of 33,554,432 \(256 MiB\); "
            r"lower order or vocab_size",
        ),
        ("vocab_size = 100_000\norder = 2\nn_sequences = 8", r"100000\^3 = 1,000,000,000,000,000 entries"),
        ("vocab_size = 8\nn_sequences = 1_000_000_000", r"n × length = 1,000,000,000 × 8 = 8,000,000,000 entries"),
    ],
    ids=["order", "vocab_size", "n_sequences"],
)
def test_worlds_too_big_for_memory_are_refused_before_allocating(zoo_dir, world, message):
    write_recipe(zoo_dir, "big", TINY_MARKOV.replace("vocab_size = 8\norder = 1\nseed = 0\nn_sequences = 64", world))
    with pytest.raises(ValueError, match=r"big/model.toml: \[world\] MarkovSource.*" + message):
        build("big", progress=False)
    write_recipe(
        zoo_dir,
        "big",
        '[world]\nkind = "hmm"\nn_states = 100_000\nvocab_size = 8\nn_sequences = 8\n[model]\nn_ctx = 8\n',
    )
    with pytest.raises(
        ValueError,
        match=r"HiddenMarkovSource: the tables n_states × \(n_states \+ vocab_size\) = "
        r"100000 × 100008 = 10,000,800,000 entries",
    ):
        build("big", progress=False)
    write_recipe(zoo_dir, "big", '[world]\nkind = "facts"\nn_train = 1_000_000_000\n[model]\nn_ctx = 8\n')
    with pytest.raises(ValueError, match=r"n_train = 1,000,000,000 documents is more than a facts world may draw"):
        load_recipe("big")


# --- builds: the previous model stays until the new one is complete; resumption ----------------
def published_bytes(directory) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != "model.toml" and not p.name.startswith(".")
    }


def interrupted_build(name: str, after: int = 2) -> None:
    """`build(name)`, with its training stopped by a SIGINT after step `after` (and its checkpoint)."""
    import signal

    import lab.train.loop

    real = lab.train.loop.train

    def stop(*args, **kwargs):
        real(*args, **kwargs | {"stop_after": after})
        raise lab.train.loop.TrainingInterrupted(signal.SIGINT, after)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(building, "train", stop)  # where the build looks it up
        with pytest.raises(lab.train.loop.TrainingInterrupted):
            build(name, progress=False)


def test_an_interrupted_build_leaves_the_model_in_place_and_resumes_to_the_same_bits(zoo_dir, user_threads):
    write_recipe(zoo_dir, "tiny", TINY_MARKOV)
    with pytest.raises(
        FileNotFoundError,
        match=r"nothing to resume for tiny: .* holds no interrupted build .* "
        r"run `forma build tiny` to train afresh",
    ):
        build("tiny", progress=False, resume=True)
    interrupted_build("tiny")
    assert not is_trained("tiny")  # nothing is published before a build completes
    build("tiny", progress=False, resume=True)
    uninterrupted = published_bytes(zoo_dir / "tiny")
    card = json.loads(uninterrupted["card.json"])
    assert card["steps"] == 6 and HookedTransformer.from_pretrained("tiny").cfg.n_ctx == 8

    interrupted_build("tiny", after=4)
    assert published_bytes(zoo_dir / "tiny") == uninterrupted  # the previous model, untouched and loadable
    HookedTransformer.from_pretrained("tiny")
    with pytest.raises(
        ValueError,
        match=r"cannot resume tiny: the interrupted build was started without --quick; "
        r"resume it with `forma build tiny --resume`",
    ):
        build("tiny", quick=True, progress=False, resume=True)
    write_recipe(zoo_dir, "tiny", TINY_MARKOV.replace("lr = 1e-2", "lr = 2e-2"))
    with pytest.raises(ValueError, match=r"\[train\] lr \(build 0.01, now 0.02\); run `forma build tiny` to start"):
        build("tiny", progress=False, resume=True)
    write_recipe(zoo_dir, "tiny", TINY_MARKOV.replace("checkpoint_interval = 2", "checkpoint_interval = 1"))
    build("tiny", progress=False, resume=True)  # how often to checkpoint may change
    resumed = published_bytes(zoo_dir / "tiny")
    assert resumed["model.safetensors"] == uninterrupted["model.safetensors"]
    assert {
        k: v for k, v in json.loads(resumed["card.json"]).items() if not k.endswith("_s") and k != "provenance"
    } == {k: v for k, v in card.items() if not k.endswith("_s") and k != "provenance"}
    builds = sorted(p.name for p in (zoo_dir / "tiny" / BUILDS_DIR).iterdir())
    assert len(builds) == 2  # the published build and the one before it, for readers that resolved it
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        build("tiny", progress=False, resume=True)


def test_a_fresh_build_discards_an_interrupted_one(zoo_dir, caplog):
    write_recipe(zoo_dir, "tiny", TINY_MARKOV)
    interrupted_build("tiny")
    abandoned = (zoo_dir / "tiny" / NEXT_LINK).resolve()
    build("tiny", progress=False)
    assert "discarding the interrupted build" in caplog.text and not abandoned.exists()
    assert is_trained("tiny") and not (zoo_dir / "tiny" / NEXT_LINK).exists()


def test_a_crash_at_any_step_of_publishing_shows_the_old_model_or_the_new_one(zoo_dir):
    """Plain files from before builds were linked are moved into a build, then the new one is switched
    in: a crash before any file operation of that leaves every name showing one whole model."""
    import os

    write_recipe(zoo_dir, "tiny", TINY_MARKOV)
    directory = zoo_dir / "tiny"
    build("tiny", progress=False)
    staging = (directory / CURRENT_LINK).resolve()
    new = published_bytes(directory)
    old_model = HookedTransformer(HookedTransformer.load(directory).cfg, seed=7)
    names = ("model.safetensors", "config.json", "card.json", "world.json")

    class Crash(Exception):
        pass

    def plain_folder() -> None:  # the layout before links: the old model's files, plainly in the folder
        for path in list(directory.iterdir()):
            if path.name not in ("model.toml", BUILDS_DIR):
                path.unlink()
        for path in (directory / BUILDS_DIR).iterdir():
            if path != staging:
                shutil.rmtree(path)
        old_model.save(directory)
        (directory / "card.json").write_text('{"old": true}')
        (directory / "world.json").write_text('{"old": true}')

    old = None
    for crash_at in range(1, 100):
        plain_folder()
        old = old or published_bytes(directory)
        calls = 0

        def counted(real, crash_at=crash_at):
            def operation(*args, **kwargs):
                nonlocal calls
                calls += 1
                if calls == crash_at:
                    raise Crash
                return real(*args, **kwargs)

            return operation

        with pytest.MonkeyPatch.context() as patch:
            for op in ("replace", "symlink", "link", "unlink"):
                patch.setattr(os, op, counted(getattr(os, op)))
            try:
                builds.publish_build(directory, staging)
                finished = True
            except Crash:
                finished = False
        seen = {name: (directory / name).read_bytes() for name in names}
        assert seen in ({n: old[n] for n in names}, {n: new[n] for n in names}), crash_at
        builds.publish_build(directory, staging)  # the next build's publish finishes what a crash cut short
        assert published_bytes(directory) == new
        if finished:
            break
    assert crash_at > 10  # the crash was tried at each of the many operations


def test_a_killed_writes_temporary_folder_in_a_build_is_removed_when_it_is_published(zoo_dir):
    """atomic_write's temporary folder (what a write killed inside safetensors leaves, its `.tmpXXXXXX` within)
    and a bare temporary file of an earlier Forma, in the build being published: removed, never published."""
    write_recipe(zoo_dir, "tiny", TINY_MARKOV)
    directory = zoo_dir / "tiny"
    build("tiny", progress=False)
    staging = (directory / CURRENT_LINK).resolve()
    (staging / ".model.safetensors.ab12cd.tmp").mkdir()
    (staging / ".model.safetensors.ab12cd.tmp" / ".tmpX1y2Z3").write_bytes(b"half a file")
    (staging / ".card.json.ef34gh.tmp").write_text("half")
    builds.publish_build(directory, staging)
    assert not [p.name for p in staging.iterdir() if p.name.endswith(".tmp")]


def test_a_diverging_build_is_one_line_from_the_cli_and_keeps_its_checkpoint(zoo_dir, capsys):
    import re

    from lab.cli.parser import main

    write_recipe(zoo_dir, "tiny", TINY_MARKOV)
    assert main(["build", "tiny", "--no-progress"]) == 0
    before = published_bytes(zoo_dir / "tiny")
    capsys.readouterr()
    write_recipe(
        zoo_dir,
        "tiny",
        TINY_MARKOV.replace("lr = 1e-2", "lr = 1e30").replace("checkpoint_interval = 2", "checkpoint_interval = 1"),
    )
    assert main(["build", "tiny", "--no-progress"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    diverged = re.fullmatch(
        r"forma build: error: training diverged at step (\d+): train loss is (nan|inf) \(lr \S+\); "
        r"try a lower lr or a tighter grad_clip; the checkpoint of step (\d+) is kept in (\S+)",
        lines[0],
    )
    assert diverged, lines[0]
    step, kept, checkpoint = int(diverged[1]), int(diverged[3]), diverged[4]
    assert kept == step - 1 and json.loads((Path(checkpoint) / "train_state.json").read_text())["step"] == kept
    assert published_bytes(zoo_dir / "tiny") == before  # the previous model is still the model


def test_a_second_build_of_the_same_model_at_once_is_refused(zoo_dir):
    import fcntl
    import os

    write_recipe(zoo_dir, "tiny", TINY_MARKOV)
    fd = os.open(zoo_dir / "tiny" / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a running `forma build tiny` holds it
        with pytest.raises(ValueError, match=r"another `forma build tiny` is building in .*tiny; wait for it"):
            build("tiny", progress=False)
    finally:
        os.close(fd)
    assert not (zoo_dir / "tiny" / NEXT_LINK).exists()  # it started nothing
    build("tiny", progress=False)


# --- held-out splits disjoint from training, for every world ---------------------------------
def _disjoint_source(data, recipe):
    assert cards._identical_rows(data.train, data.val) == 0
    n = len(data.val)
    assert not torch.equal(data.val, data.train[-n:]) and not torch.equal(data.val, data.train[:n])


def _independent_facts(data, recipe):
    """The facts world's held-out documents are independent draws from p, not unseen facts, and its card says so
    with the overlap counted right: checked on the token rows, a path apart from the fact indices it was counted
    from, and against what independent draws give."""
    from lab.data.facts import FactWorld, FactWorldConfig

    spec = {k: v for k, v in recipe["world"].items() if k not in ("kind", "form", "n_heldout")}
    world = FactWorld(FactWorldConfig.from_dict(spec))
    record = data.world["held_out"]
    assert len(data.train) == world.cfg.n_train and record["draws"] == len(data.val)
    assert recipe["world"].get("form", "bare") == "bare"
    # In the bare form a statement's row is its fact: a held-out row equal to a training row is a draw of a
    # training fact, so the count of such rows is the recorded overlap.
    train_rows = {row.tobytes() for row in data.train.numpy()}
    shared = sum(row.tobytes() in train_rows for row in data.val.numpy())
    assert shared == record["draws_of_facts_in_training"] and shared > 0  # what the card reports, and not 0
    assert len({row.tobytes() for row in data.val.numpy()}) == record["distinct_facts"]
    # Independent of the training draws: as many draws of training facts as independent draws from p give
    # (binomial, 1 − p(unseen facts) each), within 4 standard errors. Held-out rows taken from training would
    # all be training facts.
    q = 1 - world.true_missing_mass()
    assert record["expected_draws_of_facts_in_training"] == len(data.val) * q
    assert abs(shared - len(data.val) * q) <= 4 * (len(data.val) * q * (1 - q)) ** 0.5, (shared, len(data.val) * q)
    assert "independent draws, not unseen facts" in record["how"]


def _disjoint_pydoc(data, recipe):
    from lab.data.stdlib_corpus import split_documents, split_text, stdlib_docstrings

    train_text, val_text = split_text(
        stdlib_docstrings(cache=folders.zoo_dir() / "pydoc" / "corpus.txt"), recipe["world"]["held_out_fraction"]
    )
    assert not set(split_documents(val_text)) & set(split_documents(train_text))
    assert data.val.tolist() == data.tokenizer.encode(val_text).ids  # the held-out stream is those documents


def _disjoint_dates(data, recipe):
    def days(pairs):
        return {tuple(tgt) for _, tgt in pairs}

    assert not days(data.held_out) & days(data.train)
    assert len(days(data.held_out)) == recipe["world"]["n_held_out"]


HELD_APART = {
    "markov": _disjoint_source,
    "hmm": _disjoint_source,
    "facts": _independent_facts,
    "pydoc": _disjoint_pydoc,
    "dates": _disjoint_dates,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo_names(TRAINED))
def test_every_zoo_world_keeps_its_held_out_data_apart_as_its_card_says(name, zoo_dir, request):
    """Sources, pydoc and dates: held-out data disjoint from training. Facts: independent draws from p, whose
    overlap with training the card reports."""
    with_corpus(zoo_dir, name, request)
    recipe = load_recipe(name, quick=True)
    data = build_world(recipe["world"], recipe["model"]["n_ctx"], recipe["train"].get("seq_len"))
    HELD_APART[recipe["world"]["kind"]](data, recipe)


def test_the_disjointness_checks_catch_a_held_out_slice_of_training():
    """The split the facts card used to have: validation rows cut from the training draws."""
    recipe = load_recipe("markov", quick=True)
    data = build_world(recipe["world"], recipe["model"]["n_ctx"], recipe["train"].get("seq_len"))
    with pytest.raises(AssertionError):
        _disjoint_source(WorldData(data.train, data.train[-16:], data.d_vocab, None, data.world), recipe)


def test_the_facts_check_catches_held_out_rows_taken_from_training_or_a_miscounted_overlap():
    """At the default recipe's size (1,000 held-out draws, 6% of p's mass unseen), held-out rows resampled from
    training share 8 standard errors more training facts than independent draws do."""
    recipe = load_recipe("facts")
    data = build_world(recipe["world"], recipe["model"]["n_ctx"], recipe["train"].get("seq_len"))
    _independent_facts(data, recipe)
    resampled = data.train[
        torch.randint(0, len(data.train), (len(data.val),), generator=torch.Generator().manual_seed(0))
    ]
    record = data.world["held_out"]
    recount = dict(
        record,
        draws_of_facts_in_training=len(data.val),
        distinct_facts=len({row.tobytes() for row in resampled.numpy()}),
    )
    with pytest.raises(AssertionError):  # every row a training row: far more than independent draws share
        _independent_facts(
            WorldData(data.train, resampled, data.d_vocab, data.tokenizer, dict(data.world, held_out=recount)),
            recipe,
        )
    miscounted = dict(record, draws_of_facts_in_training=record["draws_of_facts_in_training"] - 1)
    with pytest.raises(AssertionError):
        _independent_facts(
            WorldData(data.train, data.val, data.d_vocab, data.tokenizer, dict(data.world, held_out=miscounted)),
            recipe,
        )


def test_zoo_entries_read_each_recipe_and_card_and_name_what_is_unreadable(zoo_dir):
    from lab.folders import zoo_entries, zoo_entry

    entries = {entry.name: entry for entry in zoo_entries()}
    assert sorted(entries) == zoo_names()
    assert all(not e.trained and e.card is None and e.problem is None and e.description for e in entries.values())
    (zoo_dir / "markov" / "card.json").write_text(json.dumps({"n_params": 12, "val_kl_to_truth_nats": 0.25}))
    (zoo_dir / "markov" / "model.safetensors").write_bytes(b"")
    markov = zoo_entry("markov")
    assert markov.trained and markov.card == {"n_params": 12, "val_kl_to_truth_nats": 0.25}
    (zoo_dir / "facts" / "card.json").write_text("{cut sho")
    facts = zoo_entry("facts")
    assert facts.card is None and "card.json is unreadable" in facts.problem and "forma build facts" in facts.problem
    (zoo_dir / "pydoc" / "model.toml").write_text("description = ")
    assert "model.toml is unreadable" in zoo_entry("pydoc").problem
