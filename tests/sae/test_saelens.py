"""SAELens' own trainer trains a sparse autoencoder on a hook of a Forma model, with no adapter.

Runs in the SAE environment only (`make test-sae`: .venv-sae from constraints-sae.txt, `forma-lab[sae]`:
transformer-lens 3.9 beside sae-lens, which does not install beside transformer-lens 4). What SAELens calls
is Forma's own API: `run_with_cache(tokens, names_filter=[hook], stop_at_layer=L, prepend_bos=False)` to
harvest, `model(tokens, return_type="both", loss_per_token=True)` and `run_with_hooks(...)` to evaluate.
Nothing is fetched: the model is passed as `override_model`, the data as an in-memory tokenized dataset.
"""

import json
import os
import re
from pathlib import Path

import pytest
import sae_lens  # noqa: F401  (the SAE environment has it (make test-sae); the main run leaves tests/sae out)
import torch

from lab import HookedTransformer, ModelConfig
from tests.builders import markov_tokens

HOOK = "blocks.0.hook_resid_post"
SEED = 0
PAGE = Path(__file__).resolve().parents[2] / "docs" / "ecosystem.md"


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


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


def the_pages_example() -> str:
    """docs/ecosystem.md's SAELens example: the one ```py block of its SAELens section."""
    section = PAGE.read_text().split("\n## SAELens\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```py\n(.*?)^```", section, flags=re.S | re.M)
    assert len(blocks) == 1, f"{PAGE.name}'s SAELens section has {len(blocks)} py blocks"
    return blocks[0]


@pytest.fixture(scope="module")
def sae(trained, tmp_path_factory):
    """The page's example as written: SAELens' LanguageModelSAETrainingRunner on the Forma model itself
    (override_model, no adapter), run in a temporary folder; its SAE, its config and its spliced loss."""
    model, data = trained
    namespace = {"model": model, "cfg": model.cfg, "data": data}
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("sae"))  # anything SAELens writes stays out of the checkout
    try:
        exec(compile(the_pages_example(), str(PAGE), "exec"), namespace)
    finally:
        os.chdir(here)
    assert namespace["config"].hook_name == HOOK
    return namespace["sae"].eval(), namespace["config"], namespace["spliced"].item()


@pytest.mark.slow
def test_saelens_trains_an_sae_on_a_forma_hook_and_it_splices_back(trained, sae, tmp_path):
    model, data = trained
    sae, _, page_spliced = sae
    with torch.no_grad():  # the page's own splice, on its training data, lies between clean and ablated too
        page_clean = model(data, return_type="loss").item()
        page_ablated = model.run_with_hooks(
            data, return_type="loss", fwd_hooks=[(HOOK, lambda act, hook: torch.zeros_like(act))]
        ).item()
    assert page_clean < page_spliced < page_ablated
    held_out = markov_tokens(512, 16, model.cfg.d_vocab, SEED + 1)
    with torch.no_grad():
        clean = model(held_out, return_type="loss").item()
        spliced = model.run_with_hooks(
            held_out, return_type="loss", fwd_hooks=[(HOOK, lambda act, hook: sae(act))]
        ).item()
        ablated = model.run_with_hooks(
            held_out, return_type="loss", fwd_hooks=[(HOOK, lambda act, hook: torch.zeros_like(act))]
        ).item()
    recovered = (ablated - spliced) / (ablated - clean)
    result = {
        "hook": HOOK,
        "clean_loss": clean,
        "sae_spliced_loss": spliced,
        "zero_ablated_loss": ablated,
        "loss_recovered_fraction": recovered,
    }
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
    sae, config, _ = sae
    store = ActivationsStore.from_config(
        model, config, override_dataset=Dataset.from_dict({"tokens": data[:512].tolist()})
    )
    batch = store.get_batch_tokens(4)
    harvested = store.get_activations(batch)  # run_with_cache(..., stop_at_layer=1, prepend_bos=False)
    _, cache = model.run_with_cache(batch, names_filter=HOOK)
    assert torch.allclose(harvested.squeeze(2), cache[HOOK], atol=1e-6)
    metrics, _ = run_evals(
        sae,
        store,
        model,
        ActivationScaler(),
        EvalConfig(
            batch_size_prompts=8,
            n_eval_reconstruction_batches=2,
            n_eval_sparsity_variance_batches=2,
            compute_ce_loss=True,
            compute_kl=True,
        ),
        exclude_special_tokens=False,
    )
    losses = metrics["model_performance_preservation"]
    assert losses["ce_loss_without_sae"] < losses["ce_loss_with_sae"] < losses["ce_loss_with_ablation"]
