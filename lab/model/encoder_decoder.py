"""EncoderDecoder: the encoder–decoder transformer of Vaswani et al. (2017), built from the decoder-only parts.

    e⁰ = W_E^src[src] (+ PE)                     eˡ⁺¹ = enc_block_l(eˡ)            m = LN_enc(e^L)
    d⁰ = W_E^tgt[tgt] (+ PE)                     dˡ⁺¹ = dec_block_l(dˡ, m)         logits = LN_dec(d^L) W_U + b_U

An encoder block is a decoder-only block (`PreLNBlock` / `PostLNBlock`) whose self-attention has no
mask: every source token sees every other. A decoder block adds cross-attention between its causal
self-attention and its MLP: queries from the decoder's residual stream, keys and values from the
encoder's output m (§3.2.3). Attention, norms, MLPs, embeddings and positions are the classes of
`lab.model.components`; nothing here re-implements them.

Each stack ends in a norm in pre-LN *and* post-LN, as `torch.nn.Transformer` does (its encoder.norm
and decoder.norm), so its weights map one to one (`from_torch`); in a post-LN stack that last norm
re-normalises an already normalised stream.

Hook names (TransformerLens style): hook_src_embed, hook_src_pos_embed, encoder.{l}.hook_resid_pre|mid|post,
encoder.{l}.ln1|ln2.hook_scale|hook_normalized, encoder.{l}.attn.hook_q|k|v|attn_scores|pattern|z,
encoder.{l}.hook_attn_out, encoder.{l}.mlp.hook_pre|hook_post, encoder.{l}.hook_mlp_out,
encoder_ln_final.hook_scale|hook_normalized, hook_encoder_out; hook_tgt_embed, hook_tgt_pos_embed,
decoder.{l}.hook_resid_pre|mid|mid_cross|post, decoder.{l}.attn.*, decoder.{l}.cross_attn.*,
decoder.{l}.ln1|ln_cross|ln2.*, decoder.{l}.hook_attn_out|hook_cross_attn_out|hook_mlp_out,
decoder.{l}.mlp.*, decoder_ln_final.*, unembed.hook_in|hook_out (the logits).
"""

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import ActivationCache, HookedRootModule

from lab.configs import Record, check_fields
from lab.model.attention import Attention
from lab.model.checkpoint import (
    WEIGHTS_FILE,
    load_weights,
    read_checkpoint,
    read_tokenizers,
    write_checkpoint,
)
from lab.model.components import BLOCKS
from lab.model.config import ModelConfig
from lab.model.decoding import (
    Sampling,
    check_max_new_tokens,
    check_sampling,
    check_token_id,
    sample_tokens,
    seeded_generator,
)
from lab.model.embeddings import POSITIONS, Embed, Unembed
from lab.model.kv_cache import KVCache, KVCacheEntry
from lab.model.memory_check import check_fits_in_memory
from lab.model.mlp import MLPS
from lab.model.norms import NORMS, LayerNorm
from lab.model.pretrained import load_pretrained
from lab.model.primitives import CheckedHookPoint
from lab.model.transformer import Cache, HookedTransformer, next_token_loss, resolve_names_filter

SRC_TOKENIZER_FILE = "src_tokenizer.json"
TGT_TOKENIZER_FILE = "tgt_tokenizer.json"


@dataclass(frozen=True)
class EncoderDecoderConfig(Record):
    """Shape and variant of an encoder–decoder transformer; defaults are the seed's (Vaswani et al. 2017):
    sinusoidal positions, LayerNorm, ReLU MLP, post-LN "Add & Norm"."""

    d_vocab_src: int
    d_vocab_tgt: int
    d_model: int
    n_heads: int
    n_encoder_layers: int
    n_decoder_layers: int
    n_ctx: int  # the longest source and the longest target sequence
    d_head: int = 0  # 0: d_model // n_heads
    d_mlp: int = 0  # 0: 4 · d_model
    # Rotary is left out: it encodes positions inside self-attention and has no meaning across two sequences.
    positions: Literal["sinusoidal", "learned", "none"] = "sinusoidal"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = 1e-5
    mlp: Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu"] = "relu"
    block: Literal["pre_ln", "post_ln"] = "post_ln"
    bias: bool = True
    init_std: float = 0.02
    tokenizer: str = field(default="", compare=False)  # informational: what the ids mean

    def __post_init__(self) -> None:
        check_fields(self)  # every field its annotation's type
        for name in ("d_vocab_src", "d_vocab_tgt", "n_encoder_layers", "n_decoder_layers"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"EncoderDecoderConfig: {name} must be a positive integer, got {value!r}")
        try:  # every other field is checked where the components read it, in ModelConfig
            stack = self.stack_config("encoder")
        except ValueError as err:
            raise ValueError(f"EncoderDecoderConfig: {err}") from err
        object.__setattr__(self, "d_head", stack.d_head)  # frozen: fill the derived defaults
        object.__setattr__(self, "d_mlp", stack.d_mlp)

    def stack_config(self, stack: Literal["encoder", "decoder"]) -> ModelConfig:
        """The ModelConfig that one stack's components are built from."""
        d_vocab, n_layers = (
            (self.d_vocab_src, self.n_encoder_layers)
            if stack == "encoder"
            else (self.d_vocab_tgt, self.n_decoder_layers)
        )
        return ModelConfig(
            d_vocab=d_vocab,
            d_model=self.d_model,
            n_layers=n_layers,
            n_heads=self.n_heads,
            n_ctx=self.n_ctx,
            d_head=self.d_head,
            d_mlp=self.d_mlp,
            positions=self.positions,
            norm=self.norm,
            norm_eps=self.norm_eps,
            mlp=self.mlp,
            block=self.block,
            bias=self.bias,
            init_std=self.init_std,
            tokenizer=self.tokenizer,
        )

    def n_params(self) -> int:
        """Exact parameter count of `EncoderDecoder(self)` (buffers excluded)."""
        stack = self.stack_config("encoder")
        norm, attention = stack.norm_params(), stack.attention_params()
        block = attention + stack.mlp_params() + 2 * norm
        positions = self.n_ctx * self.d_model if self.positions == "learned" else 0
        encoder = self.d_vocab_src * self.d_model + positions + self.n_encoder_layers * block + norm
        decoder = (
            self.d_vocab_tgt * self.d_model
            + positions
            + self.n_decoder_layers * (block + attention + norm)
            + norm
            + self.d_model * self.d_vocab_tgt
            + self.d_vocab_tgt
        )  # cross-attention, ln_cross; W_U, b_U
        return encoder + decoder

    def n_buffer_elements(self) -> int:
        """Elements of the two sinusoidal tables (source and target), when positions are sinusoidal."""
        return 2 * self.n_ctx * self.d_model if self.positions == "sinusoidal" else 0


# --------------------------------------------------------------------------------------------
# Decoder blocks: causal self-attention, cross-attention, MLP
# --------------------------------------------------------------------------------------------
class _DecoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = NORMS[cfg.norm](cfg)
        self.attn = Attention(cfg)  # causal self-attention
        self.ln_cross = NORMS[cfg.norm](cfg)
        self.cross_attn = Attention(cfg, causal=False)  # queries: the decoder; keys, values: the encoder
        self.ln2 = NORMS[cfg.norm](cfg)
        self.mlp = MLPS[cfg.mlp](cfg)
        self.hook_resid_pre = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_cross_attn_out = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid_cross = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = CheckedHookPoint()  # [batch, pos, d_model]


class PreLNDecoderBlock(_DecoderBlock):
    """x ← x + attn(LN₁(x));  x ← x + cross_attn(LN_cross(x), m);  x ← x + mlp(LN₂(x))."""

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        encoder_out: Float[Tensor, "batch src_pos d_model"],
        cache: KVCacheEntry | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(x)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid_pre), past_kv_cache_entry=cache))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        cross_out = self.hook_cross_attn_out(self.cross_attn(self.ln_cross(resid_mid), encoder_out))
        resid_mid_cross = self.hook_resid_mid_cross(resid_mid + cross_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid_cross)))
        return self.hook_resid_post(resid_mid_cross + mlp_out)


class PostLNDecoderBlock(_DecoderBlock):
    """Post-LN ("Add & Norm", §3.1):
    x ← LN₁(x + attn(x));  x ← LN_cross(x + cross_attn(x, m));  x ← LN₂(x + mlp(x))."""

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        encoder_out: Float[Tensor, "batch src_pos d_model"],
        cache: KVCacheEntry | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(x)
        attn_out = self.hook_attn_out(self.attn(resid_pre, past_kv_cache_entry=cache))
        resid_mid = self.hook_resid_mid(self.ln1(resid_pre + attn_out))
        cross_out = self.hook_cross_attn_out(self.cross_attn(resid_mid, encoder_out))
        resid_mid_cross = self.hook_resid_mid_cross(self.ln_cross(resid_mid + cross_out))
        mlp_out = self.hook_mlp_out(self.mlp(resid_mid_cross))
        return self.hook_resid_post(self.ln2(resid_mid_cross + mlp_out))


DECODER_BLOCKS: dict[str, type[nn.Module]] = {"pre_ln": PreLNDecoderBlock, "post_ln": PostLNDecoderBlock}


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------
class EncoderDecoder(HookedRootModule):
    """An encoder–decoder transformer whose every activation is a TransformerLens HookPoint (names above)."""

    def __init__(self, cfg: EncoderDecoderConfig, seed: int = 0, src_tokenizer: Any = None, tgt_tokenizer: Any = None):
        super().__init__()
        if not isinstance(cfg, EncoderDecoderConfig):
            raise TypeError(f"EncoderDecoder needs an EncoderDecoderConfig, got {type(cfg).__name__}")
        check_fits_in_memory("EncoderDecoder", cfg.n_params(), cfg.n_buffer_elements())
        self.cfg = cfg
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        enc, dec = cfg.stack_config("encoder"), cfg.stack_config("decoder")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.src_embed = Embed(enc)
            self.hook_src_embed = CheckedHookPoint()  # [batch, src_pos, d_model]
            self.tgt_embed = Embed(dec)
            self.hook_tgt_embed = CheckedHookPoint()  # [batch, pos, d_model]
            if cfg.positions != "none":  # positions added to the residual stream
                self.hook_src_pos_embed = CheckedHookPoint()  # [batch, src_pos, d_model]
                self.hook_tgt_pos_embed = CheckedHookPoint()  # [batch, pos, d_model]
            self.src_pos_embed = POSITIONS[cfg.positions](enc)
            self.tgt_pos_embed = POSITIONS[cfg.positions](dec)
            self.encoder = nn.ModuleList([BLOCKS[cfg.block](enc, causal=False) for _ in range(cfg.n_encoder_layers)])
            self.encoder_ln_final = NORMS[cfg.norm](enc)
            self.hook_encoder_out = CheckedHookPoint()  # [batch, src_pos, d_model]: what every cross-attention reads
            self.decoder = nn.ModuleList([DECODER_BLOCKS[cfg.block](dec) for _ in range(cfg.n_decoder_layers)])
            self.decoder_ln_final = NORMS[cfg.norm](dec)
            self.unembed = Unembed(dec)  # unembed.hook_in, unembed.hook_out (the logits)
        self.setup()  # HookedRootModule: name every HookPoint

    # --- the forward pass ----------------------------------------------------------------------
    def forward(
        self, src: Int[Tensor, "batch src_pos"], tgt: Int[Tensor, "batch pos"]
    ) -> Float[Tensor, "batch pos d_vocab_tgt"]:
        """Logits for every target position: position t predicts tgt[t + 1] from src and tgt[≤ t]."""
        return self.decode(tgt, self.encode(src))

    def encode(self, src: Int[Tensor, "batch src_pos"]) -> Float[Tensor, "batch src_pos d_model"]:
        """m = LN_enc(encoder(W_E^src[src] + PE)): computed once per source, read by every cross-attention."""
        src = self._check(src, self.cfg.d_vocab_src, "source")
        x = self.hook_src_embed(self.src_embed(src))
        if self.cfg.positions != "none":
            x = x + self.hook_src_pos_embed(self.src_pos_embed(src, 0))
        for block in self.encoder:
            x = block(x)
        return self.hook_encoder_out(self.encoder_ln_final(x))

    def decode(
        self,
        tgt: Int[Tensor, "batch pos"],
        encoder_out: Float[Tensor, "batch src_pos d_model"],
        kv_cache: KVCache | None = None,
    ) -> Float[Tensor, "batch pos d_vocab_tgt"]:
        """Target logits given the encoder's output. With a KV cache, `tgt` continues the cached prefix."""
        offset = 0 if kv_cache is None else kv_cache.length
        tgt = self._check(tgt, self.cfg.d_vocab_tgt, "target", offset)
        if encoder_out.shape[0] != tgt.shape[0]:
            raise ValueError(f"the encoder output has batch {encoder_out.shape[0]}, the target batch {tgt.shape[0]}")
        if kv_cache is None:
            return self._decode(tgt, encoder_out, None, 0)
        offset = kv_cache.check(self.cfg.n_decoder_layers, tgt.shape[0])
        try:
            return self._decode(tgt, encoder_out, kv_cache, offset)
        except BaseException:
            kv_cache.truncate(offset)  # a pass that raises leaves the cache as it was before it
            raise

    def _decode(
        self,
        tgt: Int[Tensor, "batch pos"],
        encoder_out: Float[Tensor, "batch src_pos d_model"],
        kv_cache: KVCache | None,
        offset: int,
    ) -> Float[Tensor, "batch pos d_vocab_tgt"]:
        x = self.hook_tgt_embed(self.tgt_embed(tgt))
        if self.cfg.positions != "none":
            x = x + self.hook_tgt_pos_embed(self.tgt_pos_embed(tgt, offset))
        for layer, block in enumerate(self.decoder):
            x = block(x, encoder_out, None if kv_cache is None else kv_cache.entries[layer])
        return self.unembed(self.decoder_ln_final(x))

    def loss(self, src: Int[Tensor, "batch src_pos"], tgt: Int[Tensor, "batch pos"]) -> Float[Tensor, ""]:
        """Mean next-token cross-entropy of the target in nats under teacher forcing."""
        return next_token_loss(self(src, tgt), self._check(tgt, self.cfg.d_vocab_tgt, "target"))

    def _check(self, tokens: Any, d_vocab: int, what: str, offset: int = 0) -> Int[Tensor, "batch pos"]:
        """Validate a batch of ids at the boundary; a 1-D sequence becomes a batch of one."""
        if (
            not isinstance(tokens, Tensor)
            or tokens.dtype.is_floating_point
            or tokens.dtype.is_complex
            or tokens.dtype == torch.bool
        ):
            raise ValueError(f"{what} tokens must be a torch.Tensor of integer ids")
        tokens = tokens[None, :] if tokens.ndim == 1 else tokens
        if tokens.ndim != 2 or tokens.numel() == 0:
            raise ValueError(f"{what} tokens must have a non-empty shape [batch, pos], got {tuple(tokens.shape)}")
        if offset + tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(f"{what} of {offset + tokens.shape[1]} tokens is longer than n_ctx = {self.cfg.n_ctx}")
        if int(tokens.min()) < 0 or int(tokens.max()) >= d_vocab:
            raise ValueError(
                f"{what} token ids must lie in [0, {d_vocab}), got [{int(tokens.min())}, {int(tokens.max())}]"
            )
        return tokens.to(device=self.unembed.W_U.device, dtype=torch.long)

    # --- decoding ------------------------------------------------------------------------------
    @torch.no_grad()  # not inference_mode: the tokens it returns may feed a forward pass with autograd on
    def generate(
        self,
        src: Int[Tensor, "batch src_pos"],
        max_new_tokens: int,
        bos_token_id: int,
        eos_token_id: int | None = None,
        use_kv_cache: bool = True,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Int[Tensor, "batch pos"]:
        """<bos> followed by up to `max_new_tokens` target tokens (temperature 0: greedy).

        The encoder runs once; then the decoding loop both model classes share (`lab.model.decoding.sample_tokens`)
        feeds the decoder only its newest token each step, reusing the self-attention keys and values of the
        earlier ones (a KVCache). Cross-attention projects the cached encoder output afresh each step
        (src_pos · d_model² per layer: small next to the rest). Rows that emit `eos_token_id` keep emitting it;
        decoding stops when every row has.
        """
        check_max_new_tokens(max_new_tokens, 1, self.cfg.n_ctx)  # <bos> and the new tokens
        check_sampling(temperature, seed=seed)
        check_token_id(bos_token_id, "bos_token_id", self.cfg.d_vocab_tgt, optional=False)
        check_token_id(eos_token_id, "eos_token_id", self.cfg.d_vocab_tgt)
        encoder_out = self.encode(src)
        tokens = torch.full((encoder_out.shape[0], 1), bos_token_id, dtype=torch.long, device=encoder_out.device)
        cache = KVCache.empty(self.cfg.n_decoder_layers) if use_kv_cache else None
        return sample_tokens(
            lambda new, kv: self.decode(new, encoder_out, kv)[:, -1],
            tokens,
            max_new_tokens,
            self.cfg.d_vocab_tgt,
            cache,
            Sampling(temperature, generator=seeded_generator(seed, tokens.device)),
            eos_token_id=eos_token_id,
        ).tokens

    def translate(self, source: str, max_new_tokens: int | None = None) -> list[str]:
        """The greedy translation of a source string, as target tokens (without <bos> and <eos>)."""
        if self.src_tokenizer is None or self.tgt_tokenizer is None:
            raise ValueError("this model has no tokenizers attached: use generate() with token ids")
        src = torch.tensor([self.src_tokenizer.encode(source).ids], dtype=torch.long)
        bos, eos = self.tgt_tokenizer.token_to_id("<bos>"), self.tgt_tokenizer.token_to_id("<eos>")
        out = self.generate(src, max_new_tokens or self.cfg.n_ctx - 1, bos, eos)[0, 1:].tolist()
        return [self.tgt_tokenizer.id_to_token(i) for i in out[: out.index(eos) if eos in out else None]]

    # --- hooks: TransformerLens's API, with hook names checked first ----------------------------
    check_hook_names = HookedTransformer.check_hook_names  # same checks, same messages
    run_with_hooks = HookedTransformer.run_with_hooks

    @contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True, clear_contexts: bool = False):
        """Attach hooks for the duration of a `with` block; they are removed even if the block raises."""
        self.check_hook_names(name for name, _ in [*fwd_hooks, *bwd_hooks])
        with super().hooks(list(fwd_hooks), list(bwd_hooks), reset_hooks_end, clear_contexts) as model:
            yield model

    def run_with_cache(
        self, *model_args: Any, names_filter: Any = None, **kwargs: Any
    ) -> tuple[Tensor, ActivationCache]:
        """(logits, ActivationCache) for `model(src, tgt)`; names_filter as in HookedTransformer.run_with_cache."""
        names_filter = resolve_names_filter(self, names_filter)
        logits, cache = super().run_with_cache(*model_args, names_filter=names_filter, **kwargs)
        return logits, Cache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    # --- checkpoints ---------------------------------------------------------------------------
    def load_weights(self, state: dict[str, Tensor], source: str = "state dict") -> None:
        """Copy weights in, after checking that names and shapes match this config exactly."""
        load_weights(self, state, source)

    def save(self, directory: str | Path) -> Path:
        """Write model.safetensors, config.json and the tokenizers that are attached, atomically."""
        return write_checkpoint(
            self, directory, {SRC_TOKENIZER_FILE: self.src_tokenizer, TGT_TOKENIZER_FILE: self.tgt_tokenizer}
        )

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> "EncoderDecoder":
        """Load a folder written by `save`; every malformed part is an error that says which."""
        directory = Path(directory)
        cfg, state = read_checkpoint(directory, EncoderDecoderConfig)
        src_tokenizer, tgt_tokenizer = read_tokenizers(directory, (SRC_TOKENIZER_FILE, TGT_TOKENIZER_FILE))
        model = cls(cfg, src_tokenizer=src_tokenizer, tgt_tokenizer=tgt_tokenizer)
        model.load_weights(state, source=str(directory / WEIGHTS_FILE))
        return model.to(device).eval()

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, device: str | torch.device = "cpu") -> "EncoderDecoder":
        """A zoo model by name, or a folder written by `save` (`lab.load.load_encoder_decoder`, reached through
        `lab.model.pretrained`: loading by name is above the model package)."""
        return load_pretrained(cls, name_or_path, device)

    # --- torch.nn.Transformer on identical weights ---------------------------------------------
    @classmethod
    @torch.no_grad()
    def from_torch(
        cls,
        transformer: nn.Transformer,
        src_embed: nn.Embedding,
        tgt_embed: nn.Embedding,
        out_proj: nn.Linear,
        n_ctx: int = 512,
    ) -> "EncoderDecoder":
        """The same function as this PyTorch model, on the same weights (dropout is not copied: eval only).

        The pieces are an `nn.Transformer` (post-LN, or pre-LN with norm_first=True; ReLU or GELU;
        batch_first either way), an `nn.Embedding` for the source and one for the target, and an
        `nn.Linear(d_model, d_vocab_tgt)` output projection, composed with sinusoidal positions
        PE = `lab.model.embeddings.sinusoidal_table(n_ctx, d_model)` as

            logits = out_proj(transformer(src_embed(src) + PE[:S], tgt_embed(tgt) + PE[:T],
                                          tgt_mask=nn.Transformer.generate_square_subsequent_mask(T)))

        with no source or target padding mask. A model that scales its embeddings by √d_model
        (§3.4) can fold the factor into src_embed.weight and tgt_embed.weight before converting.
        """
        cfg = _torch_config(transformer, src_embed, out_proj, n_ctx)
        if tgt_embed.num_embeddings != cfg.d_vocab_tgt:
            raise ValueError(f"tgt_embed has {tgt_embed.num_embeddings} rows but out_proj {cfg.d_vocab_tgt} outputs")
        model = cls(cfg)
        model.src_embed.W_E.copy_(src_embed.weight)
        model.tgt_embed.W_E.copy_(tgt_embed.weight)
        model.unembed.W_U.copy_(out_proj.weight.T)
        model.unembed.b_U.copy_(out_proj.bias if out_proj.bias is not None else torch.zeros(cfg.d_vocab_tgt))
        for ours, theirs in zip(model.encoder, transformer.encoder.layers):
            _copy_attention(ours.attn, theirs.self_attn)
            _copy_norm(ours.ln1, theirs.norm1)
            _copy_norm(ours.ln2, theirs.norm2)
            _copy_mlp(ours.mlp, theirs.linear1, theirs.linear2)
        for ours, theirs in zip(model.decoder, transformer.decoder.layers):
            _copy_attention(ours.attn, theirs.self_attn)
            _copy_attention(ours.cross_attn, theirs.multihead_attn)
            _copy_norm(ours.ln1, theirs.norm1)
            _copy_norm(ours.ln_cross, theirs.norm2)
            _copy_norm(ours.ln2, theirs.norm3)
            _copy_mlp(ours.mlp, theirs.linear1, theirs.linear2)
        _copy_norm(model.encoder_ln_final, transformer.encoder.norm)
        _copy_norm(model.decoder_ln_final, transformer.decoder.norm)
        return model.eval()


def _torch_config(
    transformer: nn.Transformer, src_embed: nn.Embedding, out_proj: nn.Linear, n_ctx: int
) -> EncoderDecoderConfig:
    """The config of EncoderDecoder.from_torch's pieces; ValueError for a transformer it does not read."""
    enc_layer = transformer.encoder.layers[0]
    mha = enc_layer.self_attn
    activation = {torch.nn.functional.relu: "relu", torch.nn.functional.gelu: "gelu"}.get(enc_layer.activation)
    if activation is None:
        raise ValueError(f"from_torch reads ReLU or GELU feed-forward layers, got {enc_layer.activation!r}")
    if transformer.encoder.norm is None or transformer.decoder.norm is None:
        raise ValueError("from_torch expects the final encoder.norm and decoder.norm that nn.Transformer adds")
    if not mha._qkv_same_embed_dim:
        raise ValueError("from_torch expects packed in_proj_weight (kdim = vdim = d_model)")
    return EncoderDecoderConfig(
        d_vocab_src=src_embed.num_embeddings,
        d_vocab_tgt=out_proj.out_features,
        d_model=mha.embed_dim,
        n_heads=mha.num_heads,
        n_encoder_layers=len(transformer.encoder.layers),
        n_decoder_layers=len(transformer.decoder.layers),
        n_ctx=n_ctx,
        d_mlp=enc_layer.linear1.out_features,
        positions="sinusoidal",
        norm="layernorm",
        norm_eps=enc_layer.norm1.eps,
        mlp=activation,
        block="pre_ln" if enc_layer.norm_first else "post_ln",
        bias=mha.in_proj_bias is not None,
    )


def _copy_attention(ours: Attention, theirs: nn.MultiheadAttention) -> None:
    """in_proj_weight packs [W_q; W_k; W_v] ∈ R^{3d × d} (y = x Wᵀ); head h owns rows h·d_head … (h+1)·d_head."""
    per_head = "(head d_head) d_model -> head d_model d_head"
    for W, w in zip((ours.W_Q, ours.W_K, ours.W_V), theirs.in_proj_weight.chunk(3)):
        W.copy_(einops.rearrange(w, per_head, head=ours.n_heads))
    ours.W_O.copy_(
        einops.rearrange(theirs.out_proj.weight, "d_model (head d_head) -> head d_head d_model", head=ours.n_heads)
    )
    if theirs.in_proj_bias is not None:
        for b, bias in zip((ours.b_Q, ours.b_K, ours.b_V), theirs.in_proj_bias.chunk(3)):
            b.copy_(einops.rearrange(bias, "(head d_head) -> head d_head", head=ours.n_heads))
        ours.b_O.copy_(theirs.out_proj.bias)


def _copy_norm(ours: LayerNorm, theirs: nn.LayerNorm) -> None:
    ours.w.copy_(theirs.weight)
    ours.b.copy_(theirs.bias if theirs.bias is not None else torch.zeros_like(ours.b))


def _copy_mlp(ours: nn.Module, linear1: nn.Linear, linear2: nn.Linear) -> None:
    ours.W_in.copy_(linear1.weight.T)
    ours.W_out.copy_(linear2.weight.T)
    if linear1.bias is not None:
        ours.b_in.copy_(linear1.bias)
        ours.b_out.copy_(linear2.bias)
