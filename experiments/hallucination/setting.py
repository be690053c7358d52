"""The world at one Pareto shape γ as token ids (which tokens the grammar allows at each position of a document),
and the model that learns it."""

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from experiments.hallucination.config import Config
from lab.data.facts import FactWorld, FactWorldConfig
from lab.data.tokenizers import word_level
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer


# --------------------------------------------------------------------------------------------
# The world as token ids
# --------------------------------------------------------------------------------------------
@dataclass
class Setting:
    """One world and the token ids its grammar allows at each position of a document.

    Factoid y = (first i, last j, value v) has the flat index (i · n_last + j) · n_values + v.
    """

    world: FactWorld
    tokenizer: Any
    bos_id: int
    first_ids: Int[Tensor, " n_first"]
    last_ids: Int[Tensor, " n_last"]
    attribute_id: int
    value_ids: Int[Tensor, "n_values value_len"]
    fact_first: np.ndarray  # [n_facts] index into first names
    fact_last: np.ndarray
    fact_value: np.ndarray
    fact_y: np.ndarray  # flat factoid index of each fact
    train_rows: Int[Tensor, "n_train doc_len"]
    heldout_rows: Int[Tensor, "n_heldout doc_len"]  # independent draws from p: the held-out NLL
    heldout_draws: dict[str, Any]  # how they were drawn and their overlap with training (FactWorld.heldout_record)

    @property
    def shape(self) -> tuple[int, int, int]:
        return len(self.first_ids), len(self.last_ids), len(self.value_ids)

    @property
    def n_factoids(self) -> int:
        return int(np.prod(self.shape))

    @property
    def doc_len(self) -> int:
        return 4 + self.value_ids.shape[1]


def make_setting(cfg: Config, gamma: float) -> Setting:
    """The world at shape γ (persons and facts do not depend on γ; popularity and the sample do)."""
    world = FactWorld(
        FactWorldConfig(
            n_first_names=cfg.n_first_names,
            n_last_names=cfg.n_last_names,
            n_persons=cfg.n_persons,
            attributes=(cfg.attribute,),
            pareto_gamma=gamma,
            n_train=cfg.n_train,
            seed=cfg.seed,
            n_values=cfg.n_values,
        )
    )
    tokenizer = word_level(world.word_vocabulary())
    vocab = tokenizer.get_vocab()
    values = world.value_spaces[cfg.attribute]
    value_words = [v.split() for v in values]
    if len({len(w) for w in value_words}) != 1:
        raise ValueError(f"every {cfg.attribute} value must have the same number of words (fixed-length documents)")
    first_index = {name: i for i, name in enumerate(world.first_names)}
    last_index = {name: j for j, name in enumerate(world.last_names)}
    value_index = {v: k for k, v in enumerate(values)}
    fact_first = np.array([first_index[world.persons[f.person_index].first] for f in world.facts])
    fact_last = np.array([last_index[world.persons[f.person_index].last] for f in world.facts])
    fact_value = np.array([value_index[f.value] for f in world.facts])
    n_last, n_values = len(world.last_names), len(values)
    heldout = world.heldout_fact_indices(cfg.n_heldout)  # independent draws from p, not unseen facts

    def rows(fact_indices: np.ndarray) -> Tensor:
        # The bare render "{first} {last} {attribute} {value} ." without its constant final ".".
        texts = ["<bos> " + world.render(world.facts[i], "bare").removesuffix(" .") for i in fact_indices]
        return torch.tensor([e.ids for e in tokenizer.encode_batch(texts)], dtype=torch.long)

    return Setting(
        world=world,
        tokenizer=tokenizer,
        bos_id=vocab["<bos>"],
        first_ids=torch.tensor([vocab[w] for w in world.first_names]),
        last_ids=torch.tensor([vocab[w] for w in world.last_names]),
        attribute_id=vocab[cfg.attribute],
        value_ids=torch.tensor([[vocab[w] for w in words] for words in value_words]),
        fact_first=fact_first,
        fact_last=fact_last,
        fact_value=fact_value,
        fact_y=(fact_first * n_last + fact_last) * n_values + fact_value,
        train_rows=rows(world.train_fact_indices),
        heldout_rows=rows(heldout),
        heldout_draws=world.heldout_record(heldout, "documents"),
    )


def make_model(cfg: Config, setting: Setting) -> HookedTransformer:
    model_cfg = ModelConfig(
        d_vocab=setting.tokenizer.get_vocab_size(),
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_ctx=setting.doc_len,
        tokenizer="facts-word-level",
    )
    return HookedTransformer(model_cfg, seed=cfg.seed, tokenizer=setting.tokenizer)
