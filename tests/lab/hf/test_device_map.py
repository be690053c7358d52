"""Big models: `load_hf(path, device_map=, dtype=)` converts block by block into a model spread over the CPU and
an offload folder on disk, which computes exactly what the whole model does — logits, every cached activation,
hooks on offloaded blocks, generation, the stacked weights — and `bridge(path, device_map=)` does the same
through TransformerBridge. What reads weights outside a forward pass is either made to work or named."""

import os

import pytest
import torch

from lab.analysis.activations.collect import collect_activations
from lab.analysis.lens import direct_logit_attribution, logit_lens, residual_norms
from lab.analysis.patching import patch_heads
from lab.analysis.steering import generate_steered
from lab.hf.convert import from_hf, to_hf
from lab.hf.loading import bridge, load_hf
from lab.model.decoding import generate
from lab.model.offload import onloaded
from tests.builders import VOCAB, hf_model, word_tokenizer

# The first block and the embedding in memory, the second block and the head on disk (Hugging Face's names).
MAPS = {
    "gpt_neox": {
        "gpt_neox.embed_in": "cpu",
        "gpt_neox.layers.0": "cpu",
        "gpt_neox.layers.1": "disk",
        "gpt_neox.final_layer_norm": "cpu",
        "lm_head": "disk",
    },
    "llama": {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.norm": "disk",
        "lm_head": "cpu",
    },
}
WEIGHTS = ("W_E", "W_U", "b_U", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out")


@pytest.fixture(params=["gpt_neox", "llama"])
def folder(request, tmp_path):
    hf = hf_model("gpt_neox") if request.param == "gpt_neox" else hf_model("llama", tie=True)
    hf.save_pretrained(tmp_path / "hf")
    word_tokenizer(tmp_path / "hf")
    return tmp_path / "hf", request.param


@pytest.fixture
def tokens():
    return torch.randint(4, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


def offloaded(folder, tmp_path):
    path, model_type = folder
    return load_hf(path, device_map=MAPS[model_type], offload_folder=tmp_path / "offload")


def test_an_offloaded_model_computes_what_the_whole_one_does(folder, tmp_path, tokens):
    whole, spread = load_hf(folder[0]), offloaded(folder, tmp_path)
    assert {p.device.type for p in spread.blocks[1].parameters()} == {"meta"}  # really on disk
    assert {p.device.type for p in spread.blocks[0].parameters()} == {"cpu"}
    assert any(name.startswith("blocks.1.") for name in os.listdir(tmp_path / "offload"))
    assert spread.hf_device_map["blocks.1"] == "disk"
    with torch.no_grad():
        assert torch.equal(spread(tokens), whole(tokens))
        logits, cache = spread.run_with_cache(tokens)
        reference_logits, reference = whole.run_with_cache(tokens)
    assert torch.equal(logits, reference_logits) and cache.keys() == reference.keys()
    for name in reference.keys():
        assert torch.equal(cache[name], reference[name]), name
    assert torch.equal(
        generate(spread, tokens[:, :4], 8, temperature=0), generate(whole, tokens[:, :4], 8, temperature=0)
    )


def test_a_hook_on_an_offloaded_block_reads_and_patches(folder, tmp_path, tokens):
    whole, spread = load_hf(folder[0]), offloaded(folder, tmp_path)
    seen = {}

    def halve(x, hook):
        seen[hook.name] = x.clone()
        return x * 0.5

    hooks = [
        ("blocks.1.attn.hook_pattern", lambda x, hook: None),
        (
            "blocks.1.hook_resid_mid" if "blocks.1.hook_resid_mid" in whole.hook_dict else "blocks.1.hook_attn_out",
            halve,
        ),
    ]
    with torch.no_grad():
        ours = spread.run_with_hooks(tokens, fwd_hooks=hooks)
        theirs = whole.run_with_hooks(tokens, fwd_hooks=hooks)
    assert seen and torch.equal(ours, theirs) and not torch.equal(ours, whole(tokens))


def test_stacked_weights_read_offloaded_blocks(folder, tmp_path):
    whole, spread = load_hf(folder[0]), offloaded(folder, tmp_path)
    for name in WEIGHTS:
        assert torch.equal(getattr(spread, name), getattr(whole, name)), name
    assert spread.blocks[1].attn.W_Q.is_meta  # read from the store, left there


def test_analysis_functions_on_an_offloaded_model(folder, tmp_path, tokens):
    whole, spread = load_hf(folder[0]), offloaded(folder, tmp_path)
    assert torch.equal(logit_lens(spread, tokens), logit_lens(whole, tokens))
    assert torch.equal(residual_norms(spread, tokens), residual_norms(whole, tokens))
    ours, theirs = direct_logit_attribution(spread, tokens[0], 7), direct_logit_attribution(whole, tokens[0], 7)
    assert ours.labels == theirs.labels and torch.allclose(ours.values, theirs.values, atol=1e-6)
    hook = "blocks.1.hook_resid_post"
    assert torch.equal(
        collect_activations(spread, tokens, hook, progress=False)[hook],
        collect_activations(whole, tokens, hook, progress=False)[hook],
    )
    corrupted = tokens.flip(1)
    assert torch.equal(
        patch_heads(spread, tokens, corrupted, answer=5, wrong=6).values,
        patch_heads(whole, tokens, corrupted, answer=5, wrong=6).values,
    )
    vector = torch.ones(spread.cfg.d_model)
    assert torch.equal(
        generate_steered(spread, tokens[:, :4], hook, vector, 2.0, 6, temperature=0),
        generate_steered(whole, tokens[:, :4], hook, vector, 2.0, 6, temperature=0),
    )
    with torch.no_grad():
        assert torch.equal(to_hf(spread)(tokens).logits, to_hf(whole)(tokens).logits)
    _, cache = spread.run_with_cache(tokens)
    _, reference = whole.run_with_cache(tokens)
    assert torch.equal(cache.decompose_resid(), reference.decompose_resid())
    assert torch.equal(spread.accumulated_bias(2), whole.accumulated_bias(2))  # block 1 is on disk
    stack = cache.accumulated_resid(apply_ln=True)
    assert torch.allclose(cache.logit_attrs(stack, tokens=7), reference.logit_attrs(stack, tokens=7), atol=1e-6)


def test_an_offloaded_model_saves_and_refuses_to_move(folder, tmp_path, tokens):
    from lab import HookedTransformer

    spread = offloaded(folder, tmp_path)
    again = HookedTransformer.load(spread.save(tmp_path / "saved"))
    with torch.no_grad():
        assert torch.equal(again(tokens), load_hf(folder[0])(tokens))
    with pytest.raises(RuntimeError, match="offloaded"):
        spread.to("cpu")


def test_transformer_lens_weight_readers_need_onloaded(folder, tmp_path, tokens):
    """ActivationCache.stack_head_results reads blocks[l].attn.W_O itself: on meta it fails; inside
    `onloaded(model)` every offloaded weight is in memory and it agrees with the whole model. (The failed call
    leaves meta head results in its cache, so the second call gets a fresh one.)"""
    whole, spread = load_hf(folder[0]), offloaded(folder, tmp_path)
    _, reference = whole.run_with_cache(tokens)
    with pytest.raises(RuntimeError, match="meta"):
        spread.run_with_cache(tokens)[1].stack_head_results()
    _, cache = spread.run_with_cache(tokens)
    with onloaded(spread):
        assert not spread.blocks[1].attn.W_O.is_meta
        assert torch.allclose(cache.stack_head_results(), reference.stack_head_results(), atol=1e-6)
    assert spread.blocks[1].attn.W_O.is_meta


def test_auto_device_map_spills_to_disk_within_max_memory(folder, tmp_path, tokens):
    spread = load_hf(folder[0], device_map="auto", max_memory={"cpu": 250_000}, offload_folder=tmp_path / "off")
    assert "disk" in spread.hf_device_map.values() and spread.hf_device_map["embed"] == "cpu"
    with torch.no_grad():
        assert torch.equal(spread(tokens), load_hf(folder[0])(tokens))


def test_forma_module_names_and_one_device(folder, tmp_path, tokens):
    whole = load_hf(folder[0])
    spread = load_hf(folder[0], device_map={"": "cpu", "blocks.1": "disk"}, offload_folder=tmp_path / "off")
    on_cpu = load_hf(folder[0], device_map="cpu")
    with torch.no_grad():
        assert torch.equal(spread(tokens), whole(tokens)) and torch.equal(on_cpu(tokens), whole(tokens))
    assert spread.hf_device_map["blocks.1"] == "disk" and spread.hf_device_map["blocks.0"] == "cpu"


@pytest.mark.parametrize("device_map", [None, "cpu"])
def test_a_dtype_is_kept_not_forced_to_float32(folder, device_map):
    path, _ = folder
    low = load_hf(path, dtype=torch.bfloat16, device_map=device_map)
    whole = load_hf(path)
    assert {p.dtype for p in low.parameters()} == {torch.bfloat16}
    for name, tensor in whole.state_dict().items():
        assert torch.equal(low.state_dict()[name], tensor.to(torch.bfloat16)), name


def test_dtype_auto_reads_the_folders_own(tmp_path):
    hf_model("llama").to(torch.bfloat16).save_pretrained(tmp_path)
    assert {p.dtype for p in load_hf(tmp_path, dtype="auto").parameters()} == {torch.bfloat16}
    assert {p.dtype for p in load_hf(tmp_path).parameters()} == {torch.float32}


def test_from_hf_of_an_offloaded_hugging_face_model(folder, tmp_path, tokens):
    from transformers import AutoModelForCausalLM

    path, model_type = folder
    hf = AutoModelForCausalLM.from_pretrained(
        path, device_map=MAPS[model_type], offload_folder=str(tmp_path / "o"), dtype=torch.float32
    )
    assert any(p.is_meta for p in hf.parameters())
    with torch.no_grad():
        assert torch.equal(from_hf(hf)(tokens), load_hf(path)(tokens))


def test_the_bridge_takes_a_device_map(folder, tmp_path, tokens):
    path, model_type = folder
    spread = bridge(path, device_map=MAPS[model_type], offload_folder=tmp_path / "o", dtype=torch.float32)
    whole = bridge(path, dtype=torch.float32)
    with torch.no_grad():
        logits, cache = spread.run_with_cache(tokens, names_filter=["blocks.1.hook_resid_post"])
        reference_logits, reference = whole.run_with_cache(tokens, names_filter=["blocks.1.hook_resid_post"])
    assert (logits - reference_logits).abs().max() <= 1e-5
    assert (cache["blocks.1.hook_resid_post"] - reference["blocks.1.hook_resid_post"]).abs().max() <= 1e-5


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(device="cpu", device_map="cpu"), "not both"),
        (dict(device_map={"": "cpu", "model.layers.1": "disk"}), "offload_folder"),
        (dict(device_map={"": "cpu", "model.embed_tokens": "disk"}, offload_folder="o"), "token embedding"),
        (dict(device_map={"": "meta"}), "meta"),
        (dict(device_map={"": "cpu", "model.layer.1": "disk"}), "model.layer.1"),
        (
            dict(
                device_map={"": "cpu", "model.layers.0.self_attn": "cpu", "model.layers.0.mlp": "disk"},
                offload_folder="o",
            ),
            "whole",
        ),
        (dict(device_map={"": "cpu"}, max_memory={"cpu": 10**6}), "max_memory"),
        (dict(device_map={"": "gpu"}), "'gpu'"),
        (dict(dtype="float16"), "dtype"),
    ],
)
def test_device_map_mistakes_are_named(tmp_path, options, words):
    hf_model("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=words):
        load_hf(tmp_path, **options)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_a_gpu_with_cpu_and_disk_offload(tmp_path, tokens):
    """Main device the GPU; block 1 offloaded to the CPU, the tied head's bias to disk (it runs on the GPU)."""
    hf_model("llama", tie=True).save_pretrained(tmp_path / "hf")
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 parity, not TF32 rounding
    try:
        whole = load_hf(tmp_path / "hf")
        spread = load_hf(
            tmp_path / "hf",
            device_map={"": 0, "model.layers.1": "cpu", "lm_head": "disk"},
            offload_folder=tmp_path / "offload",
        )
        assert spread.W_E.device.type == "cuda" and spread.blocks[1].attn.W_Q.is_meta
        with torch.no_grad():
            assert (spread(tokens).cpu() - whole(tokens)).abs().max() <= 1e-4
            _, cache = spread.run_with_cache(tokens, names_filter="blocks.1.attn.hook_pattern")
            _, reference = whole.run_with_cache(tokens, names_filter="blocks.1.attn.hook_pattern")
        assert (cache["blocks.1.attn.hook_pattern"].cpu() - reference["blocks.1.attn.hook_pattern"]).abs().max() <= 1e-5
        assert torch.equal(spread.W_Q.cpu(), whole.W_Q)
        assert torch.equal(
            generate(spread, tokens[:, :4], 8, temperature=0).cpu(), generate(whole, tokens[:, :4], 8, temperature=0)
        )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
