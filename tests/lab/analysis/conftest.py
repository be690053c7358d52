"""Fixtures of the analysis tests: a private zoo for `forma transcoders` (in one process and on two ranks)."""

import json
import shutil

import pytest

from lab import HookedTransformer, ModelConfig
from lab.folders import DEFAULT_ZOO_DIR


@pytest.fixture
def markov_zoo(tmp_path, monkeypatch):
    """A private zoo whose markov model is a tiny untrained one with a quick world (its recipe.json)."""
    folder = tmp_path / "models" / "markov"
    folder.mkdir(parents=True)
    shutil.copy(DEFAULT_ZOO_DIR / "markov" / "model.toml", folder / "model.toml")
    world = {
        "kind": "markov",
        "vocab_size": 32,
        "order": 2,
        "concentration": 0.5,
        "seed": 0,
        "n_sequences": 256,
        "val_sequences": 64,
    }
    (folder / "recipe.json").write_text(
        json.dumps({"format": "forma-build/1", "name": "markov", "quick": True, "world": world})
    )
    HookedTransformer(ModelConfig(d_vocab=32, d_model=32, n_layers=2, n_heads=4, n_ctx=16), seed=0).save(folder)
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path / "models"))
    return folder
