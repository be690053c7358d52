"""A model folder loads exactly what its config describes or not at all: a missing, unexpected or mis-shaped
tensor, a truncated or pickled weights file, a malformed tokenizer is an error that names it — in load_hf,
from_hf, the bridge, `forma trust`, `forma hooks` and the dashboard's loader — never random weights, a
traceback, or an unpickled file."""

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file

from lab import HookedTransformer
from lab.cli.parser import main
from lab.hf.convert import from_hf
from lab.hf.loading import bridge, load_hf
from tests.builders import gpt2_folder, hf_model, rewrite_weights, tiny_config


def every_loader(directory):
    """What each entry point says about a folder: the library calls, both CLI commands, the dashboard."""
    return {
        "load_hf": lambda: load_hf(directory),
        "from_pretrained": lambda: HookedTransformer.from_pretrained(directory),
        "bridge": lambda: bridge(directory),
    }


# --- missing, unexpected and mis-shaped tensors ---------------------------------------------------------
@pytest.fixture
def three_layers_said_two_held(tmp_path):
    """config.json says 3 layers; model.safetensors holds the 2 that hf_model("gpt2") has."""
    return gpt2_folder(tmp_path / "gpt2", n_layer_in_config=3, tokenizer=True)


def test_a_layer_the_weights_lack_is_an_error_naming_it(three_layers_said_two_held):
    for name, load in every_loader(three_layers_said_two_held).items():
        with pytest.raises(ValueError, match=r"missing .*transformer\.h\.2\.") as err:
            load()
        assert "config.json" in str(err.value), name


def test_forma_trust_and_hooks_refuse_it_with_exit_2(three_layers_said_two_held, capsys):
    for command in ("trust", "hooks"):
        assert main([command, str(three_layers_said_two_held)]) == 2
        err = capsys.readouterr().err
        assert f"forma {command}: error:" in err and "transformer.h.2." in err and "Traceback" not in err
    assert not (three_layers_said_two_held / "trust.json").exists()


def test_the_dashboards_loader_shows_the_error(three_layers_said_two_held, monkeypatch):
    import dashboards.display as common

    shown = []
    monkeypatch.setattr(common.st, "error", shown.append)
    monkeypatch.setattr(common.st, "warning", shown.append)
    from tests.builders import rendered

    assert common.try_load_model(str(three_layers_said_two_held)) is None
    assert len(shown) == 1 and "transformer.h.2." in rendered(shown[0])  # the page escapes what the error quotes


def test_an_unexpected_tensor_is_an_error_naming_it(tmp_path):
    folder = gpt2_folder(tmp_path, tokenizer=True)
    rewrite_weights(folder, lambda state: state.update({"transformer.h.7.mlp.c_fc.weight": torch.zeros(2, 2)}))
    for load in every_loader(folder).values():
        with pytest.raises(ValueError, match=r"unexpected .*transformer\.h\.7\.mlp\.c_fc\.weight"):
            load()


def test_a_mis_shaped_tensor_is_an_error_naming_it_and_both_shapes(tmp_path):
    folder = gpt2_folder(tmp_path, tokenizer=True)
    rewrite_weights(folder, lambda state: state.update({"transformer.h.0.mlp.c_fc.weight": torch.zeros(64, 100)}))
    for load in every_loader(folder).values():
        with pytest.raises(ValueError, match=r"transformer\.h\.0\.mlp\.c_fc\.weight.*\(64, 100\).*\(64, 256\)"):
            load()


def test_what_hugging_face_documents_as_derived_may_be_absent_or_present(tmp_path):
    """GPT-2's causal-mask buffers (attn.bias) are ignored, a tied lm_head need not be stored."""
    folder = gpt2_folder(tmp_path, tie=True)
    rewrite_weights(
        folder,
        lambda state: state.update(
            {f"transformer.h.{l}.attn.bias": torch.tril(torch.ones(1, 1, 64, 64)) for l in range(2)}
        ),
    )
    assert "lm_head.weight" not in load_file(folder / "model.safetensors")
    tokens = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(load_hf(folder)(tokens), from_hf(hf_model("gpt2", tie=True))(tokens))


def test_an_untied_head_must_be_stored(tmp_path):
    folder = gpt2_folder(tmp_path, tie=False)
    rewrite_weights(folder, lambda state: state.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\]"):
        load_hf(folder)


def test_from_hf_checks_the_module_tree_against_its_config(hf_family):
    from lab.hf.families import FAMILIES

    prefix = FAMILIES[hf_family.model_type].modules["blocks.{l}"].removesuffix(".{l}")
    hf = hf_family.build()
    del hf.get_submodule(prefix)[1]  # the config still says 2 layers
    with pytest.raises(ValueError, match=rf"missing .*{prefix}\.1\."):
        from_hf(hf)
    hf = hf_family.build()
    with torch.no_grad():
        hf.get_output_embeddings().weight = torch.nn.Parameter(torch.zeros(100, 32))
    with pytest.raises(ValueError, match=r"lm_head\.weight.*\(100, 32\).*\(100, 64\)"):
        from_hf(hf)
    hf = hf_family.build()
    hf.register_buffer("stray", torch.zeros(3))
    hf.stray_weight = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="unexpected .*stray_weight"):
        from_hf(hf)


def test_a_mistyped_field_in_a_hugging_face_config_is_an_error_naming_it(tmp_path, capsys):
    folder = gpt2_folder(tmp_path, tie=False, tokenizer=True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": "false"}))
    for load in every_loader(folder).values():
        with pytest.raises(ValueError, match="config.json.*tie_word_embeddings"):
            load()
    assert main(["trust", str(folder)]) == 2 and "tie_word_embeddings" in capsys.readouterr().err


# --- files that are not what they claim ---------------------------------------------------------------
class WritesWhenUnpickled:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_pickle_checkpoint_is_refused_unread_with_how_to_convert(tmp_path, capsys):
    folder = gpt2_folder(tmp_path / "gpt2", tokenizer=True)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "unpickled"
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"transformer.wte.weight": WritesWhenUnpickled(marker)}))
    for name, load in every_loader(folder).items():
        with pytest.raises(ValueError, match="reads safetensors only") as err:
            load()
        assert "pytorch_model.bin" in str(err.value) and "save_pretrained" in str(err.value), name
    for command in ("trust", "hooks"):
        assert main([command, str(folder)]) == 2
        assert "safetensors only" in capsys.readouterr().err
    assert not marker.exists()


def test_no_weights_at_all_is_a_file_not_found(tmp_path):
    folder = gpt2_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf(folder)


def test_a_truncated_safetensors_file_is_an_error_naming_it(tmp_path, capsys):
    folder = gpt2_folder(tmp_path / "gpt2", tokenizer=True)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    for name, load in every_loader(folder).items():
        with pytest.raises(ValueError, match="truncated") as err:
            load()
        assert str(weights) in str(err.value), name
    assert main(["hooks", str(folder)]) == 2 and "truncated" in capsys.readouterr().err


def test_a_sharded_checkpoint_is_checked_shard_by_shard(tmp_path):
    folder = tmp_path / "sharded"
    hf_model("llama").save_pretrained(folder, max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    tokens = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (load_hf(folder)(tokens) - hf_model("llama")(tokens).logits).abs().max() <= 1e-4
    (folder / shards[-1]).unlink()
    with pytest.raises(FileNotFoundError, match=shards[-1]):
        load_hf(folder)
    (folder / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="model.safetensors.index.json"):
        load_hf(folder)


def test_a_malformed_tokenizer_is_an_error_naming_the_file(tmp_path, capsys):
    hf = gpt2_folder(tmp_path / "hf", tokenizer=True)
    (hf / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    forma = tmp_path / "forma"
    HookedTransformer(tiny_config(), seed=0).save(forma)
    (forma / "tokenizer.json").write_text("not a tokenizer")
    for folder in (hf, forma):
        with pytest.raises(ValueError, match="tokenizer") as err:
            HookedTransformer.from_pretrained(folder)
        assert str(folder) in str(err.value)
        assert main(["hooks", str(folder)]) == 2
        assert "tokenizer" in capsys.readouterr().err
