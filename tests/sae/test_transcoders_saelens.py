"""Forma's transcoder trainer against SAELens' trainer where both train the same kind: a top-k sparse autoencoder
(a transcoder whose input and output hook are the same) of one hook of a tiny trained Forma model, the same
activations, the same k (so the same L0), the same number of training tokens and batch size. SAELens trains no
transcoders (its Transcoder classes load pretrained ones), so the autoencoder is where the two meet. Compared:
the fraction of variance unexplained on held-out activations, each trainer with its own defaults otherwise.

Runs in the SAE environment only (`make test-sae`)."""

import json
import os

import pytest
import torch

from lab import HookedTransformer, ModelConfig
from lab.analysis.activations import save_activations
from lab.analysis.transcoders.measures import reconstruction_measures
from lab.analysis.transcoders.model import TranscoderConfig
from lab.analysis.transcoders.train import TranscoderTraining, train_transcoders
from tests.builders import markov_tokens

HOOK = "blocks.0.hook_mlp_out"
K, D_SAE, TOKENS, BATCH = 4, 64, 65_536, 512

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    model = HookedTransformer(ModelConfig(d_vocab=32, d_model=32, n_layers=2, n_heads=4, n_ctx=32), seed=0)
    data = markov_tokens(4096, 16, 32, 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(200):
        loss = model(data[torch.randint(0, len(data), (64,))], return_type="loss")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), data


@pytest.mark.slow
def test_forma_top_k_matches_saelens_top_k_fvu_at_equal_l0(trained, tmp_path):
    from datasets import Dataset
    from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner, TopKTrainingSAEConfig
    from sae_lens.config import LoggingConfig

    model, data = trained
    config = LanguageModelSAERunnerConfig(
        sae=TopKTrainingSAEConfig(d_in=32, d_sae=D_SAE, k=K),
        model_name="forma",
        hook_name=HOOK,
        dataset_path="",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=16,
        prepend_bos=False,
        training_tokens=TOKENS,
        train_batch_size_tokens=BATCH,
        store_batch_size_prompts=64,
        n_batches_in_buffer=64,
        lr=3e-3,
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
    os.chdir(tmp_path)
    try:
        sae = LanguageModelSAETrainingRunner(
            config, override_model=model, override_dataset=Dataset.from_dict({"tokens": data.tolist()})
        ).run()
    finally:
        os.chdir(here)
    cfg = TranscoderConfig(
        d_model=32,
        n_layers=1,
        d_features=D_SAE,
        activation="topk",
        k=K,
        input_hook="blocks.{layer}.hook_mlp_out",
        output_hook="blocks.{layer}.hook_mlp_out",
    )
    store = save_activations(model, data, cfg.hooks(), tmp_path / "train", positions="all", progress=False)
    ours = train_transcoders(
        store, cfg, TranscoderTraining(steps=TOKENS // BATCH, batch_size=BATCH, lr=3e-3), tmp_path / "forma"
    )
    held_out = save_activations(
        model, markov_tokens(256, 16, 32, 1), cfg.hooks(), tmp_path / "held_out", positions="all", progress=False
    )
    forma = reconstruction_measures(ours, held_out)
    x = held_out.load().acts[HOOK]
    with torch.no_grad():
        features = sae.encode(x)
        error = (sae.decode(features) - x).pow(2).sum()
    saelens = {"fvu": float(error / (x - x.mean(0)).pow(2).sum()), "l0": float((features > 0).sum(-1).float().mean())}
    result = {
        "hook": HOOK,
        "k": K,
        "d_sae": D_SAE,
        "training_tokens": TOKENS,
        "forma_fvu": forma["fvu"][0],
        "forma_l0": forma["l0"][0],
        "saelens_fvu": saelens["fvu"],
        "saelens_l0": saelens["l0"],
    }
    print("top-k autoencoders, Forma against SAELens:", json.dumps(result))
    assert forma["l0"][0] == pytest.approx(saelens["l0"], abs=0.5)  # equal L0 (each ≤ k: a feature may be 0)
    assert forma["fvu"][0] < 1.2 * saelens["fvu"], result
