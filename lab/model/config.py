"""ModelConfig: the architecture of a decoder-only transformer, as one small validated dataclass.

Every choice the model offers (positions, norm, MLP, block layout, tying, grouped key/value heads, which
linear maps carry biases, a sliding attention window) is
a field here; `lab.model.components` maps each value to a class, so `forward` never branches on the
config. The config round-trips through JSON and TOML and rejects unknown keys, so a typo in a
checkpoint or a zoo recipe is an error rather than a silently ignored setting.

It also answers the config names TransformerLens's analysis code reads (`normalization_type`, `act_fn`,
`eps`, `use_attn_result`, ...): from its fields, and from the `RuntimeSettings` of the model that owns it
(`lab.model.runtime`).
"""

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from lab.configs import Record, check_fields, need
from lab.model.runtime import RuntimeSettings
from lab.outside_files import MAX_JSON_BYTES, read_text


@dataclass(frozen=True)
class ModelConfig(Record):
    """Shape and variant of a decoder-only transformer (names follow TransformerLens)."""

    d_vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_ctx: int
    d_head: int = 0  # 0: d_model // n_heads
    d_mlp: int = 0  # 0: 4 · d_model
    n_kv_heads: int = 0  # 0: n_heads (plain multi-head attention); fewer: grouped key/value heads
    d_vocab_out: int = 0  # 0: d_vocab; the logits' width, W_U [d_model, d_vocab_out], when it differs from the input's
    # shortformer: learned positions added to each attention's query and key inputs only, not the residual stream
    positions: Literal["learned", "sinusoidal", "rotary", "shortformer", "none"] = "learned"
    rotary_dim: int = 0  # 0: d_head (rotate every dimension of each head)
    rotary_base: float = 10000.0
    norm: Literal["layernorm", "rmsnorm", "layernorm_pre", "rmsnorm_pre"] = "layernorm"  # *_pre: no gain or bias
    norm_eps: float = 1e-5
    mlp: Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu"] = "gelu"
    # parallel: x + attn(LN₁(x)) + mlp(LN₂(x)) (GPT-NeoX); attn_only: x + attn(LN₁(x)), no MLP
    block: Literal["pre_ln", "post_ln", "parallel", "attn_only"] = "pre_ln"
    tied_embeddings: bool = False
    bias: bool = True  # biases on Q, K, V, O and the MLP's linear maps
    qkv_bias: bool = False  # biases on Q, K and V only, in a model whose `bias` is false (Qwen2)
    sliding_window: int = 0  # 0: none; w: query i attends to keys i − w < j ≤ i only (Mistral)
    init_std: float = 0.02
    tokenizer: str = field(default="", compare=False)  # informational: what the ids mean

    def __post_init__(self) -> None:
        check_fields(self)  # every field its annotation's type: bias = "false" is an error, not True
        for name in ("d_vocab", "d_model", "n_layers", "n_heads", "n_ctx"):
            value = getattr(self, name)
            need(self, value > 0, f"{name} must be a positive integer, got {value!r}")
        for name in ("d_head", "d_mlp", "n_kv_heads", "d_vocab_out", "rotary_dim", "sliding_window"):
            value = getattr(self, name)
            need(self, value >= 0, f"{name} must be a non-negative integer (0 = default), got {value!r}")
        # Fill the derived defaults (frozen dataclass: write through object.__setattr__).
        if self.d_head == 0:
            need(
                self,
                self.d_model % self.n_heads == 0,
                f"d_model ({self.d_model}) is not divisible by n_heads ({self.n_heads}); set d_head",
            )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_mlp == 0:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        if self.n_kv_heads == 0:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.rotary_dim == 0:
            object.__setattr__(self, "rotary_dim", self.d_head)
        if self.d_vocab_out == 0:
            object.__setattr__(self, "d_vocab_out", self.d_vocab)
        need(
            self,
            not self.tied_embeddings or self.d_vocab_out == self.d_vocab,
            f"tied embeddings need d_vocab_out = d_vocab ({self.d_vocab}), got {self.d_vocab_out}",
        )
        need(
            self,
            self.n_heads % self.n_kv_heads == 0,
            f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})",
        )
        need(
            self,
            self.positions != "rotary" or (self.rotary_dim % 2 == 0 and self.rotary_dim <= self.d_head),
            f"rotary_dim must be even and at most d_head ({self.d_head}), got {self.rotary_dim}",
        )
        need(self, self.rotary_base > 0, f"rotary_base must be positive, got {self.rotary_base}")
        need(
            self,
            self.positions != "sinusoidal" or self.d_model % 2 == 0,
            f"sinusoidal positions need an even d_model, got {self.d_model}",
        )
        need(
            self,
            not (self.bias and self.qkv_bias),
            "qkv_bias adds Q, K and V biases to a model whose bias is false; with bias = true they are already there",
        )
        need(self, self.norm_eps > 0, f"norm_eps must be positive, got {self.norm_eps}")
        need(self, self.init_std > 0, f"init_std must be positive, got {self.init_std}")
        object.__setattr__(self, "_runtime", RuntimeSettings())  # not a field: what a model built from it switches

    # --- serialisation (to_dict, from_dict, to_json, from_json: lab.configs.Record) ------------
    def to_toml(self) -> str:
        lines = []
        for key, value in self.to_dict().items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, str):
                lines.append(f"{key} = {json.dumps(value)}")
            else:
                lines.append(f"{key} = {value!r}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_toml(cls, text: str) -> "ModelConfig":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"ModelConfig: malformed TOML ({err})") from err
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        text = read_text(path, what="model config", max_bytes=MAX_JSON_BYTES)
        return cls.from_toml(text) if path.suffix == ".toml" else cls.from_json(text)

    # --- what the model costs -----------------------------------------------------------------
    def n_params(self) -> int:
        """Exact parameter count of `HookedTransformer(self)` (buffers excluded)."""
        d = self.d_model
        block = self.attention_params() + (
            self.norm_params() if self.block == "attn_only" else self.mlp_params() + 2 * self.norm_params()
        )
        total = self.n_layers * block + self.d_vocab * d + self.d_vocab_out  # W_E, b_U
        total += 0 if self.tied_embeddings else d * self.d_vocab_out  # W_U
        total += self.norm_params() if self.block != "post_ln" else 0  # ln_final (a post-LN block ends in its own)
        total += self.n_ctx * d if self.positions in ("learned", "shortformer") else 0
        return total

    def n_buffer_elements(self) -> int:
        """Elements of the fixed tables `HookedTransformer(self)` keeps beside its parameters: the sinusoidal
        table, or each layer's rotary cos and sin."""
        if self.positions == "sinusoidal":
            return self.n_ctx * self.d_model
        return 2 * self.n_layers * self.n_ctx * self.rotary_dim if self.positions == "rotary" else 0

    def attention_params(self) -> int:
        """W_Q, W_K, W_V, W_O (and their biases) of one attention layer."""
        d, h, kv, dh = self.d_model, self.n_heads, self.n_kv_heads, self.d_head
        weights = d * h * dh + 2 * d * kv * dh + h * dh * d
        return weights + ((h * dh + 2 * kv * dh) if self.has_qkv_bias else 0) + (d if self.bias else 0)

    @property
    def has_qkv_bias(self) -> bool:
        """Whether Q, K and V carry biases: every bias (`bias`), or those three only (`qkv_bias`)."""
        return self.bias or self.qkv_bias

    def mlp_params(self) -> int:
        """W_in, W_out (W_gate for SwiGLU) and their biases of one MLP."""
        d, m = self.d_model, self.d_mlp
        return (3 if self.mlp == "swiglu" else 2) * d * m + ((m + d) if self.bias else 0)

    def norm_params(self) -> int:
        """The gain (and LayerNorm's bias) of one norm; none once weight processing has folded them."""
        return {"layernorm": 2 * self.d_model, "rmsnorm": self.d_model}.get(self.norm, 0)

    # --- TransformerLens's config names, answered from the fields ----------------------------
    @property
    def normalization_type(self) -> str | None:
        return {"layernorm": "LN", "rmsnorm": "RMS", "layernorm_pre": "LNPre", "rmsnorm_pre": "RMSPre"}[self.norm]

    @property
    def act_fn(self) -> str:
        return {"swiglu": "silu", "gelu_tanh": "gelu_new"}.get(self.mlp, self.mlp)

    @property
    def gated_mlp(self) -> bool:
        return self.mlp == "swiglu"

    @property
    def positional_embedding_type(self) -> str:
        return {
            "learned": "standard",
            "sinusoidal": "sinusoidal",
            "rotary": "rotary",
            "shortformer": "shortformer",
            "none": "none",
        }[self.positions]

    @property
    def parallel_attn_mlp(self) -> bool:
        return self.block == "parallel"

    @property
    def n_key_value_heads(self) -> int | None:
        return self.n_kv_heads if self.n_kv_heads != self.n_heads else None

    @property
    def attn_only(self) -> bool:
        return self.block == "attn_only"

    @property
    def final_rms(self) -> bool:
        return self.norm in ("rmsnorm", "rmsnorm_pre")

    @property
    def default_prepend_bos(self) -> bool:
        """Whether text gets a BOS first by default: the owning model's setting (False for a config on its own,
        and for Forma's own models; True for a Hugging Face model whose tokenizer has a BOS, as TransformerLens
        sets it). Assignable: `model.cfg.default_prepend_bos = False`."""
        return self._runtime.default_prepend_bos

    @property
    def uses_rms_norm(self) -> bool:
        return self.final_rms

    @property
    def eps(self) -> float:
        return self.norm_eps

    # --- what TransformerLens reads of a built model: its RuntimeSettings ----------------------
    @property
    def runtime(self) -> RuntimeSettings:
        """The run-time settings of the model that owns this config (a fresh default for a config on its own)."""
        return self._runtime

    @property
    def device(self) -> torch.device:
        """Where the owning model's weights are (its token embedding's device)."""
        return self._runtime.device

    @property
    def dtype(self) -> torch.dtype:
        return self._runtime.dtype

    @property
    def use_attn_result(self) -> bool:
        return self._runtime.use_attn_result

    @property
    def use_split_qkv_input(self) -> bool:
        return self._runtime.use_split_qkv_input

    @property
    def use_attn_in(self) -> bool:
        return self._runtime.use_attn_in

    @property
    def use_hook_mlp_in(self) -> bool:
        return self._runtime.use_hook_mlp_in

    @property
    def use_hook_tokens(self) -> bool:
        return self._runtime.use_hook_tokens

    @property
    def ungroup_grouped_query_attention(self) -> bool:
        return self._runtime.ungroup_grouped_query_attention


_frozen_setattr = ModelConfig.__setattr__


def _setattr(config: ModelConfig, name: str, value: Any) -> None:
    """A ModelConfig is frozen, except the run-time defaults TransformerLens lets a user assign through the config
    (`model.cfg.default_prepend_bos = False`), which are its model's RuntimeSettings."""
    if name in RuntimeSettings.ASSIGNABLE:
        config._runtime.assign(name, value)
    else:
        _frozen_setattr(config, name, value)


ModelConfig.__setattr__ = _setattr  # type: ignore[method-assign]  # after @dataclass, which writes its own
