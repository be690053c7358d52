"""Every registered Hugging Face family (lab.hf.families.FAMILIES, each variant its file lists) converts natively:
identical weights give identical logits both ways, hooks mean what TransformerBridge's mean, KV-cached greedy
decoding equals Hugging Face's generate; the sliding window is the same mask on every attention path; and the
guide to adding a family (docs/design.md) names the files and table the code has."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from lab import HookedTransformer, ModelConfig
from lab.cli.parser import main
from lab.hf.convert import export_family, from_hf, to_hf
from lab.hf.families import FAMILIES, SUPPORTED
from lab.hf.family import UnsupportedArchitecture
from lab.hf.loading import load_hf
from lab.model.decoding import generate
from tests.builders import REPO, VOCAB, hf_model, randomise_gains_and_biases, tiny_config, word_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models (tests/conftest.py::one_thread)

# The variants whose shape is another family's: to_hf writes them as that family.
EXPORTS_AS = {"mistral-no-window": "llama"}  # a Mistral without a window is LLaMA


def max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def test_hugging_face_to_forma_logits_match(hf_case, tokens):
    hf = hf_case.build()
    model = from_hf(hf)
    with torch.no_grad():
        assert max_diff(model(tokens), hf(tokens).logits) <= 1e-4


def test_forma_to_hugging_face_logits_match(hf_case, tokens):
    """A Forma model of the family's shape with its own random weights (gains and biases moved off 1 and 0)
    exports to the family's class (exactly one family has its shape), and that class computes the same logits;
    back again is the identity."""
    model = randomise_gains_and_biases(HookedTransformer(from_hf(hf_case.build()).cfg, seed=5)).eval()
    assert [t for t, family in FAMILIES.items() if family.shape(model.cfg)] == [export_family(model.cfg)]
    exported = to_hf(model)
    assert exported.config.model_type == EXPORTS_AS.get(hf_case.variant, hf_case.model_type)
    with torch.no_grad():
        assert max_diff(exported(tokens).logits, model(tokens)) <= 1e-4
        assert torch.equal(from_hf(exported)(tokens), model(tokens))


def test_the_configs_say_what_each_family_is():
    neox = from_hf(hf_model("gpt_neox")).cfg
    assert (neox.block, neox.positions, neox.rotary_dim, neox.d_head, neox.norm, neox.bias, neox.mlp) == (
        "parallel",
        "rotary",
        4,
        16,
        "layernorm",
        True,
        "gelu",
    )
    assert from_hf(hf_model("gpt_neox", parallel=False)).cfg.block == "pre_ln"
    qwen = from_hf(hf_model("qwen2", window=6)).cfg
    assert (qwen.bias, qwen.qkv_bias, qwen.norm, qwen.mlp, qwen.sliding_window, qwen.n_kv_heads) == (
        False,
        True,
        "rmsnorm",
        "swiglu",
        6,
        2,
    )
    assert from_hf(hf_model("qwen2")).cfg.sliding_window == 0
    mistral = from_hf(hf_model("mistral", window=5)).cfg
    assert (mistral.bias, mistral.qkv_bias, mistral.sliding_window) == (False, False, 5)
    assert from_hf(hf_model("mistral", window=None)).cfg.sliding_window == 0
    assert {"gpt_neox", "qwen2", "mistral"} <= set(SUPPORTED)


def test_a_parallel_block_has_no_resid_mid_and_every_hook_fires(tokens):
    """x + attn(ln1(x)) + mlp(ln2(x)): both branches read resid_pre, so resid_mid does not exist (TransformerLens
    never fires it either); every hook point that does exist fires."""
    model = from_hf(hf_model("gpt_neox"))
    assert "blocks.0.hook_resid_mid" not in model.hook_dict
    assert {
        "blocks.0.hook_resid_pre",
        "blocks.0.hook_attn_out",
        "blocks.0.hook_mlp_out",
        "blocks.0.hook_resid_post",
        "blocks.0.attn.hook_rot_q",
        "blocks.0.ln2.hook_normalized",
    } <= set(model.hook_dict)
    fired = set()
    model.run_with_hooks(tokens, fwd_hooks=[(lambda n: True, lambda x, hook: fired.add(hook.name))])
    assert fired == set(model.hook_dict)
    _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        b = f"blocks.{layer}."
        total = cache[b + "hook_resid_pre"] + cache[b + "hook_attn_out"] + cache[b + "hook_mlp_out"]
        assert max_diff(total, cache[b + "hook_resid_post"]) <= 1e-5


def test_hooks_agree_with_the_transformer_bridge(hf_case, tmp_path, tokens):
    """The same hook names hold the same activations as TransformerLens's TransformerBridge (raw mode, no weight
    processing) on the same Hugging Face model, layer by layer: the residual stream (resid_mid where the block has
    one), each sublayer's output and the attention pattern."""
    from transformer_lens.model_bridge import TransformerBridge

    hf = hf_case.build()
    model = from_hf(hf)  # before booting: the bridge rewraps the HF module tree in place
    bridge = TransformerBridge.boot_transformers(
        type(hf).__name__, hf_model=hf, tokenizer=word_tokenizer(tmp_path), device="cpu"
    )
    names = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out"]
    names = [name for name in names if f"blocks.0.{name}" in model.hook_dict] + ["attn.hook_pattern"]
    with torch.no_grad():
        _, ours = model.run_with_cache(tokens)
        _, theirs = bridge.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        for hook in names:
            key = f"blocks.{layer}.{hook}"
            assert max_diff(ours[key], theirs[key]) <= 1e-4, key


def test_kv_cached_greedy_decoding_equals_hugging_face_generate(hf_case):
    """20 new tokens from a 6-token prompt: past every sliding window, with Forma's KV cache on."""
    hf = hf_case.build()
    model = from_hf(hf)
    prompt = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    ours = generate(model, prompt, 20, temperature=0, use_kv_cache=True)
    assert torch.equal(ours, theirs)


@pytest.mark.slow
def test_a_saved_folder_loads_and_passes_forma_trust(hf_family, tmp_path, tokens):
    hf, model_type = hf_family.build(), hf_family.model_type
    hf.save_pretrained(tmp_path)
    word_tokenizer(tmp_path)
    model = load_hf(tmp_path)
    assert model.tokenizer is not None
    with torch.no_grad():
        assert max_diff(model(tokens), hf(tokens).logits) <= 1e-4
    assert main(["trust", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "trust.json").read_text())
    assert report["passed"] and report["hugging_face"]["architecture"] == model_type
    assert report["hugging_face"]["max_abs_logit_diff"] <= 1e-4


# --------------------------------------------------------------------------------------------
# The sliding window on Forma's own attention paths
# --------------------------------------------------------------------------------------------
WINDOWED = [
    dict(sliding_window=4),
    dict(sliding_window=4, n_kv_heads=2, positions="rotary", norm="rmsnorm", mlp="swiglu", bias=False, qkv_bias=True),
]


def explicit(model, tokens, **kwargs):
    return model.run_with_hooks(
        tokens, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda x, hook: None)], **kwargs
    )


@pytest.mark.parametrize("changes", WINDOWED, ids=["gpt2-like", "qwen2-like"])
def test_fused_and_explicit_attention_agree_with_a_window(changes, tokens):
    model = randomise_gains_and_biases(HookedTransformer(tiny_config(**changes), seed=2)).eval()
    with torch.no_grad():
        assert max_diff(model(tokens), explicit(model, tokens)) <= 1e-5


@pytest.mark.parametrize("changes", WINDOWED, ids=["gpt2-like", "qwen2-like"])
def test_kv_cache_equals_recompute_with_a_window(changes):
    from lab.model.decoding import decode

    model = randomise_gains_and_biases(HookedTransformer(tiny_config(**changes), seed=2)).eval()
    prompt = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(1))
    cached = decode(model, prompt, 12, temperature=0, use_kv_cache=True)
    fresh = decode(model, prompt, 12, temperature=0, use_kv_cache=False)
    assert torch.equal(cached.tokens, fresh.tokens)
    assert max_diff(cached.logits, fresh.logits) <= 1e-4


def test_the_pattern_is_zero_exactly_outside_the_window(tokens):
    """A_ij > 0 iff i − w < j ≤ i: each query sees itself and the w − 1 keys before it (Mistral's window)."""
    model = HookedTransformer(tiny_config(sliding_window=4), seed=0).eval()
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["blocks.0.attn.hook_pattern"]
    i, j = torch.arange(tokens.shape[1])[:, None], torch.arange(tokens.shape[1])[None, :]
    visible = (j <= i) & (j > i - 4)
    assert torch.all(pattern[..., ~visible] == 0) and torch.all(pattern[..., visible] > 0)


def test_a_window_of_one_attends_to_itself_only(tokens):
    """w = 1: softmax over one key is 1, so z = v at every position, for every head of its group."""
    model = HookedTransformer(tiny_config(sliding_window=1, n_kv_heads=2), seed=0).eval()
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_v", "hook_z")))
    v = cache["blocks.1.attn.hook_v"].repeat_interleave(2, dim=2)
    assert max_diff(cache["blocks.1.attn.hook_z"], v) <= 1e-6


def test_a_window_as_long_as_the_sequence_hides_nothing(tokens):
    windowed = HookedTransformer(tiny_config(sliding_window=tokens.shape[1]), seed=0).eval()
    plain = HookedTransformer(tiny_config(), seed=0).eval()
    assert torch.equal(windowed(tokens), plain(tokens))
    longer = torch.cat([tokens, tokens[:, :1]], dim=1)
    assert not torch.allclose(windowed(longer)[:, -1], plain(longer)[:, -1])


# --------------------------------------------------------------------------------------------
# The config fields
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes",
    [
        dict(block="parallel"),
        dict(block="parallel", positions="rotary", rotary_dim=4, tied_embeddings=True),
        dict(bias=False, qkv_bias=True, n_kv_heads=2, mlp="swiglu", norm="rmsnorm"),
        dict(sliding_window=3),
    ],
    ids=["parallel", "parallel-rotary-tied", "qkv-bias", "window"],
)
def test_parameter_count_is_exact(changes):
    cfg = tiny_config(**changes)
    assert sum(p.numel() for p in HookedTransformer(cfg).parameters()) == cfg.n_params()


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(sliding_window=-1), "sliding_window"),
        (dict(sliding_window="4"), "sliding_window"),
        (dict(qkv_bias="true"), "qkv_bias"),
        (dict(qkv_bias=True), "qkv_bias"),
        (dict(block="parallell"), "block"),
    ],
)
def test_new_fields_are_validated(changes, words):
    with pytest.raises(ValueError, match=words):
        tiny_config(**changes)


def test_configs_saved_before_the_new_fields_still_load():
    old = {
        "d_vocab": 100,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "n_ctx": 64,
        "d_head": 16,
        "d_mlp": 256,
        "n_kv_heads": 4,
        "positions": "learned",
        "rotary_dim": 16,
        "rotary_base": 10000.0,
        "norm": "layernorm",
        "norm_eps": 1e-5,
        "mlp": "gelu",
        "block": "pre_ln",
        "tied_embeddings": False,
        "bias": True,
        "init_std": 0.02,
        "tokenizer": "",
    }
    cfg = ModelConfig.from_json(json.dumps(old))
    assert (cfg.qkv_bias, cfg.sliding_window) == (False, 0) and cfg == tiny_config()
    assert ModelConfig.from_json(cfg.to_json()) == cfg


def test_gpt2_and_llama_configs_are_unchanged():
    for hf in (hf_model("gpt2"), hf_model("llama")):
        cfg = from_hf(hf).cfg
        assert (cfg.qkv_bias, cfg.sliding_window) == (False, 0) and cfg.block == "pre_ln"


# --------------------------------------------------------------------------------------------
# What does not convert says so, and names the bridge
# --------------------------------------------------------------------------------------------
def test_variants_forma_lacks_point_to_the_bridge():
    from transformers import (
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    no_attention_bias = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            vocab_size=50,
            attention_bias=False,
        )
    )
    mixed_windows = Qwen2ForCausalLM(
        Qwen2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=50,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
        )
    )
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=50)
    scaled_rope = LlamaForCausalLM(
        LlamaConfig(**small, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    )
    llama_biases = LlamaForCausalLM(LlamaConfig(**small, attention_bias=True))
    for hf, words in (
        (no_attention_bias, "attention biases"),
        (mixed_windows, "sliding window"),
        (scaled_rope, "rope scaling"),
        (llama_biases, "biases"),
    ):
        with pytest.raises(UnsupportedArchitecture, match=words) as err:
            from_hf(hf)
        assert "bridge" in str(err.value)


def test_to_hf_names_every_shape_it_exports():
    with pytest.raises(UnsupportedArchitecture) as err:
        to_hf(HookedTransformer(tiny_config(sliding_window=4)))  # GPT-2 has no sliding window
    for family in ("GPT-2", "LLaMA", "GPT-NeoX", "Qwen2", "Mistral"):
        assert family in str(err.value)


# --------------------------------------------------------------------------------------------
# The guide to adding a family (docs/design.md, "Add a Hugging Face family")
# --------------------------------------------------------------------------------------------
def guide() -> str:
    text = (REPO / "docs" / "design.md").read_text()
    return text[text.index("## Add a Hugging Face family") :]


def test_the_guide_names_the_files_the_table_and_every_field_of_a_family():
    """The guide's file and table exist; every file there registers what it defines (each table key its family's
    model_type, each family with a variant for the tests), and the guide names every field of Family."""
    import dataclasses
    import importlib

    from lab.hf.family import Family

    text = guide()
    assert "`lab/hf/families/<name>.py`" in text and "`FAMILIES` of `lab/hf/families/__init__.py`" in text
    assert {f.name for f in dataclasses.fields(Family)} <= set(re.findall(r"`(\w+)`", text))
    defined = []
    for path in sorted((REPO / "lab" / "hf" / "families").glob("[!_]*.py")):
        module = importlib.import_module(f"lab.hf.families.{path.stem}")
        families = [value for value in vars(module).values() if isinstance(value, Family)]
        assert families, f"{path} defines no Family"
        defined += families
    assert sorted(id(f) for f in defined) == sorted(id(f) for f in FAMILIES.values())
    assert all(key == family.model_type and family.variants for key, family in FAMILIES.items())
    assert SUPPORTED == tuple(FAMILIES)


def test_a_family_added_to_the_table_runs_in_every_parametrised_test(tmp_path):
    """A throwaway family registered in FAMILIES (by a plugin loaded before the tests are collected, standing in for
    the guide's entry in the table) is collected by every test that takes the families' fixtures, beside each variant
    of every registered family: nothing else is edited."""
    (tmp_path / "throwaway_family.py").write_text(
        "import dataclasses\n"
        "from lab.hf.families import FAMILIES\n"
        "FAMILIES['throwaway'] = dataclasses.replace(\n"
        "    FAMILIES['gpt2'], model_type='throwaway', variants={'throwaway-only': {}}\n"
        ")\n"
    )
    tests = [
        "tests/lab/hf/test_hf_families.py::test_hugging_face_to_forma_logits_match",
        "tests/lab/hf/test_hf_families.py::test_forma_to_hugging_face_logits_match",
        "tests/lab/hf/test_hf_families.py::test_kv_cached_greedy_decoding_equals_hugging_face_generate",
        "tests/lab/hf/test_hf_families.py::test_hooks_agree_with_the_transformer_bridge",
        "tests/lab/hf/test_hf.py::test_round_trip_through_hugging_face",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "throwaway_family"] + tests,
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    collected = set(result.stdout.split())
    variants = [variant for family in FAMILIES.values() for variant in family.variants] + ["throwaway-only"]
    for test in tests:
        assert {f"{test}[{variant}]" for variant in variants} <= collected, test
