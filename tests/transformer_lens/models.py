"""The models under test of the ported TransformerLens test files: tiny Hugging Face checkpoints built here from
configs (never fetched), standing in for the pretrained models TransformerLens's tests load by name, and the two
implementations that load them — TransformerLens 3.9's own HookedTransformer (the reference) and Forma's.

Each upstream model name maps to a tiny checkpoint of a family Forma converts, as close to the original as Forma
allows: GPT-2 for gpt2 / gpt2-small / distilgpt2 and for TransformerLens's own SoLU and TinyStories models (GPT-2
shaped, with their tokenizers' special tokens); GPT-NeoX for Pythia; GPT-2's layout (OPT's: learned positions,
LayerNorm, biases) for OPT, with a tokenizer that, like OPT's, adds its BOS itself; and LLaMA with grouped key/value
heads for test_reference.py. Each has its original's layers and heads at a tiny width, and `AutoTokenizer` of an
upstream name gives its stand-in's tokenizer (conftest.py). Tokenizers are byte-level BPEs trained here on a paragraph
of English. `HookedTransformer(cfg)` of a TransformerLens config builds TransformerLens's model (random weights,
as upstream) and, for Forma, the same weights converted (`forma_of`).
"""

import functools
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

CORPUS = """Hi World! Hi there.
Hello world! Hello World! Hello, world! How are you today? I'm fine, thank you. I am happy. The quick brown
fox jumps over the lazy dog. Italy is in Europe. Pyeongchang Olympics was held in 2018. 2023-09-09 287594812673495.
The circumference is the perimeter of the circle. There were some biomolecules in the sample. one two three one two
three, four token sequence, seven token sequence seven token sequence, 2 2 2 seven token seq. When John and Mary went
to the shops, John gave the bag to Mary. When Tom and James went to the park, James gave the ball to Tom. When Dan
and Sid went to the shops, Sid gave an apple to Dan. After Martin and Amy went to the park, Amy gave a drink to
Martin. I went to Staten Island, to buy myself a mandolin. Sharon. It's always locked, it's always blocked. I'd
rather be burned in Canada than to freeze here in the South, by the magistrate, by the candidate. Once upon a time
there was a little girl named Lily. She loved to play outside in the sun with her friends. An apple a day keeps the
doctor away, a day keeps junk the. As soon as this ferry boat docks I'm headed to the church to play bingo. Hello, my
dog is cute. This is a much longer text. Hello, my cat is cute. Shine your light on me, Miss Liberty. Lorem ipsum
dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor. Charlie Planet. Solid Gold Magikarp. The capital
of France is Paris, and the capital of Germany is Berlin. Hi there, Hi again. Hi World! Hi World! Hi World! biomolecules are in cells. The Eiffel Tower is located in the city of Paris.
0123456789 + - * / = ( ) [ ] { } < > @ # a b c d e f g h i j k l m n o p q r s t u v w x y z. The circ le. Le chat.
"""


@functools.lru_cache(maxsize=None)
def _bpe(specials: tuple[str, ...]) -> Any:
    """A byte-level BPE of 1,024 tokens trained on CORPUS, `specials` first (ids 0, 1, ...): every word of CORPUS
    is one token, as common words are in a real BPE, so that upstream's prompts are as many tokens as there."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([CORPUS] * 8, trainer)
    return tokenizer


def _save_tokenizer(folder: Path, kind: str) -> None:
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    if kind == "gpt2":  # GPT-2's and GPT-NeoX's: one special token, BOS = EOS = UNK, no pad
        tok = _bpe(("<|endoftext|>",))
        names = dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    elif kind == "solu":  # TransformerLens's SoLU models' tokenizer: its own BOS, EOS and pad
        tok = _bpe(("<|EOS|>", "<|BOS|>", "<|PAD|>"))
        names = dict(bos_token="<|BOS|>", eos_token="<|EOS|>", pad_token="<|PAD|>", unk_token="<|EOS|>")
    else:  # OPT's: BOS = EOS = </s>, a pad, and the tokenizer itself puts </s> first
        import copy

        tok = copy.deepcopy(_bpe(("<pad>", "</s>", "<unk>")))
        tok.post_processor = processors.TemplateProcessing(single="</s> $A", pair="</s> $A </s> $B",
                                                           special_tokens=[("</s>", tok.token_to_id("</s>"))])
        names = dict(bos_token="</s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    PreTrainedTokenizerFast(tokenizer_object=tok, **names).save_pretrained(folder)


def _randomised(model: Any) -> Any:
    """Move every 1-D parameter (norm gains, biases) off Hugging Face's initial ones and zeros, so that a misplaced
    gain or bias cannot hide, and scale the attention's query and key maps so that its patterns are far from
    uniform (as a trained model's are), which makes position and padding mistakes show."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
        for name, p in model.named_parameters():
            if name.endswith(("c_attn.weight", "q_proj.weight", "k_proj.weight", "query_key_value.weight")):
                p.mul_(4.0)
    return model


def _hf_model(family: str, n_layers: int, n_heads: int, d_model: int) -> Any:
    from transformers import (GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig,
                              LlamaForCausalLM)

    torch.manual_seed(0)
    if family == "gpt2":
        config = GPT2Config(n_layer=n_layers, n_embd=d_model, n_head=n_heads, vocab_size=1024, n_positions=1024,
                            n_ctx=1024, bos_token_id=0, eos_token_id=0)
        return _randomised(GPT2LMHeadModel(config).eval())
    if family == "neox":
        config = GPTNeoXConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=n_layers,
                               num_attention_heads=n_heads, vocab_size=1024, max_position_embeddings=1024, rotary_pct=0.25,
                               bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
        return _randomised(GPTNeoXForCausalLM(config).eval())
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                         num_key_value_heads=n_heads // 2, vocab_size=1024, max_position_embeddings=1024, bos_token_id=1,
                         eos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    return _randomised(LlamaForCausalLM(config).eval())


# upstream name -> (family, layers, heads, d_model, tokenizer): the layers and heads of the model it stands in for
CHECKPOINTS = {
    "gpt2": ("gpt2", 12, 12, 48, "gpt2"), "solu-1l": ("gpt2", 1, 8, 64, "solu"), "solu-2l": ("gpt2", 2, 8, 64, "solu"),
    "solu-3l": ("gpt2", 3, 8, 64, "solu"), "tiny-stories-1M": ("gpt2", 8, 16, 64, "gpt2"),
    "pythia": ("neox", 6, 8, 64, "gpt2"), "opt": ("gpt2", 12, 12, 48, "opt"),  # OPT: GPT-2's layout, its tokenizer
    "llama": ("llama", 2, 4, 64, "opt"),  # LLaMA with grouped K/V heads (not upstream's: test_reference.py's)
}
# TransformerLens's own attention-only models, which no Hugging Face family holds: built from a TransformerLens
# config with a fixed seed (standard positions, where the originals have shortformer ones Forma does not write down)
NATIVE = {"attn-only-1l": 1, "attn-only-2l": 2, "attn-only-demo": 4}
ALIASES = {"gpt2-small": "gpt2", "distilgpt2": "gpt2", "roneneldan/TinyStories-1M": "tiny-stories-1M",
           "pythia-14m": "pythia", "pythia-70m": "pythia",
           "EleutherAI/pythia-70m": "pythia", "facebook/opt-125m": "opt", "opt-125m": "opt"}

_ROOT: list[Path] = []


def native(name: str) -> Any:
    """A TransformerLens HookedTransformer standing in for one of its own attention-only models, unprocessed."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import AutoTokenizer

    folder = checkpoint("solu-1l")  # its tokenizer: the SoLU models'
    cfg = HookedTransformerConfig(n_layers=NATIVE[name], d_model=64, n_heads=8, d_head=8, n_ctx=1024, d_vocab=1024,
                                  attn_only=True, act_fn="relu", normalization_type="LN", seed=0,
                                  default_prepend_bos=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    return HookedTransformer(cfg, tokenizer, move_to_device=False)


def checkpoint(name: str) -> Path:
    """The folder of the tiny checkpoint standing in for upstream's `name`, built on first use."""
    key = ALIASES.get(name, name)
    if key not in CHECKPOINTS:
        raise KeyError(f"no tiny checkpoint stands in for {name!r}: it cannot be loaded offline")
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="forma-tl-checkpoints-")))
    folder = _ROOT[0] / f"checkpoint-{list(CHECKPOINTS).index(key)}"  # no family name in the path: TransformerLens
    # reads some families' architecture from a path's name
    if not (folder / "config.json").is_file():
        family, n_layers, n_heads, d_model, tokenizer = CHECKPOINTS[key]
        _hf_model(family, n_layers, n_heads, d_model).save_pretrained(folder)
        _save_tokenizer(folder, tokenizer)
    return folder


class Reference:
    """TransformerLens 3.9's HookedTransformer: `HookedTransformer(cfg)` as upstream, and `from_pretrained` of a
    tiny checkpoint by TransformerLens's own loading (its config conversion, state-dict conversion and weight
    processing; only the name lookup, which would go to a model hub, is skipped)."""

    @property
    def cls(self) -> type:
        from transformer_lens import HookedTransformer

        return HookedTransformer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.cls(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # class attributes and static helpers
        return getattr(self.cls, name)

    def from_pretrained(self, model_name: str, fold_ln: bool = True, center_writing_weights: bool = True,
                        center_unembed: bool = True, refactor_factored_attn_matrices: bool = False,
                        fold_value_biases: bool = True, default_prepend_bos: bool | None = None,
                        default_padding_side: str | None = None, device: Any = None, dtype: Any = "float32",
                        **kwargs: Any) -> Any:
        import transformer_lens.loading_from_pretrained as loading
        from transformer_lens.HookedTransformer import DTYPE_FROM_STRING
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if kwargs:
            raise TypeError(f"the tiny checkpoints take no {sorted(kwargs)}")
        flags = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                     fold_value_biases=fold_value_biases, refactor_factored_attn_matrices=refactor_factored_attn_matrices)
        if model_name in NATIVE:
            model = native(model_name)
            model.load_and_process_state_dict(model.state_dict(), **flags)
            if default_prepend_bos is not None:
                model.cfg.default_prepend_bos = default_prepend_bos
            return model
        folder = str(checkpoint(model_name))
        dtype = DTYPE_FROM_STRING[dtype] if isinstance(dtype, str) else dtype
        cfg = loading.get_pretrained_model_config(folder, fold_ln=fold_ln, device=device or "cpu",
                                                  default_prepend_bos=default_prepend_bos, dtype=dtype)
        hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        state = loading.get_pretrained_state_dict(folder, cfg, hf, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        model = self.cls(cfg, tokenizer, move_to_device=False, default_padding_side=default_padding_side)
        model.load_and_process_state_dict(state, **flags)
        return model

    def from_pretrained_no_processing(self, model_name: str, **kwargs: Any) -> Any:
        flags = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False,
                     refactor_factored_attn_matrices=False)
        return self.from_pretrained(model_name, **(flags | kwargs))


class Forma(Reference):
    """Forma's HookedTransformer over the same tiny checkpoints (its own from_pretrained), and over the weights of
    a TransformerLens model built from a TransformerLens config (`forma_of`)."""

    @property
    def cls(self) -> type:
        from lab import HookedTransformer

        return HookedTransformer

    def __call__(self, cfg: Any, tokenizer: Any = None, move_to_device: bool = True,
                 default_padding_side: str | None = None) -> Any:
        from transformer_lens import HookedTransformer

        return forma_of(HookedTransformer(cfg, tokenizer, move_to_device, default_padding_side))

    def from_pretrained(self, model_name: str, **kwargs: Any) -> Any:
        if model_name in NATIVE:  # TransformerLens's weights, processed as from_pretrained processes them
            model = forma_of(native(model_name))
            flags = dict(fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True,
                         refactor_factored_attn_matrices=False)
            model.process_weights_(**{name: kwargs.pop(name, value) for name, value in flags.items()})
            if kwargs.get("default_prepend_bos") is not None:
                model.cfg.default_prepend_bos = kwargs.pop("default_prepend_bos")
            kwargs.pop("device", None), kwargs.pop("dtype", None), kwargs.pop("default_prepend_bos", None)
            if kwargs:
                raise TypeError(f"the tiny checkpoints take no {sorted(kwargs)}")
            return model
        return self.cls.from_pretrained(checkpoint(model_name), **kwargs)


def forma_of(tl_model: Any) -> Any:
    """A Forma HookedTransformer with a TransformerLens HookedTransformer's architecture, weights, tokenizer and
    default_prepend_bos; ValueError for an architecture Forma does not write down."""
    from lab import HookedTransformer, ModelConfig

    c = tl_model.cfg
    unsupported = [what for what, present in [
        (f"act_fn {c.act_fn!r}", c.act_fn not in ACTIVATIONS and not c.gated_mlp and not c.attn_only),
        (f"normalization_type {c.normalization_type!r}", c.normalization_type not in NORMS),
        (f"positional_embedding_type {c.positional_embedding_type!r}",
         c.positional_embedding_type not in ("standard", "rotary", "shortformer")),
        ("rotary_adjacent_pairs", c.rotary_adjacent_pairs),
        ("attention_dir bidirectional", c.attention_dir != "causal")] if present]
    if unsupported:
        raise ValueError(f"Forma's HookedTransformer has no {', '.join(unsupported)}")
    cfg = ModelConfig(
        d_vocab=c.d_vocab, d_vocab_out=c.d_vocab_out, d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads, n_ctx=c.n_ctx, d_head=c.d_head,
        d_mlp=c.d_mlp, n_kv_heads=c.n_key_value_heads or c.n_heads, norm_eps=c.eps,
        positions={"rotary": "rotary", "shortformer": "shortformer"}.get(c.positional_embedding_type, "learned"),
        rotary_dim=(c.rotary_dim or 0) if c.positional_embedding_type == "rotary" else 0,
        rotary_base=float(c.rotary_base), norm=NORMS[c.normalization_type],
        mlp="swiglu" if c.gated_mlp else ACTIVATIONS.get(c.act_fn, "relu"),
        block="attn_only" if c.attn_only else "parallel" if c.parallel_attn_mlp else "pre_ln")
    state = {name.replace("attn._", "attn."): value for name, value in tl_model.state_dict().items()
             if not name.endswith(("attn.mask", "attn.IGNORE", "rotary_sin", "rotary_cos"))}
    model = HookedTransformer(cfg, tokenizer=tl_model.tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.load_weights(state, source="a TransformerLens HookedTransformer")
    model.cfg.default_prepend_bos = bool(c.default_prepend_bos)
    for switch in ("use_hook_tokens", "use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in",
                   "ungroup_grouped_query_attention"):  # TransformerLens's config switches, as the model's setters
        getattr(model, f"set_{switch}")(bool(getattr(c, switch)))
    return model.to(c.device).eval()


ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "silu": "silu"}
NORMS = {"LN": "layernorm", "RMS": "rmsnorm", "LNPre": "layernorm_pre", "RMSPre": "rmsnorm_pre"}
IMPLEMENTATIONS = {"reference": Reference(), "forma": Forma()}
