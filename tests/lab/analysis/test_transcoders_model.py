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


def subset_of(tc: Transcoders, layers: tuple[int, ...]) -> Transcoders:
    """The transcoders of `layers` alone, each layer's weights `tc`'s."""
    cfg = tc.cfg.replace(n_layers=len(layers), layers=layers)
    subset = Transcoders(cfg)
    with torch.no_grad():
        for i, layer in enumerate(layers):
            subset.W_enc[i], subset.b_enc[i], subset.b_dec[i] = tc.W_enc[layer], tc.b_enc[layer], tc.b_dec[layer]
            subset.W_dec[i].copy_(tc.W_dec[layer])
    return subset.eval()


def test_transcoders_of_some_layers_read_and_replace_those_layers_alone(tmp_path):
    """A set of layers (2,) reads and writes layer 2's hooks; its measures are that layer's, and the replacement
    (and its zero-ablated baseline) replaces that layer's MLP alone: exact transcoders recover all of it, and the
    baseline is the model with only that MLP ablated."""
    model = tiny_model(mlp="relu")
    tc = subset_of(exact_transcoders(model), (2,))
    assert tc.cfg.hooks() == ["blocks.2.ln2.hook_normalized", "blocks.2.hook_mlp_out"]
    assert tc.cfg.model_layers() == [2]
    tokens = torch.randint(0, 50, (8, 16), generator=torch.Generator().manual_seed(0))
    store = save_activations(model, tokens, tc.cfg.hooks(), tmp_path / "h", positions="all", progress=False)
    assert reconstruction_measures(tc, store)["fvu"][0] < 1e-10
    loss = replacement_loss(model, tc, tokens)
    assert loss["recovered"] == pytest.approx(1.0, abs=1e-4)
    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.2.hook_mlp_out", lambda out, hook: torch.zeros_like(out))]):
        logits = model(tokens)
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), tokens[:, 1:].reshape(-1))
    assert loss["ce_zero_ablated"] == pytest.approx(float(ce), abs=1e-5)
    assert loss["ce_zero_ablated"] != pytest.approx(
        replacement_loss(model, exact_transcoders(model), tokens)["ce_zero_ablated"]
    )


def test_a_subset_is_saved_loaded_and_checked_against_the_model(tmp_path):
    model = tiny_model()
    tc = subset_of(random_transcoders(model), (0, 2))
    tc.save(tmp_path / "tc", built_from(model_fingerprint(model), 1))
    loaded = Transcoders.load(tmp_path / "tc", model)
    assert loaded.cfg.layers == (0, 2) and torch.equal(loaded.W_enc, tc.W_enc)
    with pytest.raises(ValueError, match="transcoders of layer 2, the model has n_layers 2"):
        Transcoders.load(tmp_path / "tc", tiny_model(n_layers=2))
    for layers, says in (((2, 0), "increasing order"), ((0, 0), "increasing order"), ((1,), "must name n_layers")):
        with pytest.raises(ValueError, match=says):
            tc.cfg.replace(layers=layers)


def test_an_attribution_graph_refuses_transcoders_of_some_layers():
    from lab.analysis.graphs.replacement import LocalReplacement

    model = tiny_model()
    with pytest.raises(ValueError, match="layers 0, 2 alone: an attribution graph needs one for every layer"):
        LocalReplacement(model, subset_of(random_transcoders(model), (0, 2)), torch.tensor([1, 2, 3]))
