"""The fast patching sweeps (each patched run from its own layer and first changed position on, the target
run's keys and values before it as a KV cache) give the exhaustive sweep's numbers — every run from the
embedding — for every component, both directions, heads and heads by position, on a zoo-sized model and on a
rotary model with grouped key/value heads; and TransformerLens's own patching functions give them too, on
Forma and on a TransformerBridge over the same weights."""

import pytest
import torch
import transformer_lens.patching as tl_patching

from lab import HookedTransformer, ModelConfig
from lab.analysis.patching import logit_diff, patch_heads, patch_heads_by_position, patch_positions, runs_fast
from tests.builders import BRIDGE_VOCAB, bridge_of, bridge_tokenizer, forma_model, patchable

TOL = 1e-5
VOCAB = 64
# The markov zoo model's shape (lab/zoo: models/markov/model.toml), and a LLaMA-like variant of it.
ARCHITECTURES = {
    "zoo": dict(d_model=64, n_layers=2, n_heads=4, d_mlp=512, positions="rotary", mlp="gelu"),
    "gqa": dict(
        d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, positions="rotary", norm="rmsnorm", mlp="swiglu", bias=False
    ),
    "gpt2": dict(d_model=32, n_layers=2, n_heads=4, mlp="gelu_tanh"),
}
COMPONENTS = ["resid_pre", "attn_out", "mlp_out", "resid_post"]


pytestmark = pytest.mark.usefixtures("one_thread")


def built(kind: str) -> HookedTransformer:
    """A random model whose weights are large enough that patching moves the metric visibly."""
    return patchable(HookedTransformer(ModelConfig(d_vocab=VOCAB, n_ctx=16, **ARCHITECTURES[kind]), seed=3))


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def model(request) -> HookedTransformer:
    return built(request.param)


@pytest.fixture(scope="module")
def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    clean = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    corrupted = clean.clone()
    corrupted[:, 2] = (corrupted[:, 2] + 11) % VOCAB
    corrupted[:, 4] = (corrupted[:, 4] + 5) % VOCAB
    return clean, corrupted


METRIC = logit_diff(torch.tensor([3, 5]), torch.tensor([4, 6]))


def assert_same_result(fast, reference) -> None:
    assert fast.values.shape == reference.values.shape
    assert (fast.values - reference.values).abs().max() <= TOL
    assert abs(fast.clean - reference.clean) <= TOL and abs(fast.corrupted - reference.corrupted) <= TOL
    assert (fast.component, fast.axis, fast.cells, fast.direction) == (
        reference.component,
        reference.axis,
        reference.cells,
        reference.direction,
    )
    assert (reference.values - reference.corrupted).abs().max() > 1e-3  # the patches do move the metric


@pytest.mark.parametrize("direction", ["denoise", "noise"])
@pytest.mark.parametrize("component", COMPONENTS)
def test_fast_position_sweep_equals_the_exhaustive_sweep(model, prompts, component, direction):
    clean, corrupted = prompts
    assert runs_fast(model)
    reference = patch_positions(model, clean, corrupted, component, METRIC, direction=direction, exhaustive=True)
    for max_batch in (64, 5):  # one pass per first position, and passes spanning several first positions
        fast = patch_positions(model, clean, corrupted, component, METRIC, direction=direction, max_batch=max_batch)
        assert_same_result(fast, reference)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_fast_head_sweeps_equal_the_exhaustive_sweeps(model, prompts, direction):
    clean, corrupted = prompts
    for sweep in (patch_heads, patch_heads_by_position):
        reference = sweep(model, clean, corrupted, METRIC, direction=direction, exhaustive=True)
        for max_batch in (64, 7):
            assert_same_result(
                sweep(model, clean, corrupted, METRIC, direction=direction, max_batch=max_batch), reference
            )
    by_pos = patch_heads_by_position(model, clean, corrupted, METRIC, direction=direction)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    assert by_pos.values.shape == (n_layers, n_heads, clean.shape[1]) and by_pos.axis == "head_pos"


def test_chosen_layers_and_positions_are_the_same_cells_of_the_full_sweep(prompts):
    model = built("gqa")
    clean, corrupted = prompts
    full = patch_positions(model, clean, corrupted, "attn_out", METRIC)
    some = patch_positions(model, clean, corrupted, "attn_out", METRIC, layers=[1, 0], positions=[-1, 4, 3])
    assert some.cells == [5, 4, 3]
    assert (some.values - full.values[[1, 0]][:, [5, 4, 3]]).abs().max() <= TOL
    heads = patch_heads_by_position(model, clean, corrupted, METRIC, layers=[1], positions=[4])
    assert heads.values.shape == (1, model.cfg.n_heads, 1)
    assert (
        heads.values[0, :, 0] - patch_heads_by_position(model, clean, corrupted, METRIC).values[1, :, 4]
    ).abs().max() <= TOL


def test_a_metric_that_reads_every_position_sees_the_logits_the_exhaustive_run_gives(prompts):
    """The fast path computes only positions ≥ the patched one and takes the earlier logits from the target
    run: a metric over all positions tells whether they were put back where they belong."""
    model = built("zoo")
    clean, corrupted = prompts
    weights = torch.randn(clean.shape[1], VOCAB, generator=torch.Generator().manual_seed(0))

    def everywhere(logits: torch.Tensor) -> torch.Tensor:
        return (logits.log_softmax(-1) * weights).mean()

    reference = patch_positions(model, clean, corrupted, "resid_pre", everywhere, exhaustive=True)
    assert_same_result(patch_positions(model, clean, corrupted, "resid_pre", everywhere, max_batch=3), reference)


def test_a_model_with_a_hook_attached_takes_the_exhaustive_path(prompts):
    """A caller's hook acts on every position of every layer; the fast path skips some, so it steps aside."""
    model = built("gpt2")
    clean, corrupted = prompts

    def halve(x, hook):
        return x * 0.5

    model.blocks[0].hook_resid_mid.add_hook(halve)
    try:
        assert not runs_fast(model)
        with_hook = patch_positions(model, clean, corrupted, "mlp_out", METRIC)
        reference = patch_positions(model, clean, corrupted, "mlp_out", METRIC, exhaustive=True)
    finally:
        model.reset_hooks()
    assert torch.equal(with_hook.values, reference.values)
    assert (with_hook.values - patch_positions(model, clean, corrupted, "mlp_out", METRIC).values).abs().max() > 1e-3


def test_bad_sweep_arguments_are_refused_with_the_field_named(prompts):
    model = built("gpt2")
    clean, corrupted = prompts
    with pytest.raises(ValueError, match="positions"):
        patch_positions(model, clean, corrupted, "resid_pre", METRIC, positions=[6])
    with pytest.raises(ValueError, match="max_batch"):
        patch_positions(model, clean, corrupted, "resid_pre", METRIC, max_batch=0)
    with pytest.raises(ValueError, match="patch_heads_by_position"):
        patch_positions(model, clean, corrupted, "z", METRIC)
    with pytest.raises(ValueError, match="layers"):
        patch_heads_by_position(model, clean, corrupted, METRIC, layers=[2])


# --- against TransformerLens's own patching functions --------------------------------------------------
TL_SWEEPS = {
    "resid_pre": tl_patching.get_act_patch_resid_pre,
    "attn_out": tl_patching.get_act_patch_attn_out,
    "mlp_out": tl_patching.get_act_patch_mlp_out,
}


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request):

    model = forma_model(request.param)
    model.tokenizer = bridge_tokenizer()
    return model, bridge_of(model)


@pytest.mark.slow
def test_fast_sweeps_equal_transformer_lens_patching_on_forma_and_on_the_bridge(pair):
    model, bridge = pair
    clean = torch.randint(4, BRIDGE_VOCAB, (2, 4), generator=torch.Generator().manual_seed(0))
    corrupted = clean.clone()
    corrupted[:, 1] = (corrupted[:, 1] + 3 - 4) % (BRIDGE_VOCAB - 4) + 4
    metric = logit_diff(5, 6)
    caches = {peer: peer.run_with_cache(clean)[1] for peer in (model, bridge)}
    for component, sweep in TL_SWEEPS.items():
        ours = patch_positions(model, clean, corrupted, component, metric).values
        for peer, cache in caches.items():
            assert (ours - sweep(peer, corrupted, cache, metric)).abs().max() <= TOL, component
    heads = patch_heads(model, clean, corrupted, metric).values
    by_pos = patch_heads_by_position(model, clean, corrupted, metric).values
    for peer, cache in caches.items():
        assert (
            heads - tl_patching.get_act_patch_attn_head_out_all_pos(peer, corrupted, cache, metric)
        ).abs().max() <= TOL
        theirs = tl_patching.get_act_patch_attn_head_out_by_pos(peer, corrupted, cache, metric)  # [layer, pos, head]
        assert (by_pos - theirs.transpose(1, 2)).abs().max() <= TOL


def test_a_metric_that_declares_what_it_reads_sees_nan_elsewhere(prompts):
    """logit_diff declares the one position it reads, and the fast path unembeds only there: a metric that
    declares one position and reads another gets NaN, not a wrong number."""
    model = built("gpt2")
    clean, corrupted = prompts

    def misdeclared(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -2, 3].mean()

    misdeclared.positions = (-1,)
    result = patch_positions(model, clean, corrupted, "resid_pre", misdeclared, positions=[4, 5])
    assert result.values.isnan().all()
    with pytest.raises(ValueError, match="reads positions"):
        patch_positions(model, clean, corrupted, "resid_pre", logit_diff(3, 4, position=6))
