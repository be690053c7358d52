"""circuit-tracer's side of the real-size comparison (benchmarks/graphs_circuit_tracer.py --model smollm2) holds the
same model as Forma: smollm2's folder (a Llama in transformers' layout) built by TransformerLens 3.2's
HookedTransformerConfig and convert_llama_weights inside circuit-tracer's ReplacementModel
(tests/ct/circuit_tracer_side.py, in .venv-ct), with top-k transcoders written by Forma, gives Forma's logits on
short prompts.

`make test-ct` runs this with FORMA_CT_PYTHON pointing at .venv-ct's Python; in CI (CI=true) it must run.
"""

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lab.analysis.transcoders.model import TranscoderConfig, Transcoders
from lab.load import load_model
from tests.builders import smollm2_folder
from tests.ct.peer import CT_PYTHON, circuit_tracer_files, run_circuit_tracer

if not Path(CT_PYTHON).exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"CI needs circuit-tracer's environment at {CT_PYTHON} (make venv-ct)")
    pytest.skip(f"no circuit-tracer environment at {CT_PYTHON} (make venv-ct); CI runs this", allow_module_level=True)


def test_circuit_tracers_llama_conversion_of_smollm2_gives_formas_logits(tmp_path):
    folder = smollm2_folder()
    model = load_model(folder).eval()
    cfg = model.cfg
    transcoders = Transcoders(
        TranscoderConfig(d_model=cfg.d_model, n_layers=cfg.n_layers, d_features=32, activation="topk", k=4)
    )
    k = circuit_tracer_files(transcoders, tmp_path / "transcoders")
    generator = torch.Generator().manual_seed(4)
    prompts = [
        model.tokenizer.encode("<|im_start|>The capital of Italy is"),
        [1, *torch.randint(2, cfg.d_vocab, (15,), generator=generator).tolist()],
    ]
    run_circuit_tracer({tmp_path: prompts}, hf=str(folder), n_ctx=64, k=k, logits=True)
    theirs = load_file(str(tmp_path / "ct-logits.safetensors"))
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            ours = model(torch.tensor([prompt]))[0]
        assert ours.shape == theirs[f"logits-{i}"].shape == (len(prompt), cfg.d_vocab)
        assert (ours - theirs[f"logits-{i}"]).abs().max() < 1e-3 * ours.abs().max()
        assert torch.equal(ours.argmax(-1), theirs[f"logits-{i}"].argmax(-1))
