"""SAELens' own trainer trains a sparse autoencoder on a hook of a Forma model, with no adapter.

Runs in the SAE environment only (`make test-sae`: .venv-sae from constraints-sae.txt, `forma-lab[sae]`:
transformer-lens 3.9 beside sae-lens, which does not install beside transformer-lens 4). What SAELens calls
is Forma's own API: `run_with_cache(tokens, names_filter=[hook], stop_at_layer=L, prepend_bos=False)` to
harvest, `model(tokens, return_type="both", loss_per_token=True)` and `run_with_hooks(...)` to evaluate.
Nothing is fetched: the model is passed as `override_model`, the data as an in-memory tokenized dataset.
"""

import json

import pytest
import sae_lens  # the SAE environment has it (make test-sae); the main run leaves tests/sae out
import torch

from lab import HookedTransformer, ModelConfig

HOOK = "blocks.0.hook_resid_post"
SEED = 0


def markov_tokens(n_seq: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """Sequences of one fixed order-1 chain with peaked rows (so the residual stream has structure)."""
    g = torch.Generator().manual_seed(SEED)
    rows = (-torch.log(torch.rand(vocab, vocab, generator=g))) ** (1 / 0.3)
    transition = rows / rows.sum(-1, keepdim=True)
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.empty(n_seq, seq_len, dtype=torch.long)
    x[:, 0] = torch.randint(0, vocab, (n_seq,), generator=g)
    for t in range(1, seq_len):
        x[:, t] = torch.multinomial(transition[x[:, t - 1]], 1, generator=g).squeeze(1)
    return x


@pytest.fixture(scope="module")
def trained():
    """A tiny Forma model trained for a few hundred steps on the chain, in eval mode, and its data."""
    torch.manual_seed(SEED)
    cfg = ModelConfig(d_vocab=32, d_model=32, n_layers=2, n_heads=4, n_ctx=32, mlp="gelu")
    model = HookedTransformer(cfg, seed=SEED)
    data = markov_tokens(2048, 16, cfg.d_vocab, SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(200):
        loss = model(data[torch.randint(0, len(data), (64,))], return_type="loss")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), data


def runner_config(d_model: int, out) -> "sae_lens.LanguageModelSAERunnerConfig":
    from sae_lens import LanguageModelSAERunnerConfig, StandardTrainingSAEConfig
    from sae_lens.config import LoggingConfig

    return LanguageModelSAERunnerConfig(
        sae=StandardTrainingSAEConfig(d_in=d_model, d_sae=4 * d_model, l1_coefficient=2.0),
        model_name="forma-tiny-markov", hook_name=HOOK, dataset_path="", is_dataset_tokenized=True,
        streaming=False, context_size=16, prepend_bos=False, training_tokens=60_000,
        train_batch_size_tokens=512, store_batch_size_prompts=64,
        # SAELens' buffer (n_batches_in_buffer × context_size tokens) must hold a training batch
        n_batches_in_buffer=64, lr=3e-3, device="cpu", seed=SEED, exclude_special_tokens=False,
        logger=LoggingConfig(log_to_wandb=False), n_checkpoints=0, checkpoint_path=str(out / "checkpoints"),
        output_path=str(out / "final"), verbose=False)


@pytest.fixture(scope="module")
def sae(trained, tmp_path_factory):
    """SAELens' LanguageModelSAETrainingRunner on the Forma model itself (override_model, no adapter)."""
    from datasets import Dataset
    from sae_lens import LanguageModelSAETrainingRunner

    model, data = trained
    config = runner_config(model.cfg.d_model, tmp_path_factory.mktemp("sae"))
    dataset = Dataset.from_dict({"tokens": data.tolist()})  # tokenized, in memory: no hub
    return LanguageModelSAETrainingRunner(config, override_dataset=dataset, override_model=model).run().eval(), config


@pytest.mark.slow
def test_saelens_trains_an_sae_on_a_forma_hook_and_it_splices_back(trained, sae, tmp_path):
    model, _ = trained
    sae, _ = sae
    held_out = markov_tokens(512, 16, model.cfg.d_vocab, SEED + 1)
    with torch.no_grad():
        clean = model(held_out, return_type="loss").item()
        spliced = model.run_with_hooks(held_out, return_type="loss",
                                       fwd_hooks=[(HOOK, lambda act, hook: sae(act))]).item()
        ablated = model.run_with_hooks(held_out, return_type="loss",
                                       fwd_hooks=[(HOOK, lambda act, hook: torch.zeros_like(act))]).item()
    recovered = (ablated - spliced) / (ablated - clean)
    result = {"hook": HOOK, "clean_loss": clean, "sae_spliced_loss": spliced, "zero_ablated_loss": ablated,
              "loss_recovered_fraction": recovered}
    (tmp_path / "result.json").write_text(json.dumps(result, indent=1))
    print("SAELens on a Forma hook:", json.dumps(result))
    assert clean < spliced < ablated  # the SAE reconstructs the stream, imperfectly


@pytest.mark.slow
def test_saelens_evaluation_runs_on_forma(trained, sae):
    """SAELens' evaluator on the trained SAE: its ActivationsStore harvests with stop_at_layer (the same
    activations run_with_cache gives), and run_evals reads the per-token loss, with and without the SAE."""
    from datasets import Dataset
    from sae_lens.evals import EvalConfig, run_evals
    from sae_lens.training.activation_scaler import ActivationScaler
    from sae_lens.training.activations_store import ActivationsStore

    model, data = trained
    sae, config = sae
    store = ActivationsStore.from_config(model, config, override_dataset=Dataset.from_dict({"tokens": data[:512].tolist()}))
    batch = store.get_batch_tokens(4)
    harvested = store.get_activations(batch)  # run_with_cache(..., stop_at_layer=1, prepend_bos=False)
    _, cache = model.run_with_cache(batch, names_filter=HOOK)
    assert torch.allclose(harvested.squeeze(2), cache[HOOK], atol=1e-6)
    metrics, _ = run_evals(sae, store, model, ActivationScaler(),
                           EvalConfig(batch_size_prompts=8, n_eval_reconstruction_batches=2,
                                      n_eval_sparsity_variance_batches=2, compute_ce_loss=True, compute_kl=True),
                           exclude_special_tokens=False)
    losses = metrics["model_performance_preservation"]
    assert losses["ce_loss_without_sae"] < losses["ce_loss_with_sae"] < losses["ce_loss_with_ablation"]
