"""lab.analysis: streamed activations equal run_with_cache, probes find planted directions and not noise,
patching a run into itself restores everything, steering is nothing at zero and the same cached or not."""

import json

import numpy as np
import pytest
import torch

from lab import HookedTransformer
from lab.analysis.activations.collect import collect_activations, select_positions
from lab.analysis.activations.store import ActivationStore, save_activations
from lab.analysis.patching import logit_diff, patch_heads, patch_positions
from lab.analysis.probes.fitting import r2_score
from lab.analysis.probes.probe import fit_probe, fit_probes, steering_vector
from lab.analysis.probes.readouts import random_model, shuffled_control
from lab.analysis.probes.splits import group_kfold, group_split
from lab.analysis.steering import generate_steered, steer
from lab.metrics.discrimination import auroc, bootstrap_ci
from lab.model.decoding import generate
from tests.builders import VOCAB, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


HOOKS = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z", "blocks.0.attn.hook_pattern"]


@pytest.fixture
def data() -> torch.Tensor:
    return torch.randint(0, VOCAB, (10, 12), generator=torch.Generator().manual_seed(3))


def no_hooks_attached(model: HookedTransformer) -> bool:
    return (
        all(not hp._forward_hooks and not hp._backward_hooks for hp in model.hook_dict.values())
        and not model._forward_pre_hooks
    )


def reference(model, data, name, seq, pos):
    _, cache = model.run_with_cache(data, names_filter=[name])
    dim = 2 if name.endswith("hook_pattern") else 1
    return cache[name].movedim(dim, 1)[seq, pos]


# --- activations --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "positions", ["last", "all", [0, 5, -1], lambda t: t % 3 == 0], ids=["last", "all", "indices", "predicate"]
)
def test_streamed_activations_equal_run_with_cache_at_the_selected_positions(model, data, positions):
    acts = collect_activations(model, data, HOOKS, positions, batch_size=3, progress=False)
    b, p = select_positions(data, positions)
    assert torch.equal(acts.seq, b) and torch.equal(acts.pos, p)
    for name in HOOKS:
        assert torch.allclose(acts[name], reference(model, data, name, acts.seq, acts.pos), atol=1e-6), name
    assert acts["blocks.1.attn.hook_z"].shape == (len(acts), 4, 16)
    assert no_hooks_attached(model)


def test_last_position_skips_right_padding_and_a_list_of_batches_matches_a_tensor(model, data):
    padded = data.clone()
    padded[0, 8:] = 0
    padded[1, 4:] = 0
    acts = collect_activations(
        model, list(padded.split(4)), "blocks.1.hook_resid_pre", "last", pad_id=0, progress=False
    )
    assert acts.pos[:3].tolist() == [7, 3, 11]
    assert torch.allclose(
        acts["blocks.1.hook_resid_pre"],
        reference(model, padded, "blocks.1.hook_resid_pre", acts.seq, acts.pos),
        atol=1e-6,
    )


def test_the_forward_pass_stops_after_the_last_hook_asked_for(model, data):
    calls = []
    with model.hooks(fwd_hooks=[("unembed.hook_out", lambda x, hook: calls.append(1))]):
        collect_activations(model, data, "blocks.0.hook_resid_post", progress=False)
        assert not calls
        collect_activations(model, data, "blocks.0.hook_resid_post", progress=False, stop_early=False)
        assert calls


def test_disk_shards_round_trip(model, data, tmp_path):
    positions = lambda t: t % 2 == 0  # noqa: E731 - a predicate is what is being tested
    store = save_activations(
        model, data, HOOKS, tmp_path / "acts", positions, batch_size=4, shard_mb=0.002, progress=False
    )
    index = json.loads((tmp_path / "acts" / "index.json").read_text())
    assert len(index["shards"]) > 1 and index["n_sequences"] == len(data)
    assert index["hooks"]["blocks.1.attn.hook_z"] == {"shape": [4, 16], "dtype": "float32"}
    memory = collect_activations(model, data, HOOKS, positions, progress=False)
    loaded = ActivationStore(tmp_path / "acts").load()
    for name in HOOKS:
        assert torch.equal(loaded[name], memory[name])
    assert torch.equal(loaded.seq, memory.seq) and torch.equal(loaded.pos, memory.pos)
    assert sum(len(part) for part in store.shards("blocks.0.hook_resid_post")) == len(memory)
    with pytest.raises(FileExistsError):
        save_activations(model, data, HOOKS, tmp_path / "acts", progress=False)
    again = save_activations(model, data, HOOKS[0], tmp_path / "acts", "last", progress=False, overwrite=True)
    assert len(again) == len(data) and again.names == [HOOKS[0]] and len(list((tmp_path / "acts").glob("shard-*"))) == 1


def test_float16_storage(model, data, tmp_path):
    full = collect_activations(model, data, HOOKS[0], "all", progress=False)
    half = collect_activations(model, data, HOOKS[0], "all", progress=False, dtype=torch.float16)
    assert half[HOOKS[0]].dtype == torch.float16
    assert torch.allclose(half[HOOKS[0]].float(), full[HOOKS[0]], rtol=1e-3, atol=1e-3)
    on_disk = save_activations(model, data, HOOKS[0], tmp_path, "all", progress=False, dtype=torch.float16).load()
    assert torch.equal(on_disk[HOOKS[0]], half[HOOKS[0]])


def test_unknown_hooks_and_bad_positions_are_clear_errors_and_leave_no_hooks(model, data):
    with pytest.raises(KeyError, match="did you mean"):
        collect_activations(model, data, "blocks.0.hook_resid_pots", progress=False)
    with pytest.raises(ValueError, match="out of range"):
        collect_activations(model, data, HOOKS[0], [40], progress=False)
    with pytest.raises(ValueError, match="bool tensor"):
        collect_activations(model, data, HOOKS[0], lambda t: t, progress=False)
    assert no_hooks_attached(model)


# --- probes -------------------------------------------------------------------------------------
def planted(n=400, d=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    u = torch.randn(d, generator=g)
    u /= u.norm()
    groups = np.repeat(np.arange(n // 4), 4)  # four rows per "entity"
    return X, u, (X @ u > 0).long(), groups


def test_a_logistic_probe_recovers_a_planted_direction_and_shuffled_labels_stay_at_chance():
    X, u, y, groups = planted()
    probe = fit_probe(X, y, "logistic", groups=groups, n_bootstrap=200)
    assert probe.metrics["auroc"].value > 0.98 and probe.metrics["accuracy"].value > 0.9
    assert float(probe.direction.float() @ u) > 0.95
    control = shuffled_control(X, y, "logistic", groups=groups, n_bootstrap=200)
    assert abs(control.metrics["auroc"].value - 0.5) < 0.15
    low, high = control.metrics["auroc"].low, control.metrics["auroc"].high
    assert low < 0.5 < high
    # A probe direction becomes a steering vector scaled by the gap between the class means along it.
    v = steering_vector(probe, X, y)
    gap = (X[y == 1].mean(0) - X[y == 0].mean(0)) @ probe.direction.float()
    assert torch.allclose(v.norm(), gap.abs(), rtol=1e-5)


def test_a_ridge_probe_fits_a_linear_target_and_an_mlp_probe_finds_what_a_linear_one_cannot():
    X, u, _, groups = planted(n=300, d=6)
    ridge = fit_probe(X, (X @ u).numpy(), "ridge", groups=groups, n_bootstrap=100)
    assert ridge.metrics["r2"].value > 0.99
    xor = ((X[:, 0] > 0) ^ (X[:, 1] > 0)).long()  # no single direction separates it
    linear = fit_probe(X, xor, "logistic", groups=groups, n_bootstrap=100)
    mlp = fit_probe(X, xor, "mlp", groups=groups, n_folds=3, mlp_steps=200, n_bootstrap=100)
    assert linear.metrics["auroc"].value < 0.7 < 0.9 < mlp.metrics["auroc"].value


def test_group_splits_are_disjoint():
    groups = np.repeat(np.arange(37), 3)
    train, test = group_split(groups, 0.25, seed=1)
    assert not set(groups[train]) & set(groups[test]) and len(train) + len(test) == len(groups)
    folds = group_kfold(groups, 5, seed=2)
    assert sorted(np.concatenate([val for _, val in folds]).tolist()) == list(range(len(groups)))
    for fold_train, fold_val in folds:
        assert not set(groups[fold_train]) & set(groups[fold_val])
    X, _, y, row_groups = planted()
    results = fit_probes({"a": X, "b": X[:, :8]}, y, groups=row_groups, n_bootstrap=50)
    for r in results.values():
        assert not set(row_groups[r.train_index]) & set(row_groups[r.test_index])
    assert np.array_equal(results["a"].test_index, results["b"].test_index)


def test_metrics_on_hand_computed_cases():
    # Positives {0.5, 0.9} against negatives {0.1, 0.5}: pairs won 1, 1, ½ (tie), 1 → 3.5 / 4.
    # (lab.metrics.calibration's auroc, re-exported: scores first, labels second.)
    assert auroc([0.1, 0.5, 0.5, 0.9], [0, 0, 1, 1]) == pytest.approx(0.875)
    assert np.isnan(auroc([0.2, 0.3], [1, 1]))
    assert r2_score([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    assert r2_score([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0
    m = bootstrap_ci(lambda a: float(np.mean(a)), np.arange(100.0), n_boot=300)
    assert m.low < 49.5 < m.high and m.value == 49.5


def test_the_random_model_control_has_the_same_shape_and_other_weights(model):
    control = random_model(model, seed=7)
    assert control.cfg == model.cfg and not control.training
    assert not torch.equal(control.W_E, model.W_E)
    assert {k: v.shape for k, v in control.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}


# --- patching -----------------------------------------------------------------------------------
@pytest.fixture
def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    clean = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(5))
    corrupted = clean.clone()
    corrupted[:, 2] = (corrupted[:, 2] + 11) % VOCAB
    return clean, corrupted


@pytest.mark.parametrize("component", ["resid_pre", "attn_out", "mlp_out", "resid_post"])
def test_patching_the_clean_run_into_itself_restores_the_metric_at_every_cell(model, prompts, component):
    clean, _ = prompts
    result = patch_positions(model, clean, clean, component, answer=3, wrong=4)
    assert result.values.shape == (model.cfg.n_layers, clean.shape[1])
    assert torch.allclose(result.values, torch.full_like(result.values, result.clean), atol=1e-5)


def test_patching_maps_have_the_right_shape_and_the_right_cells_restore_fully(model, prompts):
    clean, corrupted = prompts
    metric = logit_diff(torch.tensor([3, 5]), torch.tensor([4, 6]))
    resid = patch_positions(model, clean, corrupted, "resid_pre", metric)
    assert resid.values.shape == (2, 8) and resid.axis == "pos"
    normalized = resid.normalized()
    # The corrupted token's residual stream entering layer 0 is all that differs: patching it restores everything.
    assert normalized[0, 2] == pytest.approx(1.0, abs=1e-4)
    assert normalized[0, :2].abs().max() < 1e-4  # before the corruption, clean and corrupted agree
    last = patch_positions(model, clean, corrupted, "resid_post", metric, layers=[1])
    assert last.normalized()[0, -1] == pytest.approx(1.0, abs=1e-4)
    heads = patch_heads(model, clean, corrupted, metric)
    assert heads.values.shape == (model.cfg.n_layers, model.cfg.n_heads) and heads.axis == "head"
    same = patch_heads(model, clean, clean, metric)
    assert torch.allclose(same.values, torch.full_like(same.values, same.clean), atol=1e-5)
    noised = patch_positions(model, clean, corrupted, "resid_pre", metric, direction="noise", layers=[0])
    assert noised.values[0, 2] == pytest.approx(resid.corrupted, abs=1e-4)
    assert no_hooks_attached(model)


# --- steering -----------------------------------------------------------------------------------
@pytest.fixture
def rotary_model() -> HookedTransformer:  # rotary: positions enter every layer, the case a KV cache must get right
    return HookedTransformer(tiny_config(positions="rotary"), seed=4).eval()


@pytest.mark.parametrize("use_kv_cache", [True, False], ids=["kv-cache", "recompute"])
def test_steering_with_zero_changes_nothing_and_with_a_large_vector_changes_generations(rotary_model, use_kv_cache):
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(8))
    name, d = "blocks.0.hook_resid_post", rotary_model.cfg.d_model
    plain = generate(rotary_model, prompt, 12, temperature=0, use_kv_cache=use_kv_cache)
    zero = generate_steered(
        rotary_model, prompt, name, torch.zeros(d), 1.0, 12, temperature=0, use_kv_cache=use_kv_cache
    )
    assert torch.equal(zero, plain)
    vector = rotary_model.W_E[7] / rotary_model.W_E[7].norm()
    big = generate_steered(rotary_model, prompt, name, vector, 30.0, 12, temperature=0, use_kv_cache=use_kv_cache)
    assert not torch.equal(big, plain)
    assert no_hooks_attached(rotary_model)


@pytest.mark.parametrize("from_position", [0, 5, 9])
def test_steered_generation_is_the_same_with_and_without_the_kv_cache(rotary_model, from_position):
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(9))
    vector = torch.randn(rotary_model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    runs = [
        generate_steered(
            rotary_model,
            prompt,
            "blocks.1.hook_resid_pre",
            vector,
            4.0,
            12,
            temperature=0,
            use_kv_cache=cache,
            from_position=from_position,
        )
        for cache in (True, False)
    ]
    assert torch.equal(runs[0], runs[1])
    # Tokens up to index from_position are predicted from unsteered positions only.
    plain = generate(rotary_model, prompt, 12, temperature=0)
    kept = max(from_position + 1, prompt.shape[1])
    assert torch.equal(runs[0][:, :kept], plain[:, :kept])


def test_steering_hooks_are_removed_even_when_the_block_raises(rotary_model):
    with pytest.raises(RuntimeError, match="inside"):
        with steer(rotary_model, "blocks.0.hook_resid_pre", torch.ones(rotary_model.cfg.d_model)):
            raise RuntimeError("inside")
    assert no_hooks_attached(rotary_model)
    with pytest.raises(ValueError, match="does not match"):
        with steer(rotary_model, "blocks.0.hook_resid_pre", torch.ones(3)):
            rotary_model(torch.zeros(1, 4, dtype=torch.long))
    assert no_hooks_attached(rotary_model)


# --- a TransformerBridge ------------------------------------------------------------------------
def test_activations_and_patching_work_on_a_transformer_bridge(tmp_path):
    from lab.hf.convert import from_hf
    from lab.hf.loading import bridge
    from tests.builders import hf_model, word_tokenizer

    hf = hf_model("gpt2")
    hf.save_pretrained(tmp_path)
    word_tokenizer(tmp_path)
    wrapped, converted = bridge(tmp_path), from_hf(hf)
    data = torch.randint(4, VOCAB, (6, 10), generator=torch.Generator().manual_seed(2))
    name = "blocks.1.hook_resid_pre"
    ours = collect_activations(converted, data, name, [2, -1], progress=False)
    theirs = collect_activations(wrapped, data, name, [2, -1], progress=False)
    assert torch.allclose(ours[name], theirs[name], atol=1e-4)
    with pytest.raises(KeyError):
        collect_activations(wrapped, data, "blocks.1.hook_nonsense", progress=False)
    corrupted = data.clone()
    corrupted[:, 3] = (corrupted[:, 3] + 1) % VOCAB
    a = patch_positions(converted, data, corrupted, "resid_pre", answer=5, wrong=6)
    b = patch_positions(wrapped, data, corrupted, "resid_pre", answer=5, wrong=6)
    assert torch.allclose(a.values, b.values, atol=1e-4)


def test_a_linear_probe_reads_x_w_plus_b_in_activation_space():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 5, generator=g) * torch.tensor([1.0, 2, 3, 4, 5]) + 3  # unstandardised on purpose
    y = (X[:, 0] - X[:, 2] > 0).long()
    logistic = fit_probe(X, y, "logistic", n_bootstrap=10)
    assert torch.allclose(torch.sigmoid(X.double() @ logistic.weight + logistic.bias), logistic.predict_scores(X))
    ridge = fit_probe(X, X[:, 1].numpy(), "ridge", n_bootstrap=10)
    assert torch.allclose(X.double() @ ridge.weight + ridge.bias, ridge.predict_scores(X))
