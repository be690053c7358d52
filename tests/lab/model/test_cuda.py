"""CUDA paths: the same numbers on a GPU as on the CPU. These run on a machine with a GPU
(`benchmarks/gpu.sh`); CI has none, so there they are reported as skipped, never silently passed."""

import pytest
import torch

from lab import HookedTransformer
from lab.hf.convert import from_hf
from lab.model.decoding import decode
from tests.builders import tiny_config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]

VARIANTS = [dict(), dict(positions="rotary", mlp="swiglu", n_kv_heads=2, norm="rmsnorm", bias=False)]


@pytest.fixture(autouse=True)
def exact_matmuls():
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 parity, not TF32 rounding
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous


@pytest.mark.parametrize("variant", VARIANTS, ids=["gpt2-like", "llama-like"])
def test_gpu_logits_match_cpu(variant, tokens):
    model = HookedTransformer(tiny_config(**variant), seed=0).eval()
    with torch.no_grad():
        cpu = model(tokens)
        gpu = model.to("cuda")(tokens.cuda()).cpu()
    assert (cpu - gpu).abs().max() <= 1e-4


@pytest.mark.parametrize("variant", VARIANTS, ids=["gpt2-like", "llama-like"])
def test_gpu_fast_and_explicit_attention_agree(variant, tokens):
    model = HookedTransformer(tiny_config(**variant), seed=0).eval().cuda()
    x = tokens.cuda()
    with torch.no_grad():
        fast = model(x)
        explicit = model.run_with_hooks(x, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda a, hook: a)])
    assert (fast - explicit).abs().max() <= 1e-4


def test_gpu_hugging_face_parity(hf_case, tokens):
    hf = hf_case.build()
    model = from_hf(hf).cuda()
    hf = hf.cuda()
    with torch.no_grad():
        assert (model(tokens.cuda()) - hf(tokens.cuda()).logits).abs().max() <= 1e-4


def test_gpu_cache_lives_on_the_device(tokens):
    model = HookedTransformer(tiny_config(), seed=0).eval().cuda()
    _, cache = model.run_with_cache(tokens.cuda())
    assert cache["blocks.1.attn.hook_pattern"].is_cuda
    assert torch.allclose(
        cache.accumulated_resid(apply_ln=True)[-1] @ model.W_U + model.b_U, model(tokens.cuda()), atol=1e-4
    )


def test_gpu_kv_cache_equals_recompute():
    model = HookedTransformer(tiny_config(positions="rotary", n_kv_heads=2), seed=0).eval().cuda()
    prompt = torch.randint(0, 100, (2, 5), device="cuda")
    cached = decode(model, prompt, 24, temperature=0, use_kv_cache=True)
    fresh = decode(model, prompt, 24, temperature=0, use_kv_cache=False)
    assert torch.equal(cached.tokens, fresh.tokens)
    assert (cached.logits - fresh.logits).abs().max() <= 1e-4


def test_gpu_training_lowers_the_loss(tmp_path):
    from lab.data.sources import MarkovSource
    from lab.train.batches import SequenceBatches
    from lab.train.config import TrainConfig
    from lab.train.loop import train

    source = MarkovSource(vocab_size=16, order=1, seed=0)
    data = SequenceBatches(
        torch.as_tensor(source.sample(256, 32, seed=1)), torch.as_tensor(source.sample(32, 32, seed=2))
    )
    model = HookedTransformer(tiny_config(d_vocab=16, n_ctx=32), seed=0)
    cfg = TrainConfig(
        steps=40, batch_size=32, seq_len=32, lr=3e-3, warmup_steps=5, eval_interval=20, eval_batches=1, device="cuda"
    )
    result = train(model, cfg, data, out_dir=tmp_path, progress=False)
    assert next(model.parameters()).is_cuda
    assert result.history[-1]["train_loss_nats"] < result.history[0]["train_loss_nats"]


def test_gpu_bfloat16_forward_stays_close(tokens):
    model = HookedTransformer(tiny_config(), seed=0).eval().cuda()
    with torch.no_grad():
        reference = model(tokens.cuda()).log_softmax(-1)
        low = model.to(torch.bfloat16)(tokens.cuda()).float().log_softmax(-1)
    assert (reference.argmax(-1) == low.argmax(-1)).float().mean() > 0.9
