"""The world, its subjects (seen, unseen and invented, each drawn into fit, calibration or test) and the model
trained on its statements."""

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from experiments.monitor.config import ATTRIBUTE, SPLITS, Config
from lab.data.facts import FactWorld, FactWorldConfig
from lab.data.tokenizers import word_level
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer
from lab.train.batches import SequenceBatches
from lab.train.config import TrainConfig
from lab.train.loop import train


# --------------------------------------------------------------------------------------------
# The world, the subjects and the model
# --------------------------------------------------------------------------------------------
@dataclass
class Setting:
    """The world, its tokenizer, and one row per subject: its name, kind, split and true value (None: invented)."""

    world: FactWorld
    tokenizer: Any
    subjects: pd.DataFrame  # first, last, kind, person (−1 invented), exposure, split, truth
    train_rows: Tensor
    heldout_rows: Tensor  # independent draws from p for training's held-out loss
    held_out: dict[str, Any]  # how they were drawn and their overlap with training (FactWorld.heldout_record)

    @property
    def prompts(self) -> Tensor:
        """ "<bos> First Last birthday" for every subject, [n_subjects, 4]."""
        texts = [f"<bos> {f} {l} {ATTRIBUTE}" for f, l in zip(self.subjects["first"], self.subjects["last"])]
        return torch.tensor([e.ids for e in self.tokenizer.encode_batch(texts)], dtype=torch.long)

    @property
    def value_len(self) -> int:
        return len(self.world.value_spaces[ATTRIBUTE][0].split())


def make_setting(cfg: Config) -> Setting:
    world = FactWorld(
        FactWorldConfig(
            n_first_names=cfg.n_first_names,
            n_last_names=cfg.n_last_names,
            n_persons=cfg.n_persons,
            attributes=(ATTRIBUTE,),
            pareto_gamma=cfg.pareto_gamma,
            n_train=cfg.n_train,
            seed=cfg.seed,
        )
    )
    tokenizer = word_level(world.word_vocabulary())
    exposure = world.train_counts  # one attribute: a fact's training count is its person's exposure
    taken = {(p.first, p.last) for p in world.persons}
    rng = np.random.default_rng([cfg.seed, 22])
    invented: list[tuple[str, str]] = []
    for flat in rng.permutation(len(world.first_names) * len(world.last_names)):
        pair = (world.first_names[flat // len(world.last_names)], world.last_names[flat % len(world.last_names)])
        if pair not in taken:
            invented.append(pair)
            if len(invented) == cfg.n_invented:
                break
    rows = [
        {
            "first": p.first,
            "last": p.last,
            "kind": "seen" if exposure[i] > 0 else "unseen",
            "person": i,
            "exposure": int(exposure[i]),
            "truth": world.true_value(i, ATTRIBUTE),
        }
        for i, p in enumerate(world.persons)
    ]
    rows += [
        {"first": f, "last": l, "kind": "invented", "person": -1, "exposure": 0, "truth": None} for f, l in invented
    ]
    subjects = pd.DataFrame(rows)
    # Each subject on one side only: fit, calibration or test, drawn independently of its kind.
    cuts = np.cumsum(cfg.split_fractions)[:-1]
    draw = np.random.default_rng([cfg.seed, 23]).random(len(subjects))
    subjects["split"] = np.array(SPLITS)[np.searchsorted(cuts, draw, side="right")]

    def encode(indices: np.ndarray) -> Tensor:
        texts = [f"<bos> {world.render(world.facts[i], 'bare')} <eos>" for i in indices]
        return torch.tensor([e.ids for e in tokenizer.encode_batch(texts)], dtype=torch.long)

    heldout = world.heldout_fact_indices(max(200, cfg.n_train // 4))  # independent draws from p, not unseen facts
    return Setting(
        world, tokenizer, subjects, encode(world.train_fact_indices), encode(heldout), world.heldout_record(heldout)
    )


def train_model(cfg: Config, setting: Setting) -> tuple[HookedTransformer, dict[str, Any]]:
    model_cfg = ModelConfig(
        d_vocab=setting.tokenizer.get_vocab_size(),
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_ctx=setting.train_rows.shape[1],
        positions="learned",
        mlp="gelu",
        tokenizer="facts-word-level",
    )
    model = HookedTransformer(model_cfg, seed=cfg.seed, tokenizer=setting.tokenizer)
    train_cfg = TrainConfig(
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        seq_len=setting.train_rows.shape[1],
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        warmup_steps=cfg.warmup_steps,
        eval_interval=cfg.steps,
        eval_batches=1,
        checkpoint_every_s=0.0,
        seed=cfg.seed,
    )
    with tempfile.TemporaryDirectory(prefix="monitor-") as tmp:
        result = train(
            model, train_cfg, SequenceBatches(setting.train_rows, setting.heldout_rows), Path(tmp), progress=False
        )
    return model.eval(), {
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "n_params": model_cfg.n_params(),
        "train_loss_nats": result.train_loss_nats,
        "heldout_loss_nats": result.best_val_loss_nats,
        "train_s": result.elapsed_s,
    }
