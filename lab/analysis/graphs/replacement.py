"""The local replacement model of one prompt (Ameisen et al. 2025, "Circuit Tracing", §2): the model with every MLP
replaced by its transcoder plus an error term that makes up the difference on this prompt, and with the attention
patterns and the norms' denominators frozen at their values on the prompt. Frozen so, the map from the sources —
token embeddings, active features' outputs a_s·W_dec, error vectors — to any node's input (a feature's
pre-activation, a logit) is linear, and one backward pass gives a node's every incoming edge:

    edge(s → t) = ⟨∂ input_t / ∂ out_s , out_s⟩        (the source's output vector, contracted with the gradient)

so that input_t = Σ_s edge(s → t) + bias_t, the bias being the input with every source set to zero (the biases of
the attention, the norms, the decoders, learned positions).

`LocalReplacement(model, transcoders, tokens)` runs the prompt once and keeps what the freezing needs; `rows(targets)`
computes edges for any vectors read at any hook (feature encoders at the MLP input, demeaned unembeddings at the
logits, a query or key direction at an attention head), in chunks of positions: targets are sorted by position and
a chunk of up to `batch_size` targets whose last position is P needs the prompt's first P + 1 tokens only (causal
attention: nothing later can reach them); a forward pass over a prefix serves every chunk whose own prefix is at
least half of it, and each chunk takes one backward pass per target, batched (`is_grads_batched`). Memory is one
prefix's forward plus the chunk's batch × prefix of gradients.

A node budget (`max_features`, circuit-tracer's `max_feature_nodes`) keeps the active features with the largest
activation × decoder norm (the size of what each writes); the others' outputs a·W_dec are folded into the error
nodes of the layers they write, so that every node's input is still the sum of its incoming edges plus its bias and
the graph, n_nodes² large, stays bounded at any prompt length.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lab.analysis.transcoders.model import TranscoderConfig, Transcoders

FEATURE_BLOCK = 256  # source features contracted at once: memory rows × FEATURE_BLOCK × d_model


@dataclass(frozen=True)
class Target:
    """A vector `vector` read at hook `hook`, position `pos`: `vector` has the hook's per-position shape ([d_model],
    [d_vocab], [heads, d_head]); the node's input is ⟨vector, activation[pos]⟩."""

    hook: str
    pos: int
    vector: Tensor


def keep_largest(acts: Tensor, decoder_norms: Tensor, budget: int | None) -> Tensor:
    """acts [L, pos, f] with all but the `budget` features of largest |activation| × ‖decoder‖ ([L, f]) set to zero
    (ties to the earlier feature in (layer, pos, feature) order); budget None keeps every one."""
    active = acts.nonzero()
    if budget is None or len(active) <= budget:
        return acts
    values = acts[tuple(active.T)]
    score = values.abs() * decoder_norms[active[:, 0], active[:, 2]].to(values.dtype)
    kept = active[torch.sort(score, descending=True, stable=True).indices[:budget]]
    out = torch.zeros_like(acts)
    out[tuple(kept.T)] = acts[tuple(kept.T)]
    return out


def _check_replacement(cfg: Any, tc: TranscoderConfig, tokens: Tensor, max_features: int | None) -> Tensor:
    """The prompt as one row of token ids, once the model (its config `cfg`), the transcoders (`tc`), the prompt and
    the feature budget are found fit for a local replacement; else a ValueError saying what does not fit."""
    if getattr(cfg, "block", "pre_ln") == "post_ln":
        raise ValueError(
            "attribution graphs need the MLP's input normalised on its own branch (pre-LN or parallel "
            "blocks); a post-LN block normalises after the MLP"
        )
    if tc.layers is not None:
        raise ValueError(
            f"transcoders of layers {', '.join(map(str, tc.layers))} alone: an attribution graph needs one for "
            "every layer (train them with --layers all)"
        )
    if (tc.n_layers, tc.d_model) != (cfg.n_layers, cfg.d_model):
        raise ValueError(
            f"transcoders for {tc.n_layers} layers of width {tc.d_model} do not fit a model of "
            f"{cfg.n_layers} layers of width {cfg.d_model}"
        )
    if max_features is not None and (type(max_features) is not int or max_features < 0):
        raise ValueError(f"max_features is a whole number of feature nodes ≥ 0, got {max_features!r}")
    tokens = torch.as_tensor(tokens).reshape(-1)
    if tokens.numel() < 1:
        raise ValueError("attribution needs a prompt of at least one token")
    return tokens


class LocalReplacement:
    """The prompt's clean run, its transcoder features and error vectors, and the edges into any target."""

    def __init__(
        self,
        model: Any,
        transcoders: Transcoders,
        tokens: Tensor,
        batch_size: int = 128,
        max_features: int | None = None,
    ):
        cfg, tc = model.cfg, transcoders.cfg
        tokens = _check_replacement(cfg, tc, tokens, max_features)
        self.model, self.transcoders, self.tokens, self.batch_size = model, transcoders, tokens, batch_size
        self.n_layers, self.n_pos = cfg.n_layers, tokens.numel()
        L = self.n_layers
        self.frozen = [f"blocks.{layer}.attn.hook_pattern" for layer in range(L)]
        self.frozen += [f"blocks.{layer}.{norm}.hook_scale" for layer in range(L) for norm in ("ln1", "ln2")]
        self.frozen += ["ln_final.hook_scale"]
        self.frozen = [name for name in self.frozen if name in model.hook_dict]  # a norm-free stack has no scale
        names = [
            *self.frozen,
            "hook_embed",
            *[tc.hook("input", layer) for layer in range(L)],
            *[tc.hook("output", layer) for layer in range(L)],
        ]
        with torch.no_grad():
            self.logits, cache = model.run_with_cache(tokens[None], names_filter=names)
            self.cache = {name: cache[name].detach() for name in self.frozen}
            self.embed = cache["hook_embed"][0].detach()  # [pos, d_model]
            inputs = torch.stack([cache[tc.hook("input", layer)][0] for layer in range(L)], dim=1)  # [pos, L, d]
            outputs = torch.stack([cache[tc.hook("output", layer)][0] for layer in range(L)])  # [L, pos, d]
            self.pre = transcoders.encode(inputs.float()).transpose(0, 1)  # [L, pos, f]
            acts = transcoders.activate(self.pre.transpose(0, 1)).transpose(0, 1)
            self.n_active = int((acts != 0).sum())  # before the budget
            acts = keep_largest(acts, transcoders.decoder_norms().detach(), max_features)
            self.features = acts.nonzero()  # [m, 3]: (layer, pos, feature), sorted
            self.activations = acts[tuple(self.features.T)]
            recon = transcoders.decode(acts.transpose(0, 1)).transpose(0, 1)  # [L, pos, d]: kept features only
            self.errors = (outputs.float() - recon).to(outputs.dtype)  # [L, pos, d]
            self.outputs = outputs.detach()  # [L, pos, d]: each MLP's output on the prompt
        self.n_features = len(self.features)
        self.n_sources = self.n_features + L * self.n_pos + self.n_pos

    # --- the frozen forward pass ----------------------------------------------------------------------------------
    def _hooks(self, length: int, leaves: dict[str, Tensor] | None) -> list[tuple[str, Any]]:
        """Hooks for a forward pass over the first `length` tokens: frozen patterns and scales; each MLP
        output and the token embeddings become leaves whose gradients the edges read (leaves=None: every source set
        to zero, each MLP output its decoder bias alone, for the bias run)."""
        tc = self.transcoders.cfg
        output_layer = {tc.hook("output", layer): layer for layer in range(self.n_layers)}

        def freeze(value: Tensor, hook: Any) -> Tensor:
            frozen = self.cache[hook.name]
            frozen = frozen[:, :, :length, :length] if frozen.ndim == 4 else frozen[:, :length]
            return frozen.to(value.dtype)

        def source(value: Tensor, hook: Any) -> Tensor:
            if leaves is None:
                if hook.name == "hook_embed":
                    return torch.zeros_like(value)
                bias = self.transcoders.b_dec[output_layer[hook.name]].detach()
                return bias.to(value.dtype).expand_as(value).contiguous()
            # The clean run's value, whatever this pass computed upstream: every source is held at the prompt's.
            clean = self.embed if hook.name == "hook_embed" else self.outputs[output_layer[hook.name]]
            leaf = clean[:length].to(value.dtype).expand_as(value).clone().requires_grad_(True)
            leaves[hook.name] = leaf
            return leaf

        hooks = [(name, freeze) for name in self.frozen]
        hooks += [("hook_embed", source)] + [(name, source) for name in output_layer]
        return hooks

    def run(
        self, length: int, reads: Sequence[str], leaves: dict[str, Tensor] | None, edits: Sequence[tuple[str, Any]] = ()
    ) -> dict[str, Tensor]:
        """The frozen model over the first `length` tokens: the activations at `reads`. `edits` are
        further hooks, run after the freezing ones (an ablation of one source with every other held fixed)."""
        tokens = self.tokens[None, :length]
        seen: dict[str, Tensor] = {}

        def keep(value: Tensor, hook: Any) -> None:
            seen[hook.name] = value

        hooks = self._hooks(length, leaves) + list(edits) + [(name, keep) for name in dict.fromkeys(reads)]
        with self.model.hooks(fwd_hooks=hooks):
            self.model(tokens)
        return seen

    # --- edges --------------------------------------------------------------------------------------------------
    def rows(self, targets: Sequence[Target]) -> Tensor:
        """[len(targets), n_sources] edges: columns are the active features (in `features` order), the error nodes
        (layer-major: layer · n_pos + pos) and the token embeddings (by position).

        Targets sorted by position are cut into chunks of `batch_size`; chunks whose prefix reaches at least half
        the longest pending one's share its forward pass, kept for their backward passes: at most ⌈log₂ n⌉ + 1
        forward passes for a prompt of n tokens, and no backward pass over more than twice its chunk's prefix."""
        out = torch.zeros(len(targets), self.n_sources)
        order = sorted(range(len(targets)), key=lambda i: targets[i].pos)
        chunks = [[targets[i] for i in order[s : s + self.batch_size]] for s in range(0, len(order), self.batch_size)]
        ends = [chunk[-1].pos + 1 for chunk in chunks]  # each chunk's prefix: its last target's position + 1
        end = len(chunks)
        while end:
            length, start = ends[end - 1], end - 1
            while start and 2 * ends[start - 1] >= length:
                start -= 1
            leaves: dict[str, Tensor] = {}
            with torch.enable_grad():
                seen = self.run(length, [t.hook for chunk in chunks[start:end] for t in chunk], leaves)
                for c in range(start, end):
                    out[order[c * self.batch_size : c * self.batch_size + len(chunks[c])]] = self._chunk(
                        chunks[c], seen, leaves, length
                    )
            end = start
        return out

    def _chunk(self, targets: Sequence[Target], seen: dict[str, Tensor], leaves: dict[str, Tensor], length: int):
        """One backward pass per target of the chunk, batched (vmap over the injected gradients), through the
        forward pass `seen` over the first `length` tokens (kept for the next chunk that shares it)."""
        rows = len(targets)
        names = list(dict.fromkeys(t.hook for t in targets))
        grads_out = {name: torch.zeros(rows, *seen[name].shape, dtype=seen[name].dtype) for name in names}
        for row, t in enumerate(targets):
            grads_out[t.hook][row, 0, t.pos] += t.vector.to(grads_out[t.hook].dtype)
        inputs = list(leaves)
        grads = torch.autograd.grad(
            [seen[n] for n in names],
            [leaves[n] for n in inputs],
            [grads_out[n] for n in names],
            allow_unused=True,
            retain_graph=True,
            is_grads_batched=True,
        )
        grad = {
            name: (torch.zeros(rows, *leaves[name].shape) if g is None else g)[:, 0].float()
            for name, g in zip(inputs, grads)
        }
        return self._contract(grad, rows, length)

    def _contract(self, grad: dict[str, Tensor], rows: int, length: int) -> Tensor:
        """Each source's edge: its output vector contracted with the gradient at its position."""
        tc, L, n = self.transcoders.cfg, self.n_layers, self.n_pos
        out = torch.zeros(rows, self.n_sources)
        layers, positions, index = self.features.T
        with torch.no_grad():
            for layer in range(L):
                mine = torch.nonzero((layers == layer) & (positions < length)).flatten()
                targets = range(layer, L) if tc.cross_layer else (layer,)
                for target in targets:
                    g = grad[tc.hook("output", target)]  # [rows, length, d]
                    for block in mine.split(FEATURE_BLOCK):  # [rows, block, d] at a time
                        vectors = self.transcoders.decoder(layer, index[block], target).float()
                        out[:, block] += (g[:, positions[block]] * vectors).sum(-1) * self.activations[block]
                error = self.errors[layer, :length].float()
                columns = self.n_features + layer * n + torch.arange(length)
                out[:, columns] = torch.einsum("rpd,pd->rp", grad[tc.hook("output", layer)], error)
            columns = self.n_features + L * n + torch.arange(length)
            out[:, columns] = torch.einsum("rpd,pd->rp", grad["hook_embed"], self.embed[:length].float())
        return out

    # --- node inputs and biases -----------------------------------------------------------------------------------
    @torch.no_grad()
    def values(self, targets: Sequence[Target], sources: bool = True, edits: Sequence[tuple[str, Any]] = ()) -> Tensor:
        """Each target's input ⟨vector, activation[pos]⟩ in the frozen model over the whole prompt: with the sources
        as they are (= the clean run's), or with every source zero (sources=False: the targets' biases)."""
        seen = self.run(self.n_pos, [t.hook for t in targets], {} if sources else None, edits)
        return torch.stack([(seen[t.hook][0, t.pos].float() * t.vector.float()).sum() for t in targets])
