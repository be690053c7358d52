"""The tests' builders: tiny models, Hugging Face models and tokenizers built from configs (nothing is fetched from a
hub), and the command lines of quick runs. Fixtures live in conftest.py and build on these; a test imports a builder
from here, never from conftest or from another test file."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from lab import HookedTransformer, ModelConfig

VOCAB = 100
REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
# The intra-op thread count a user's process gets (torch's default for this machine, or OMP_NUM_THREADS), read
# before any fixture pins one.
USER_THREADS = torch.get_num_threads()


def quick_argv(name: str) -> list[str]:
    return [sys.executable, "-m", "lab.cli", "run", name, "--quick"]


def rerun_argv(name: str, out: Path) -> list[str]:
    """The same-seed rerun: on one worker where the experiment shares its trainings out (lab.parallel)."""
    import dataclasses

    import experiments

    fields = {f.name for f in dataclasses.fields(experiments.load(name).Config)}
    return quick_argv(name) + (["--workers", "1"] if "workers" in fields else []) + ["--out", str(out)]


def run_bash(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """A guide page's ```bash block, run as tests/test_docs.py runs one: `bash -euo pipefail -c CODE` in `cwd`,
    offline, with this Python's scripts (forma, torchrun) first on PATH and one intra-op thread a process."""
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        OMP_NUM_THREADS="1",
    )
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def tiny_config(**changes) -> ModelConfig:
    base = dict(d_vocab=VOCAB, d_model=64, n_layers=2, n_heads=4, n_ctx=64)
    return ModelConfig(**(base | changes))


def patchable(model: HookedTransformer, unembedding_scale: float = 1.0) -> HookedTransformer:
    """A random model, in eval mode, whose W_Q, W_K, W_O and W_out are ×4 (and W_U × unembedding_scale): large
    enough that patching one activation moves a metric well above float round-off."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("W_Q", "W_K", "W_O", "W_out")):
                p.mul_(4.0)
            elif name.endswith("W_U"):
                p.mul_(unembedding_scale)
    return model.eval()


def hf_gpt2(tie: bool = True):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
    )
    return GPT2LMHeadModel(cfg).eval()


def hf_llama(n_kv_heads: int = 2, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg).eval()
    # A fresh LLaMA has unit RMSNorm gains; randomise them so a misplaced gain cannot hide.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def word_tokenizer(directory):
    """A WordLevel tokenizer over VOCAB words, saved with save_pretrained and reloaded from disk."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = ["<unk>", "<pad>", "<bos>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 4)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


def randomise_gains_and_biases(model, scale: float = 0.3):
    """Hugging Face initialises norm gains to one and biases to zero; move every 1-D parameter off those values
    so that a misplaced gain or bias cannot hide behind them. (Not Forma's b_U: no Hugging Face head has one.)"""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and name != "unembed.b_U":
                p.add_(scale * torch.randn(p.shape, generator=generator))
    return model


def hf_neox(parallel: bool = True, rotary_pct: float = 0.25, tie: bool = False, act: str = "gelu"):
    """GPT-NeoX / Pythia: parallel (or sequential) attention and MLP, partial rotary, biases, LayerNorm."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rotary_pct=rotary_pct,
        hidden_act=act,
        use_parallel_residual=parallel,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
    )
    return randomise_gains_and_biases(GPTNeoXForCausalLM(cfg).eval())


def hf_qwen2(tie: bool = False, window: int = 0, n_kv_heads: int = 2):
    """Qwen2: LLaMA with biases on Q, K and V; with `window`, sliding-window attention in every layer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        use_sliding_window=window > 0,
        sliding_window=window or None,
        max_window_layers=0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return randomise_gains_and_biases(Qwen2ForCausalLM(cfg).eval())


def hf_mistral(window: int | None = 5, n_kv_heads: int = 2, tie: bool = False):
    """Mistral: LLaMA with sliding-window attention (each query sees itself and the window − 1 keys before it)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        sliding_window=window,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return randomise_gains_and_biases(MistralForCausalLM(cfg).eval())
