"""The tests' builders: tiny models, Hugging Face models and tokenizers built from configs (nothing is fetched from a
hub), and the command lines of quick runs. Fixtures live in conftest.py and build on these; a test imports a builder
from here, never from conftest or from another test file."""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from lab import HookedTransformer, ModelConfig

VOCAB = 100
REPO = Path(__file__).resolve().parents[1]
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


@dataclass(frozen=True)
class HFCase:
    """One variant of a registered Hugging Face family, as the tests build it: `hf_model(model_type, **options)`."""

    model_type: str
    variant: str  # the test id, from the family's `variants`
    options: dict

    def build(self):
        return hf_model(self.model_type, **self.options)


def hf_cases(first_only: bool = False) -> list[HFCase]:
    """Every variant of every family of lab.hf.families.FAMILIES (or each family's first), in the table's order."""
    from lab.hf.families import FAMILIES

    return [
        HFCase(model_type, variant, options)
        for model_type, family in FAMILIES.items()
        for variant, options in list(family.variants.items())[: 1 if first_only else None]
    ]


def hf_model(model_type: str, randomise: bool = True, **options):
    """A tiny Hugging Face causal LM of a family in lab.hf.families.FAMILIES, built from that family's `tiny` config
    (`options` pick its variant: tie=, n_kv_heads=, window=, ...), seeded, in eval mode, with every gain and bias
    moved off Hugging Face's initial 1 and 0 so that a misplaced one cannot hide (`randomise=False`: as Hugging
    Face initialises them)."""
    from transformers import AutoModelForCausalLM

    from lab.hf.families import FAMILIES

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES[model_type].tiny(VOCAB, **options), trust_remote_code=False)
    return randomise_gains_and_biases(model.eval()) if randomise else model.eval()


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
