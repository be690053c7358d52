"""What TransformerLens reads of a ModelConfig: its config names, and the run-time settings of the model that owns it.

TransformerLens's analysis code (its ActivationCache, patching and attribution functions) reads a model's config by
TransformerLens's own names (`normalization_type`, `act_fn`, `n_key_value_heads`, `eps`, ...). `TransformerLensNames`
answers them from ModelConfig's fields. Those that describe a built model rather than an architecture (where its
weights are, `device` and `dtype`, and TransformerLens's run-time switches `use_attn_result`, `use_split_qkv_input`,
`use_attn_in`, `use_hook_mlp_in`) are read from the model's `RuntimeSettings`: a config stays frozen, and a model
owns its own copy of the config.
"""

from dataclasses import dataclass

import torch


@dataclass(eq=False)
class RuntimeSettings:
    """How a built model runs, beside what it is: TransformerLens's switches and Forma's explicit paths.

    One object per model, shared by its config copy (`model.cfg.use_attn_result`, ... read it) and its
    components (which read it in `forward`). It changes only through the model's setters
    (`set_use_attn_result`, `set_use_split_qkv_input`, `set_use_attn_in`, `set_use_hook_mlp_in`,
    `set_ungroup_grouped_query_attention`, `set_explicit_paths`), because a switch also adds or removes the hook
    points it makes real. None of it is saved: a checkpoint holds the architecture and the weights.
    """

    use_attn_result: bool = False  # attn.hook_result [batch, pos, head, d_model] on every forward, cached by default
    use_split_qkv_input: bool = False  # attn.hook_q_input / hook_k_input / hook_v_input: one residual copy per head
    use_attn_in: bool = False  # attn.hook_attn_in: one residual copy per head, shared by q, k and v
    use_hook_mlp_in: bool = False  # blocks.{l}.hook_mlp_in: the MLP branch's input
    use_hook_tokens: bool = False  # hook_tokens [batch, pos]: the token ids, before the embedding
    ungroup_grouped_query_attention: bool = False  # hook_k, hook_v and their inputs: a K/V head per query head
    explicit_paths: bool = False  # explicit attention and norms on every forward, hooked or not
    default_prepend_bos: bool = False  # text gets the tokenizer's BOS first unless prepend_bos says otherwise
    weights: tuple = ()  # (the model's Embed,) once a model owns this: where `device` and `dtype` are read

    # What a user may assign through the config, as in TransformerLens (no hook point depends on it).
    ASSIGNABLE = ("default_prepend_bos",)

    def assign(self, name: str, value: object) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
        setattr(self, name, value)

    @property
    def device(self) -> torch.device:
        return self._embedding("device").device

    @property
    def dtype(self) -> torch.dtype:
        return self._embedding("dtype").dtype

    def _embedding(self, what: str) -> torch.Tensor:
        if not self.weights:
            raise AttributeError(
                f"a ModelConfig on its own has no {what}: it describes an architecture; a model's "
                f"weights have one (model.cfg.{what})"
            )
        return self.weights[0].W_E


class TransformerLensNames:
    """TransformerLens's config names, answered from a ModelConfig's fields and its model's RuntimeSettings."""

    _runtime: RuntimeSettings
    norm: str
    mlp: str
    positions: str
    block: str
    n_heads: int
    n_kv_heads: int
    norm_eps: float
    d_vocab: int

    # --- the names TransformerLens's ActivationCache reads --------------------------------------
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
