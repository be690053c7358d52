"""Catch hallucinations while they are generated: per-token risk signals read through hooks on the KV-cached path.

Token t is drawn from the model's distribution p_t = softmax(z_t) at the position that produced it (at the first
step the prompt's last position, then the newest token's). For each generated token the monitor records

    max_prob           max_v p_t(v)
    entropy            H(p_t) = −Σ_v p_t(v) ln p_t(v)                                   nats
    margin             p_t(v₁) − p_t(v₂), the two most probable tokens
    lens_kl            KL(p_t ‖ q_t), q_t = softmax(LN_final(x_t^(m)) W_U + b_U) the logit lens (nostalgebraist 2020)
                       of the middle layer m: how far the prediction still moves after it (nats)
    subject_attention  (1 / (|L|·H)) Σ_{l ∈ L} Σ_h Σ_{s ∈ subject} A^{l,h}_{t,s}: attention mass on the subject's
                       prompt positions, averaged over the layers L read (the upper half by default) and the heads
                       (Yuksekgonul et al. 2023, arXiv 2309.15098, read low attention to the constraint tokens as
                       a sign of a factual error)
    probe              σ(x_t^(m)·w + b), a linear probe on the middle layer's residual stream (`LinearReadout`)

and once per prompt, at the first step, `p_ik` = σ(x_s^(l)·w + b) read at a chosen prompt position s and layer l
(P(IK), Kadavath et al. 2022, arXiv 2207.05221). Signals are of p_t itself (temperature 1), whatever the
temperature tokens are drawn at. A signal's value is not yet a risk: `RISK_SIGN` says which way each is expected
to point (risk = sign · value), and an experiment may check that sign on its calibration data.

Memory: between steps the monitor holds only the current step's activation of each hook it reads, [batch, d_model]
(never the whole cache), and one float per signal per generated token. The hooks only read: generation with the
monitor gives the tokens and logits of generation without it (tested), with the KV cache or without.

A model that is not a Forma HookedTransformer (a TransformerBridge) is decoded by recomputing the prefix at each
step, and only the signals of its output distribution (max_prob, entropy, margin) are available.

Sampling baselines (self-consistency, semantic entropy) need k generations by definition: `sample_continuations`
draws them in one batch; `lab.metrics.selective` scores them.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lab.model.decoding import check_max_new_tokens, check_sampling, decode, sample_next
from lab.model.kv_cache import KVCache
from lab.model.transformer import HookedTransformer

TOKEN_SIGNALS = ("max_prob", "entropy", "margin", "lens_kl", "subject_attention", "probe")
OUTPUT_SIGNALS = ("max_prob", "entropy", "margin")  # read from the logits alone: every model has them
PROMPT_SIGNALS = ("p_ik",)
SAMPLING_SIGNALS = ("self_consistency", "semantic_entropy")
SIGNALS = TOKEN_SIGNALS + PROMPT_SIGNALS + SAMPLING_SIGNALS
# risk = sign · value, as each signal is expected to point before any data: a confident output, a small margin's
# absence, attention on the subject (Yuksekgonul et al. 2023), P(IK) and agreement among samples mean safety;
# entropy, the probe's P(wrong) and semantic entropy mean risk. The lens KL has no agreed sign: DoLa (Chuang et al.
# 2023, arXiv 2309.03883) finds factual tokens change most in the late layers, which makes a large KL *safer*.
RISK_SIGN = {
    "max_prob": -1,
    "entropy": 1,
    "margin": -1,
    "lens_kl": -1,
    "subject_attention": -1,
    "probe": 1,
    "p_ik": -1,
    "self_consistency": -1,
    "semantic_entropy": 1,
}


@dataclass(frozen=True)
class LinearReadout:
    """σ(x·w + b) of one hook's activation x [d]: at the newest position of every step (position None — a token
    signal), or at a fixed prompt position at the first step (a prompt signal)."""

    hook: str
    weight: Float[Tensor, " d"]
    bias: float
    position: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.weight, Tensor) or self.weight.ndim != 1:
            raise ValueError(
                f"LinearReadout on {self.hook}: weight must be a 1-D tensor [d_model], got "
                f"{getattr(self.weight, 'shape', type(self.weight).__name__)}"
            )
        if self.position is not None and not isinstance(self.position, int):
            raise ValueError(f"LinearReadout on {self.hook}: position must be an int or None, got {self.position!r}")

    @classmethod
    def from_probe(cls, result: Any, hook: str, position: int | None = None) -> "LinearReadout":
        """A logistic probe of `lab.analysis.probes.probe.fit_probe`, read as P(its second class)."""
        return cls(hook, result.weight.float(), float(result.bias), position)

    def __call__(self, x: Float[Tensor, "batch d"]) -> Float[Tensor, " batch"]:
        if x.shape[-1] != self.weight.shape[0]:
            raise ValueError(
                f"LinearReadout on {self.hook}: the activation has {x.shape[-1]} features, the weight "
                f"{self.weight.shape[0]}"
            )
        return torch.sigmoid(x.float() @ self.weight.to(x.device) + self.bias)


@dataclass
class MonitoredGeneration:
    """The prompt and its continuation, each signal per generated token [batch, new], and the prompt signals."""

    tokens: Int[Tensor, "batch pos"]
    prompt_length: int
    signals: dict[str, Float[Tensor, "batch new"]]
    prompt_signals: dict[str, Float[Tensor, " batch"]]

    @property
    def new_tokens(self) -> Int[Tensor, "batch new"]:
        return self.tokens[:, self.prompt_length :]


def output_signals(logits: Float[Tensor, "batch d_vocab"]) -> dict[str, Float[Tensor, " batch"]]:
    """max_prob, entropy (nats) and top-2 margin of softmax(logits), in float32."""
    return _output_signals(logits.float().log_softmax(dim=-1))[0]


def _output_signals(log_p: Tensor) -> tuple[dict[str, Tensor], Tensor]:
    if log_p.shape[-1] < 2:
        raise ValueError("a top-2 margin needs a vocabulary of at least 2 tokens")
    p = log_p.exp()
    top = p.topk(2, dim=-1).values
    return {"max_prob": top[:, 0], "entropy": -(p * log_p).sum(-1), "margin": top[:, 0] - top[:, 1]}, p


class Monitor:
    """Reads TOKEN_SIGNALS and PROMPT_SIGNALS while `model` generates (see the module docstring).

    middle_layer: the block whose hook_resid_post the lens and, by default, the probe read (default n_layers // 2 − 1,
    the residual stream after half the blocks); probe: a token LinearReadout; p_ik: a prompt LinearReadout;
    lens / attention: whether to compute lens_kl and subject_attention; attention_layers: the blocks whose
    attention subject_attention reads (default the upper half).
    """

    def __init__(
        self,
        model: Any,
        *,
        middle_layer: int | None = None,
        probe: LinearReadout | None = None,
        p_ik: LinearReadout | None = None,
        lens: bool = True,
        attention: bool = True,
        attention_layers: Sequence[int] | None = None,
    ) -> None:
        self.model = model
        self.hooked = isinstance(model, HookedTransformer)
        n_layers = model.cfg.n_layers
        self.middle_layer = max(0, n_layers // 2 - 1) if middle_layer is None else middle_layer
        if not (isinstance(self.middle_layer, int) and 0 <= self.middle_layer < n_layers):
            raise ValueError(f"middle_layer must be a block index in [0, {n_layers}), got {middle_layer!r}")
        # The upper half by default: where attention moves the attribute out of the subject (Geva et al. 2023,
        # arXiv 2304.14767).
        self.attention_layers = tuple(range(n_layers // 2, n_layers) if attention_layers is None else attention_layers)
        if not self.attention_layers or not all(
            isinstance(l, int) and 0 <= l < n_layers for l in self.attention_layers
        ):
            raise ValueError(f"attention_layers must be block indices in [0, {n_layers}), got {attention_layers!r}")
        self.middle_hook = f"blocks.{self.middle_layer}.hook_resid_post"
        self.probe, self.p_ik = probe, p_ik
        self.lens, self.attention = lens and self.hooked, attention and self.hooked
        why = (
            "this model is not a Forma HookedTransformer: only its output distribution is read"
            if not self.hooked
            else None
        )
        if why and (probe is not None or p_ik is not None):
            raise ValueError(f"probe and p_ik readouts need hooks on the residual stream: {why}")
        for readout, kind in ((probe, "probe"), (p_ik, "p_ik")):
            if readout is not None:
                model.check_hook_names([readout.hook])
                if (readout.position is None) != (kind == "probe"):
                    raise ValueError(
                        f"the {kind} readout must have position "
                        f"{'None (every step)' if kind == 'probe' else 'set (a prompt position)'}"
                    )
        self.unavailable = {name: why for name in ("lens_kl", "subject_attention") if why}
        if not lens:
            self.unavailable["lens_kl"] = "not asked for (lens=False)"
        if not attention:
            self.unavailable["subject_attention"] = "not asked for (attention=False)"
        if probe is None:
            self.unavailable["probe"] = why or "no probe readout given"
        if p_ik is None:
            self.unavailable["p_ik"] = why or "no P(IK) readout given"
        self._reset(None)

    @property
    def token_signals(self) -> tuple[str, ...]:
        return tuple(name for name in TOKEN_SIGNALS if name not in self.unavailable)

    def _reset(self, subject: Tensor | None, cache: KVCache | None = None) -> None:
        self._subject, self._cache = subject, cache
        self._step = 0
        self._latest: dict[str, Tensor] = {}  # hook → this step's activation at the newest position [batch, d]
        self._query: dict[int, Tensor] = {}  # layer → this step's newest query [batch, 1, head, d_head]
        self._keys: dict[int, Tensor] = {}  # layer → this step's keys, only when decoding without a cache
        # the subject's indicator over every position the context can hold, [batch, n_ctx]
        self._indicator = None if subject is None else F.pad(subject, (0, self.model.cfg.n_ctx - subject.shape[1]))
        self._series: dict[str, list[Tensor]] = {name: [] for name in self.token_signals}
        self._prompt: dict[str, Tensor] = {}

    def held(self) -> dict[str, tuple[int, ...]]:
        """The shapes of what the monitor keeps between steps besides its per-token floats (bounded memory): the
        newest position's activation of each residual hook it reads; queries and keys live only within a step."""
        return {name: tuple(t.shape) for name, t in {**self._latest, **self._query, **self._keys}.items()}

    # --- the hooks ---------------------------------------------------------------------------------------------
    def _keep_latest(self, activation: Tensor, hook: Any) -> None:
        self._latest[hook.name] = activation[:, -1]

    def _read_prompt(self, activation: Tensor, hook: Any) -> None:
        if self._step == 0:
            self._prompt["p_ik"] = self.p_ik(activation[:, self.p_ik.position])

    def _keep_query(self, q: Tensor, hook: Any) -> None:
        self._query[_layer(hook.name)] = q[:, -1:]

    def _keep_keys(self, k: Tensor, hook: Any) -> None:  # without a cache: this step's keys are all the keys
        self._keys[_layer(hook.name)] = k

    def _subject_attention(self) -> Tensor:
        """The newest query's mass on the subject at every layer read, Σ_{s ∈ subject} A_s = softmax(q Kᵀ/√d_head) ·
        1_subject: attention whose values are the subject's indicator, so one fused call computes it for all those
        layers at once, once the step's keys are in the cache (and the model's own attention keeps its fused path)."""
        layers = self.attention_layers
        keys = [self._cache.entries[l].keys if self._cache is not None else self._keys.pop(l) for l in layers]
        q = torch.stack([self._query.pop(l) for l in layers]).flatten(0, 1).transpose(1, 2)  # [layer·batch, head, 1, d]
        k = torch.stack(keys).flatten(0, 1).transpose(1, 2)  # [layer·batch, kv_head, pos, d_head]
        indicator = self._indicator[:, None, : k.shape[2], None].repeat(len(layers), k.shape[1], 1, 1)
        mass = F.scaled_dot_product_attention(q, k, indicator.to(q.dtype), enable_gqa=k.shape[1] != q.shape[1])
        return mass[:, :, 0, 0].float().unflatten(0, (len(layers), -1)).mean(dim=(0, 2))  # [batch]

    def _on_logits(self, logits: Tensor, hook: Any) -> None:
        log_p = logits[:, -1].float().log_softmax(-1)
        signals, p = _output_signals(log_p)
        if self.lens:
            middle = self._latest[self.middle_hook][:, None]
            lens = self.model.ln_final(middle) @ self.model.W_U + self.model.b_U  # not through the hooked unembed
            log_q = lens[:, 0].float().log_softmax(-1)
            signals["lens_kl"] = (p * (log_p - log_q)).sum(-1)
        if self.attention:
            signals["subject_attention"] = self._subject_attention()
        if self.probe is not None:
            signals["probe"] = self.probe(self._latest[self.probe.hook])
        for name in self.token_signals:
            self._series[name].append(signals[name])
        self._step += 1

    def fwd_hooks(self) -> list[tuple[str, Any]]:
        reads = {
            hook
            for hook, wanted in (
                (self.middle_hook, self.lens),
                (self.probe.hook if self.probe else None, self.probe is not None),
            )
            if wanted
        }
        hooks = [(name, self._keep_latest) for name in sorted(reads)]
        if self.p_ik is not None:
            hooks.append((self.p_ik.hook, self._read_prompt))
        if self.attention:
            for layer in self.attention_layers:
                rotated = f"blocks.{layer}.attn.hook_rot_q" in self.model.hook_dict  # rotary: the rotated q and k
                q, k = (f"blocks.{layer}.attn.hook_{'rot_' if rotated else ''}{x}" for x in "qk")
                hooks.append((q, self._keep_query))
                if self._cache is None:
                    hooks.append((k, self._keep_keys))
        return hooks + [("unembed.hook_out", self._on_logits)]

    # --- generating --------------------------------------------------------------------------------------------
    def generate(
        self,
        tokens: Int[Tensor, "batch pos"],
        max_new_tokens: int,
        *,
        subject: Any = None,
        temperature: float = 0.0,
        seed: int | None = None,
        eos_token_id: int | None = None,
        use_kv_cache: bool = True,
    ) -> MonitoredGeneration:
        """Generate (greedy by default) with every available signal read on the way. `subject`: a bool mask
        [batch, prompt_len] (or a list of prompt positions, for every row) of the subject's tokens — needed for
        subject_attention."""
        tokens = self.model.check_tokens(tokens) if self.hooked else tokens
        mask = _subject_mask(subject, tokens) if self.attention else None
        if self.attention and mask is None:
            raise ValueError(
                "subject_attention needs the subject's prompt positions: pass subject=, or build the "
                "Monitor with attention=False"
            )
        cache = KVCache.empty(self.model.cfg.n_layers) if self.hooked and use_kv_cache else None
        self._reset(mask, cache)
        try:
            if self.hooked:
                with self.model.hooks(fwd_hooks=self.fwd_hooks()):
                    out = decode(
                        self.model,
                        tokens,
                        max_new_tokens,
                        temperature,
                        seed=seed,
                        use_kv_cache=use_kv_cache,
                        eos_token_id=eos_token_id,
                        kv_cache=cache,
                        keep_logits=False,
                    ).tokens
            else:
                out = _recompute_decode(
                    self.model, tokens, max_new_tokens, temperature, seed, eos_token_id, self._series
                )
            new = out.shape[1] - tokens.shape[1]
            signals = {
                name: (torch.stack(series[:new], dim=1) if new else out.new_zeros(out.shape[0], 0).float())
                for name, series in self._series.items()
            }
            return MonitoredGeneration(out, tokens.shape[1], signals, dict(self._prompt))
        finally:
            self._reset(None)


def _layer(hook_name: str) -> int:
    return int(hook_name.split(".")[1])


def _subject_mask(subject: Any, tokens: Tensor) -> Bool[Tensor, "batch pos"] | None:
    if subject is None:
        return None
    batch, length = tokens.shape
    if isinstance(subject, Tensor) and subject.dtype == torch.bool:
        if tuple(subject.shape) != (batch, length):
            raise ValueError(f"subject mask must have the prompt's shape {(batch, length)}, got {tuple(subject.shape)}")
        return subject.to(tokens.device).float()
    positions = list(subject)
    if not positions or not all(isinstance(p, int) and -length <= p < length for p in positions):
        raise ValueError(f"subject must be a bool mask or prompt positions in [0, {length}), got {subject!r}")
    mask = torch.zeros(batch, length, device=tokens.device)
    mask[:, positions] = 1.0
    return mask


@torch.inference_mode()
def _recompute_decode(
    model: Any,
    tokens: Tensor,
    max_new_tokens: int,
    temperature: float,
    seed: int | None,
    eos_token_id: int | None,
    series: dict[str, list[Tensor]] | None,
) -> Tensor:
    """Decoding without a KV cache for a model that has none of Forma's (each step reads the whole prefix)."""
    check_sampling(temperature, seed=seed)
    n_ctx = getattr(model.cfg, "n_ctx", None)
    if n_ctx is not None:
        check_max_new_tokens(max_new_tokens, tokens.shape[1], n_ctx)
    generator = None if seed is None else torch.Generator(device=tokens.device).manual_seed(seed)
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    for _ in range(max_new_tokens):
        logits = model(tokens)[:, -1]
        if series is not None:
            for name, value in output_signals(logits).items():
                series[name].append(value)
        nxt = sample_next(logits, temperature, generator=generator)
        if eos_token_id is not None:
            nxt = torch.where(done, eos_token_id, nxt)
            done |= nxt == eos_token_id
        tokens = torch.cat((tokens, nxt[:, None]), dim=1)
        if eos_token_id is not None and bool(done.all()):
            break
    return tokens


def sample_continuations(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    k: int,
    max_new_tokens: int,
    seed: int,
    eos_token_id: int | None = None,
) -> Int[Tensor, "batch k new"]:
    """k continuations per prompt at temperature 1 from the full softmax, in one batch of batch·k rows."""
    if not (isinstance(k, int) and k >= 1):
        raise ValueError(f"k must be an integer ≥ 1, got {k!r}")
    rows = tokens.repeat_interleave(k, dim=0)
    if isinstance(model, HookedTransformer):
        out = decode(model, rows, max_new_tokens, 1.0, seed=seed, eos_token_id=eos_token_id, keep_logits=False).tokens
    else:
        out = _recompute_decode(model, rows, max_new_tokens, 1.0, seed, eos_token_id, None)
    return out[:, tokens.shape[1] :].reshape(tokens.shape[0], k, -1)


def answer_lengths(new_tokens: Int[Tensor, "batch new"], stop_ids: Collection[int]) -> Int[Tensor, " batch"]:
    """How many generated tokens make the answer: those before the first stop token, and at least the first (the
    token that decided the answer is empty is still the claim's only token)."""
    if new_tokens.shape[1] == 0:
        raise ValueError("no generated tokens: an answer needs at least one")
    stops = torch.isin(new_tokens, torch.tensor(sorted(stop_ids), dtype=new_tokens.dtype, device=new_tokens.device))
    first = torch.where(
        stops.any(1), stops.float().argmax(1), torch.full_like(stops[:, 0], new_tokens.shape[1], dtype=torch.long)
    )
    return first.clamp_min(1)


def claim_risk(
    series: Float[Tensor, "batch new"], lengths: Int[Tensor, " batch"], sign: int
) -> Float[Tensor, " batch"]:
    """max over the answer's tokens of sign · signal: a claim is as risky as its riskiest token, so abstaining when
    the claim's risk exceeds λ is abstaining at the first token whose risk exceeds λ (`abstain_at`)."""
    if sign not in (-1, 1):
        raise ValueError(f"sign must be −1 or +1, got {sign!r}")
    inside = torch.arange(series.shape[1], device=series.device)[None, :] < lengths[:, None]
    return (sign * series.double()).masked_fill(~inside, -torch.inf).amax(dim=1)


def abstain_at(token_risk: Sequence[float], length: int, threshold: float) -> int | None:
    """The index of the first answer token whose risk exceeds `threshold` — where a monitored generation stops —
    or None when the whole answer stays at or below it (the answer is given)."""
    for index, risk in enumerate(list(token_risk)[: max(1, length)]):
        if risk > threshold:
            return index
    return None
