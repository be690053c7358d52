"""TransformerLens's own analysis code runs on Forma's model unchanged and gives the numbers it gives on
TransformerLens's TransformerBridge over the same weights.

Each Forma model (GPT-2-like: learned positions, LayerNorm, biases; LLaMA-like: rotary, RMSNorm, SwiGLU, 4
query heads over 2 key/value heads) is exported with `lab.hf.convert.to_hf` and wrapped by a TransformerBridge. The
bridge runs in compatibility mode with no weight processing, so its hooks carry exactly Forma's numbers; where
TransformerLens requires folded weights (direct logit attribution) a second bridge runs with its default
processing and the quantity compared is one that processing leaves alone (a logit difference). Where
TransformerLens itself refuses a model (edge attribution, K/V direct paths on grouped K/V heads), the test
asserts the same refusal on both. Norm gains and biases are randomised so that a misplaced one cannot hide.
"""

import copy
import dataclasses

import pytest
import torch
import transformer_lens.patching as patching
import transformer_lens.tools.analysis as analysis
from transformer_lens import FactoredMatrix, SVDInterpreter, head_detector

from lab import HookedTransformer, ModelConfig
from lab.model.kv_cache import KVCache
from tests.builders import BRIDGE_VOCAB, bridge_of, bridge_tokenizer, forma_model

KINDS = ["gpt2", "llama"]
TOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")


@dataclasses.dataclass
class Pair:
    kind: str
    forma: HookedTransformer
    bridge: object
    clean: torch.Tensor
    corrupt: torch.Tensor

    @property
    def both(self):
        return (self.forma, self.bridge)


@pytest.fixture(scope="module", params=KINDS)
def pair(request) -> Pair:
    model = forma_model(request.param)
    model.tokenizer = bridge_tokenizer()
    clean = torch.randint(4, BRIDGE_VOCAB, (2, 4), generator=torch.Generator().manual_seed(0))
    corrupt = clean.clone()
    corrupt[:, 1] = (corrupt[:, 1] + 7 - 4) % (BRIDGE_VOCAB - 4) + 4
    return Pair(request.param, model, bridge_of(model), clean, corrupt)


@pytest.fixture(scope="module")
def folded(pair):
    """The processed bridge over the pair's weights."""
    return bridge_of(pair.forma, processed=True)


def metric(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, 5] - logits[:, -1, 6]).mean()


def tensors(value) -> list[torch.Tensor]:
    """Every float tensor inside a result (tensor, tuple, list, dict, dataclass), in order."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if dataclasses.is_dataclass(value):
        return [t for f in dataclasses.fields(value) for t in tensors(getattr(value, f.name))]
    return []


def assert_same(ours, theirs, tol: float = TOL) -> float:
    """Both results hold the same float tensors to `tol`; returns the largest difference."""
    a, b = tensors(ours), tensors(theirs)
    assert a and len(a) == len(b), (len(a), len(b))
    worst = 0.0
    for x, y in zip(a, b):
        assert x.shape == y.shape, (x.shape, y.shape)
        worst = max(worst, (x.detach().float() - y.detach().float()).abs().max().item())
    assert worst <= tol, worst
    return worst


def test_the_pair_starts_from_the_same_numbers(pair):
    with torch.no_grad():
        assert_same(pair.forma(pair.clean), pair.bridge(pair.clean))
    _, ours = pair.forma.run_with_cache(pair.clean)
    _, theirs = pair.bridge.run_with_cache(pair.clean)
    for name in ours.keys():
        assert_same(ours[name], theirs["unembed.hook_out" if name == "unembed.hook_out" else name])


# --- the config TransformerLens reads ---------------------------------------------------------------
def test_the_config_answers_what_transformer_lens_reads():
    model = forma_model("llama")
    cfg = model.cfg
    assert (cfg.device, cfg.dtype) == (torch.device("cpu"), torch.float32)
    assert (cfg.uses_rms_norm, cfg.eps, cfg.d_vocab_out, cfg.n_key_value_heads) == (True, cfg.norm_eps, BRIDGE_VOCAB, 2)
    assert not any((cfg.use_attn_result, cfg.use_split_qkv_input, cfg.use_attn_in, cfg.use_hook_mlp_in))
    model.double()
    assert cfg.dtype == torch.float64  # read live from the weights
    assert model.cfg == ModelConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    with pytest.raises(AttributeError, match="describes an architecture"):
        _ = ModelConfig(d_vocab=8, d_model=8, n_layers=1, n_heads=2, n_ctx=4).device
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.use_attn_result = True


def test_each_model_owns_its_switches():
    cfg = ModelConfig(d_vocab=8, d_model=8, n_layers=1, n_heads=2, n_ctx=4)
    a, b = HookedTransformer(cfg), HookedTransformer(cfg)
    a.set_use_attn_result(True)
    assert a.cfg.use_attn_result and not b.cfg.use_attn_result and not cfg.use_attn_result
    twin = copy.deepcopy(a)
    twin.set_use_attn_result(False)
    assert a.cfg.use_attn_result and not twin.cfg.use_attn_result
    assert twin.blocks[0].attn._runtime is twin.cfg.runtime  # the copy's components read the copy's settings


# --- transformer_lens.patching ------------------------------------------------------------------------
SWEEPS = sorted(
    name
    for name in dir(patching)
    if name.startswith("get_act_patch")
    and name not in ("get_act_patch_direct_path", "get_act_patch_direct_path_all_sources", "get_act_patch_resid_mid")
)
SLOW_SWEEPS = {
    "get_act_patch_attn_head_pattern_dest_src_pos",
    "get_act_patch_attn_head_by_pos_every",
    "get_act_patch_attn_head_all_pos_every",
    "get_act_patch_block_every",
}


@pytest.mark.parametrize("sweep", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_SWEEPS else s for s in SWEEPS])
def test_activation_patching_sweeps_agree(pair, sweep):
    fn = getattr(patching, sweep)
    results = [fn(model, pair.corrupt, model.run_with_cache(pair.clean)[1], metric) for model in pair.both]
    assert_same(*results)


def test_resid_mid_patching_patches_the_stream_itself(pair):
    """Forma's blocks.L.hook_resid_mid is the residual stream after attention, which both the MLP and the skip
    connection read (as in TransformerLens's HookedTransformer). The bridge's resid_mid is an alias of ln2's
    input, which only the MLP reads: its sweep equals Forma's sweep over hook_mlp_in, the MLP branch alone."""
    model = forma_model(pair.kind)
    cache = model.run_with_cache(pair.clean)[1]
    stream = patching.get_act_patch_resid_mid(model, pair.corrupt, cache, metric)
    on_bridge = patching.get_act_patch_resid_mid(
        pair.bridge, pair.corrupt, pair.bridge.run_with_cache(pair.clean)[1], metric
    )
    model.set_use_hook_mlp_in(True)
    cache = model.run_with_cache(pair.clean)[1]
    mlp_branch = patching.generic_activation_patch(
        model, pair.corrupt, cache, metric, patching.layer_pos_patch_setter, "mlp_in", ["layer", "pos"]
    )
    assert_same(mlp_branch, on_bridge)
    # Patching the whole stream at the last layer's last position sets the logits there to the clean ones.
    clean_metric = metric(model(pair.clean))
    assert abs(stream[-1, -1].item() - clean_metric.item()) <= TOL
    assert (stream - mlp_branch).abs().max() > 1e-3  # the skip connection matters


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_direct_path_patching_agrees_or_is_refused_alike(pair, component):
    caches = [(model.run_with_cache(pair.clean)[1], model.run_with_cache(pair.corrupt)[1]) for model in pair.both]
    if pair.kind == "llama" and component != "q":  # TransformerLens: K/V paths are undefined on grouped K/V heads
        for model, (clean, corrupt) in zip(pair.both, caches):
            with pytest.raises(ValueError, match="GQA/MQA"):
                patching.get_act_patch_direct_path(
                    model, pair.corrupt, clean, corrupt, metric, 0, 1, component, verbose=False
                )
        return
    results = [
        patching.get_act_patch_direct_path(
            model, pair.corrupt, clean, corrupt, metric, src_layer=0, src_head=1, component=component, verbose=False
        )
        for model, (clean, corrupt) in zip(pair.both, caches)
    ]
    assert_same(*results)
    assert results[0][1].abs().max() > 0
    assert not pair.forma.cfg.use_split_qkv_input and "blocks.1.hook_q_input" not in pair.forma.hook_dict


@pytest.mark.slow
def test_direct_path_patching_from_every_source_agrees(pair):
    results = [
        patching.get_act_patch_direct_path_all_sources(
            model,
            pair.corrupt,
            model.run_with_cache(pair.clean)[1],
            model.run_with_cache(pair.corrupt)[1],
            metric,
            verbose=False,
        )
        for model in pair.both
    ]
    assert_same(*results)


# --- head_detector, SVDInterpreter, FactoredMatrix ------------------------------------------------------
@pytest.mark.parametrize("pattern", ["previous_token_head", "duplicate_token_head", "induction_head"])
def test_detect_head_agrees(pair, pattern):
    results = [head_detector.detect_head(model, ["w1 w2 w3 w1 w2", "w5 w6 w5 w6 w7"], pattern) for model in pair.both]
    assert_same(*results)


@pytest.mark.parametrize("vectors, layer, head", [("OV", 1, 3), ("OV", 0, 0), ("w_in", 1, None), ("w_out", 0, None)])
def test_svd_interpreter_agrees(pair, vectors, layer, head):
    results = [
        SVDInterpreter(model).get_singular_vectors(vectors, layer_index=layer, num_vectors=3, head_index=head)
        for model in pair.both
    ]
    assert_same(*results)


def test_svd_interpreter_reads_a_tied_unembedding():
    tied = forma_model("gpt2", tied_embeddings=True)
    untied = forma_model("gpt2")
    untied.load_state_dict({k: v for k, v in tied.state_dict().items()} | {"unembed.W_U": tied.W_E.T.detach()})
    results = [
        SVDInterpreter(m).get_singular_vectors("OV", layer_index=1, num_vectors=3, head_index=2) for m in (tied, untied)
    ]
    assert_same(*results, tol=0)


def test_ov_and_qk_circuits_agree_and_repeat_grouped_heads(pair):
    for name in ("OV", "QK"):
        ours, theirs = getattr(pair.forma, name), getattr(pair.bridge, name)
        assert isinstance(ours, FactoredMatrix)
        assert_same(ours.AB, theirs.AB)
        assert_same(ours.S, theirs.S, tol=1e-4)  # singular values of 32 × 32 products
    model = pair.forma
    group = model.cfg.n_heads // model.cfg.n_kv_heads
    assert torch.allclose(model.OV[1, 3].AB, model.W_V[1, 3 // group] @ model.W_O[1, 3])
    assert torch.allclose(model.QK[0, 1].AB, model.W_Q[0, 1] @ model.W_K[0, 1 // group].T)


# --- ActivationCache ---------------------------------------------------------------------------------
CACHE_METHODS = {
    "accumulated_resid": lambda c: c.accumulated_resid(apply_ln=True, incl_mid=True),
    "accumulated_resid_mlp_input": lambda c: c.accumulated_resid(layer=1, mlp_input=True, apply_ln=True),
    "decompose_resid": lambda c: c.decompose_resid(apply_ln=True),
    "decompose_resid_mid": lambda c: c.decompose_resid(layer=1, mlp_input=True, apply_ln=True),
    "stack_head_results": lambda c: c.stack_head_results(layer=-1, apply_ln=True),
    "compute_head_results": lambda c: (c.compute_head_results(), c["blocks.1.attn.hook_result"])[1],
    "get_neuron_results": lambda c: c.get_neuron_results(1, neuron_slice=[0, 5, 7]),
    "stack_neuron_results": lambda c: c.stack_neuron_results(layer=2, apply_ln=True),
    "apply_ln_to_stack": lambda c: c.apply_ln_to_stack(c.decompose_resid(), layer=1, mlp_input=True),
    "get_full_resid_decomposition": lambda c: c.get_full_resid_decomposition(expand_neurons=True, apply_ln=True),
    "get_full_resid_decomposition_mid": lambda c: c.get_full_resid_decomposition(
        layer=1, mlp_input=True, expand_neurons=False, apply_ln=True
    ),
    "stack_activation": lambda c: c.stack_activation("resid_post"),
    "apply_slice_to_batch_dim": lambda c: c.apply_slice_to_batch_dim(1)["blocks.0.attn.hook_pattern"],
    "to": lambda c: c.to("cpu")["blocks.1.hook_mlp_out"],
    "logit_lens": lambda c: c.logit_lens(positions=None),
}


@pytest.mark.parametrize("method", sorted(CACHE_METHODS))
def test_activation_cache_methods_agree(pair, method):
    results = [CACHE_METHODS[method](model.run_with_cache(pair.clean)[1]) for model in pair.both]
    assert_same(*results)


def test_remove_batch_dim_agrees(pair):
    results = [
        model.run_with_cache(pair.clean[:1], remove_batch_dim=True)[1]["blocks.1.hook_resid_mid"] for model in pair.both
    ]
    assert_same(*results)


@pytest.mark.parametrize(
    "layer, mlp_input, include_mlp_biases",
    [(0, False, True), (1, True, True), (2, False, True), (1, False, False), (1, True, False)],
)
def test_accumulated_bias_agrees(pair, layer, mlp_input, include_mlp_biases):
    results = [model.accumulated_bias(layer, mlp_input, include_mlp_biases) for model in pair.both]
    assert_same(*results, tol=0)


def test_accumulated_bias_of_a_parallel_block_leaves_out_its_own_attention():
    """A parallel block's MLP reads the block's input, so the stream entering it carries no b_O of its own
    block; in a sequential block it does."""
    parallel, sequential = forma_model("neox"), forma_model("gpt2")
    for layer in range(2):
        assert torch.equal(parallel.accumulated_bias(layer, mlp_input=True), parallel.accumulated_bias(layer))
        own = sequential.blocks[layer].attn.b_O
        assert torch.allclose(
            sequential.accumulated_bias(layer, mlp_input=True), sequential.accumulated_bias(layer) + own, atol=0
        )
    assert parallel.accumulated_bias(1).abs().max() > 0  # the biases are there to leave out


def test_hook_mlp_in_of_a_parallel_block_is_its_mlps_copy_of_resid_pre():
    model = forma_model("neox")
    model.set_use_hook_mlp_in(True)
    tokens = torch.randint(4, BRIDGE_VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    assert torch.equal(cache["blocks.1.hook_mlp_in"], cache["blocks.1.hook_resid_pre"])

    def shift(x, hook):
        x[..., 0] += 1.0
        return x

    with model.hooks(fwd_hooks=[("blocks.1.hook_mlp_in", shift)]):
        _, patched = model.run_with_cache(tokens)
    assert torch.equal(patched["blocks.1.hook_attn_out"], cache["blocks.1.hook_attn_out"])
    assert (patched["blocks.1.hook_mlp_out"] - cache["blocks.1.hook_mlp_out"]).abs().max() > 1e-3


def test_logit_attrs_decompose_the_logit_difference(pair, folded):
    """tokens_to_residual_directions carries the final norm's gain, so the parts sum to the logit difference
    (less the constant b · (W_U[a] − W_U[i]) of LayerNorm's bias) and match the folded bridge."""
    answer, wrong = torch.tensor([5, 7]), torch.tensor([6, 8])
    results = []
    for model in (pair.forma, folded):
        cache = model.run_with_cache(pair.clean)[1]
        results.append(
            cache.logit_attrs(cache.decompose_resid(pos_slice=-1), tokens=answer, incorrect_tokens=wrong, pos_slice=-1)
        )
    assert_same(*results)
    model = pair.forma
    logits = model(pair.clean)[:, -1]
    rows = torch.arange(2)
    difference = logits[rows, answer] - logits[rows, wrong]
    if model.cfg.norm == "layernorm":
        difference = difference - model.ln_final.b @ (model.W_U[:, answer] - model.W_U[:, wrong])
    assert torch.allclose(results[0].sum(0), difference, atol=TOL)


# --- transformer_lens.tools.analysis --------------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [dict(positions=None, incl_mid=True, return_type="log_probs"), dict(targets=[5, 6]), dict(top_k=3, layers=[0, 2])],
    ids=["all", "targets", "top_k"],
)
def test_logit_lens_agrees(pair, options):
    results = [analysis.logit_lens(model, pair.clean, **options) for model in pair.both]
    assert_same(*results)


def test_logit_lens_equals_formas_own(pair):
    from lab.analysis.lens import logit_lens

    tl = analysis.logit_lens(pair.forma, pair.clean, positions=None, return_type="log_probs")
    assert_same(tl.values if hasattr(tl, "values") else tensors(tl)[0], logit_lens(pair.forma, pair.clean))


def test_logit_readout_agrees(pair):
    vectors = torch.randn(3, 32, generator=torch.Generator().manual_seed(2))
    assert_same(*[analysis.logit_readout(model, vectors, return_type="log_probs") for model in pair.both])


@pytest.mark.parametrize("unit", ["component", "head", "layer"])
def test_direct_logit_attribution_agrees_with_the_folded_bridge(pair, folded, unit):
    results = [
        analysis.direct_logit_attribution(
            model, pair.clean, answer_tokens=torch.tensor([5, 7]), incorrect_tokens=torch.tensor([6, 8]), unit=unit
        )
        for model in (pair.forma, folded)
    ]
    assert results[0].labels == results[1].labels
    assert_same(results[0].attribution, results[1].attribution)


def test_direct_logit_attribution_is_refused_on_the_unfolded_bridge_only(pair):
    """TransformerLens refuses an unfolded final norm on the bridge; on Forma the gain lives in
    tokens_to_residual_directions, so the same call is exact (see test_logit_attrs_...)."""
    with pytest.raises(ValueError, match="identity final norm"):
        analysis.direct_logit_attribution(pair.bridge, pair.clean, answer_tokens=5, incorrect_tokens=6)
    analysis.direct_logit_attribution(pair.forma, pair.clean, answer_tokens=5, incorrect_tokens=6)


def test_node_attribution_patching_agrees(pair):
    with torch.enable_grad():
        results = [
            analysis.attribution_patch(model, pair.clean, pair.corrupt, metric, analysis.EdgeAttributionConfig("node"))
            for model in pair.both
        ]
    assert results[0].node_scores.keys() == results[1].node_scores.keys()
    assert_same(*[torch.tensor(list(r.node_scores.values())) for r in results])


def test_edge_attribution_and_faithfulness_agree_or_are_refused_alike(pair):
    config = analysis.EdgeAttributionConfig("edge")
    if pair.kind == "llama":  # TransformerLens: edge granularity is undefined on grouped K/V heads
        for model in pair.both:
            with torch.enable_grad(), pytest.raises(ValueError, match="GQA/MQA"):
                analysis.attribution_patch(model, pair.clean, pair.corrupt, metric, config)
        return
    with torch.enable_grad():
        results = [analysis.attribution_patch(model, pair.clean, pair.corrupt, metric, config) for model in pair.both]
    assert results[0].edge_scores.keys() == results[1].edge_scores.keys()
    assert_same(*[torch.tensor(list(r.edge_scores.values())) for r in results])
    circuit = [(w, r) for w, r, _ in results[0].top_edges(6)]
    faithful = [
        analysis.faithfulness(model, pair.clean[:1], pair.corrupt[:1], metric, circuit)  # one pair at a time
        for model in pair.both
    ]
    assert_same(*[torch.tensor([f.recovered]) for f in faithful])
    for flag in ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in"):  # restored, hook points gone
        assert not getattr(pair.forma.cfg, flag)
    assert not any(n.endswith(("q_input", "mlp_in")) for n in pair.forma.hook_dict)


HOOK = "blocks.1.hook_resid_pre"
POSITIONS = torch.full((2,), 3)


def task(model):
    return lambda tokens: model(tokens)[:, -1, [5, 6]]


def test_interchange_interventions_agree(pair):
    basis = analysis.random_basis(32, 2, seed=0)
    results = []
    for model in pair.both:
        source = analysis.collect_activations(model, HOOK, pair.corrupt, task(model), positions=POSITIONS)
        results.append(
            (
                source,
                analysis.run_with_intervention(
                    model,
                    HOOK,
                    analysis.SubspaceInterchange(basis),
                    pair.clean,
                    source,
                    task(model),
                    positions=POSITIONS,
                ),
                analysis.intervened_logits(
                    model,
                    HOOK,
                    analysis.SubspaceInterchange(basis),
                    pair.clean,
                    source,
                    task(model),
                    positions=POSITIONS,
                ),
            )
        )
    assert_same(*results)


def test_distributed_alignment_search_agrees(pair):
    g = torch.Generator().manual_seed(5)
    base, source = (
        torch.randint(4, BRIDGE_VOCAB, (16, 4), generator=g),
        torch.randint(4, BRIDGE_VOCAB, (16, 4), generator=g),
    )
    targets = torch.randint(0, 2, (16,), generator=g)
    positions = torch.full((16,), 3)
    with torch.enable_grad():
        results = [
            analysis.fit_das(
                model,
                HOOK,
                base,
                source,
                targets,
                task(model),
                rank=1,
                base_positions=positions,
                source_positions=positions,
                epochs=3,
                batch_size=8,
            )
            for model in pair.both
        ]
    assert_same(torch.tensor(results[0].losses), torch.tensor(results[1].losses), tol=1e-4)
    assert_same(results[0].basis, results[1].basis, tol=1e-4)


def test_sparse_probing_on_activations_agrees(pair):
    g = torch.Generator().manual_seed(3)
    inputs = torch.randint(4, BRIDGE_VOCAB, (40, 4), generator=g)
    labels = (inputs[:, 2] % 2 == 0).long()
    results = []
    for model in pair.both:
        features = analysis.collect_activations(
            model, "blocks.0.hook_mlp_out", inputs, task(model), positions=torch.full((40,), 3)
        )
        results.append(analysis.fit_sparse_probe(features, labels, k=3))
    assert results[0].selected_features.tolist() == results[1].selected_features.tolist()
    assert_same(*results, tol=1e-4)


def test_reinitialized_is_a_fresh_model_of_that_seed(pair):
    """Every component's reset_parameters draws as its constructor does: TransformerLens's random-init
    control is exactly HookedTransformer(cfg, seed). The bridge refuses (TransformerLens points it to
    random_init_bridge)."""
    fresh = analysis.reinitialized(pair.forma, seed=3)
    reference = HookedTransformer(pair.forma.cfg, seed=3)
    assert fresh.state_dict().keys() == reference.state_dict().keys()
    assert all(torch.equal(v, reference.state_dict()[k]) for k, v in fresh.state_dict().items())
    assert not torch.equal(pair.forma.blocks[0].ln1.w, fresh.blocks[0].ln1.w)  # the trained model is untouched
    with pytest.raises(ValueError, match="reset_parameters"):
        analysis.reinitialized(pair.bridge, seed=3)


def test_bridge_only_tools_refuse_a_forma_model(pair):
    with pytest.raises(ValueError, match="TransformerBridge"):
        analysis.attention_head_subspace_affinity(pair.forma, target_role="Q")
    with pytest.raises(TypeError, match="TransformerBridge only"):
        analysis.JacobianLens.fit(pair.forma, ["w1 w2 w3"], corpus="forma")


# --- TransformerLens's switches make real hook points ------------------------------------------------------
SWITCHES = {
    "use_split_qkv_input": {
        "blocks.{l}.hook_q_input": "head",
        "blocks.{l}.hook_k_input": "kv",
        "blocks.{l}.hook_v_input": "kv",
    },
    "use_attn_in": {"blocks.{l}.hook_attn_in": "head"},
    "use_hook_mlp_in": {"blocks.{l}.hook_mlp_in": None},
}


@pytest.mark.parametrize("kind", KINDS + ["neox"])
@pytest.mark.parametrize("flag", sorted(SWITCHES))
def test_a_switch_makes_its_hook_points_exist_only_while_it_is_on(kind, flag):
    model = forma_model(kind)
    tokens = torch.randint(4, BRIDGE_VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    names = [n.format(l=l) for n in SWITCHES[flag] for l in range(model.cfg.n_layers)]
    plain = model(tokens)
    assert not set(names) & set(model.hook_dict)
    getattr(model, f"set_{flag}")(True)
    assert getattr(model.cfg, flag) and set(names) <= set(model.hook_dict)
    logits, cache = model.run_with_cache(tokens)
    assert (logits - plain).abs().max() <= TOL  # unedited copies: the same network
    heads = {"head": model.cfg.n_heads, "kv": model.cfg.n_kv_heads, None: None}
    for pattern, axis in SWITCHES[flag].items():
        shape = (2, 6, heads[axis], 32) if axis else (2, 6, 32)
        assert tuple(cache[pattern.format(l=1)].shape) == shape
    getattr(model, f"set_{flag}")(False)
    assert not set(names) & set(model.hook_dict) and not getattr(model.cfg, flag)
    assert torch.equal(model(tokens), plain)


@pytest.mark.parametrize("flag", sorted(SWITCHES))
def test_the_split_hooks_agree_with_the_bridge(pair, flag):
    model = forma_model(pair.kind)
    for target in (model, pair.bridge):
        getattr(target, f"set_{flag}")(True)
    try:
        caches = [m.run_with_cache(pair.clean)[1] for m in (model, pair.bridge)]
        for pattern in SWITCHES[flag]:
            assert_same(caches[0][pattern.format(l=1)], caches[1][pattern.format(l=1)])
    finally:
        pair.bridge.__getattribute__(f"set_{flag}")(False)


def test_patching_one_heads_query_copy_moves_that_head_only():
    model = forma_model("llama")
    model.set_use_split_qkv_input(True)
    tokens = torch.randint(4, BRIDGE_VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    _, before = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_q")

    def edit_head_2(copies, hook):
        copies[:, :, 2] += 1.0  # in place: the copies are real, so only head 2's changes
        return copies

    with model.hooks(fwd_hooks=[("blocks.1.hook_q_input", edit_head_2)]):
        _, after = model.run_with_cache(
            tokens, names_filter=["blocks.1.attn.hook_q", "blocks.1.hook_resid_pre", "blocks.1.attn.hook_k"]
        )
    changed = (after["blocks.1.attn.hook_q"] - before["blocks.1.attn.hook_q"]).abs().amax(dim=(0, 1, 3))
    assert changed[2] > 1e-3 and changed[[0, 1, 3]].max() == 0


def test_hook_mlp_in_feeds_the_mlp_branch_alone():
    model = forma_model("gpt2")
    model.set_use_hook_mlp_in(True)
    tokens = torch.randint(4, BRIDGE_VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    _, clean = model.run_with_cache(tokens)

    def shift(x, hook):
        x[..., 0] += 1.0  # in place on the branch's own copy (not a constant: LayerNorm would remove it)
        return x

    with model.hooks(fwd_hooks=[("blocks.0.hook_mlp_in", shift)]):
        _, patched = model.run_with_cache(tokens)
    assert torch.equal(patched["blocks.0.hook_resid_mid"], clean["blocks.0.hook_resid_mid"])
    assert (patched["blocks.0.hook_mlp_out"] - clean["blocks.0.hook_mlp_out"]).abs().max() > 1e-3


def test_switch_misuse_is_a_clear_error():
    model = forma_model("gpt2")
    with pytest.raises(ValueError, match="use_attn_result must be True or False"):
        model.set_use_attn_result("yes")
    model.set_use_attn_in(True)
    with pytest.raises(ValueError, match="mutually exclusive"):
        model.set_use_split_qkv_input(True)
    model.set_use_attn_in(False)
    model.set_use_split_qkv_input(True)
    with pytest.raises(ValueError, match="mutually exclusive"):
        model.set_use_attn_in(True)


def test_use_attn_result_forms_and_caches_every_heads_result(pair):
    model = forma_model(pair.kind)
    model.set_use_attn_result(True)
    pair.bridge.set_use_attn_result(True)
    try:
        ours = model.run_with_cache(pair.clean)[1]
        theirs = pair.bridge.run_with_cache(pair.clean)[1]
        assert "blocks.0.attn.hook_result" in ours.keys()  # cached by default now, as TransformerLens does
        assert_same(ours["blocks.0.attn.hook_result"], theirs["blocks.0.attn.hook_result"])
    finally:
        pair.bridge.set_use_attn_result(False)


# --- the explicit paths (for wrappers that hook modules, not TransformerLens hook points) -----------------------
@pytest.mark.parametrize("kind", KINDS + ["neox"])
def test_explicit_paths_fire_every_hook_point_without_a_hook(kind):
    """With set_explicit_paths(True) and set_use_attn_result(True), every hook point runs on a plain forward
    pass: a torch forward hook on each HookPoint module (how nnsight sees them) fires for all of them; the
    logits stay those of the fused paths."""
    model = forma_model(kind)
    tokens = torch.randint(4, BRIDGE_VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    fused = model(tokens)

    def fired_in_a_plain_pass() -> set[str]:
        fired: set[str] = set()
        handles = [
            point.register_forward_hook(lambda module, args, out, name=name: fired.add(name))
            for name, point in model.hook_dict.items()
        ]
        try:
            logits = model(tokens)
        finally:
            for handle in handles:
                handle.remove()
        assert (logits - fused).abs().max() <= TOL
        return fired

    silent = set(model.hook_dict) - fired_in_a_plain_pass()
    assert {"blocks.0.attn.hook_pattern", "blocks.0.ln1.hook_scale"} <= silent
    assert "blocks.1.attn.hook_result" not in model.hook_dict  # only while use_attn_result is on
    model.set_explicit_paths(True)
    model.set_use_attn_result(True)
    assert fired_in_a_plain_pass() == set(model.hook_dict)
    model.set_explicit_paths(False)
    assert "blocks.0.attn.hook_pattern" not in fired_in_a_plain_pass()


# --- TransformerLens's call conventions --------------------------------------------------------------
def counted_blocks(model: HookedTransformer) -> tuple[list[int], list]:
    ran: list[int] = []
    handles = [
        block.register_forward_pre_hook(lambda module, args, layer=layer: ran.append(layer))
        for layer, block in enumerate(model.blocks)
    ]
    return ran, handles


@pytest.mark.parametrize("kind", KINDS)
def test_stop_at_layer_stops_computing(kind):
    model = forma_model(kind)
    tokens = torch.randint(4, BRIDGE_VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    ran, handles = counted_blocks(model)
    later = []
    try:
        with model.hooks(
            fwd_hooks=[
                ("blocks.1.hook_resid_pre", lambda x, hook: None),
                ("blocks.1.attn.hook_q", lambda x, hook: later.append(hook.name)),
                ("unembed.hook_out", lambda x, hook: later.append(hook.name)),
            ]
        ):
            resid = model(tokens, stop_at_layer=1)
        assert ran == [0] and later == []
        assert torch.allclose(resid, cache["blocks.1.hook_resid_pre"], atol=TOL)
        ran.clear()
        assert torch.allclose(model(tokens, stop_at_layer=-1), resid) and ran == [0]
        ran.clear()
        assert torch.allclose(model(tokens, stop_at_layer=0), cache["blocks.0.hook_resid_pre"]) and ran == []
        ran.clear()
        _, partial = model.run_with_cache(tokens, stop_at_layer=1)
        assert ran == [0] and not any(name.startswith("blocks.1") for name in partial.keys())
        assert "ln_final.hook_scale" not in partial.keys()
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("kind", KINDS)
def test_start_at_layer_resumes_from_the_residual_stream(kind):
    model = forma_model(kind)
    tokens = torch.randint(4, BRIDGE_VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    logits, cache = model.run_with_cache(tokens)
    ran, handles = counted_blocks(model)
    try:
        resumed = model(cache["blocks.1.hook_resid_pre"], start_at_layer=1)
        assert ran == [1] and torch.allclose(resumed, logits, atol=TOL)
        loss = model(cache["blocks.1.hook_resid_pre"], "loss", start_at_layer=1, tokens=tokens)
        assert torch.allclose(loss, model.loss(tokens), atol=TOL)
        middle = model(cache["blocks.0.hook_resid_pre"], start_at_layer=0, stop_at_layer=1)
        assert torch.allclose(middle, cache["blocks.1.hook_resid_pre"], atol=TOL)
    finally:
        for handle in handles:
            handle.remove()


def test_return_types_agree_with_the_bridge(pair):
    model = pair.forma
    with torch.no_grad():
        for return_type in ("loss", "both"):
            for per_token in (False, True):
                results = [m(pair.clean, return_type=return_type, loss_per_token=per_token) for m in pair.both]
                if return_type == "both":  # the compatibility-mode bridge's logits: compare log-probs
                    results = [(logits.log_softmax(-1), loss) for logits, loss in results]
                assert_same(*results)
        assert model(pair.clean, return_type=None) is None
        assert model(pair.clean, "loss", loss_per_token=True).shape == (2, 3)
        assert_same(*[m(pair.clean, stop_at_layer=1) for m in pair.both])
        assert_same(
            *[
                m.run_with_hooks(pair.clean, return_type="loss", fwd_hooks=[(HOOK, lambda x, hook: 0 * x)])
                for m in pair.both
            ]
        )


def test_text_input_and_prepend_bos(pair):
    model = pair.forma
    text = "w1 w2 w3"
    bos = model.tokenizer.bos_token_id
    assert model.to_tokens(text, prepend_bos=False).tolist() == [[5, 6, 7]]
    assert model.to_tokens(text, prepend_bos=True).tolist() == [[bos, 5, 6, 7]]
    assert model.to_tokens([text, "w4 w5 w6"], prepend_bos=False).shape == (2, 3)
    assert model.to_str_tokens(text, prepend_bos=True) == ["<bos>", "w1", "w2", "w3"]
    assert model.to_string(5) == model.to_string(torch.tensor(5)) == "w1"
    assert model.to_string(torch.tensor([5, 6])) == "w1 w2"
    with torch.no_grad():
        assert torch.equal(model(text, prepend_bos=True), model(torch.tensor([[bos, 5, 6, 7]])))
        assert_same(
            model(text, return_type="loss", prepend_bos=True), pair.bridge(text, return_type="loss", prepend_bos=True)
        )


def test_transformer_lens_test_prompt_runs(pair, capsys):
    try:
        from transformer_lens.utilities import test_prompt
    except ImportError:  # TransformerLens 3: transformer_lens.utils
        from transformer_lens.utils import test_prompt
    test_prompt("w1 w2 w3", "w4", pair.forma, top_k=3)
    printed = capsys.readouterr().out
    assert "Rank" in printed and "w4" in printed


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, t: m(t, return_type="probs"), "return_type must be one of"),
        (lambda m, t: m(t, stop_at_layer=3), r"stop_at_layer must be an integer layer in \[-2, 2\]"),
        (lambda m, t: m(t, stop_at_layer=True), "stop_at_layer must be an integer"),
        (lambda m, t: m(t, start_at_layer=1), "the input is the residual stream"),
        (lambda m, t: m(torch.zeros(2, 6, 32), "loss", start_at_layer=1), "needs tokens="),
        (lambda m, t: m(torch.zeros(2, 6, 32), start_at_layer=2, stop_at_layer=1), "comes after stop_at_layer"),
        (lambda m, t: m(t, stop_at_layer=1, kv_cache=KVCache.empty(2)), "cannot be combined"),
        (lambda m, t: m.to_tokens("w1", prepend_bos=True), "no beginning-of-sequence token"),
    ],
)
def test_call_convention_misuse_is_a_clear_error(call, message):
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = forma_model("gpt2")
    model.tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, "w1": 1}, unk_token="<unk>"))  # no BOS token
    model.tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokens = torch.randint(4, BRIDGE_VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=message):
        call(model, tokens)
