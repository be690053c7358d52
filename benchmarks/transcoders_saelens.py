"""Forma's transcoder trainer against SAELens' trainer at equal L0, where both train the same kind.

SAELens trains no transcoders (its Transcoder classes load pretrained ones), so the two meet on a sparse autoencoder:
a transcoder whose input and output hook are the same (blocks.0.hook_mlp_out of a tiny Forma model trained for a
moment on an order-1 Markov chain), the same activations, the same number of features, training tokens and batch
size, each trainer with its own defaults otherwise. Measured on held-out activations by one definition for both:
FVU = Σ‖x̂ − x‖² / Σ‖x − x̄‖², L0 (active features a row) and the share of dead features.

    topk   the same k on both sides, so the same L0 (each ≤ k: a chosen feature may be 0).
    relu   SAELens' standard ReLU autoencoder with L1 coefficient --l1 sets the L0; Forma's ReLU transcoder's
           sparsity λ (its decoder-norm-weighted L1, on an FVU-scaled loss: not SAELens' scale) is then found by
           bisection on log λ until its L0 is within TOLERANCE (relative) of SAELens', and the FVUs compared there;
           once with Forma's own schedule (λ ramped up over the first fifth of the steps, the rate decayed over the
           last fifth: "forma") and once with SAELens' (λ whole from the start, a constant rate:
           "forma_saelens_schedule"), since on a run this short the schedule, not the objective, decides the FVU.

Runs in the SAE environment (.venv-sae: sae-lens beside transformer-lens 3.9); writes
benchmarks/results/transcoders_saelens.json, which docs/attribution-graphs.md reads.
tests/sae/test_transcoders_saelens.py runs the same comparison.

    .venv-sae/bin/python -m benchmarks.transcoders_saelens [--l1 1]
"""

import argparse
import json
import math
import os
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from benchmarks.timing import machine, write
from lab import HookedTransformer, ModelConfig
from lab.analysis.activations.store import save_activations
from lab.analysis.transcoders.model import TranscoderConfig
from lab.analysis.transcoders.train import TranscoderTraining, train_transcoders
from lab.data.sources import MarkovSource

HOOK = "blocks.0.hook_mlp_out"
D_MODEL, D_SAE, K, SEQ_LEN, TOKENS, BATCH, LR = 32, 64, 4, 16, 65_536, 512, 3e-3
TOLERANCE = 0.05  # the L0s at which FVUs are compared differ by at most this share of SAELens' L0
L1 = 1.0  # SAELens' L1 coefficient for the ReLU comparison
MAX_BISECTIONS = 12
# SAELens' own schedule for its standard autoencoder: the L1 coefficient whole from the first step, a constant rate
SAELENS_SCHEDULE = {"sparsity_warmup": 0.0, "decay_from": 1.0}


def tiny_model() -> tuple[HookedTransformer, torch.Tensor, torch.Tensor]:
    """A 2-layer model trained 200 steps on an order-1 Markov chain of 32 tokens (so that its activations have
    structure), with its training sequences and 256 held-out ones."""
    source = MarkovSource(vocab_size=32, order=1, concentration=0.3, seed=0)
    data = torch.from_numpy(source.sample(4096, SEQ_LEN, seed=0)).long()
    held_out = torch.from_numpy(source.sample(256, SEQ_LEN, seed=1)).long()
    torch.manual_seed(0)
    model = HookedTransformer(ModelConfig(d_vocab=32, d_model=D_MODEL, n_layers=2, n_heads=4, n_ctx=32), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(200):
        loss = model(data[torch.randint(0, len(data), (64,))], return_type="loss")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), data, held_out


def measures(x: torch.Tensor, reconstruction: torch.Tensor, acts: torch.Tensor) -> dict[str, float]:
    """FVU, L0 and dead share of one autoencoder on rows x (the definition lab.analysis.transcoders.measures uses)."""
    x, reconstruction = x.double(), reconstruction.double()
    on = acts > 0
    return {
        "fvu": float((reconstruction - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum()),
        "l0": float(on.sum(-1).double().mean()),
        "dead": float(1 - on.any(0).double().mean()),
    }


def train_saelens(model: HookedTransformer, data: torch.Tensor, kind: str, l1: float, folder: Path) -> Any:
    from datasets import Dataset
    from sae_lens import (
        LanguageModelSAERunnerConfig,
        LanguageModelSAETrainingRunner,
        StandardTrainingSAEConfig,
        TopKTrainingSAEConfig,
    )
    from sae_lens.config import LoggingConfig

    sae = (
        TopKTrainingSAEConfig(d_in=D_MODEL, d_sae=D_SAE, k=K)
        if kind == "topk"
        else StandardTrainingSAEConfig(d_in=D_MODEL, d_sae=D_SAE, l1_coefficient=l1)
    )
    config = LanguageModelSAERunnerConfig(
        sae=sae,
        model_name="forma",
        hook_name=HOOK,
        dataset_path="",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=SEQ_LEN,
        prepend_bos=False,
        training_tokens=TOKENS,
        train_batch_size_tokens=BATCH,
        store_batch_size_prompts=64,
        n_batches_in_buffer=64,
        lr=LR,
        seed=0,
        device="cpu",
        exclude_special_tokens=False,
        logger=LoggingConfig(log_to_wandb=False),
        n_checkpoints=0,
        checkpoint_path=None,
        output_path=None,
        verbose=False,
    )
    here = os.getcwd()
    os.chdir(folder)  # SAELens writes beside the working directory
    try:
        return LanguageModelSAETrainingRunner(
            config, override_model=model, override_dataset=Dataset.from_dict({"tokens": data.tolist()})
        ).run()
    finally:
        os.chdir(here)


def compare(kind: str, l1: float = L1) -> dict[str, Any]:
    """One kind's comparison (see the module's docstring): each side's held-out FVU, L0 and dead share, and for
    relu Forma's λ search."""
    model, data, held_out_tokens = tiny_model()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = TranscoderConfig(
            d_model=D_MODEL,
            n_layers=1,
            d_features=D_SAE,
            activation=kind,
            k=K if kind == "topk" else 0,
            input_hook="blocks.{layer}.hook_mlp_out",
            output_hook="blocks.{layer}.hook_mlp_out",
        )
        store = save_activations(model, data, cfg.hooks(), tmp / "train", positions="all", progress=False)
        held_out = save_activations(
            model, held_out_tokens, cfg.hooks(), tmp / "held_out", positions="all", progress=False
        )
        x = held_out.load().acts[HOOK]
        (tmp / "saelens").mkdir()
        sae = train_saelens(model, data, kind, l1, tmp / "saelens")
        with torch.no_grad():
            features = sae.encode(x)
            saelens = measures(x, sae.decode(features), features)

        def forma(sparsity: float, run: str, schedule: dict[str, float]) -> dict[str, float]:
            training = TranscoderTraining(steps=TOKENS // BATCH, batch_size=BATCH, lr=LR, sparsity=sparsity, **schedule)
            ours = train_transcoders(store, cfg, training, tmp / f"forma-{run}")
            with torch.no_grad():
                acts = ours.activate(ours.encode(x[:, None]))
                return {"sparsity": sparsity, **measures(x, ours.decode(acts)[:, 0], acts[:, 0])}

        def at_saelens_l0(schedule: dict[str, float], name: str) -> tuple[dict[str, float], list[dict[str, float]]]:
            """Bisection on log λ (L0 falls as λ grows) until Forma's L0 is within TOLERANCE of SAELens'."""
            low, high, search = math.log(1e-4), math.log(10.0), []
            for run in range(MAX_BISECTIONS):
                search.append(forma(math.exp((low + high) / 2), f"{name}{run}", schedule))
                gap = search[-1]["l0"] - saelens["l0"]
                if abs(gap) <= TOLERANCE * saelens["l0"]:
                    break
                low, high = ((low + high) / 2, high) if gap > 0 else (low, (low + high) / 2)
            return min(search, key=lambda r: abs(r["l0"] - saelens["l0"])), search

        if kind == "topk":
            sides = {"forma": (forma(0.0, "topk", {}), [])}
        else:
            sides = {
                "forma": at_saelens_l0({}, "default"),
                "forma_saelens_schedule": at_saelens_l0(SAELENS_SCHEDULE, "same"),
            }
    result = _result(kind, l1, saelens, sides)
    print(kind, json.dumps(result), flush=True)
    return result


def _result(kind: str, l1: float, saelens: dict[str, float], sides: dict[str, tuple]) -> dict[str, Any]:
    """One kind's record: the setting, SAELens' measures, and each Forma side's measures with its gap to
    SAELens' L0, its FVU over SAELens', and its λ search."""
    result: dict[str, Any] = {
        "kind": kind,
        "hook": HOOK,
        "d_sae": D_SAE,
        "training_tokens": TOKENS,
        "batch": BATCH,
        "lr": LR,
        "k": K if kind == "topk" else None,
        "saelens_l1_coefficient": l1 if kind == "relu" else None,
        "l0_tolerance": TOLERANCE,
        "saelens": saelens,
    }
    for side, (ours, search) in sides.items():
        result[side] = ours | {
            "l0_relative_gap": abs(ours["l0"] - saelens["l0"]) / saelens["l0"],
            "fvu_ratio_over_saelens": ours["fvu"] / saelens["fvu"],
            "search": search,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--l1", type=float, default=L1, help="SAELens' L1 coefficient (relu)")
    args = parser.parse_args()
    results = {"machine": machine(), "sae_lens": version("sae-lens")}
    results["kinds"] = {kind: compare(kind, args.l1) for kind in ("topk", "relu")}
    write("transcoders_saelens", results)


if __name__ == "__main__":
    main()
