"""What Forma's side of the circuit-tracer comparison shares between tests/ct and benchmarks/graphs_circuit_tracer.py:
the tiny GPT-2, transcoders for it, running circuit-tracer's side in its environment, and the comparison of two
graphs node by node."""

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import torch

from lab.analysis.transcoders.model import TranscoderConfig, Transcoders

REPO = Path(__file__).resolve().parents[2]
CT_PYTHON = os.environ.get("FORMA_CT_PYTHON", str(REPO / ".venv-ct" / "bin" / "python"))


def tiny_gpt2(folder: Path, layers: int = 2, d_model: int = 64, vocab: int = 100, n_ctx: int = 64):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=layers,
        n_embd=d_model,
        n_head=4,
        vocab_size=vocab,
        n_positions=n_ctx,
        initializer_range=0.08,
        bos_token_id=0,
        eos_token_id=0,
    )
    hf = GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(folder / "hf")
    return hf


def transcoders_for(model, activation: str, d_features: int = 128) -> Transcoders:
    cfg = model.cfg
    tc = Transcoders(
        TranscoderConfig(
            d_model=cfg.d_model,
            n_layers=cfg.n_layers,
            d_features=d_features,
            activation=activation,
            threshold=0.05,
            seed=1,
        )
    )
    with torch.no_grad():
        tc.b_enc.fill_(-0.1)
        tc.b_dec.normal_(0, 0.01, generator=torch.Generator().manual_seed(2))
    return tc.eval()


def circuit_tracer_files(transcoders: Transcoders, directory: Path) -> int | None:
    """`transcoders` in circuit-tracer's per-layer files, and the k its side must apply (None: the files say it all).
    A top-k set (which to_circuit_tracer refuses: circuit-tracer's loader reads no top-k) is written as the ReLU set
    of the same weights, and circuit_tracer_side.py sets its activation to TopK(k) then ReLU."""
    if transcoders.cfg.activation != "topk":
        transcoders.to_circuit_tracer(directory)
        return None
    relu = Transcoders(replace(transcoders.cfg, activation="relu", k=0))
    relu.load_state_dict(transcoders.state_dict())
    relu.to_circuit_tracer(directory)
    return transcoders.cfg.k


def run_circuit_tracer(
    cases: dict[Path, list[list[int]]],
    batch_size: int = 64,
    threads: int = 1,
    timeout: int = 900,
    tolerate_failure: bool = False,
    **options,
) -> dict[Path, dict]:
    """circuit-tracer's graphs of each folder's prompts (tests/ct/circuit_tracer_side.py in .venv-ct, one process for
    every folder): each folder's ct.json. options: the side's other settings (hf, n_ctx, k, max_feature_nodes,
    warmup, logits; its docstring). tolerate_failure: a side that fails (killed for memory, say) is no error; the
    prompts it finished are returned, with "failed": its return code and the end of its stderr."""
    for folder, prompts in cases.items():
        (folder / "prompts.json").write_text(
            json.dumps({"prompts": prompts, "batch_size": batch_size, "threads": threads} | options)
        )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [CT_PYTHON, "-m", "tests.ct.circuit_tracer_side", *map(str, cases)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0 and not tolerate_failure:
        raise AssertionError(done.stderr[-3000:])
    if options.get("logits"):
        return {}
    out = {}
    for folder in cases:
        out[folder] = (
            json.loads((folder / "ct.json").read_text()) if (folder / "ct.json").is_file() else {"prompts": []}
        )
        if done.returncode != 0:  # the prompts it finished are in ct.json; how it ended is kept beside them
            out[folder]["failed"] = {"returncode": done.returncode, "stderr_tail": done.stderr[-1500:]}
    return out


def compare(graph, ct: dict[str, torch.Tensor]) -> dict[str, float]:
    """Edges between the nodes both graphs hold (every node but position 0's features and errors), matched by id."""
    n_layers, n_pos = graph.n_layers, graph.n_pos
    active = ct["active_features"][ct["selected_features"]]
    ct_ids = [f"{layer}_{f}_{p}" for layer, p, f in active.tolist()]
    ct_ids += [f"err_{layer}_{p}" for layer in range(n_layers) for p in range(n_pos)]
    ct_ids += [f"E_{int(t)}_{p}" for p, t in enumerate(graph.tokens.tolist())]
    ct_ids += [f"{n_layers + 1}_{int(t)}_{n_pos - 1}" for t in ct["logit_tokens"].tolist()]
    ours = {node: i for i, node in enumerate(graph.node_ids())}
    assert torch.equal(ct["logit_tokens"], graph.logit_tokens)
    forma_features = {i for i in graph.node_ids()[: graph.n_features] if not i.endswith("_0")}
    assert set(ct_ids[: len(active)]) == forma_features  # the same active features off position 0
    shared = [
        i
        for i, node in enumerate(ct_ids)
        if node in ours and not node.startswith("err_") or (node.startswith("err_") and not node.endswith("_0"))
    ]
    rows = torch.tensor([ours[ct_ids[i]] for i in shared])
    ct_sub = ct["adjacency"][shared][:, shared]
    forma_sub = graph.adjacency[rows][:, rows]
    scale = float(forma_sub.abs().max())
    return {
        "max_abs_difference": float((ct_sub - forma_sub).abs().max()),
        "scale": scale,
        "edges": int((forma_sub != 0).sum()),
    }


def compare_shared(graph, ct: dict[str, torch.Tensor]) -> dict[str, float]:
    """Two graphs within a feature budget: circuit-tracer keeps the features of most influence on the logits and
    drops the rest, Forma those of largest activation × decoder norm and folds the rest into its error nodes, so
    the error nodes differ. Edges among the nodes both hold but the errors (the features both kept, the token
    embeddings, the logits both target) are the same quantity on both sides, matched by id."""
    n_layers = graph.n_layers
    active = ct["active_features"][ct["selected_features"]]
    ct_ids = [f"{layer}_{f}_{p}" for layer, p, f in active.tolist()]
    ct_ids += [None] * (n_layers * graph.n_pos)  # error nodes
    ct_ids += [f"E_{int(t)}_{p}" for p, t in enumerate(graph.tokens.tolist())]
    ct_ids += [f"{n_layers + 1}_{int(t)}_{graph.n_pos - 1}" for t in ct["logit_tokens"].tolist()]
    ours = {node: i for i, node in enumerate(graph.node_ids())}
    shared = [i for i, node in enumerate(ct_ids) if node is not None and node in ours]
    rows = torch.tensor([ours[ct_ids[i]] for i in shared])
    ct_sub = ct["adjacency"][shared][:, shared]
    forma_sub = graph.adjacency[rows][:, rows]
    return {
        "forma_features": graph.n_features,
        "ct_features": len(active),
        "shared_features": sum(1 for node in ct_ids[: len(active)] if node in ours),
        "same_logit_tokens": bool(torch.equal(ct["logit_tokens"], graph.logit_tokens)),
        "max_abs_difference": float((ct_sub - forma_sub).abs().max()),
        "scale": float(forma_sub.abs().max()),
        "edges": int((forma_sub != 0).sum()),
    }
