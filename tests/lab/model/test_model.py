"""The hooked transformer: its equations, its hooks, its checks, its checkpoints."""

import math

import pytest
import torch
from transformer_lens import ActivationCache

from lab import HookedTransformer, ModelConfig
from lab.model.attention import Rotary
from lab.model.embeddings import sinusoidal_table
from lab.model.primitives import FEW_ROWS, linear
from tests.builders import VOCAB, tiny_config

VARIANTS = [
    dict(),
    dict(positions="sinusoidal", norm="rmsnorm", mlp="relu"),
    dict(positions="rotary", mlp="swiglu", n_kv_heads=2, bias=False, norm="rmsnorm"),
    dict(positions="rotary", rotary_dim=8, mlp="silu"),
    dict(positions="none", mlp="gelu_tanh", tied_embeddings=True),
    dict(block="post_ln", positions="sinusoidal", mlp="relu"),
    dict(positions="shortformer", block="parallel"),
]
IDS = ["gpt2-like", "sinusoidal-rms-relu", "llama-like", "partial-rotary", "nopos-tied", "post-ln", "shortformer"]


# --- config -----------------------------------------------------------------------------------
def test_config_round_trips_through_json_and_toml():
    cfg = tiny_config(positions="rotary", n_kv_heads=2, mlp="swiglu")
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert ModelConfig.from_toml(cfg.to_toml()) == cfg


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(d_model=65), "divisible"),
        (dict(positions="alibi"), "positions must be one of"),
        (dict(n_kv_heads=3), "multiple of n_kv_heads"),
        (dict(n_layers=0), "n_layers must be a positive integer"),
        (dict(mlp="geglu"), "mlp must be one of"),
        (dict(d_vocab_out=VOCAB - 1, tied_embeddings=True), "tied embeddings need d_vocab_out"),
    ],
)
def test_config_rejects_bad_values(bad, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**bad)


def test_config_rejects_unknown_and_missing_keys():
    data = tiny_config().to_dict() | {"d_modle": 3}
    with pytest.raises(ValueError, match="unknown keys \\['d_modle'\\]"):
        ModelConfig.from_dict(data)
    with pytest.raises(ValueError, match="missing required keys \\['n_ctx'\\]"):
        ModelConfig.from_dict({k: v for k, v in tiny_config().to_dict().items() if k != "n_ctx"})
    with pytest.raises(ValueError, match="malformed JSON"):
        ModelConfig.from_json("{")


# --- the forward pass --------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_every_variant_runs_and_counts_its_parameters(variant, tokens):
    model = HookedTransformer(tiny_config(**variant))
    assert model(tokens).shape == (*tokens.shape, VOCAB)
    assert model.cfg.n_params() == sum(p.numel() for p in model.parameters())


def test_an_output_vocabulary_of_its_own_size(tokens):
    """d_vocab_out: W_U [d_model, d_vocab_out], logits [batch, pos, d_vocab_out], generation draws from them."""
    model = HookedTransformer(tiny_config(d_vocab_out=VOCAB - 5))
    assert model.unembed.W_U.shape == (model.cfg.d_model, VOCAB - 5)
    assert model(tokens).shape == (*tokens.shape, VOCAB - 5)
    assert model.cfg.n_params() == sum(p.numel() for p in model.parameters())
    assert ModelConfig.from_json(model.cfg.to_json()) == model.cfg
    assert tiny_config().d_vocab_out == VOCAB  # 0: the input's
    assert model.generate(
        tokens[:1, :4], max_new_tokens=3, do_sample=False, stop_at_eos=False, verbose=False
    ).shape == (1, 7)


def test_the_attention_takes_transformer_lens_signature():
    """attn(query_input=, key_input=, value_input=, past_kv_cache_entry=, attention_mask=) as TransformerLens calls
    its attention: separate inputs, one copy per head, and a left-padding mask each give the self-attention's
    numbers (the padded row's real tokens as the same text alone)."""
    model = HookedTransformer(tiny_config(positions="rotary", n_kv_heads=2, bias=False, mlp="swiglu", norm="rmsnorm"))
    attn, cfg = model.blocks[0].attn, model.cfg
    x = torch.randn(2, 6, cfg.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fused = attn(x)
        separate = attn(
            query_input=x, key_input=x.clone(), value_input=x.clone(), past_kv_cache_entry=None, attention_mask=None
        )
        copies = [x[:, :, None].expand(-1, -1, n, -1) for n in (cfg.n_heads, cfg.n_kv_heads, cfg.n_kv_heads)]
        per_head = attn(*copies)
        mask = torch.ones(2, 6, dtype=torch.long)
        mask[0, :2] = 0
        padded, alone = attn(x, attention_mask=mask), attn(x[:1, 2:])
    assert (separate - fused).abs().max() <= 1e-5 and (per_head - fused).abs().max() <= 1e-5
    assert (padded[1] - fused[1]).abs().max() <= 1e-5 and (padded[0, 2:] - alone[0]).abs().max() <= 1e-5


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_causality(variant, tokens):
    """Changing token t leaves every logit before t unchanged, and changes the logits at t."""
    model = HookedTransformer(tiny_config(**variant)).eval()
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10], b[:, 10])


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_fast_and_explicit_attention_agree(variant, tokens):
    model = HookedTransformer(tiny_config(**variant)).eval()
    with torch.no_grad():
        fast = model(tokens)
        explicit = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda x, hook: x)])
    assert (fast - explicit).abs().max() <= 1e-5


def count_attention_paths(attn_cls: type, monkeypatch) -> dict[str, int]:
    """How many times the attention class's explicit and fused paths run from now on (counted as they run)."""
    calls = {"explicit": 0, "fused": 0}
    for path in calls:
        original = getattr(attn_cls, f"_{path}")

        def counted(self, *args, _original=original, _path=path):
            calls[_path] += 1
            return _original(self, *args)

        monkeypatch.setattr(attn_cls, f"_{path}", counted)
    return calls


def test_fast_path_is_taken_unless_the_pattern_is_asked_for(model, tokens, monkeypatch):
    calls = count_attention_paths(type(model.blocks[0].attn), monkeypatch)
    model(tokens)
    model.run_with_cache(tokens, names_filter=lambda n: "resid" in n)
    assert calls == {"explicit": 0, "fused": 4}
    model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_pattern")
    assert calls == {"explicit": 1, "fused": 6}  # the pattern only read: z from the fused kernel all the same


@pytest.mark.parametrize(
    "variant", [dict(), dict(positions="rotary", norm="rmsnorm", mlp="swiglu", n_kv_heads=2)], ids=["gpt2", "llama"]
)
def test_reading_an_activation_changes_no_number_and_editing_one_takes_the_explicit_path(variant, tokens):
    """A cache of every activation (patterns and norm scales included) gives the plain forward's logits bit for
    bit; a hook that edits the pattern or a scale, in place or by a new tensor, changes them."""
    model = HookedTransformer(tiny_config(**variant), seed=0).eval()
    with torch.no_grad():
        plain = model(tokens)
        cached, cache = model.run_with_cache(tokens)
        assert torch.equal(cached, plain) and "blocks.1.attn.hook_pattern" in cache.keys()

        def in_place(x, hook):
            x[..., 0] *= 1.5

        for name, hook in [
            ("blocks.1.attn.hook_pattern", in_place),
            ("blocks.0.ln2.hook_scale", in_place),
            ("blocks.1.attn.hook_attn_scores", lambda x, hook: x * 0.5),
        ]:
            assert (model.run_with_hooks(tokens, fwd_hooks=[(name, hook)]) - plain).abs().max() > 1e-4, name
    with torch.inference_mode():  # inference tensors count no writes: the same holds, by comparison
        assert torch.equal(model.run_with_cache(tokens)[0], model(tokens))
        edited = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_pattern", in_place)])
        assert (edited - model(tokens)).abs().max() > 1e-4


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_caching_one_hook_runs_the_plain_forward(variant, tokens, monkeypatch):
    """run_with_cache with one residual-stream hook costs the model's own forward: the fused attention and the
    fused norms at every layer (no scores, no pattern, no norm internals formed), the same logits bit for bit,
    and a cache of that one activation, as a hook on the forward sees it."""
    import lab.model.norms as norms

    model = HookedTransformer(tiny_config(**variant), seed=0).eval()
    calls, explicit_norms = count_attention_paths(type(model.blocks[0].attn), monkeypatch), []
    wants = norms.wants_norm_internals
    monkeypatch.setattr(norms, "wants_norm_internals", lambda norm: explicit_norms.append(wants(norm)) or wants(norm))
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    seen = {}
    with torch.no_grad():
        plain = model(tokens)
        logits, cache = model.run_with_cache(tokens, names_filter=[last])
        model.run_with_hooks(tokens, fwd_hooks=[(last, lambda x, hook: seen.update(x=x.clone()))])
    assert calls == {"explicit": 0, "fused": 3 * model.cfg.n_layers}
    assert explicit_norms and not any(explicit_norms)
    assert torch.equal(logits, plain)
    assert list(cache.keys()) == [last] and torch.equal(cache[last], seen["x"])


def test_pattern_is_causal_and_normalised(model, tokens):
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    pattern = cache["pattern", 0]
    assert torch.allclose(pattern.sum(-1), torch.ones(pattern.shape[:-1]), atol=1e-6)
    future = torch.triu(torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool), diagonal=1)
    assert pattern[..., future].abs().max() == 0


def test_loss_is_next_token_cross_entropy_in_nats(model, tokens):
    logits = model(tokens)
    log_probs = logits.log_softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None])
    assert torch.allclose(model.loss(tokens), -log_probs.mean(), atol=1e-6)
    # An untrained model is close to uniform: loss ≈ log |V|.
    assert abs(model.loss(tokens).item() - math.log(VOCAB)) < 0.1


@pytest.mark.parametrize("d_in, d_out", [(64, 48), (70, 50257 // 300), (8, 8)], ids=["even", "ragged", "one-block"])
@pytest.mark.parametrize("stored", ["[d_in, d_out]", "[d_out, d_in]"])
@pytest.mark.parametrize(
    "lead", [(1,), (3,), (2, 4), (FEW_ROWS + 1,)], ids=["1-row", "3-rows", "2x4-rows", "many-rows"]
)
def test_linear_is_x_W_plus_b_on_every_layout_and_row_count(d_in, d_out, stored, lead):
    """primitives.linear is x W + b (float round-off) whichever way W is laid out in memory and however many rows
    x has: the few-row path (blocks of the weight, batched) and the plain product alike."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(d_in, d_out, generator=g) if stored == "[d_in, d_out]" else torch.randn(d_out, d_in, generator=g).T
    x, b = torch.randn(*lead, d_in, generator=g), torch.randn(d_out, generator=g)
    want = (x.double() @ W.double() + b.double()).float()
    with torch.inference_mode():
        for bias in (b, None):
            got = linear(x, W, bias)
            assert got.shape == (*lead, d_out)
            assert (got - (want if bias is not None else want - b)).abs().max() <= 1e-4


def test_linear_takes_the_block_path_for_a_few_rows_outside_autograd_only(monkeypatch):
    calls = []
    bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda *args: calls.append(1) or bmm(*args))
    W, few, many = torch.randn(64, 32), torch.randn(1, FEW_ROWS, 64), torch.randn(1, FEW_ROWS + 1, 64)
    with torch.inference_mode():
        linear(few, W), linear(few, W.T.contiguous().T)
        assert len(calls) == 2
        linear(many, W)
        assert len(calls) == 2
    out = linear(few, W.requires_grad_())  # under autograd: the plain product, differentiable
    assert len(calls) == 2 and out.requires_grad


# --- input checks ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.tensor([[0, VOCAB]]), "token id 100 is out of range"),
        (torch.tensor([[-1, 3]]), "token id -1 is out of range"),
        (torch.zeros(1, 65, dtype=torch.long), "longer than the model's context n_ctx = 64"),
        (torch.zeros(1, 3), "integer dtype"),
        (torch.zeros(1, 0, dtype=torch.long), "empty"),
        (torch.zeros(1, 2, 3, dtype=torch.long), "shape"),
        ([1, 2, 3], "torch.Tensor"),
    ],
)
def test_bad_tokens_raise_a_clear_error(model, bad, message):
    with pytest.raises(ValueError, match=message):
        model(bad)


# --- hooks -------------------------------------------------------------------------------------
EXPECTED_HOOKS = [
    "hook_embed",
    "hook_pos_embed",
    "unembed.hook_in",
    "unembed.hook_out",
    "ln_final.hook_scale",
    "ln_final.hook_normalized",
    *[
        f"blocks.1.{name}"
        for name in (
            "hook_resid_pre",
            "hook_resid_mid",
            "hook_resid_post",
            "hook_attn_out",
            "hook_mlp_out",
            "ln1.hook_scale",
            "ln1.hook_normalized",
            "ln2.hook_scale",
            "ln2.hook_normalized",
            "attn.hook_q",
            "attn.hook_k",
            "attn.hook_v",
            "attn.hook_attn_scores",
            "attn.hook_pattern",
            "attn.hook_z",
            "mlp.hook_pre",
            "mlp.hook_post",
        )
    ],
]


def test_every_activation_has_its_transformer_lens_name(model, tokens):
    assert set(EXPECTED_HOOKS) <= set(model.hook_dict)
    _, cache = model.run_with_cache(tokens)
    b, p = tokens.shape
    assert cache["blocks.1.attn.hook_pattern"].shape == (b, 4, p, p)
    assert cache["blocks.1.ln1.hook_scale"].shape == (b, p, 1)
    assert set(cache.keys()) == set(model.hook_dict)
    assert not any(name.endswith("attn.hook_result") for name in model.hook_dict)  # only while its switch is on
    model.set_use_attn_result(True)
    _, named = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_result")
    assert named["blocks.1.attn.hook_result"].shape == (b, p, 4, 64)


def test_a_missing_cache_entry_says_why_it_is_missing(model, tokens):
    _, cache = model.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)
    with pytest.raises(KeyError, match=r"use_attn_result is False.*set_use_attn_result\(True\)"):
        cache["blocks.0.attn.hook_result"]
    _, some = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    with pytest.raises(
        KeyError, match=r"'blocks.1.hook_resid_post' is a hook of the model but was not cached.*names_filter"
    ):
        some["resid_post", 1]
    with pytest.raises(KeyError, match=r"unknown hook name 'blocks.0.hook_nosuch'"):
        cache["nosuch", 0]
    with pytest.raises(KeyError, match=r"did you mean.*blocks.0.hook_resid_post"):
        cache["blocks.0.hook_resid_pst"]
    assert cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]  # TransformerLens's shorthands still work


def test_head_results_computed_from_the_default_cache_equal_the_hooked_ones(model, tokens):
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        stacked = cache.stack_head_results()  # TransformerLens computes them from hook_z and W_O
        model.set_use_attn_result(True)
        _, hooked = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("attn.hook_result"))
    expected = torch.cat([hooked[f"blocks.{l}.attn.hook_result"] for l in range(model.cfg.n_layers)], dim=2)
    assert torch.allclose(stacked, expected.movedim(2, 0), atol=1e-6)


# Hooks on these switch a computation to its explicit path (same result to round-off, tested below).
PATH_SWITCHING = ("hook_pattern", "hook_attn_scores", "hook_result", "hook_scale", "hook_normalized")


def test_an_identity_hook_leaves_logits_bit_identical(model, tokens):
    with torch.no_grad():
        plain = model(tokens)
        hooked = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: not n.endswith(PATH_SWITCHING), lambda x, hook: x)])
    assert torch.equal(plain, hooked)


@pytest.mark.parametrize("variant", [dict(), dict(norm="rmsnorm")], ids=["layernorm", "rmsnorm"])
def test_fused_and_explicit_norms_agree(variant, tokens):
    model = HookedTransformer(tiny_config(**variant), seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.2 * torch.randn_like(p))
        fused = model(tokens)
        explicit = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_scale"), lambda x, hook: x)])
    assert (fused - explicit).abs().max() <= 1e-5


def test_zero_ablating_a_head_changes_the_logits(model, tokens):
    def ablate(z, hook):
        z[:, :, 2] = 0.0
        return z

    with torch.no_grad():
        assert not torch.allclose(
            model(tokens), model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", ablate)])
        )


def test_result_hook_sums_to_attn_out(model, tokens):
    model.set_use_attn_result(True)
    _, cache = model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_result", "blocks.0.hook_attn_out"])
    summed = cache["blocks.0.attn.hook_result"].sum(2) + model.blocks[0].attn.b_O
    assert torch.allclose(summed, cache["blocks.0.hook_attn_out"], atol=1e-6)


def _attached(model) -> int:
    return sum(len(hp.fwd_hooks) + len(hp.bwd_hooks) for hp in model.hook_dict.values())


def test_no_hook_survives_a_hook_that_raises(model, tokens):
    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_mid", boom)])
    assert _attached(model) == 0
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(fwd_hooks=[("blocks.0.mlp.hook_post", boom)]):
            model(tokens)
    assert _attached(model) == 0
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(fwd_hooks=[("hook_embed", boom)]):
            model.run_with_cache(tokens)
    assert _attached(model) == 0


def test_unknown_hook_name_names_close_matches(model, tokens):
    with pytest.raises(KeyError, match="blocks.0.hook_resid_pre"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pr", lambda x, hook: x)])
    with pytest.raises(KeyError, match="unknown hook name"):
        model.run_with_cache(tokens, names_filter=["blocks.9.attn.hook_pattern"])
    assert _attached(model) == 0


# --- TransformerLens's cache methods on our cache ---------------------------------------------
def test_decompose_resid_sums_to_the_final_residual_stream(model, tokens):
    _, cache = model.run_with_cache(tokens)
    parts = cache.decompose_resid(return_labels=False)
    assert torch.allclose(parts.sum(0), cache["blocks.1.hook_resid_post"], atol=1e-5)


@pytest.mark.parametrize("variant", [dict(), dict(norm="rmsnorm", positions="rotary")], ids=["ln", "rms"])
def test_logit_lens_at_the_last_layer_reproduces_the_logits(variant, tokens):
    model = HookedTransformer(tiny_config(**variant)).eval()
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        stack = cache.accumulated_resid(apply_ln=True)
        lens = stack @ model.W_U + model.b_U
    assert (lens[-1] - logits).abs().max() <= 1e-5


def test_logit_attrs_runs(model, tokens):
    _, cache = model.run_with_cache(tokens)
    parts = cache.decompose_resid(return_labels=False, pos_slice=-1)
    attrs = cache.logit_attrs(parts, tokens=tokens[:, -1], incorrect_tokens=tokens[:, 0], pos_slice=-1)
    assert attrs.shape == (parts.shape[0], tokens.shape[0])
    assert torch.isfinite(attrs).all()


# --- checkpoints -------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_save_and_load_round_trip(variant, tmp_path, tokens):
    model = HookedTransformer(tiny_config(**variant), seed=7).eval()
    model.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = HookedTransformer.load(tmp_path)
    assert loaded.cfg == model.cfg
    assert torch.equal(loaded(tokens), model(tokens))
    assert torch.equal(HookedTransformer.from_pretrained(tmp_path)(tokens), model(tokens))


def test_a_forma_folder_loads_as_saved_and_encodes_text_as_written(tmp_path, tokens):
    """A Forma folder (a zoo model's) is a checkpoint of the model itself: from_pretrained's processing flags
    default off for it, and its text gets no BOS (cfg.default_prepend_bos False), as its card says."""
    from lab.data.tokenizers import word_level

    model = HookedTransformer(tiny_config(d_vocab=8), seed=7, tokenizer=word_level(["a", "b", "c", "d"])).eval()
    model.save(tmp_path)
    loaded = HookedTransformer.from_pretrained(tmp_path)
    assert loaded.cfg == model.cfg and not loaded.cfg.default_prepend_bos
    assert loaded.to_tokens("a b").tolist() == [[4, 5]]
    assert loaded.to_tokens("a b", prepend_bos=True).tolist() == [[2, 4, 5]]
    processed = HookedTransformer.from_pretrained(
        tmp_path, fold_ln=True, center_writing_weights=True, center_unembed=True
    )
    assert processed.cfg.norm == "layernorm_pre"
    with torch.no_grad():
        ids = tokens[:, :8] % 8
        assert torch.allclose(processed(ids).log_softmax(-1), model(ids).log_softmax(-1), atol=1e-5)


def test_bad_checkpoints_raise_clear_errors(tmp_path, model):
    model.save(tmp_path / "ok")
    truncated = tmp_path / "truncated"
    model.save(truncated)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="malformed or truncated checkpoint"):
        HookedTransformer.load(truncated)
    mismatch = tmp_path / "mismatch"
    model.save(mismatch)
    (mismatch / "config.json").write_text(model.cfg.replace(d_mlp=128).to_json())
    with pytest.raises(ValueError, match=r"mis-shaped .*mlp\.W_in"):
        HookedTransformer.load(mismatch)
    (mismatch / "config.json").write_text('{"d_vocab": 3')
    with pytest.raises(ValueError, match=r"malformed JSON in .*config\.json, line 1 column 14"):
        HookedTransformer.load(mismatch)
    with pytest.raises(FileNotFoundError, match="no model folder"):
        HookedTransformer.load(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown model 'no-such-model'"):
        HookedTransformer.from_pretrained("no-such-model")


def test_a_failed_save_leaves_the_old_checkpoint_intact(tmp_path, model, monkeypatch, tokens):
    model.save(tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    import lab.model.checkpoint as checkpoint

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        HookedTransformer(model.cfg, seed=99).save(tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_tokenizer_round_trip(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "the", "cat", "sat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model = HookedTransformer(tiny_config(d_vocab=4), tokenizer=tok)
    assert model.to_tokens("the cat sat").tolist() == [[1, 2, 3]]
    assert model.to_string(torch.tensor([1, 2, 3])) == "the cat sat"
    assert model.to_str_tokens("the cat") == ["the", "cat"]
    model.save(tmp_path)
    assert HookedTransformer.load(tmp_path).to_tokens("sat cat").tolist() == [[3, 2]]
    with pytest.raises(ValueError, match="no tokenizer"):
        HookedTransformer(tiny_config()).to_tokens("hello")


def test_single_token_helpers_refuse_what_is_not_one_token_of_the_vocabulary():
    """to_single_token gives the id of a string that is one token; a word the vocabulary lacks (which the tokenizer
    encodes to <unk>) and a string of two tokens are refused, by name, as TransformerLens refuses them (an
    AssertionError); to_single_str_token gives a token id's string."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "the", "cat"])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model = HookedTransformer(tiny_config(d_vocab=3), tokenizer=tok)
    assert model.to_single_token("cat") == 2 and model.to_single_token("<unk>") == 0
    assert model.to_single_str_token(1) == "the"
    with pytest.raises(AssertionError, match="'dog' is not in the tokenizer's vocabulary"):
        model.to_single_token("dog")
    with pytest.raises(AssertionError, match="'the cat' is 2 tokens, not one"):
        model.to_single_token("the cat")
    with pytest.raises(ValueError, match="takes one token id"):
        model.to_single_str_token("cat")


# --- the transformer's own claims (docs/definitions.md §4) -------------------------------------------
def test_sinusoidal_encoding_of_pos_plus_k_is_a_fixed_rotation():
    d, k = 64, 5
    pe = sinusoidal_table(200, d).double()
    frequency = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cos(k * frequency), torch.sin(k * frequency)
    # Per pair (sin, cos): [sin(a+b), cos(a+b)] = [[cos b, sin b], [−sin b, cos b]] · [sin a, cos a]
    s, c = pe[:-k, 0::2], pe[:-k, 1::2]
    rotated_s, rotated_c = cos * s + sin * c, -sin * s + cos * c
    assert (rotated_s - pe[k:, 0::2]).abs().max() < 1e-5
    assert (rotated_c - pe[k:, 1::2]).abs().max() < 1e-5


def test_rotary_scores_depend_only_on_the_offset():
    cfg = tiny_config(positions="rotary", n_ctx=128)
    rotary = Rotary(cfg)
    q, k = torch.randn(1, 1, 1, cfg.d_head), torch.randn(1, 1, 1, cfg.d_head)

    def score(m: int, n: int) -> float:
        return float((rotary(q, m) * rotary(k, n)).sum())

    for shift in (0, 3, 17):
        scores = [score(m, m + shift) for m in range(0, 100, 7)]
        assert max(scores) - min(scores) < 1e-4
    assert abs(score(0, 3) - score(0, 17)) > 1e-3


def test_parameter_count_is_twelve_l_d_squared_plus_embeddings():
    for L, d, V in [(2, 64, 100), (6, 256, 1000), (12, 768, 50257)]:
        cfg = ModelConfig(
            d_vocab=V,
            d_model=d,
            n_layers=L,
            n_heads=4,
            n_ctx=64,
            positions="none",
            tied_embeddings=True,
            bias=False,
            norm="rmsnorm",
        )
        # 12·L·d² + |V|·d, plus the lower-order terms: norm gains (2 per block + final) and b_U.
        assert cfg.n_params() == 12 * L * d * d + V * d + (2 * L + 1) * d + V
        with torch.device("meta"):
            assert sum(p.numel() for p in HookedTransformer(cfg).parameters()) == cfg.n_params()


def test_llama_7b_shaped_config_counts_6_74e9_parameters():
    cfg = ModelConfig(
        d_vocab=32000,
        d_model=4096,
        n_layers=32,
        n_heads=32,
        n_ctx=2048,
        d_mlp=11008,
        positions="rotary",
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
    )
    with torch.device("meta"):
        model = HookedTransformer(cfg)
    count = sum(p.numel() for p in model.parameters())
    assert count == cfg.n_params()
    # LLaMA-7B has 6,738,415,616 parameters; Forma's unembedding adds a bias b_U of |V| = 32,000.
    assert count == 6_738_415_616 + 32000
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize("variant", [dict(), dict(n_kv_heads=2, positions="rotary", bias=False)], ids=["mha", "gqa"])
def test_few_token_and_many_token_projections_agree(variant):
    """Under autograd a decoding step (few tokens: per-head products) and a batch (one fused product), and outside
    it both (the kept fused weights), give the same q, k, v."""
    from lab.model.attention import FEW_TOKENS

    model = HookedTransformer(tiny_config(**variant), seed=0).eval()
    one = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    many = one.repeat(FEW_TOKENS // 6 + 1, 1)
    assert one.numel() < FEW_TOKENS <= many.numel()
    names = [f"blocks.1.attn.hook_{n}" for n in "qkv"]
    with torch.enable_grad():
        _, few = model.run_with_cache(one, names_filter=names)
        _, lots = model.run_with_cache(many, names_filter=names)
        assert (model(one) - model(many)[:1]).abs().max() <= 1e-5
    with torch.no_grad():
        _, kept = model.run_with_cache(one, names_filter=names)
    for name in names:
        assert (few[name] - lots[name][:1]).abs().max() <= 1e-6, name
        assert (few[name] - kept[name]).abs().max() <= 1e-6, name


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_zero_b_U_is_left_out_until_it_changes_and_still_gets_its_gradient(tied):
    """The unembedding skips adding an all-zero b_U outside autograd; an in-place write or a new tensor is read
    again, and under autograd b_U is always added, so its gradient is real."""
    model = HookedTransformer(tiny_config(tied_embeddings=tied), seed=0).eval()
    tokens = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))

    def by_hand() -> torch.Tensor:
        resid = model(tokens, stop_at_layer=model.cfg.n_layers)
        return model.ln_final(resid) @ model.W_U + model.b_U

    with torch.no_grad():
        before = model(tokens)
        assert (before - by_hand()).abs().max() <= 1e-5
        for change, shift in ((lambda b: b.add_(0.5), 0.5), (lambda b: b.zero_(), 0.0)):  # in place: a new version
            change(model.unembed.b_U)
            assert (model(tokens) - (before + shift)).abs().max() <= 1e-5
        model.unembed.b_U = torch.nn.Parameter(torch.full((VOCAB,), 0.25))  # a new tensor
        assert (model(tokens) - (before + 0.25)).abs().max() <= 1e-5
        model.unembed.b_U = torch.nn.Parameter(torch.zeros(VOCAB))
    model.loss(tokens).backward()
    assert model.unembed.b_U.grad is not None and model.unembed.b_U.grad.abs().sum() > 0


def test_the_kept_fused_qkv_weights_follow_every_change_to_the_weights():
    """Outside autograd attention keeps [W_Q | W_K | W_V] side by side; an in-place write, load_state_dict and a new
    parameter each give the output that weights laid anew (under autograd) give."""
    model = HookedTransformer(tiny_config(n_kv_heads=2, positions="rotary"), seed=0).eval()
    other = HookedTransformer(tiny_config(n_kv_heads=2, positions="rotary"), seed=1).eval()
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))

    def agrees() -> torch.Tensor:
        with torch.no_grad():
            kept = model(tokens)
        with torch.enable_grad():
            fresh = model(tokens).detach()
        assert (kept - fresh).abs().max() <= 1e-5
        return kept

    first = agrees()
    with torch.no_grad():
        model.blocks[0].attn.W_K.mul_(1.5)
        model.blocks[1].attn.b_V.add_(0.1)
    assert (agrees() - first).abs().max() > 1e-3  # the change reached the output
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert (agrees() - other(tokens)).abs().max() <= 1e-5
    model.blocks[1].attn.W_Q = torch.nn.Parameter(torch.randn_like(model.blocks[1].attn.W_Q))
    second = agrees()
    with torch.no_grad():
        assert (second - other(tokens)).abs().max() > 1e-3
