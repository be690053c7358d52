"""The zoo: recipes build into loadable models, by name, with their cards; bad names are clear errors."""

import json
import math
import shutil

import pytest
import torch

import lab.zoo as zoo
from lab import HookedTransformer
from lab.zoo import build, load_recipe, ngram_perplexities, zoo_names


def test_the_zoo_has_the_three_recipes():
    assert {"markov", "facts", "pydoc"} <= set(zoo_names())
    for name in zoo_names():
        recipe = load_recipe(name, quick=True)
        assert recipe["world"]["kind"] and recipe["model"]["n_ctx"] > 0 and recipe["train"]["steps"] > 0


@pytest.fixture
def zoo_dir(tmp_path, monkeypatch):
    """A private copy of the zoo's recipes, so building never touches models/."""
    for name in zoo_names():
        (tmp_path / name).mkdir()
        shutil.copy(zoo.DEFAULT_ZOO_DIR / name / "model.toml", tmp_path / name / "model.toml")
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", ["markov", "facts", "pydoc"])
def test_quick_recipes_build_load_and_learn(name, zoo_dir):
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
        mixed = (card["val_kl_complete_contexts_nats"] * n_complete
                 + card["val_kl_first_positions_nats"] * (n_all - n_complete)) / n_all
        assert card["val_kl_to_truth_nats"] == pytest.approx(mixed, rel=1e-9)


def test_untrained_and_unknown_names_are_clear_errors(zoo_dir):
    with pytest.raises(FileNotFoundError, match="forma train markov"):
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


# --- held-out splits disjoint from training, for every world ---------------------------------
def _disjoint_source(data, recipe):
    assert zoo._identical_rows(data.train, data.val) == 0
    n = len(data.val)
    assert not torch.equal(data.val, data.train[-n:]) and not torch.equal(data.val, data.train[:n])


def _disjoint_facts(data, recipe):
    from lab.data.facts import FactWorld, FactWorldConfig

    spec = {k: v for k, v in recipe["world"].items() if k not in ("kind", "form", "n_heldout")}
    world = FactWorld(FactWorldConfig.from_dict(spec))
    # Training holds every one of the n_train draws; the held-out documents are other, fresh draws.
    assert len(data.train) == world.cfg.n_train
    held = world.heldout_fact_indices(len(data.val))
    train_draws = world.train_fact_indices.tolist()
    k = len(held)
    assert all(train_draws[i:i + k] != held.tolist() for i in range(len(train_draws) - k + 1))  # no slice of training
    assert data.world["held_out"] == data.world["held_out"] | world.heldout_overlap(held)
    assert "also occur in training" in data.world["held_out"]["how"]


def _disjoint_pydoc(data, recipe):
    from lab.data.text import split_documents, split_text, stdlib_docstrings

    train_text, val_text = split_text(stdlib_docstrings(cache=zoo.zoo_dir() / "pydoc" / "corpus.txt"),
                                      recipe["world"]["held_out_fraction"])
    assert not set(split_documents(val_text)) & set(split_documents(train_text))
    assert data.val.tolist() == data.tokenizer.encode(val_text).ids  # the held-out stream is those documents


def _disjoint_dates(data, recipe):
    def days(pairs):
        return {tuple(tgt) for _, tgt in pairs}

    assert not days(data.held_out) & days(data.train)
    assert len(days(data.held_out)) == recipe["world"]["n_held_out"]


DISJOINT = {"markov": _disjoint_source, "hmm": _disjoint_source, "facts": _disjoint_facts, "pydoc": _disjoint_pydoc,
            "dates": _disjoint_dates}


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo_names())
def test_every_zoo_world_holds_out_data_disjoint_from_training(name, zoo_dir):
    recipe = load_recipe(name, quick=True)
    data = zoo.build_world(recipe["world"], recipe["model"]["n_ctx"], recipe["train"].get("seq_len"))
    DISJOINT[recipe["world"]["kind"]](data, recipe)


def test_the_disjointness_checks_catch_a_held_out_slice_of_training():
    """The split the facts card used to have: validation rows cut from the training draws."""
    recipe = load_recipe("markov", quick=True)
    data = zoo.build_world(recipe["world"], recipe["model"]["n_ctx"], recipe["train"].get("seq_len"))
    with pytest.raises(AssertionError):
        _disjoint_source(zoo.WorldData(data.train, data.train[-16:], data.d_vocab, None, data.world), recipe)
