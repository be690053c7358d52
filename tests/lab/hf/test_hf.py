"""Hugging Face parity: identical weights give identical logits, both ways, and TransformerBridge agrees."""

import pytest
import torch

from lab import HookedTransformer
from lab.hf.convert import from_hf, to_hf
from lab.hf.family import UnsupportedArchitecture
from lab.hf.folder import hf_model_type
from lab.hf.loading import load_hf
from tests.builders import hf_model, tiny_config, word_tokenizer


def test_llama_fixture_uses_grouped_kv_heads():
    model = from_hf(hf_model("llama", n_kv_heads=2))
    assert model.cfg.n_kv_heads == 2 < model.cfg.n_heads


def test_round_trip_through_hugging_face(hf_case, tokens):
    """A converted model exports back to a Hugging Face model computing its logits, and converts again to the very
    same model (every registered family and variant; tests/test_hf_families.py holds each direction alone)."""
    model = from_hf(hf_case.build())
    with torch.no_grad():
        assert (to_hf(model)(tokens).logits - model(tokens)).abs().max() <= 1e-5
        again = from_hf(to_hf(model))
        assert torch.equal(again(tokens), model(tokens))


def test_to_hf_of_a_native_model(tokens):
    model = HookedTransformer(tiny_config(mlp="gelu_tanh"), seed=3).eval()
    with torch.no_grad():
        assert (to_hf(model)(tokens).logits - model(tokens)).abs().max() <= 1e-4


def test_load_hf_reads_a_local_folder(tmp_path, tokens):
    hf = hf_model("llama")
    hf.save_pretrained(tmp_path)
    word_tokenizer(tmp_path)
    model = load_hf(tmp_path)
    assert model.tokenizer is not None
    assert model.cfg.default_prepend_bos  # a LLaMA whose tokenizer has a BOS: text gets it, as in TransformerLens
    assert model.to_tokens("w1 w2 w3").tolist() == [[2, 5, 6, 7]]
    assert model.to_tokens("w1 w2 w3", prepend_bos=False).tolist() == [[5, 6, 7]]
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max() <= 1e-4
        assert torch.equal(HookedTransformer.from_pretrained_no_processing(tmp_path)(tokens), model(tokens))
        processed = HookedTransformer.from_pretrained(tmp_path)  # TransformerLens's processing, by default
        assert processed.cfg.norm == "rmsnorm_pre"
        assert not any(module.training for module in processed.modules())  # the new norms in the model's mode
        assert (processed(tokens).log_softmax(-1) - model(tokens).log_softmax(-1)).abs().max() <= 1e-5


def test_the_rotary_table_is_computed_once_for_every_layer(monkeypatch):
    """Converting builds the model on the meta device and computes the rotary cos/sin tables on the CPU once, shared
    by every layer: one Rotary beyond the meta model's own (one per layer), not one per layer and buffer."""
    from lab.model.attention import Rotary

    built = []
    init = Rotary.__init__
    monkeypatch.setattr(Rotary, "__init__", lambda self, cfg: (built.append(cfg), init(self, cfg))[1])
    model = from_hf(hf_model("llama"))
    assert len(built) == model.cfg.n_layers + 1
    tables = {block.attn.rotary.cos.data_ptr() for block in model.blocks}
    assert len(tables) == 1


def test_hf_model_type_names_a_hugging_face_folder_and_nothing_else(tmp_path):
    """The architecture a save_pretrained folder records, read without transformers; None for a Forma model
    folder (its config.json names no model_type), a folder without config.json, and an unreadable one."""
    hf_model("llama").save_pretrained(tmp_path / "hf")
    HookedTransformer(tiny_config()).save(tmp_path / "forma")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    (tmp_path / "empty").mkdir()
    assert hf_model_type(tmp_path / "hf") == "llama"
    assert [hf_model_type(tmp_path / name) for name in ("forma", "broken", "empty", "absent")] == [None] * 4


def test_unsupported_architecture_points_to_the_bridge():
    from transformers import OPTConfig, OPTForCausalLM

    hf = OPTForCausalLM(
        OPTConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            ffn_dim=64,
            vocab_size=50,
            word_embed_proj_dim=32,
        )
    )
    with pytest.raises(UnsupportedArchitecture, match="TransformerBridge") as err:
        from_hf(hf)
    assert all(family in str(err.value) for family in ("GPT-2", "LLaMA", "GPT-NeoX", "Qwen2", "Mistral"))
    with pytest.raises(UnsupportedArchitecture, match="post-LN|pre-LN"):
        to_hf(HookedTransformer(tiny_config(block="post_ln")))
