"""circuit-tracer's side of the peer comparison, run in its own environment (.venv-ct: circuit-tracer 0.5 with
transformers 4.57 and transformer-lens 3.2, which Forma itself does not run on): it imports neither Forma nor anything
that imports it. Given a folder with

    hf/                     a GPT-2 saved by transformers' save_pretrained (the weights Forma converts too)
    transcoders/layer_{l}.safetensors    per-layer transcoders in circuit-tracer's format (Forma's to_circuit_tracer)
    prompts.json            {"prompts": [[token ids], ...], "batch_size": n}

it builds circuit-tracer's TransformerLens ReplacementModel from a HookedTransformerConfig and the converted state
dict (nothing is fetched from a hub), attributes each prompt and writes ct-{i}.safetensors (adjacency,
active_features, selected_features, logit_tokens, logit_probs) and ct.json (each prompt's seconds and peak resident
memory above the start of its call).

    .venv-ct/bin/python -m tests.ct.circuit_tracer_side FOLDER [FOLDER ...]
"""

import ctypes
import json
import sys
import time
from pathlib import Path

import torch


def status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def measured(fn):
    """(fn(), seconds, peak resident bytes above the start)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    before = status_kb("VmRSS")
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start, status_kb("VmHWM") - before


def tokenizer_for(vocab: int, folder: Path):
    """A word-level tokenizer whose token i is "t{i}" and token 0 the special "<bos>", built here (none is fetched)
    and read back from its folder (TransformerLens reloads a tokenizer by its name_or_path)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = {"<bos>": 0} | {f"t{i}": i for i in range(1, vocab)}
    core = Tokenizer(models.WordLevel(words, unk_token="<bos>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>").save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def replacement_model(folder: Path):
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(folder / "hf", local_files_only=True).eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_ctx=c.n_positions,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=4 * c.n_embd,
        d_vocab=c.vocab_size,
        act_fn="gelu_new",
        normalization_type="LN",
        eps=c.layer_norm_epsilon,
        model_name="forma-peer-gpt2",
        original_architecture="GPT2LMHeadModel",
        default_prepend_bos=False,
        positional_embedding_type="standard",
        dtype=torch.float32,
        device="cpu",
    )
    paths = {layer: str(folder / "transcoders" / f"layer_{layer}.safetensors") for layer in range(c.n_layer)}
    transcoders = load_transcoder_set(
        paths,
        scan="forma-peer",
        feature_input_hook="ln2.hook_normalized",
        feature_output_hook="hook_mlp_out",
        device=torch.device("cpu"),
        dtype=torch.float32,
        lazy_encoder=False,
        lazy_decoder=False,
    )
    tokenizer = tokenizer_for(c.vocab_size, folder / "tokenizer")
    model = TransformerLensReplacementModel.from_config(cfg, transcoders, tokenizer=tokenizer)
    state = convert_gpt2_weights(hf, cfg)
    renamed = {}
    for name, value in state.items():  # the replacement model wraps each MLP and the unembedding
        name = name.replace(".mlp.", ".mlp.old_mlp.").replace("unembed.", "unembed.old_unembed.")
        renamed[name] = value
    missing, unexpected = model.load_state_dict(renamed, strict=False)
    # GPT-2 has no unembedding bias (TransformerLens's stays at its zeros); the transcoders are loaded already; the
    # attention's causal mask and IGNORE are TransformerLens's own buffers.
    missing = [
        m
        for m in missing
        if not (
            m.startswith("transcoders.") or m == "unembed.old_unembed.b_U" or m.endswith(("attn.mask", "attn.IGNORE"))
        )
    ]
    if missing or unexpected:
        raise RuntimeError(f"the converted GPT-2 does not fit: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def main(*folders: str) -> None:
    for folder in folders:  # one process (its imports take seconds) for every case
        attribute_prompts(Path(folder))


def attribute_prompts(folder: Path) -> None:
    from circuit_tracer import attribute
    from safetensors.torch import save_file

    spec = json.loads((folder / "prompts.json").read_text())
    torch.set_num_threads(int(spec.get("threads", torch.get_num_threads())))
    model = replacement_model(folder)
    timings = []
    for i, prompt in enumerate(spec["prompts"]):
        tokens = torch.tensor(prompt)
        graph, seconds, peak = measured(
            lambda tokens=tokens: attribute(tokens, model, batch_size=spec.get("batch_size", 128))
        )
        timings.append(
            {
                "n_pos": len(prompt),
                "seconds": seconds,
                "peak_bytes": peak,
                "n_features": int(len(graph.selected_features)),
            }
        )
        save_file(
            {
                "adjacency": graph.adjacency_matrix.float().contiguous(),
                "active_features": graph.active_features.long().contiguous(),
                "selected_features": graph.selected_features.long().contiguous(),
                "logit_tokens": torch.tensor([t.vocab_idx for t in graph.logit_targets]),
                "logit_probs": graph.logit_probabilities.float().contiguous(),
            },
            str(folder / f"ct-{i}.safetensors"),
        )
    import circuit_tracer

    (folder / "ct.json").write_text(
        json.dumps(
            {"circuit_tracer": circuit_tracer.__version__, "threads": torch.get_num_threads(), "prompts": timings},
            indent=2,
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
