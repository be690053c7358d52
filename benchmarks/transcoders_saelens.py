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

--model smollm2: training throughput at real size. A top-k autoencoder (1,024 features, k = 16) of smollm2's
blocks.15.hook_mlp_out (d_model 576), trained on the same tokens (SMOLLM2.tokens) of held-out windows of the real corpus
(`forma corpus real`) in batches of SMOLLM2.batch rows, once by each side: SAELens' LanguageModelSAETrainingRunner
over TransformerLens 3.9's HookedTransformer of smollm2 (benchmarks/harvest_saelens.py's tl_llama; it runs the model
as it trains), and Forma's harvest (save_activations, to disk) then train_transcoders (out of core). Tokens per
second of each whole run (Forma's: harvest and training; its training alone beside), and each one's FVU and L0 on
held-out windows. Writes benchmarks/results/transcoders_saelens_smollm2.json.

    .venv-sae/bin/python -m benchmarks.transcoders_saelens [--l1 1] [--model smollm2 [--corpus corpora/real] [--quick]]
"""

import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from benchmarks.harvest_saelens import tl_llama
from benchmarks.summary import write_summary
from benchmarks.timing import machine, write
from lab import HookedTransformer, ModelConfig
from lab.analysis.activations.store import save_activations
from lab.analysis.transcoders.model import TranscoderConfig
from lab.analysis.transcoders.train import TranscoderTraining, train_transcoders
from lab.data.sources import MarkovSource
from lab.folders import zoo_model_dir
from lab.load import load_model
from lab.zoo.transcoders import corpus_windows

HOOK = "blocks.0.hook_mlp_out"
D_MODEL, D_SAE, K, SEQ_LEN, TOKENS, BATCH, LR = 32, 64, 4, 16, 65_536, 512, 3e-3
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Setting:
    """What both trainers are given: the hook, the autoencoder's shape, the tokens and SAELens' store."""

    hook: str = HOOK
    d_in: int = D_MODEL
    d_sae: int = D_SAE
    k: int = K
    seq_len: int = SEQ_LEN
    tokens: int = TOKENS
    batch: int = BATCH
    lr: float = LR
    store_prompts: int = 64  # SAELens' store_batch_size_prompts
    buffer_batches: int = 64  # SAELens' n_batches_in_buffer


TINY = Setting()
SMOLLM2 = Setting(
    hook="blocks.15.hook_mlp_out",
    d_in=576,
    d_sae=1024,
    k=16,
    seq_len=128,
    tokens=8_192,
    batch=512,
    lr=1e-3,
    store_prompts=8,
    buffer_batches=4,
)
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


def train_saelens(
    model: HookedTransformer, data: torch.Tensor, kind: str, l1: float, folder: Path, setting: Setting = TINY
) -> Any:
    from datasets import Dataset
    from sae_lens import (
        LanguageModelSAERunnerConfig,
        LanguageModelSAETrainingRunner,
        StandardTrainingSAEConfig,
        TopKTrainingSAEConfig,
    )
    from sae_lens.config import LoggingConfig

    sae = (
        TopKTrainingSAEConfig(d_in=setting.d_in, d_sae=setting.d_sae, k=setting.k)
        if kind == "topk"
        else StandardTrainingSAEConfig(d_in=setting.d_in, d_sae=setting.d_sae, l1_coefficient=l1)
    )
    config = LanguageModelSAERunnerConfig(
        sae=sae,
        model_name="forma",
        hook_name=setting.hook,
        dataset_path="",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=setting.seq_len,
        prepend_bos=False,
        training_tokens=setting.tokens,
        train_batch_size_tokens=setting.batch,
        store_batch_size_prompts=setting.store_prompts,
        n_batches_in_buffer=setting.buffer_batches,
        lr=setting.lr,
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


def throughput(corpus: Path, setting: Setting = SMOLLM2) -> dict[str, Any]:
    """The --model smollm2 comparison (the module's docstring): each side's tokens/s, FVU and L0."""
    from transformers import AutoModelForCausalLM

    folder = zoo_model_dir("smollm2")
    hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    tl, ours = tl_llama(hf, "cpu", setting.seq_len), load_model(folder).eval()
    windows = corpus_windows(corpus, setting.tokens // setting.seq_len + 8, setting.seq_len, split="val")
    data, held_out_tokens = windows[:-8], windows[-8:]
    layer = int(setting.hook.split(".")[1])
    cfg = TranscoderConfig(
        d_model=setting.d_in,
        n_layers=1,
        d_features=setting.d_sae,
        activation="topk",
        k=setting.k,
        input_hook="blocks.{layer}.hook_mlp_out",
        output_hook="blocks.{layer}.hook_mlp_out",
        layers=(layer,),
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        held_out = save_activations(ours, held_out_tokens, cfg.hooks(), tmp / "held_out", progress=False)
        x = held_out.load().acts[setting.hook]
        (tmp / "saelens").mkdir()
        start = time.perf_counter()
        sae = train_saelens(tl, data, "topk", 0.0, tmp / "saelens", setting)
        saelens_s = time.perf_counter() - start
        start = time.perf_counter()
        store = save_activations(ours, data, cfg.hooks(), tmp / "train", positions="all", progress=False)
        harvest_s = time.perf_counter() - start
        training = TranscoderTraining(steps=setting.tokens // setting.batch, batch_size=setting.batch, lr=setting.lr)
        trained = train_transcoders(store, cfg, training, tmp / "forma")
        forma_s = time.perf_counter() - start
        with torch.no_grad():
            features = sae.encode(x)
            saelens = measures(x, sae.decode(features), features)
            acts = trained.activate(trained.encode(x[:, None]))
            forma = measures(x, trained.decode(acts)[:, 0], acts[:, 0])
    n = data.numel()
    return {
        "setting": vars(setting) | {"training_tokens": n},
        "saelens": saelens | {"seconds": saelens_s, "tokens_per_s": n / saelens_s},
        "forma": forma
        | {
            "seconds": forma_s,
            "harvest_seconds": harvest_s,
            "tokens_per_s": n / forma_s,
            "training_tokens_per_s": n / (forma_s - harvest_s),
        },
        "throughput_ratio_forma_over_saelens": saelens_s / forma_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--l1", type=float, default=L1, help="SAELens' L1 coefficient (relu)")
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny", help="smollm2: training throughput")
    parser.add_argument("--corpus", type=Path, default=REPO / "corpora" / "real", help="smollm2's real corpus")
    parser.add_argument("--quick", action="store_true", help="smollm2: a smoke run of 1,024 tokens, nothing written")
    args = parser.parse_args()
    if args.model == "smollm2":
        torch.manual_seed(0)
        quick = Setting(**vars(SMOLLM2) | {"tokens": 1024, "batch": 256, "store_prompts": 2})
        result = throughput(args.corpus, quick if args.quick else SMOLLM2)
        print(json.dumps(result), flush=True)
        if args.quick:
            return
        payload = {
            "machine": machine(),
            "sae_lens": version("sae-lens"),
            "model": "smollm2",
            "corpus": args.corpus.name,
        }
        write("transcoders_saelens_smollm2", payload | result)
        write_summary()
        return
    results = {"machine": machine(), "sae_lens": version("sae-lens")}
    results["kinds"] = {kind: compare(kind, args.l1) for kind in ("topk", "relu")}
    write("transcoders_saelens", results)


if __name__ == "__main__":
    main()
