"""How a built model runs, beside what it is: its `RuntimeSettings`.

TransformerLens's analysis code reads some config names that describe a built model rather than an architecture:
where its weights are (`device`, `dtype`) and TransformerLens's run-time switches (`use_attn_result`,
`use_split_qkv_input`, `use_attn_in`, `use_hook_mlp_in`). A ModelConfig answers them from the RuntimeSettings of
the model that owns it: a config stays frozen, and a model owns its own copy of the config.
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
