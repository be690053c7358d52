"""A GGUF file (llama.cpp's format) made into a Hugging Face LLaMA folder that `load_hf` reads.

The container is parsed by the `gguf` package (pure Python over a memory map: its metadata and each tensor's raw
bytes); the numbers are Forma's own. Quantized tensors are dequantized as ggml defines its blocks (ggml-common.h,
ggml-quants.c, `dequantize_row_*`), 32 weights a block:

    Q8_0  (34 bytes)  fp16 d, then 32 int8 q:                       w = d · q
    Q4_1  (20 bytes)  fp16 d, fp16 m, then 16 bytes of nibbles:      w = d · q + m,  q ∈ 0 … 15
                      byte j holds weight j in its low nibble and weight j + 16 in its high one

in float32, a product then a sum, as transformers' and the gguf package's dequantizers compute them (ggml's C may
fuse the two into one rounding; the difference is below float32's round-off of the weight).

llama.cpp's converter stores a LLaMA's W_Q and W_K rows permuted for its rotary kernel (pairs of a head's
dimensions interleaved, `convert_hf_to_gguf.py`'s `permute`); `unpermute` undoes it, giving Hugging Face's
half-split layout. The tokenizer is rebuilt from the file's vocabulary and merges: byte-level BPE, and for
SmolLM2 (`tokenizer.ggml.pre = "smollm"`) each digit its own piece before the byte-level split, as the model's own
tokenizer and llama.cpp's "smollm" pre-tokenizer do; the control tokens (token type 3) are special tokens, and the
file's chat template is the tokenizer's.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

# ggml's block layouts: (weights a block, bytes a block)
BLOCKS = {"Q8_0": (32, 34), "Q4_1": (32, 20)}
CONTROL_TOKEN = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
# The tensors of a LLaMA GGUF and their Hugging Face names ({layer} is the block's index).
LLAMA_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{layer}.attn_norm.weight": "model.layers.{layer}.input_layernorm.weight",
    "blk.{layer}.ffn_norm.weight": "model.layers.{layer}.post_attention_layernorm.weight",
    "blk.{layer}.attn_q.weight": "model.layers.{layer}.self_attn.q_proj.weight",
    "blk.{layer}.attn_k.weight": "model.layers.{layer}.self_attn.k_proj.weight",
    "blk.{layer}.attn_v.weight": "model.layers.{layer}.self_attn.v_proj.weight",
    "blk.{layer}.attn_output.weight": "model.layers.{layer}.self_attn.o_proj.weight",
    "blk.{layer}.ffn_gate.weight": "model.layers.{layer}.mlp.gate_proj.weight",
    "blk.{layer}.ffn_up.weight": "model.layers.{layer}.mlp.up_proj.weight",
    "blk.{layer}.ffn_down.weight": "model.layers.{layer}.mlp.down_proj.weight",
}


def dequantize(raw: np.ndarray, kind: str) -> np.ndarray:
    """A tensor's rows of raw GGUF bytes (uint8, [rows, bytes]) as float32 weights [rows, weights], by ggml's
    definition of `kind` (F32, F16, Q8_0 or Q4_1)."""
    if kind == "F32":
        return np.array(raw, dtype=np.float32)  # a copy: the file's memory map is read-only
    if kind == "F16":
        return raw.astype(np.float32)
    if kind not in BLOCKS:
        raise ValueError(f"GGUF tensors of type {kind} are not read by Forma (it reads F32, F16, {', '.join(BLOCKS)})")
    per_block, block_bytes = BLOCKS[kind]
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(-1, block_bytes)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    if kind == "Q8_0":
        values = d * blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    else:  # Q4_1: low nibbles are weights 0…15, high nibbles 16…31
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        packed = blocks[:, 4:]
        q = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float32)
        values = d * q + m
    return values.reshape(rows, -1)


def unpermute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """W_Q or W_K ([n_heads · d_head, d_model]) from llama.cpp's rotary-interleaved row order back to Hugging
    Face's (each head's first half of dimensions, then its second): the inverse of `convert_hf_to_gguf.py`'s
    permute."""
    d_half = weight.shape[0] // n_heads // 2
    return weight.reshape(n_heads, d_half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def sha256_of(path: Path, chunk: int = 2**22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class GGUFFile:
    """What a GGUF file holds: its metadata (key → value) and, per tensor, its type and raw rows."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, tuple[str, np.ndarray]]

    def field(self, key: str) -> Any:
        if key not in self.metadata:
            raise ValueError(f"{self.path}: the GGUF metadata has no {key!r}")
        return self.metadata[key]


def read_gguf(path: str | Path) -> GGUFFile:
    """The metadata and raw tensors of a GGUF file; a ValueError naming the file when it is not a whole one."""
    from gguf import GGUFReader

    path = Path(path)
    try:
        reader = GGUFReader(str(path))
        metadata = {key: field.contents() for key, field in reader.fields.items()}
        tensors = {t.name: (t.tensor_type.name, t.data) for t in reader.tensors}
    except (ValueError, IndexError, KeyError, OSError, AssertionError) as err:  # what a cut or altered file raises
        raise ValueError(f"{path} is not a whole GGUF file ({type(err).__name__}: {err})") from None
    return GGUFFile(path, metadata, tensors)


def llama_config(gguf: GGUFFile) -> dict[str, Any]:
    """The Hugging Face LlamaConfig fields a LLaMA GGUF's metadata gives."""
    arch = gguf.field("general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf.path}: a GGUF of architecture {arch!r}; Forma builds LLaMA ones")
    n_heads = int(gguf.field("llama.attention.head_count"))
    d_model = int(gguf.field("llama.embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(gguf.field("tokenizer.ggml.tokens")),
        "hidden_size": d_model,
        "intermediate_size": int(gguf.field("llama.feed_forward_length")),
        "num_hidden_layers": int(gguf.field("llama.block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(gguf.field("llama.attention.head_count_kv")),
        "head_dim": int(gguf.metadata.get("llama.rope.dimension_count", d_model // n_heads)),
        "max_position_embeddings": int(gguf.field("llama.context_length")),
        "rms_norm_eps": float(gguf.field("llama.attention.layer_norm_rms_epsilon")),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(gguf.field("llama.rope.freq_base"))},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "bos_token_id": int(gguf.field("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(gguf.field("tokenizer.ggml.eos_token_id")),
        "pad_token_id": gguf.metadata.get("tokenizer.ggml.padding_token_id"),
    }


def hf_name(name: str) -> str:
    """The Hugging Face name of a LLaMA GGUF tensor."""
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) > 2:
        pattern = "blk.{layer}." + ".".join(parts[2:])
        if pattern in LLAMA_NAMES:
            return LLAMA_NAMES[pattern].format(layer=int(parts[1]))
    elif name in LLAMA_NAMES:
        return LLAMA_NAMES[name]
    raise ValueError(f"a LLaMA GGUF holds no tensor named {name!r}")


def hf_tensors(gguf: GGUFFile, config: dict[str, Any], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of a LLaMA GGUF, dequantized, under its Hugging Face name and in its layout."""
    out = {}
    for name, (kind, raw) in gguf.tensors.items():
        weight = dequantize(raw, kind)
        if ".attn_q." in name:
            weight = unpermute(weight, config["num_attention_heads"])
        elif ".attn_k." in name:
            weight = unpermute(weight, config["num_key_value_heads"])
        out[hf_name(name)] = torch.from_numpy(np.ascontiguousarray(weight)).to(dtype)
    return out


def tokenizer_of(gguf: GGUFFile) -> Any:
    """The file's tokenizer as a transformers PreTrainedTokenizerFast (byte-level BPE from its vocabulary and
    merges; see the module's docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind = gguf.field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{gguf.path}: a {kind!r} tokenizer; Forma builds byte-level BPE (gpt2) ones")
    tokens = list(gguf.field("tokenizer.ggml.tokens"))
    types = list(gguf.metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(merge.split(" ", 1)) for merge in gguf.field("tokenizer.ggml.merges")]
    bpe = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    pre = gguf.metadata.get("tokenizer.ggml.pre")
    bpe.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if pre == "smollm"
        else byte_level
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3])

    def token(key: str) -> str | None:
        index = gguf.metadata.get(f"tokenizer.ggml.{key}")
        return None if index is None else tokens[int(index)]

    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        chat_template=gguf.metadata.get("tokenizer.chat_template"),
        add_bos_token=bool(gguf.metadata.get("tokenizer.ggml.add_bos_token", False)),
        clean_up_tokenization_spaces=False,
        model_max_length=int(gguf.field("llama.context_length")),
    )


def write_hf_folder(gguf_path: str | Path, out: str | Path, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Write a LLaMA GGUF as a Hugging Face folder `out` (config.json, model.safetensors, the tokenizer's files);
    returns the config written. `out` must exist and be empty of these files (the zoo builds into a fresh folder)."""
    from safetensors.torch import save_file

    out = Path(out)
    gguf = read_gguf(gguf_path)
    config = llama_config(gguf)
    tensors = hf_tensors(gguf, config, dtype)
    config["dtype"] = str(dtype).removeprefix("torch.")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer_of(gguf).save_pretrained(str(out))
    return config
