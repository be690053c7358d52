"""Shared fixtures: tiny models and tokenizers built from configs — nothing is fetched from a hub."""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

from lab import HookedTransformer, ModelConfig
from lab.configs import torch_threads

VOCAB = 100


@pytest.fixture(scope="session")
def quick_runs_dir(tmp_path_factory) -> Path:
    """A private runs/ folder for the session's quick runs (what `FORMA_RUNS_DIR` points the dashboard at)."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def quick_run(quick_runs_dir):
    """quick_run(NAME) -> the folder of `forma run NAME --quick`, made once per session in quick_runs_dir
    (runs/NAME/<stamp>/ and runs/NAME/latest): the experiment's tests and the dashboard's read the same run."""
    from lab.cli import main
    from lab.runs import latest_run

    folders: dict[str, Path] = {}

    def run(name: str) -> Path:
        if name not in folders:
            before = os.environ.get("FORMA_RUNS_DIR")
            os.environ["FORMA_RUNS_DIR"] = str(quick_runs_dir)
            try:
                assert main(["run", name, "--quick"]) == 0
            finally:
                if before is None:
                    del os.environ["FORMA_RUNS_DIR"]
                else:
                    os.environ["FORMA_RUNS_DIR"] = before
            folders[name] = latest_run(name, quick_runs_dir)
        return folders[name]

    return run


@pytest.fixture
def one_thread():
    """Tiny models and tensors: on a busy shared machine a second intra-op thread only adds hand-offs (measured
    up to ~10× slower), so the test runs on one and the caller's setting comes back after. A file opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`, a single test by naming it."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def one_thread_per_module():
    """one_thread for a whole module, so that it holds while the module's own module-scoped fixtures train."""
    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def torch_backward_as_torch_has_it():
    """Importing nnsight replaces torch.Tensor.backward for the whole process (with one that parses the caller's
    source, for `with loss.backward():`); every test gets back the backward it started with, so that no test
    depends on which ran before it."""
    backward = torch.Tensor.backward
    yield
    torch.Tensor.backward = backward


def tiny_config(**changes) -> ModelConfig:
    base = dict(d_vocab=VOCAB, d_model=64, n_layers=2, n_heads=4, n_ctx=64)
    return ModelConfig(**(base | changes))


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def model() -> HookedTransformer:
    return HookedTransformer(tiny_config(), seed=1).eval()


def hf_gpt2(tie: bool = True):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, tie_word_embeddings=tie,
                     bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(cfg).eval()


def hf_llama(n_kv_heads: int = 2, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=n_kv_heads, vocab_size=VOCAB, max_position_embeddings=64,
                      tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None, pad_token_id=None)
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
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", pad_token="<pad>")
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
    cfg = GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=VOCAB, max_position_embeddings=64, rotary_pct=rotary_pct, hidden_act=act,
                        use_parallel_residual=parallel, tie_word_embeddings=tie, bos_token_id=None,
                        eos_token_id=None)
    return randomise_gains_and_biases(GPTNeoXForCausalLM(cfg).eval())


def hf_qwen2(tie: bool = False, window: int = 0, n_kv_heads: int = 2):
    """Qwen2: LLaMA with biases on Q, K and V; with `window`, sliding-window attention in every layer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=n_kv_heads, vocab_size=VOCAB, max_position_embeddings=64,
                      tie_word_embeddings=tie, use_sliding_window=window > 0, sliding_window=window or None,
                      max_window_layers=0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return randomise_gains_and_biases(Qwen2ForCausalLM(cfg).eval())


def hf_mistral(window: int | None = 5, n_kv_heads: int = 2, tie: bool = False):
    """Mistral: LLaMA with sliding-window attention (each query sees itself and the window − 1 keys before it)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=n_kv_heads, vocab_size=VOCAB, max_position_embeddings=64,
                        sliding_window=window, tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None,
                        pad_token_id=None)
    return randomise_gains_and_biases(MistralForCausalLM(cfg).eval())
