"""Forma's attribution graph against circuit-tracer 0.5's on the same weights and the same transcoders.

A tiny GPT-2 (transformers, from a config: nothing fetched) is converted to Forma (lab.hf.convert.from_hf) and, in
circuit-tracer's own environment (.venv-ct, `make venv-ct`: circuit-tracer needs transformers ≤ 4.57, which Forma
does not run on), loaded by circuit-tracer as its TransformerLens ReplacementModel (tests/ct/circuit_tracer_side.py,
a subprocess). Per-layer ReLU and JumpReLU transcoders trained by nothing (random, with a negative encoder bias so
that a fraction fires) are written by Forma in circuit-tracer's format. The prompts start with circuit-tracer's
special token at position 0, whose features and error circuit-tracer sets to zero (it treats that position's MLP
output as a constant); every other node is in both graphs, and every edge between them must agree.

`make test-ct` runs this with FORMA_CT_PYTHON pointing at .venv-ct's Python; in CI (CI=true) it must run.
"""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lab.analysis.graphs.attribute import attribute
from lab.hf.convert import from_hf
from tests.ct.peer import CT_PYTHON, compare, run_circuit_tracer, tiny_gpt2, transcoders_for

if not Path(CT_PYTHON).exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"CI needs circuit-tracer's environment at {CT_PYTHON} (make venv-ct)")
    pytest.skip(f"no circuit-tracer environment at {CT_PYTHON} (make venv-ct); CI runs this", allow_module_level=True)


ACTIVATIONS = ("relu", "jumprelu")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """For each activation: Forma's model and transcoders, the prompts, and circuit-tracer's graphs of them (one
    circuit-tracer process for both)."""
    cases, made = {}, {}
    generator = torch.Generator().manual_seed(3)
    prompts = [[0, *torch.randint(1, 100, (n - 1,), generator=generator).tolist()] for n in (9, 17)]
    for activation in ACTIVATIONS:
        folder = tmp_path_factory.mktemp(activation)
        model = from_hf(tiny_gpt2(folder))
        transcoders = transcoders_for(model, activation)
        transcoders.to_circuit_tracer(folder / "transcoders")
        cases[folder] = prompts
        made[activation] = (folder, model, transcoders)
    run_circuit_tracer(cases)
    return made, prompts


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_forma_and_circuit_tracer_give_the_same_graph(graphs, activation):
    made, prompts = graphs
    folder, model, tc = made[activation]
    for i, prompt in enumerate(prompts):
        graph = attribute(model, tc, prompt)
        agreement = compare(graph, load_file(str(folder / f"ct-{i}.safetensors")))
        print(f"{activation}, {graph.n_pos} tokens: {json.dumps(agreement)}")
        assert agreement["edges"] > 200
        assert agreement["max_abs_difference"] < 1e-4 * agreement["scale"], agreement
