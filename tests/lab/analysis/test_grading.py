"""lab.analysis.grading on tiny models: each grade is the quantity it names (the ground-truth lens's KL, the
relevant positions a model reads, a probe's R² and accuracy against their controls, a head's ablation effect,
attribution patching against the exhaustive sweep), on cases whose answer is known."""

import numpy as np
import pytest
import torch

from lab import HookedTransformer, ModelConfig
from lab.analysis.grading import (
    UNTRAINED_MODEL,
    UNTRAINED_TRANSCODERS,
    flagged_margin,
    grade_attribution_patching,
    grade_belief_probes,
    grade_head_detectors,
    grade_input_attribution,
    grade_lens,
    grade_value_probes,
    graph_position_scores,
    head_ablation_effects,
    head_shapley,
    last_position_truth,
    shapley_values,
)
from lab.analysis.graphs.attribute import attribute
from lab.analysis.graphs.influence import position_share
from lab.analysis.lens import ground_truth_lens
from lab.analysis.probes.splits import group_split
from lab.data.mechanisms import InductionSource, Mess3Source
from lab.data.sources import MarkovSource
from lab.metrics.grades import BASELINES
from lab.metrics.memory import last_tokens_lookup
from tests.builders import exact_transcoders, random_transcoders

pytestmark = pytest.mark.usefixtures("one_thread")


def model(d_vocab: int, **changes) -> HookedTransformer:
    cfg = ModelConfig(**{"d_vocab": d_vocab, "d_model": 16, "n_layers": 2, "n_heads": 2, "n_ctx": 12} | changes)
    return HookedTransformer(cfg, seed=5).eval()


def test_the_lens_grade_of_the_logit_lens_is_the_ground_truth_lens():
    source = MarkovSource(6, order=2, seed=1)
    tokens = source.sample(20, 10, seed=2)
    m = model(6)
    grades = grade_lens(m, torch.from_numpy(tokens), source.conditionals(tokens), n_boot=100)
    reference = ground_truth_lens(m, torch.from_numpy(tokens), source.conditionals(tokens)).kl_nats.mean(dim=(1, 2))
    for layer, grade in enumerate(grades):
        assert grade["kl_true"].value.value == pytest.approx(float(reference[layer]), rel=1e-6)
    assert grades[-1]["kl_model"].value.value == pytest.approx(0.0, abs=1e-9)


def test_a_model_that_reads_only_the_last_token_is_graded_perfect_by_gradients():
    source = MarkovSource(6, order=1, seed=1)
    tokens = torch.from_numpy(source.sample(16, 8, seed=3))
    m = model(6)
    with torch.no_grad():
        for block in m.blocks:
            block.attn.W_O.zero_()
    relevant = last_position_truth(source.relevant_positions(tokens.numpy()))
    assert relevant.sum(1).eq(1).all() and relevant[:, -1].all()
    graded = grade_input_attribution(m, tokens, relevant, ("gradient", "occlusion", "attention"), n_boot=100)
    for method in ("gradient", "occlusion"):
        assert graded.grades[method]["auroc"].value.value == 1.0
        assert graded.grades[method]["relevant_mass"].value.value == pytest.approx(1.0)
    assert graded.effects[:, :-1].abs().max() == 0
    # Perfect, and no credit: the last token alone (a trivial baseline) is the truth here too, so no method can beat
    # it; the baselines are graded beside the methods, and each method's control is the untrained model's.
    assert set(graded.baselines) == set(BASELINES) <= set(graded.grades)
    assert graded.grades["last_token"]["auroc"].value.value == 1.0
    assert graded.grades["last_token"]["relevant_mass"].value.value == pytest.approx(1.0)
    assert graded.grades["gradient"]["auroc"].control_means == UNTRAINED_MODEL
    assert set(graded.controls["gradient"]) == {UNTRAINED_MODEL}


def test_the_attribution_graph_of_a_model_that_reads_only_the_last_token_puts_all_its_influence_there():
    """No head writes: only the last token reaches the last logits, so every graph over any transcoders routes the
    prediction through it alone."""
    source = MarkovSource(6, order=1, seed=1)
    tokens = torch.from_numpy(source.sample(12, 8, seed=3))
    m = model(6)
    with torch.no_grad():
        for block in m.blocks:
            block.attn.W_O.zero_()
    relevant = last_position_truth(source.relevant_positions(tokens.numpy()))
    graded = grade_input_attribution(m, tokens, relevant, ("gradient",), n_boot=100, transcoders=random_transcoders(m))
    assert graded.grades["attribution_graph"]["auroc"].value.value == 1.0
    assert graded.grades["attribution_graph"]["relevant_mass"].value.value == pytest.approx(1.0)
    # Untrained transcoders route it the same way (attention carries nothing): the graph does not beat them.
    graph = graded.grades["attribution_graph"]["auroc"]
    assert graph.control_means == UNTRAINED_TRANSCODERS and graph.beats_control is False
    assert set(graded.replacement) == {"replacement_score"}


def test_the_graph_is_graded_against_untrained_transcoders_with_both_replacement_scores():
    """Transcoders equal to the model's MLPs leave nothing to the error nodes (replacement score 1); untrained ones of
    the same shape leave much, so the replacement grade beats its control. Controls are named: {} grades a method
    alone, and every model given is graded and kept by name."""
    source = MarkovSource(6, order=2, seed=1)
    tokens = torch.from_numpy(source.sample(8, 8, seed=4))
    m = model(6, mlp="relu")
    relevant = last_position_truth(source.relevant_positions(tokens.numpy()))
    graded = grade_input_attribution(
        m, tokens, relevant, ("gradient",), n_boot=100, transcoders=exact_transcoders(m), controls={}
    )
    replacement = graded.replacement["replacement_score"]
    assert replacement.value.value == pytest.approx(1.0, abs=1e-4)
    assert replacement.control.value < 0.9 and replacement.beats_control
    assert graded.grades["gradient"]["auroc"].control is None
    others = {"seed 7": HookedTransformer(m.cfg, seed=7).eval(), "seed 9": HookedTransformer(m.cfg, seed=9).eval()}
    both = grade_input_attribution(m, tokens, relevant, ("gradient",), n_boot=100, controls=others)
    assert set(both.controls["gradient"]) == set(others) and both.grades["gradient"]["auroc"].control_means in others


def test_the_graph_grade_is_each_prompts_position_share_averaged():
    """On a model whose heads write, the graph's relevant mass is influence.position_share of each prompt's graph at
    its relevant positions, averaged over prompts; each prompt's scores are its graph's shares of the influence."""
    source = MarkovSource(6, order=2, seed=1)
    tokens = torch.from_numpy(source.sample(6, 8, seed=4))
    m, transcoders = model(6), random_transcoders(model(6))
    relevant = last_position_truth(source.relevant_positions(tokens.numpy()))
    scores = graph_position_scores(m, transcoders, tokens)
    assert scores.shape == tokens.shape and torch.allclose(scores.sum(1), torch.ones(6))
    assert (scores[:, :-2] > 0).any()  # attention carries earlier tokens to the prediction
    graded = grade_input_attribution(m, tokens, relevant, ("gradient",), n_boot=100, transcoders=transcoders)
    shares = [position_share(attribute(m, transcoders, prompt), [-2, -1]) for prompt in tokens]
    assert graded.grades["attribution_graph"]["relevant_mass"].value.value == pytest.approx(np.mean(shares), rel=1e-6)
    assert 0 < np.mean(shares) < 1


def test_a_head_that_writes_nothing_has_no_ablation_effect():
    source = InductionSource(10, 3, 5, seed=0)
    tokens = torch.from_numpy(source.sample(12, 12, seed=1))
    m = model(10)
    with torch.no_grad():
        m.blocks[1].attn.W_O[0].zero_()
    scored = torch.from_numpy(source.copy_positions(tokens.numpy()))
    effects = head_ablation_effects(m, tokens, scored)
    assert effects.shape == (12, 2, 2)
    assert effects[:, 1, 0].abs().max() == 0 and effects[:, 0, 0].abs().max() > 0
    for path in ("total", "direct", "keys"):
        assert head_shapley(m, tokens, scored, path)[:, 1, 0].abs().max() < 1e-6, path
    graded = grade_head_detectors(m, tokens, scored, n_boot=100)
    assert set(graded["grades"]) == {
        "spearman_induction",
        "spearman_previous_token",
        "margin_induction",
        "margin_previous_token",
    }
    assert graded["values"]["induction"].shape == (2, 2) and graded["scores"]["previous_token"].shape == (2, 2)


def test_shapley_values_are_the_fair_shares_of_known_games():
    n = 3
    subsets = np.arange(2**n)
    members = np.array([[mask >> i & 1 for i in range(n)] for mask in subsets], dtype=float)
    additive = members @ np.array([1.0, 2.0, 4.0])  # each player brings its own
    assert shapley_values(additive[:, None], n)[0] == pytest.approx([1.0, 2.0, 4.0])
    both = (members[:, 0] * members[:, 1])[:, None]  # 0 and 1 only together (redundant partners' mirror image)
    assert shapley_values(both, n)[0] == pytest.approx([0.5, 0.5, 0.0])
    either = np.maximum(members[:, 0], members[:, 1])[:, None]  # either one suffices: each alone is unnecessary
    assert shapley_values(either, n)[0] == pytest.approx([0.5, 0.5, 0.0])


def test_head_shapley_values_add_up_to_ablating_every_head_and_split_by_path():
    source = InductionSource(10, 3, 5, seed=0)
    tokens = torch.from_numpy(source.sample(12, 12, seed=1))
    scored = torch.from_numpy(source.copy_positions(tokens.numpy()))
    m = model(10)
    total = head_shapley(m, tokens, scored, "total")
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(2)]
    with torch.inference_mode():
        _, cache = m.run_with_cache(tokens)
        hooks = [(n, lambda z, hook, n=n: cache[n].mean(dim=(0, 1)).expand_as(z).clone()) for n in names]

        def copied(logits):
            picked = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]
            return (picked * scored[:, :-1]).sum(1) / scored[:, :-1].sum(1).clamp_min(1)

        all_ablated = copied(m(tokens)) - copied(m.run_with_hooks(tokens, fwd_hooks=hooks))
    assert total.sum(dim=(1, 2)) == pytest.approx(all_ablated, abs=1e-5)  # Shapley's efficiency, prompt by prompt
    assert not torch.allclose(total, head_ablation_effects(m, tokens, scored))  # not one head at a time
    keys = head_shapley(m, tokens, scored, "keys")
    assert keys[:, 1].abs().max() == 0 and keys[:, 0].abs().max() > 0  # the last layer has no later keys
    # In an attention-only model a last-layer head's output reaches only the unembedding: direct is total there.
    attn_only = model(10, block="attn_only")
    with torch.no_grad():
        attn_only.blocks[0].attn.W_O.zero_()
    direct, whole = (head_shapley(attn_only, tokens, scored, path) for path in ("direct", "total"))
    assert direct == pytest.approx(whole, abs=1e-5) and direct[:, 1].abs().max() > 0
    with pytest.raises(ValueError, match="path must be"):
        head_shapley(m, tokens, scored, "values")


def test_the_flagged_margin_is_how_far_the_flagged_heads_lead_the_others():
    values = np.array([0.1, 0.9, 0.3, 0.8])
    assert flagged_margin(np.array([0.0, 0.2, 0.1, 0.3]), values) == pytest.approx(0.8 - 0.9)  # none: the top one
    assert flagged_margin(np.array([0.0, 0.9, 0.1, 0.2]), values) == pytest.approx(0.9 - 0.8)  # one: its lead
    assert flagged_margin(np.array([0.0, 0.9, 0.1, 0.7]), values) == pytest.approx(0.8 - 0.3)  # a redundant pair
    assert flagged_margin(np.array([0.9, 0.1, 0.8, 0.0]), values) == pytest.approx(0.1 - 0.9)  # the wrong heads
    assert np.isnan(flagged_margin(np.ones(4), values))


def test_belief_probes_beat_shuffled_targets_and_report_selectivity_exactly():
    source = Mess3Source()
    tokens = source.sample(60, 10, seed=4)
    graded = grade_belief_probes(model(3), torch.from_numpy(tokens), source.beliefs(tokens), n_boot=100)
    assert set(graded) == {"resid_pre 0", "resid_pre 1", "final", "all layers"}
    for readout, grades in graded.items():
        r2 = grades["r2"]
        # The token at each position moves the belief most, and every readout carries it: even an untrained model's
        # embeddings give a probe more than shuffled targets.
        assert r2.value.low > r2.control.high and r2.control_at_chance, readout
        assert grades["selectivity"].value == pytest.approx(r2.value.value - grades["r2_control_task"].value)
        assert grades["r2_beyond_token"].control_at_chance, readout
        assert grades["r2_last_k"] is graded["all layers"]["r2_last_k"]  # one baseline, beside every readout


def test_the_belief_probes_finite_memory_baseline_is_the_lookup_on_the_probes_own_split():
    """Each k's R² is lab.metrics.memory's lookup fitted on the probe's training prompts, judged on its test rows;
    on Shai et al.'s Mess3 (x = 0.05, α = 0.85) a memory of four tokens already gives the belief almost exactly."""
    source = Mess3Source()
    tokens = source.sample(80, 10, seed=4)
    beliefs = source.beliefs(tokens)
    graded = grade_belief_probes(model(3), torch.from_numpy(tokens), beliefs, n_boot=50, memory=(1, 4))
    chosen = graded["all layers"]
    test = chosen["test_rows"]
    train = np.setdiff1d(np.arange(tokens.size), test)
    flat = beliefs.reshape(-1, 3)
    for k in (1, 4):
        predicted = last_tokens_lookup(tokens, beliefs, train, k)[test]
        expected = 1 - ((flat[test] - predicted) ** 2).sum() / ((flat[test] - flat[test].mean(0)) ** 2).sum()
        assert chosen["r2_last_k"][k].value == pytest.approx(expected)
    assert chosen["r2_last_k"][4].low > 0.95 > chosen["r2_last_k"][1].high


def test_value_probes_read_a_label_the_stream_carries_and_not_one_it_cannot():
    rng = np.random.default_rng(0)
    tokens = torch.from_numpy(rng.integers(0, 12, size=(150, 6)))
    labels = tokens[:, -1].numpy() % 3  # carried by the last token's embedding
    groups = np.arange(150)
    graded = grade_value_probes(model(12), tokens, labels, groups, n_boot=100)
    final = graded["final"]
    assert final["accuracy"].value.value > 0.9 and final["accuracy"].control_at_chance
    assert final["accuracy_control_task"].value < 0.6  # one random label per prompt: nothing to learn across prompts
    noise = grade_value_probes(model(12), tokens, rng.integers(0, 3, 150), groups, n_boot=100)["final"]
    assert noise["accuracy"].value.low < noise["accuracy"].chance + 0.1


def test_a_value_probe_stands_beside_the_models_own_reading_when_labels_are_tokens():
    """With labels that are token ids, each readout's baseline is the logit lens's top label at the last position
    (the model's own output at "final"), and the probe's accuracy beyond it is the paired difference."""
    rng = np.random.default_rng(0)
    tokens = torch.from_numpy(rng.integers(0, 12, size=(150, 6)))
    labels = 4 + tokens[:, -1].numpy() % 3  # token ids 4, 5, 6, carried by the last token's embedding
    m = model(12)
    graded = grade_value_probes(m, tokens, labels, np.arange(150), n_boot=100, labels_are_tokens=True)
    test = group_split(np.arange(150), 0.3, 0)[1]  # the probe's own test prompts
    with torch.inference_mode():
        said = 4 + m(tokens)[:, -1, 4:7].argmax(-1).numpy()
    final = graded["final"]
    assert final["accuracy_logit_lens"].value == pytest.approx(np.mean(said[test] == labels[test]))
    assert final["accuracy_beyond_lens"].value == pytest.approx(
        final["accuracy"].value.value - final["accuracy_logit_lens"].value
    )
    assert "accuracy_logit_lens" not in grade_value_probes(m, tokens, labels, np.arange(150), n_boot=20)["final"]


def test_attribution_patching_grade_is_the_correlation_of_the_two_sweeps():
    source = InductionSource(10, 3, 5, seed=0)
    clean = torch.from_numpy(source.sample(3, 8, seed=2))
    corrupted = clean.clone()
    corrupted[:, 1] = (corrupted[:, 1] + 1) % 10
    graded = grade_attribution_patching(model(10), clean, corrupted, clean[:, 1], corrupted[:, 1], n_boot=50)
    for sweep, pairs in graded["pairs"].items():
        expected = np.mean([np.corrcoef(a, e)[0, 1] for a, e in pairs])
        assert graded["grades"][f"pearson_{sweep}"].value.value == pytest.approx(expected, abs=1e-6)


def test_the_effects_can_be_resampled_over_a_few_tokens_and_the_graph_kept_within_a_feature_budget():
    """On a real vocabulary every token per position is too many forward passes: `effect_values` names the few
    replacement tokens the effects average over (resample_effects' `values`), and `graph_features` caps each graph's
    feature nodes (the rest folded into the error nodes), as attribute's max_feature_nodes does."""
    from lab.analysis.input_attribution import resample_effects

    source = MarkovSource(6, order=2, seed=1)
    tokens = torch.from_numpy(source.sample(4, 8, seed=4))
    m, transcoders = model(6), random_transcoders(model(6))
    relevant = last_position_truth(source.relevant_positions(tokens.numpy()))
    few = torch.tensor([0, 3])
    graded = grade_input_attribution(
        m, tokens, relevant, ("gradient",), n_boot=50, effect_values=few, transcoders=transcoders, graph_features=2
    )
    assert torch.allclose(graded.effects, resample_effects(m, tokens, values=few))
    assert not torch.allclose(graded.effects, resample_effects(m, tokens))
    budget = [position_share(attribute(m, transcoders, p, max_feature_nodes=2), [-2, -1]) for p in tokens]
    every = [position_share(attribute(m, transcoders, p), [-2, -1]) for p in tokens]
    value = graded.grades["attribution_graph"]["relevant_mass"].value.value
    assert value == pytest.approx(np.mean(budget), rel=1e-6) and value != pytest.approx(np.mean(every), rel=1e-6)
