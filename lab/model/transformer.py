"""HookedTransformer: the decoder-only transformer, top to bottom, with a HookPoint at every activation.

    x⁰ = W_E[tokens] (+ W_pos[positions])                          embed, positions
    xˡ⁺¹ = block_l(xˡ)                                              l = 0 … n_layers − 1
    logits = LN_final(x^L) W_U + b_U                                unembed
    P_θ(x_{t+1} | x_≤t) = softmax(logits_t)

It subclasses TransformerLens's HookedRootModule, so `run_with_hooks`, `hooks()` and
`run_with_cache` (returning a `transformer_lens.ActivationCache`) work as they do in TransformerLens,
and the cache's methods (accumulated_resid, decompose_resid, logit_attrs, ...) read our model.
"""

import difflib
import json
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor
from torch import nn
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from lab.files import atomic_write
from lab.model.components import BLOCKS, NORMS, POSITIONS, CheckedHookPoint, Embed, NoNorm, TiedUnembed, Unembed
from lab.model.config import ModelConfig
from lab.model.kv_cache import KVCache
from lab.model.offload import read_weight

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"

HookFn = Callable[[Tensor, HookPoint], Tensor | None]


class HookedTransformer(HookedRootModule):
    """A decoder-only transformer whose every activation is a TransformerLens HookPoint.

    Hook names (TransformerLens's): hook_embed, hook_pos_embed, blocks.{l}.hook_resid_pre|mid|post,
    blocks.{l}.ln1|ln2.hook_scale|hook_normalized, blocks.{l}.attn.hook_q|k|v|attn_scores|pattern|z|result,
    blocks.{l}.hook_attn_out, blocks.{l}.mlp.hook_pre|hook_post, blocks.{l}.hook_mlp_out,
    ln_final.hook_scale|hook_normalized, hook_logits.
    """

    def __init__(self, cfg: ModelConfig, seed: int = 0, tokenizer: Any = None):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"HookedTransformer needs a ModelConfig, got {type(cfg).__name__}")
        check_fits_in_memory("HookedTransformer", cfg.n_params(), cfg.n_buffer_elements())
        self.cfg = cfg
        self.tokenizer = tokenizer
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = Embed(cfg)
            self.hook_embed = CheckedHookPoint()  # [batch, pos, d_model]
            if cfg.positions in ("learned", "sinusoidal"):  # positions added to the residual stream
                self.hook_pos_embed = CheckedHookPoint()  # [batch, pos, d_model]
            self.pos_embed = POSITIONS[cfg.positions](cfg, getattr(self, "hook_pos_embed", None))
            self.blocks = nn.ModuleList([BLOCKS[cfg.block](cfg) for _ in range(cfg.n_layers)])
            # A post-LN stack already ends in a norm; a pre-LN or parallel stack needs the final one.
            self.ln_final = NoNorm() if cfg.block == "post_ln" else NORMS[cfg.norm](cfg)
            self.unembed = TiedUnembed(cfg, self.embed) if cfg.tied_embeddings else Unembed(cfg)
        self.hook_logits = CheckedHookPoint()  # [batch, pos, d_vocab]
        self.setup()  # HookedRootModule: name every HookPoint

    # --- the forward pass ----------------------------------------------------------------------
    def forward(
        self, tokens: Int[Tensor, "batch pos"], kv_cache: KVCache | None = None
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits for every position. With a KV cache, `tokens` continue the cached prefix; a pass that raises
        (a hook, an interrupt) leaves the cache as it was before it."""
        if kv_cache is None:
            return self._forward(self.check_tokens(tokens), None, 0)
        offset = kv_cache.length
        tokens = self.check_tokens(tokens, offset)
        offset = kv_cache.check(self.cfg.n_layers, tokens.shape[0])
        try:
            return self._forward(tokens, kv_cache, offset)
        except BaseException:
            kv_cache.truncate(offset)  # layers before the failure appended this step's keys: take them back
            raise

    def _forward(self, tokens: Int[Tensor, "batch pos"], kv_cache: KVCache | None, offset: int
                 ) -> Float[Tensor, "batch pos d_vocab"]:
        x = self.pos_embed(self.hook_embed(self.embed(tokens)), offset)
        for layer, block in enumerate(self.blocks):
            x = block(x, None if kv_cache is None else kv_cache.entries[layer])
        return self.hook_logits(self.unembed(self.ln_final(x)))

    def check_tokens(self, tokens: Any, offset: int = 0) -> Int[Tensor, "batch pos"]:
        """Validate a batch of token ids at the boundary; a 1-D sequence becomes a batch of one."""
        if not isinstance(tokens, Tensor):
            raise ValueError(f"tokens must be a torch.Tensor of integer ids, got {type(tokens).__name__}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must have an integer dtype (torch.long), got {tokens.dtype}")
        if tokens.ndim == 1:
            tokens = tokens[None, :]
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape [batch, pos] or [pos], got {tuple(tokens.shape)}")
        if tokens.numel() == 0:
            raise ValueError(f"tokens is empty (shape {tuple(tokens.shape)}): need at least one token")
        if tokens.device.type == "meta" and self.embed.W_E.device.type != "meta":
            raise ValueError("tokens are on the meta device (a shape without values): put the ids on "
                             f"{self.embed.W_E.device}, where the model is")
        if offset + tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"sequence of {offset + tokens.shape[1]} tokens"
                + (f" ({offset} cached + {tokens.shape[1]} new)" if offset else "")
                + f" is longer than the model's context n_ctx = {self.cfg.n_ctx}")
        if tokens.device.type == "meta":  # a meta model on meta ids: shapes only, no values to check
            return tokens.to(dtype=torch.long)
        low, high = (int(v) for v in torch.stack(torch.aminmax(tokens)).tolist())  # one device sync
        if low < 0 or high >= self.cfg.d_vocab:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is out of range: ids must lie in [0, d_vocab) = [0, {self.cfg.d_vocab})")
        return tokens.to(device=self.embed.W_E.device, dtype=torch.long)

    def loss(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, ""]:
        """Mean next-token cross-entropy in nats: −(1/N) Σ log P_θ(x_{t+1} | x_≤t)."""
        tokens = self.check_tokens(tokens)
        return next_token_loss(self(tokens), tokens)

    def generate(self, tokens: Int[Tensor, "batch pos"], max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 use_kv_cache: bool = True, eos_token_id: int | None = None) -> Int[Tensor, "batch pos"]:
        """Sample a continuation (see `lab.generate`): the prompt followed by the new tokens."""
        from lab.generate import generate

        return generate(self, tokens, max_new_tokens, temperature, top_k, top_p, seed, use_kv_cache, eos_token_id)

    # --- weights under TransformerLens's names -------------------------------------------------
    # Read through `read_weight`, so that on a model spread over devices by accelerate (lab.hf.load_hf with a
    # device_map) an offloaded block's weights come from its offload store instead of the meta device.
    @property
    def W_E(self) -> Tensor:
        return read_weight(self, "embed.W_E")

    @property
    def W_pos(self) -> Tensor:
        if not hasattr(self.pos_embed, "W_pos"):
            raise AttributeError(f"a model with positions = {self.cfg.positions!r} has no W_pos")
        return read_weight(self, "pos_embed.W_pos")

    @property
    def W_U(self) -> Tensor:
        return read_weight(self, "unembed.W_U")

    @property
    def b_U(self) -> Tensor:
        return read_weight(self, "unembed.b_U")

    def _stack(self, name: str, module: str = "attn") -> Tensor:
        """blocks.{l}.{module}.{name} for every layer l, stacked on the first layer's device."""
        layers = [read_weight(self, f"blocks.{layer}.{module}.{name}") for layer in range(self.cfg.n_layers)]
        return torch.stack([w.to(layers[0].device) for w in layers])

    @property
    def W_Q(self) -> Tensor:  # [layer, head, d_model, d_head]
        return self._stack("W_Q")

    @property
    def W_K(self) -> Tensor:  # [layer, kv_head, d_model, d_head]
        return self._stack("W_K")

    @property
    def W_V(self) -> Tensor:  # [layer, kv_head, d_model, d_head]
        return self._stack("W_V")

    @property
    def W_O(self) -> Tensor:  # [layer, head, d_head, d_model]
        return self._stack("W_O")

    @property
    def W_in(self) -> Tensor:  # [layer, d_model, d_mlp]
        return self._stack("W_in", "mlp")

    @property
    def W_out(self) -> Tensor:  # [layer, d_mlp, d_model]
        return self._stack("W_out", "mlp")

    def tokens_to_residual_directions(self, tokens: Any) -> Tensor:
        """The unembedding direction(s) W_U[:, t] of token id(s) or a string (TransformerLens's API)."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        if isinstance(tokens, int):
            return self.W_U[:, tokens]
        tokens = torch.as_tensor(tokens, device=self.W_U.device)
        return self.W_U[:, tokens].movedim(0, -1)

    # --- tokenizer -----------------------------------------------------------------------------
    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer attached: pass token ids, or set model.tokenizer")
        return self.tokenizer

    def to_tokens(self, text: str | list[str]) -> Int[Tensor, "batch pos"]:
        """Encode text (a string or a list of equally long strings) into a [batch, pos] tensor."""
        tokenizer = self._require_tokenizer()
        texts = [text] if isinstance(text, str) else list(text)
        ids = [_encode(tokenizer, t) for t in texts]
        if len({len(i) for i in ids}) != 1:
            raise ValueError(f"texts encode to different lengths {[len(i) for i in ids]}: encode them one at a time")
        return torch.tensor(ids, dtype=torch.long, device=self.W_E.device)

    def to_string(self, tokens: Tensor | list[int]) -> str | list[str]:
        """Decode [pos] ids to a string, or [batch, pos] ids to a list of strings."""
        tokenizer = self._require_tokenizer()
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 2:
            return [tokenizer.decode(row.tolist()) for row in tokens]
        return tokenizer.decode(tokens.tolist())

    def to_str_tokens(self, text: str | Tensor) -> list[str]:
        """Each token of `text` (or of a [pos] id tensor) as its own string."""
        tokenizer = self._require_tokenizer()
        ids = _encode(tokenizer, text) if isinstance(text, str) else torch.as_tensor(text).flatten().tolist()
        return [tokenizer.decode([i]) for i in ids]

    def to_single_token(self, text: str) -> int:
        ids = _encode(self._require_tokenizer(), text)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens, not one")
        return ids[0]

    # --- hooks: TransformerLens's API, with hook names checked first ----------------------------
    def check_hook_names(self, names: Iterable[Any]) -> None:
        """Raise KeyError for a hook name the model does not have, naming the closest ones; ValueError for one
        that is neither a name nor a predicate on names."""
        for name in names:
            if not isinstance(name, str) and not callable(name):
                raise ValueError(f"{name!r} ({type(name).__name__}) is not a hook name or a predicate on names")
            if isinstance(name, str) and name not in self.hook_dict:
                close = difflib.get_close_matches(name, list(self.hook_dict), n=5, cutoff=0.5)
                hint = f"; did you mean {close}?" if close else "; see model.hook_dict for every name"
                raise KeyError(f"unknown hook name {name!r}{hint}")

    @contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True, clear_contexts: bool = False):
        """Attach hooks for the duration of a `with` block; they are removed even if the block raises."""
        self.check_hook_names(name for name, _ in [*fwd_hooks, *bwd_hooks])
        with super().hooks(list(fwd_hooks), list(bwd_hooks), reset_hooks_end, clear_contexts) as model:
            yield model

    def run_with_hooks(self, *model_args: Any, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True,
                       clear_contexts: bool = False, **model_kwargs: Any) -> Tensor:
        """One forward pass with (name, hook_fn) pairs attached; a hook may return a replacement."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*model_args, **model_kwargs)

    def run_with_cache(self, *model_args: Any, names_filter: Any = None, **kwargs: Any) -> tuple[Tensor, ActivationCache]:
        """(logits, ActivationCache) — the cache holds the activations that `names_filter` selects.

        names_filter: None (every hook but the per-head `attn.hook_result`), a hook name, a list of
        names, or a predicate on names. The per-head result is n_heads times the size of attn_out and
        follows from hook_z and W_O: name it to cache it, or let `cache.stack_head_results()` compute
        it (TransformerLens does the same unless `use_attn_result` is set). Asking for
        `hook_pattern`/`hook_attn_scores` switches attention to its explicit path; any other
        selection keeps the fused path.
        """
        names_filter = resolve_names_filter(self, names_filter)
        logits, cache = super().run_with_cache(*model_args, names_filter=names_filter, **kwargs)
        return logits, Cache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    # --- checkpoints ---------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write model.safetensors and config.json (and tokenizer.json when one is attached), atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: read_weight(self, k).detach().contiguous().cpu() for k in self.state_dict()}  # offloaded too
        atomic_write(directory / WEIGHTS_FILE, lambda path: save_file(state, str(path), metadata={"format": "pt"}))
        atomic_write(directory / CONFIG_FILE, lambda path: path.write_text(self.cfg.to_json()))
        if self.tokenizer is not None and hasattr(self.tokenizer, "to_str"):  # a tokenizers.Tokenizer
            atomic_write(directory / TOKENIZER_FILE, lambda path: path.write_text(self.tokenizer.to_str()))
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> "HookedTransformer":
        """Load a folder written by `save`; every malformed part is an error that says which."""
        directory = Path(directory)
        cfg, state = read_checkpoint(directory, ModelConfig)
        tokenizer = read_tokenizer(directory / TOKENIZER_FILE) if (directory / TOKENIZER_FILE).is_file() else None
        model = cls(cfg, tokenizer=tokenizer)
        model.load_weights(state, source=str(directory / WEIGHTS_FILE))
        return model.to(device).eval()

    def load_weights(self, state: dict[str, Tensor], source: str = "state dict") -> None:
        """Copy weights in, after checking that names and shapes match this config exactly."""
        expected = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in state.items()}
        missing, unexpected = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
        wrong = sorted(k for k in expected.keys() & got.keys() if expected[k] != got[k])
        if missing or unexpected or wrong:
            parts = []
            if missing:
                parts.append(f"missing {missing[:6]}{' …' if len(missing) > 6 else ''}")
            if unexpected:
                parts.append(f"unexpected {unexpected[:6]}{' …' if len(unexpected) > 6 else ''}")
            if wrong:
                parts.append("shape mismatch " + ", ".join(f"{k}: config wants {expected[k]}, weights have {got[k]}"
                                                            for k in wrong[:4]))
            raise ValueError(f"weights in {source} do not match the config: " + "; ".join(parts))
        with torch.no_grad():
            for name, tensor in self.state_dict().items():
                tensor.copy_(state[name])

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, device: str | torch.device = "cpu") -> "HookedTransformer":
        """A zoo model by name, a folder written by `save`, or a local Hugging Face folder."""
        if not str(name_or_path).strip():  # Path("") is the current folder: never what an empty name means
            raise ValueError("the model name is empty: give a zoo name or a model folder")
        path = Path(name_or_path)
        if path.is_dir():
            config = path / CONFIG_FILE
            if config.is_file() and "model_type" in _read_json(config):
                from lab.hf import load_hf

                return load_hf(path, device=device)
            return cls.load(path, device=device)
        from lab.zoo import zoo_model_dir

        return cls.load(zoo_model_dir(str(name_or_path)), device=device)


class Cache(ActivationCache):
    """TransformerLens's ActivationCache, whose KeyError says why an entry is missing: an unknown hook
    name (with the closest ones), or a hook the names_filter — or the default, for attn.hook_result —
    left out."""

    def __getitem__(self, key: Any) -> Tensor:
        try:
            return super().__getitem__(key)
        except KeyError as err:  # TransformerLens raises it with the full name the key resolved to
            name = err.args[0] if err.args and isinstance(err.args[0], str) else key
        self.model.check_hook_names([name])  # an unknown name: the model's KeyError, naming the closest ones
        why = ("left out by default (n_heads × attn_out; name it in names_filter, or use cache.stack_head_results())"
               if not cached_by_default(name) else "left out by the names_filter")
        raise KeyError(f"{name!r} is a hook of the model but was not cached: {why}")


def cached_by_default(name: str) -> bool:
    """run_with_cache's selection when none is given: every hook except the per-head result."""
    return not name.endswith("attn.hook_result")


def resolve_names_filter(model: HookedRootModule, names_filter: Any) -> Callable[[str], bool] | list[str]:
    """A run_with_cache selection as a list of checked names or a predicate (see `run_with_cache`)."""
    if names_filter is None:
        return cached_by_default
    if isinstance(names_filter, str):
        names_filter = [names_filter]
    if isinstance(names_filter, (list, tuple)):
        odd = [name for name in names_filter if not isinstance(name, str)]
        if odd:  # TransformerLens would match no hook against them and cache nothing
            raise ValueError(f"names_filter holds {odd[0]!r} ({type(odd[0]).__name__}): hook names are strings "
                             "(or pass one predicate on names)")
        model.check_hook_names(names_filter)
        return list(names_filter)
    return names_filter


def check_fits_in_memory(what: str, n_params: int, n_buffer_elements: int = 0) -> None:
    """Refuse, before allocating, a model whose weights cannot fit where they would be allocated (torch's
    default device and dtype): a clear error at once instead of minutes of building or an allocator's
    failure. Shapes on the meta device cost nothing and are always allowed."""
    device, dtype = torch.get_default_device(), torch.get_default_dtype()
    if device.type == "meta":
        return
    needed = (n_params + n_buffer_elements) * dtype.itemsize
    available = available_memory(device)
    if available is not None and needed > available:
        raise ValueError(f"{what} of {n_params:,} parameters needs {needed / 2**30:,.1f} GiB ({dtype}) but "
                         f"{device} has {available / 2**30:,.1f} GiB available: make the model smaller (or build it "
                         "under `with torch.device('meta')` to count its parameters)")


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on `device`: a GPU's free memory, or on CPU what Linux reports available
    (MemAvailable), capped by the cgroup's limit when the process runs in one; None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    free: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free.append(int(line.split()[1]) * 1024)
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(free) if free else None


def read_checkpoint(directory: Path, config_cls: Any) -> tuple[Any, dict[str, Tensor]]:
    """(config, weights) of a Forma model folder; a missing or malformed part is an error naming it."""
    if not directory.is_dir():
        raise FileNotFoundError(f"no model folder at {directory}")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} has no {name}: not a Forma model folder")
    try:
        cfg = config_cls.from_json((directory / CONFIG_FILE).read_text())
    except ValueError as err:
        raise ValueError(f"malformed config {directory / CONFIG_FILE}: {err}") from err
    try:
        state = load_file(str(directory / WEIGHTS_FILE))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"malformed or truncated checkpoint {directory / WEIGHTS_FILE}: {err}") from err
    return cfg, state


def read_tokenizer(path: Path) -> Any:
    """A `tokenizers.Tokenizer` saved as JSON; a ValueError naming the file when it cannot be read."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust library raises plain Exception for malformed JSON or an unknown model
        raise ValueError(f"malformed tokenizer {path}: {err}") from err


def next_token_loss(logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, ""]:
    """Mean next-token cross-entropy in nats: the logits at t predict the token at t + 1."""
    if tokens.shape[-1] < 2:  # no prediction to average over: the mean of nothing is NaN
        raise ValueError(f"a next-token loss needs at least 2 tokens per sequence (one to predict from, one to "
                         f"predict), got {tokens.shape[-1]}")
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"malformed JSON in {path}: {err}") from err
    return data if isinstance(data, dict) else {}


def _encode(tokenizer: Any, text: str) -> list[int]:
    encoded = tokenizer.encode(text)
    return list(encoded.ids) if hasattr(encoded, "ids") else list(encoded)
