"""Forma's attribution graph against circuit-tracer 0.5's on the same weights and the same transcoders.

A tiny GPT-2 (transformers, from a config: nothing fetched) is converted to Forma (lab.hf.from_hf) and, in
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
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lab.analysis.graphs.attribute import attribute
from lab.analysis.transcoders.model import TranscoderConfig, Transcoders
from lab.hf import from_hf

REPO = Path(__file__).resolve().parents[2]
CT_PYTHON = os.environ.get("FORMA_CT_PYTHON", str(REPO / ".venv-ct" / "bin" / "python"))
if not Path(CT_PYTHON).exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"CI needs circuit-tracer's environment at {CT_PYTHON} (make venv-ct)")
    pytest.skip(f"no circuit-tracer environment at {CT_PYTHON} (make venv-ct); CI runs this", allow_module_level=True)


def tiny_gpt2(folder: Path, layers: int = 2, d_model: int = 64, vocab: int = 100, n_ctx: int = 64):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=d_model, n_head=4, vocab_size=vocab, n_positions=n_ctx,
                     initializer_range=0.08, bos_token_id=0, eos_token_id=0)
    hf = GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(folder / "hf")
    return hf


def transcoders_for(model, activation: str, d_features: int = 128) -> Transcoders:
    cfg = model.cfg
    tc = Transcoders(TranscoderConfig(d_model=cfg.d_model, n_layers=cfg.n_layers, d_features=d_features,
                                      activation=activation, threshold=0.05, seed=1))
    with torch.no_grad():
        tc.b_enc.fill_(-0.1)
        tc.b_dec.normal_(0, 0.01, generator=torch.Generator().manual_seed(2))
    return tc.eval()


def run_circuit_tracer(folder: Path, prompts: list[list[int]], batch_size: int = 64) -> dict:
    (folder / "prompts.json").write_text(json.dumps({"prompts": prompts, "batch_size": batch_size, "threads": 1}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1",
                                                                        "TRANSFORMERS_OFFLINE": "1",
                                                                        "PYTHONPATH": str(REPO)}
    done = subprocess.run([CT_PYTHON, "-m", "tests.ct.circuit_tracer_side", str(folder)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "ct.json").read_text())


def compare(graph, ct: dict[str, torch.Tensor]) -> dict[str, float]:
    """Edges between the nodes both graphs hold (every node but position 0's features and errors), matched by id."""
    n_layers, n_pos = graph.n_layers, graph.n_pos
    active = ct["active_features"][ct["selected_features"]]
    ct_ids = [f"{l}_{f}_{p}" for l, p, f in active.tolist()]
    ct_ids += [f"err_{l}_{p}" for l in range(n_layers) for p in range(n_pos)]
    ct_ids += [f"E_{int(t)}_{p}" for p, t in enumerate(graph.tokens.tolist())]
    ct_ids += [f"{n_layers + 1}_{int(t)}_{n_pos - 1}" for t in ct["logit_tokens"].tolist()]
    ours = {node: i for i, node in enumerate(graph.node_ids())}
    assert torch.equal(ct["logit_tokens"], graph.logit_tokens)
    forma_features = {i for i in graph.node_ids()[: graph.n_features] if not i.endswith("_0")}
    assert set(ct_ids[: len(active)]) == forma_features  # the same active features off position 0
    shared = [i for i, node in enumerate(ct_ids) if node in ours and not node.startswith("err_") or
              (node.startswith("err_") and not node.endswith("_0"))]
    rows = torch.tensor([ours[ct_ids[i]] for i in shared])
    ct_sub = ct["adjacency"][shared][:, shared]
    forma_sub = graph.adjacency[rows][:, rows]
    scale = float(forma_sub.abs().max())
    return {"max_abs_difference": float((ct_sub - forma_sub).abs().max()), "scale": scale,
            "edges": int((forma_sub != 0).sum())}


@pytest.mark.parametrize("activation", ["relu", "jumprelu"])
def test_forma_and_circuit_tracer_give_the_same_graph(tmp_path, activation):
    hf = tiny_gpt2(tmp_path)
    model = from_hf(hf)
    tc = transcoders_for(model, activation)
    tc.to_circuit_tracer(tmp_path / "transcoders")
    generator = torch.Generator().manual_seed(3)
    prompts = [[0, *torch.randint(1, 100, (n - 1,), generator=generator).tolist()] for n in (9, 17)]
    run_circuit_tracer(tmp_path, prompts)
    for i, prompt in enumerate(prompts):
        graph = attribute(model, tc, prompt)
        agreement = compare(graph, load_file(str(tmp_path / f"ct-{i}.safetensors")))
        assert agreement["edges"] > 200
        print(f"{activation}, {graph.n_pos} tokens: {json.dumps(agreement)}")
        assert agreement["max_abs_difference"] < 1e-4 * agreement["scale"], agreement
