"""lab.analysis.input_attribution: each method is the quantity it names, computed a second way (by hand with
autograd and hooks, or by another Captum path); attribution patching is lab.analysis.attribution's estimate of the
same patch; the exhaustive effects are the brute-force loop; and on a model whose prediction reads one position
only, every gradient method and the exhaustive effects find that position alone."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from lab import HookedTransformer, ModelConfig
from lab.analysis.attribution import attribution_patch
from lab.analysis.input_attribution import (
    METHODS,
    attention_rollout,
    embedding_forward,
    input_attributions,
    layer_integrated_gradients,
    resample_effects,
    top_tokens,
)
from tests.builders import REPO

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 24


def model(**changes) -> HookedTransformer:
    cfg = ModelConfig(**{"d_vocab": VOCAB, "d_model": 16, "n_layers": 2, "n_heads": 2, "n_ctx": 10} | changes)
    m = HookedTransformer(cfg, seed=4).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("W_O", "W_Q", "W_K")):
                p.mul_(3.0)
    return m


TOKENS = torch.randint(0, VOCAB, (3, 8), generator=torch.Generator().manual_seed(0))


def log_prob(m: HookedTransformer, embeddings: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """m(e) = log P(target | x) at the last position with hook_embed's output set to `embeddings`."""
    logits = m.run_with_hooks(TOKENS, fwd_hooks=[("hook_embed", lambda a, hook: embeddings)])
    return logits[:, -1].log_softmax(-1).gather(1, target[:, None])[:, 0]


def test_gradient_methods_are_the_gradient_computed_by_hand():
    m = model()
    target = top_tokens(m, TOKENS).clone()
    e = m.W_E[TOKENS].detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(log_prob(m, e, target).sum(), e)
    scores = input_attributions(m, TOKENS, methods=("gradient", "gradient_x_input"))
    assert torch.allclose(scores["gradient"], grad.norm(dim=-1), atol=1e-6)
    assert torch.allclose(scores["gradient_x_input"], (grad * e.detach()).sum(-1), atol=1e-6)


def test_integrated_gradients_is_complete():
    """Σ_i IG_i = m(e) − m(0) (Sundararajan et al. 2017, Prop. 1), to the quadrature's error."""
    m = model()
    target = top_tokens(m, TOKENS).clone()
    scores = input_attributions(m, TOKENS, methods=("integrated_gradients",), ig_steps=64)["integrated_gradients"]
    with torch.no_grad():
        gap = log_prob(m, m.W_E[TOKENS], target) - log_prob(m, torch.zeros(3, 8, 16), target)
    assert torch.allclose(scores.sum(-1), gap, atol=2e-3)


def test_occlusion_is_the_drop_when_one_position_is_zeroed_and_captums_feature_ablation():
    from captum.attr import FeatureAblation

    m = model()
    target = top_tokens(m, TOKENS).clone()
    occlusion = input_attributions(m, TOKENS, methods=("occlusion",))["occlusion"]
    e = m.W_E[TOKENS].detach()
    with torch.no_grad():
        for i in range(8):
            zeroed = e.clone()
            zeroed[:, i] = 0
            assert torch.allclose(occlusion[:, i], log_prob(m, e, target) - log_prob(m, zeroed, target), atol=1e-5)
    mask = torch.arange(8)[None, :, None].expand(1, 8, 16)
    ablation = FeatureAblation(embedding_forward(m)).attribute(
        e.clone(), baselines=0.0, target=target, additional_forward_args=(TOKENS,), feature_mask=mask
    )
    assert torch.allclose(ablation[..., 0], occlusion, atol=1e-6)


def test_layer_integrated_gradients_at_the_hook_is_the_same_integral():
    """Captum's LayerIntegratedGradients on hook_embed from a baseline prompt equals IntegratedGradients on the
    embeddings from that prompt's embeddings."""
    from captum.attr import IntegratedGradients

    m = model()
    baseline = torch.full_like(TOKENS, 3)
    target = top_tokens(m, TOKENS).clone()
    layer = layer_integrated_gradients(m, TOKENS, baseline, n_steps=16)
    direct = IntegratedGradients(embedding_forward(m)).attribute(
        m.W_E[TOKENS].detach().clone(),
        baselines=m.W_E[baseline].detach().clone(),
        target=target,
        additional_forward_args=(TOKENS,),
        n_steps=16,
    )
    assert torch.allclose(layer, direct, atol=1e-5)


def test_attention_rollout_of_one_layer_is_half_its_mean_pattern_plus_half_the_identity():
    m = model(n_layers=1)
    _, cache = m.run_with_cache(TOKENS, names_filter="blocks.0.attn.hook_pattern")
    expected = 0.5 * cache["blocks.0.attn.hook_pattern"].mean(1)[:, -1] + 0.5 * torch.eye(8)[-1]
    assert torch.allclose(attention_rollout(m, TOKENS), expected, atol=1e-6)
    assert torch.allclose(attention_rollout(model(), TOKENS).sum(-1), torch.ones(3), atol=1e-5)


def test_attribution_patching_is_the_first_order_estimate_of_each_resample():
    """The score of position i is the mean over replacement tokens v of |Δ̂_v|, where Δ̂_v is what
    lab.analysis.attribution.attribution_patch estimates for patching resid_pre 0 at i from x into x_i = v
    (noising: the gradient at the clean run)."""
    m = model()
    prompt = TOKENS[:1]
    target = top_tokens(m, prompt).clone()

    def metric(logits):
        return logits[:, -1].log_softmax(-1)[0, target[0]]

    score = input_attributions(m, prompt, methods=("attribution_patching",))["attribution_patching"][0]
    for i in (0, 5, 7):
        estimates = []
        for v in range(VOCAB):
            corrupted = prompt.clone()
            corrupted[0, i] = v
            sweep = attribution_patch(m, prompt, corrupted, metric, direction="noise")["resid_pre"]
            estimates.append(float(sweep.values[0, i]) - sweep.clean)
        assert score[i] == pytest.approx(sum(abs(d) for d in estimates) / VOCAB, abs=1e-5)


def test_resample_effects_are_the_brute_force_loop():
    m = model()
    target = top_tokens(m, TOKENS).clone()
    effects = resample_effects(m, TOKENS, rows_per_pass=50)
    with torch.no_grad():
        base = m(TOKENS)[:, -1].log_softmax(-1).gather(1, target[:, None])[:, 0]
        for i in (0, 3, 7):
            total = torch.zeros(3)
            for v in range(VOCAB):
                changed = TOKENS.clone()
                changed[:, i] = v
                total += (m(changed)[:, -1].log_softmax(-1).gather(1, target[:, None])[:, 0] - base).abs()
            assert torch.allclose(effects[:, i], total / VOCAB, atol=1e-5)


def test_a_prediction_that_reads_one_position_is_attributed_to_it_alone():
    """With every attention output zeroed, the last prediction reads the last token only: the exhaustive effects
    and every gradient and ablation method give the other positions exactly nothing."""
    m = model()
    with torch.no_grad():
        for block in m.blocks:
            block.attn.W_O.zero_()
    scores = input_attributions(m, TOKENS)
    effects = resample_effects(m, TOKENS)
    assert (effects[:, :-1] == 0).all() and (effects[:, -1] > 0).all()
    for method in ("gradient", "gradient_x_input", "integrated_gradients", "occlusion", "attribution_patching"):
        assert (scores[method][:, :-1].abs() < 1e-7).all(), method
        assert (scores[method][:, -1].abs() > 1e-4).all(), method
    assert set(scores) == set(METHODS)


def test_an_unknown_method_or_target_is_refused():
    m = model()
    with pytest.raises(ValueError, match="unknown attribution method 'saliency'"):
        input_attributions(m, TOKENS, methods=("saliency",))
    with pytest.raises(ValueError, match="target token ids must lie in"):
        input_attributions(m, TOKENS, target=VOCAB)


# --- Inseq, in an environment of its own ------------------------------------------------------------------------
# inseq 0.7 requires typeguard ≤ 2.13.3 and transformer-lens ≥ 4.2 (and 3.9) requires typeguard ≥ 4.2: it cannot
# install beside Forma (docs/ecosystem.md). It runs in .venv-inseq (constraints.txt with typeguard 2.13.3, inseq
# 0.7.1 and its own dependencies; or $FORMA_INSEQ_PYTHON) on the exported Hugging Face folder, and hands back its
# attributions as files.
INSEQ_PYTHON = Path(os.environ.get("FORMA_INSEQ_PYTHON", REPO / ".venv-inseq/bin/python"))
INSEQ_SCRIPT = """
import json, sys
import numpy as np, inseq
from transformers import AutoModelForCausalLM, AutoTokenizer
folder = sys.argv[1]
hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False).eval()
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
hf.config.bos_token_id, hf.config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
out = {}
for method in ("integrated_gradients", "input_x_gradient", "saliency"):
    model = inseq.load_model(hf, method, tokenizer=tokenizer)
    # IG of −log P (its crossentropy step function); the others of P, Inseq's default (its crossentropy function
    # fails for them in 0.7.1: "Expected input batch_size (1) to match target batch_size (0)").
    options = {"n_steps": 16, "attributed_fn": "crossentropy"} if method == "integrated_gradients" else {}
    result = model.attribute(sys.argv[2], generation_args={"max_new_tokens": 1, "do_sample": False},
                             show_progress=False, **options).sequence_attributions[0]
    np.save(f"{folder}/{method}.npy", result.target_attributions[:, 0, :].numpy())
    out[method] = [t.id for t in result.target]
json.dump(out, open(f"{folder}/ids.json", "w"))
"""


@pytest.mark.processes  # Inseq runs in its own environment's Python
def test_inseq_gives_the_same_attributions_on_the_exported_model():
    """Inseq 0.7 on `lab.hf.convert.to_hf(model)` against Forma on the same ids, to round-off: integrated gradients
    from the unknown token's embedding of −log P(the generated token) (Forma's of log P, sign flipped); input ×
    gradient and saliency on the input embeddings of P itself, ∇P = P ∇log P (Forma's times P)."""
    if not INSEQ_PYTHON.exists():
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"CI needs inseq's environment at {INSEQ_PYTHON} (docs/ecosystem.md lists its pins)")
        pytest.skip(f"no inseq environment at {INSEQ_PYTHON} (set FORMA_INSEQ_PYTHON); CI runs this")
    from lab.data.tokenizers import to_hf_tokenizer, word_level
    from lab.hf.convert import to_hf

    m = model(mlp="gelu_tanh")
    folder = Path(tempfile.mkdtemp())
    tokenizer = to_hf_tokenizer(word_level([f"w{i}" for i in range(VOCAB - 4)]), folder)
    with torch.no_grad():
        m.W_U[:, :4] = 0.0  # <pad> <unk> <bos> <eos> never the top token: Inseq stops generating at <eos>
    prompt = torch.tensor([[tokenizer.convert_tokens_to_ids(f"w{i}") for i in (3, 11, 0, 7, 19, 2)]])
    assert top_tokens(m, prompt)[0] >= 4
    to_hf(m).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {"HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(INSEQ_PYTHON), "-c", INSEQ_SCRIPT, str(folder), "w3 w11 w0 w7 w19 w2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ids = json.loads((folder / "ids.json").read_text())
    with torch.no_grad():
        p = float(m(prompt)[0, -1].softmax(-1).max())
    for method, sequence in ids.items():
        assert sequence == prompt[0].tolist() + [int(top_tokens(m, prompt)[0])], method
        theirs = np.load(folder / f"{method}.npy")[:-1]  # the last row is the generated token's own: empty
        if method == "integrated_gradients":
            ours = layer_integrated_gradients(m, prompt, torch.full_like(prompt, tokenizer.unk_token_id), n_steps=16)
            np.testing.assert_allclose(-theirs, ours[0].numpy(), atol=1e-6)
        elif method == "input_x_gradient":
            ours = input_attributions(m, prompt, methods=("gradient_x_input",))["gradient_x_input"]
            np.testing.assert_allclose(theirs.sum(-1), p * ours[0].numpy(), atol=1e-6)
        else:
            ours = input_attributions(m, prompt, methods=("gradient",))["gradient"]
            np.testing.assert_allclose(np.linalg.norm(theirs, axis=-1), p * ours[0].numpy(), atol=1e-6)
