"""circuit-tracer's side of the peer comparison, run in its own environment (.venv-ct: circuit-tracer 0.5 with
transformers 4.57 and transformer-lens 3.2, which Forma itself does not run on): it imports neither Forma nor anything
that imports it. Given a folder with

    hf/                     a GPT-2 saved by transformers' save_pretrained (the weights Forma converts too), or a
                            Llama folder (config.json, model.safetensors, tokenizer.json) named by prompts.json's "hf"
    transcoders/layer_{l}.safetensors    per-layer transcoders in circuit-tracer's format (Forma's to_circuit_tracer)
    prompts.json            {"prompts": [[token ids], ...], "batch_size": n, and optionally "hf": a Llama folder,
                            "n_ctx": its context, "k": top-k transcoders, "max_feature_nodes": a node budget,
                            "logits": true (the model's logits of each prompt only, no graph)}

it builds circuit-tracer's TransformerLens ReplacementModel from a HookedTransformerConfig and the converted state
dict (TransformerLens's convert_gpt2_weights or convert_llama_weights; nothing is fetched from a hub), attributes each
prompt and writes ct-{i}.safetensors (adjacency, active_features, selected_features, logit_tokens, logit_probs) and
ct.json (each prompt's seconds and peak resident memory above the start of its call). Top-k transcoders (k set) are
circuit-tracer's own TopK followed by a ReLU, as Forma's top-k keeps the k largest pre-activations that are positive:
circuit-tracer's loader reads the files as ReLU ones, and its TopK does not clip a negative one.

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


def gpt2(folder: Path):
    """(TransformerLens config, converted state dict, tokenizer) of the GPT-2 in folder/hf."""
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
    return cfg, convert_gpt2_weights(hf, cfg), tokenizer_for(c.vocab_size, folder / "tokenizer")


def llama(hf_dir: Path, folder: Path, n_ctx: int):
    """(TransformerLens config, converted state dict, tokenizer) of the Llama in hf_dir (config.json of transformers
    5, model.safetensors, tokenizer.json), as TransformerLens's own LlamaForCausalLM config reads it: RMSNorm, rotary
    on every dimension of a head with the model's base, grouped key/value heads, a gated SiLU MLP, no biases; n_ctx
    shorter than the model's (TransformerLens keeps an n_ctx² mask a layer)."""
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    c = json.loads((hf_dir / "config.json").read_text())
    rope = c.get("rope_parameters") or {"rope_theta": c.get("rope_theta", 10000.0)}
    hf_cfg = LlamaConfig(
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"],
        num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"],
        head_dim=c["head_dim"],
        rms_norm_eps=c["rms_norm_eps"],
        rope_theta=rope["rope_theta"],
        tie_word_embeddings=c["tie_word_embeddings"],
    )
    with torch.device("meta"):
        hf = LlamaForCausalLM(hf_cfg)
    weights = load_file(str(hf_dir / "model.safetensors"))
    if c["tie_word_embeddings"]:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    hf.load_state_dict(weights, strict=True, assign=True)
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    cfg = HookedTransformerConfig(
        n_layers=c["num_hidden_layers"],
        d_model=c["hidden_size"],
        n_ctx=n_ctx,
        d_head=c["head_dim"],
        n_heads=heads,
        d_mlp=c["intermediate_size"],
        d_vocab=c["vocab_size"],
        act_fn=c["hidden_act"],
        eps=c["rms_norm_eps"],
        normalization_type="RMS",
        final_rms=True,
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=c["head_dim"],
        rotary_base=rope["rope_theta"],
        rotary_adjacent_pairs=False,
        n_key_value_heads=kv if kv != heads else None,
        model_name="forma-peer-llama",
        original_architecture="LlamaForCausalLM",
        default_prepend_bos=False,
        dtype=torch.float32,
        device="cpu",
    )
    tokenizer = json.loads((hf_dir / "tokenizer_config.json").read_text())
    special = {k: tokenizer[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if k in tokenizer}
    fast = PreTrainedTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json"), **special)
    fast.save_pretrained(folder / "tokenizer")  # TransformerLens reloads a tokenizer by its name_or_path
    reloaded = AutoTokenizer.from_pretrained(folder / "tokenizer", local_files_only=True)
    return cfg, convert_llama_weights(hf, cfg), reloaded


class TopKReLU(torch.nn.Module):
    """circuit-tracer's TopK, then a ReLU: the k largest pre-activations, those above zero kept (Forma's top-k)."""

    def __init__(self, k: int):
        super().__init__()
        from circuit_tracer.transcoder.activation_functions import TopK

        self.topk = TopK(k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.topk(x))


def transcoder_set(folder: Path, n_layers: int, k: int | None):
    from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set

    paths = {layer: str(folder / "transcoders" / f"layer_{layer}.safetensors") for layer in range(n_layers)}
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
    if k is not None:
        for transcoder in transcoders:
            transcoder.activation_function = TopKReLU(k)
    return transcoders


def replacement_model(folder: Path, spec: dict):
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel

    if "hf" in spec:
        cfg, state, tokenizer = llama(Path(spec["hf"]), folder, spec.get("n_ctx", 2048))
    else:
        cfg, state, tokenizer = gpt2(folder)
    transcoders = transcoder_set(folder, cfg.n_layers, spec.get("k"))
    model = TransformerLensReplacementModel.from_config(cfg, transcoders, tokenizer=tokenizer)
    renamed = {}
    for name, value in state.items():  # the replacement model wraps each MLP and the unembedding
        name = name.replace(".mlp.", ".mlp.old_mlp.").replace("unembed.", "unembed.old_unembed.")
        renamed[name] = value
    missing, unexpected = model.load_state_dict(renamed, strict=False)
    # GPT-2 has no unembedding bias (TransformerLens's stays at its zeros); the transcoders are loaded already; the
    # attention's causal mask, IGNORE and rotary tables are TransformerLens's own buffers.
    own = ("attn.mask", "attn.IGNORE", "attn.rotary_sin", "attn.rotary_cos")
    missing = [
        m for m in missing if not (m.startswith("transcoders.") or m == "unembed.old_unembed.b_U" or m.endswith(own))
    ]
    if missing or unexpected:
        raise RuntimeError(f"the converted model does not fit: missing {missing[:5]}, unexpected {unexpected[:5]}")
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
    model = replacement_model(folder, spec)
    if spec.get("logits"):
        with torch.no_grad():
            logits = {f"logits-{i}": model(torch.tensor([p])).float()[0] for i, p in enumerate(spec["prompts"])}
        save_file(logits, str(folder / "ct-logits.safetensors"))
        return

    def run(tokens: torch.Tensor):
        budget = spec.get("max_feature_nodes")
        return attribute(tokens, model, batch_size=spec.get("batch_size", 128), max_feature_nodes=budget)

    if spec.get("warmup"):
        run(torch.tensor(spec["prompts"][0]))
    timings = []
    for i, prompt in enumerate(spec["prompts"]):
        tokens = torch.tensor(prompt)
        graph, seconds, peak = measured(lambda tokens=tokens: run(tokens))
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
        write_timings(folder, timings)  # after each prompt: a side killed later (out of memory) leaves these


def write_timings(folder: Path, timings: list[dict]) -> None:
    import circuit_tracer

    (folder / "ct.json").write_text(
        json.dumps(
            {"circuit_tracer": circuit_tracer.__version__, "threads": torch.get_num_threads(), "prompts": timings},
            indent=2,
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
