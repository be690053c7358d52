"""lab.analysis.transcoders.model: the map, its activations and its files."""

import json

import pytest
import torch

from lab import HookedTransformer
from lab.analysis.activations.store import save_activations
from lab.analysis.transcoders.measures import reconstruction_measures, replacement_loss
from lab.analysis.transcoders.model import TranscoderConfig, Transcoders, built_from, model_fingerprint, weight_values
from tests.builders import exact_transcoders, random_transcoders, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_exact_transcoders_of_a_relu_model_reproduce_its_mlps(tmp_path):
    """Each neuron a feature: the transcoders' output is the MLP's, so FVU is 0 and the replacement recovers the
    whole gap to zero-ablation (measures checked on a case whose answer is known)."""
    model = tiny_model(mlp="relu")
    tc = exact_transcoders(model)
    tokens = torch.randint(0, 50, (8, 16), generator=torch.Generator().manual_seed(0))
    store = save_activations(model, tokens, tc.cfg.hooks(), tmp_path / "h", positions="all", progress=False)
    measures = reconstruction_measures(tc, store)
    assert max(measures["fvu"]) < 1e-10
    loss = replacement_loss(model, tc, tokens)
    assert loss["ce_replaced"] == pytest.approx(loss["ce_model"], abs=1e-5)
    assert loss["recovered"] == pytest.approx(1.0, abs=1e-4)
    assert loss["ce_zero_ablated"] != pytest.approx(loss["ce_model"], abs=1e-3)


@pytest.mark.parametrize("activation", ["relu", "topk", "jumprelu"])
def test_each_activation(activation):
    tc = random_transcoders(tiny_model(), activation=activation)
    x = torch.randn(5, 3, 32)
    acts = tc.activate(tc.encode(x))
    assert (acts >= 0).all()
    if activation == "topk":
        assert ((acts > 0).sum(-1) <= 8).all()
    if activation == "jumprelu":
        pre = tc.encode(x)
        assert torch.equal(acts, pre * (pre > tc.log_threshold.exp()))


def test_a_cross_layer_transcoder_writes_each_layer_the_sum_of_the_layers_before():
    tc = random_transcoders(tiny_model(), cross_layer=True)
    acts = torch.rand(2, 3, 64)
    out = tc.decode(acts)
    features = torch.arange(64)
    for target in range(3):
        expected = tc.b_dec[target] + sum(
            acts[:, source] @ tc.decoder(source, features, target) for source in range(target + 1)
        )
        torch.testing.assert_close(out[:, target], expected)
    assert torch.equal(tc.decoder(2, features, 0), torch.zeros(64, 32))


def test_save_and_load_round_trip_and_bad_files_are_named(tmp_path):
    tc = random_transcoders(tiny_model(), cross_layer=True, activation="jumprelu")
    tc.save(tmp_path / "tc")
    again = Transcoders.load(tmp_path / "tc")
    assert again.cfg == tc.cfg
    for name, t in tc.state_tensors().items():
        assert torch.equal(t, again.state_tensors()[name])
    (tmp_path / "tc" / "transcoders.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="malformed or truncated"):
        Transcoders.load(tmp_path / "tc")
    with pytest.raises(FileNotFoundError, match="not a transcoders folder"):
        Transcoders.load(tmp_path / "nowhere")


def test_bad_configs_are_one_clear_line():
    with pytest.raises(ValueError, match="TranscoderConfig.k"):
        TranscoderConfig(d_model=8, n_layers=1, d_features=4, activation="topk")
    with pytest.raises(ValueError, match="activation"):
        TranscoderConfig(d_model=8, n_layers=1, d_features=4, activation="gelu")


def test_circuit_tracer_files_hold_its_layout(tmp_path):
    from safetensors.torch import load_file

    tc = random_transcoders(tiny_model(), activation="jumprelu")
    paths = tc.to_circuit_tracer(tmp_path)
    layer = load_file(str(paths[1]))
    assert torch.equal(layer["W_enc"], tc.W_enc[1].T.detach())
    assert torch.equal(layer["W_dec"], tc.W_dec[1][:, 0].detach())
    torch.testing.assert_close(layer["activation_function.threshold"], tc.log_threshold[1].exp().detach())
    with pytest.raises(ValueError, match="per-layer"):
        random_transcoders(tiny_model(), cross_layer=True).to_circuit_tracer(tmp_path)


def test_transcoders_carry_their_model_and_another_model_of_the_same_shape_is_refused(tmp_path):
    """source.json holds the model's fingerprint (a hash of its config and of a strided sample of its weights) and
    the step: loading against that model works, against another of the same shape (other seed) or another config
    it is refused naming what differs, and a set that records no model is refused saying so."""
    model = tiny_model()
    tc = random_transcoders(model)
    tc.save(tmp_path / "tc", built_from(model_fingerprint(model), 40))
    assert json.loads((tmp_path / "tc" / "source.json").read_text())["step"] == 40
    assert torch.equal(Transcoders.load(tmp_path / "tc", model).W_enc, tc.W_enc)
    other = HookedTransformer(model.cfg, seed=1).eval()
    assert other.cfg == model.cfg
    with pytest.raises(ValueError, match=r"built from another model: its weights \(") as err:
        Transcoders.load(tmp_path / "tc", other)
    assert "config" not in str(err.value).split(":")[1]
    with pytest.raises(ValueError, match=r"built from another model: its config \("):
        Transcoders.load(tmp_path / "tc", tiny_model(mlp="relu"))
    with pytest.raises(ValueError, match="d_model 32, the model has d_model 16"):
        Transcoders.load(tmp_path / "tc", tiny_model(d_model=16))
    (tmp_path / "tc" / "source.json").unlink()
    with pytest.raises(ValueError, match="records no model it was built from"):
        Transcoders.load(tmp_path / "tc", model)


def test_a_config_asking_for_more_weights_than_the_file_holds_is_refused_before_memory_is_taken(tmp_path):
    """d_features 10**9 in config.json (4 TB of weights) beside a small file: one line, nothing allocated; the count
    of weights is the set's own."""
    tc = random_transcoders(tiny_model(), cross_layer=True)
    assert weight_values(tc.cfg) == sum(t.numel() for t in tc.state_tensors().values())
    tc.save(tmp_path / "tc")
    config = json.loads((tmp_path / "tc" / "config.json").read_text())
    (tmp_path / "tc" / "config.json").write_text(json.dumps(config | {"d_features": 10**9}))
    with pytest.raises(ValueError, match="too few for the .* weights its config.json describes"):
        Transcoders.load(tmp_path / "tc")
