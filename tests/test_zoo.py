"""The zoo: recipes build into loadable models, by name, with their cards; bad names are clear errors."""

import json
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
    if name == "pydoc":
        assert card["val_perplexity"] > 1 and card["unigram_perplexity"] > card["bigram_perplexity"] > 1
        assert len(card["samples"]) == 3


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
