"""The tests' builders: tiny models, transcoders, Hugging Face models, folders and tokenizers built from configs and
seeds (nothing is fetched from a hub), the dashboard's pages in AppTest, private zoos, the guide's code blocks and the
command lines of quick runs. Fixtures live in conftest.py and build on these; what two test files share is here, and
a test imports it from here, never from conftest or from another test file (tests/test_structure.py)."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from lab import HookedTransformer, ModelConfig, folders
from lab.analysis.transcoders.model import TranscoderConfig, Transcoders, built_from, model_fingerprint
from lab.data.tokenizers import to_hf_tokenizer, word_level
from lab.folders import zoo_names

VOCAB = 100
REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
# The intra-op thread count a user's process gets (torch's default for this machine, or OMP_NUM_THREADS), read
# before any fixture pins one.
USER_THREADS = torch.get_num_threads()


def signals_as_sent():
    """A Popen preexec_fn giving the child the default disposition of the signals a test sends it. A child inherits
    ignored signals (a suite started as `make test &`, or by a runner that ignores SIGINT, passes SIG_IGN on), and
    Forma is right to keep a signal it was started ignoring; a test that sends SIGINT, SIGTERM or SIGHUP means the
    default, so it says so here."""

    def preexec() -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)

    return preexec


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


def word_tokenizer(directory, words: tuple[str, ...] = ()):
    """A WordLevel tokenizer over VOCAB words (four specials, `words`, then w0, w1, …), saved with save_pretrained
    and reloaded from disk."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<bos>", "<eos>", *words]
    words = specials + [f"w{i}" for i in range(VOCAB - len(specials))]
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


def letter_tokenizer(directory):
    """word_tokenizer whose vocabulary holds the letters A–D (a multiple-choice question's answer tokens)."""
    return word_tokenizer(directory, ("A", "B", "C", "D", "Answer:"))


def gpt2_folder(directory, n_layer_in_config: int | None = None, tie: bool = True, tokenizer: bool = False):
    hf_model("gpt2", tie=tie).save_pretrained(directory)
    if n_layer_in_config is not None:
        config = json.loads((directory / "config.json").read_text())
        config["n_layer"] = n_layer_in_config
        (directory / "config.json").write_text(json.dumps(config))
    if tokenizer:
        word_tokenizer(directory)
    return directory


def rewrite_weights(directory, change):
    state = load_file(directory / "model.safetensors")
    change(state)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


# --- tiny models and transcoders for the transcoder and attribution-graph tests ---------------------------------
ARCHITECTURES = {
    "gpt2": dict(),
    "llama": dict(positions="rotary", norm="rmsnorm", mlp="swiglu", bias=False, tied_embeddings=True, n_kv_heads=2),
    "parallel": dict(block="parallel", positions="rotary"),
}


def tiny_model(architecture: str = "gpt2", **changes) -> HookedTransformer:
    cfg = dict(d_vocab=50, d_model=32, n_layers=3, n_heads=4, n_ctx=32) | ARCHITECTURES[architecture] | changes
    model = HookedTransformer(ModelConfig(**cfg), seed=0).eval()
    with torch.no_grad():  # larger weights than the initialisation's, so that every path carries signal
        for name, p in model.named_parameters():
            if name.endswith(("W_Q", "W_K", "W_O", "W_out", "W_in", "W_gate")):
                p.mul_(4.0)
    return model


def random_transcoders(
    model: HookedTransformer, cross_layer: bool = False, activation: str = "relu", d_features: int = 64
) -> Transcoders:
    cfg = model.cfg
    tc = Transcoders(
        TranscoderConfig(
            d_model=cfg.d_model,
            n_layers=cfg.n_layers,
            d_features=d_features,
            activation=activation,
            k=8 if activation == "topk" else 0,
            cross_layer=cross_layer,
            threshold=0.05,
        )
    )
    with torch.no_grad():
        tc.b_enc.fill_(-0.05)
    return tc.eval()


def exact_transcoders(model: HookedTransformer) -> Transcoders:
    """The transcoders equal to a ReLU model's MLPs: each neuron a feature. With LayerNorm's gain w and bias b,
    the MLP reads n·w + b of the normalised input n, so W_enc = diag(w) W_in, b_enc = b W_in + b_in, W_dec = W_out,
    b_dec = b_out."""
    cfg = model.cfg
    assert cfg.mlp == "relu" and cfg.norm == "layernorm" and cfg.block == "pre_ln"
    tc = Transcoders(TranscoderConfig(d_model=cfg.d_model, n_layers=cfg.n_layers, d_features=cfg.d_mlp))
    with torch.no_grad():
        for layer, block in enumerate(model.blocks):
            w, b = block.ln2.w, block.ln2.b
            tc.W_enc[layer] = w[:, None] * block.mlp.W_in
            tc.b_enc[layer] = b @ block.mlp.W_in + block.mlp.b_in
            tc.W_dec[layer][:, 0] = block.mlp.W_out
            tc.b_dec[layer] = block.mlp.b_out
    return tc.eval()


def markov_tokens(n_seq: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """Sequences of one fixed order-1 chain (the same chain whatever `seed`, which draws the sequences) with peaked
    rows, so that a residual stream has structure: what SAELens' trainers train on (tests/sae)."""
    g = torch.Generator().manual_seed(0)
    rows = (-torch.log(torch.rand(vocab, vocab, generator=g))) ** (1 / 0.3)
    transition = rows / rows.sum(-1, keepdim=True)
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.empty(n_seq, seq_len, dtype=torch.long)
    x[:, 0] = torch.randint(0, vocab, (n_seq,), generator=g)
    for t in range(1, seq_len):
        x[:, t] = torch.multinomial(transition[x[:, t - 1]], 1, generator=g).squeeze(1)
    return x


# --- Forma models beside TransformerLens's TransformerBridge over the same weights -------------------------------
BRIDGE_VOCAB = 64
BRIDGE_ARCHITECTURES = {
    "gpt2": dict(mlp="gelu_tanh"),
    "llama": dict(positions="rotary", norm="rmsnorm", mlp="swiglu", n_kv_heads=2, bias=False),
    # GPT-NeoX-like, for what needs no bridge: attention and MLP side by side, both reading resid_pre
    "neox": dict(block="parallel", positions="rotary", rotary_dim=4),
}


def forma_model(kind: str, **changes) -> HookedTransformer:
    """A tiny Forma model with randomised norm gains and biases (b_U stays 0: Hugging Face has none)."""
    architecture = BRIDGE_ARCHITECTURES[kind] | changes
    cfg = ModelConfig(d_vocab=BRIDGE_VOCAB, d_model=32, n_layers=2, n_heads=4, n_ctx=16, **architecture)
    model = HookedTransformer(cfg, seed=0).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".w"):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
            elif name.rsplit(".", 1)[-1] in ("b", "b_Q", "b_K", "b_V", "b_O", "b_in", "b_out"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def bridge_tokenizer():
    """A word-level tokenizer over w0 … w59 (after Forma's four specials), saved and reloaded as transformers'."""
    return to_hf_tokenizer(word_level([f"w{i}" for i in range(BRIDGE_VOCAB - 4)]), tempfile.mkdtemp())


def bridge_of(model: HookedTransformer, processed: bool = False):
    """TransformerBridge over the same weights: unprocessed (the same numbers at every hook) or with its
    default weight processing (fold_ln, centring; value biases kept in place, as Forma keeps them)."""
    from transformer_lens.model_bridge import TransformerBridge

    from lab.hf.convert import to_hf

    name = "gpt2" if model.cfg.norm == "layernorm" else "LlamaForCausalLM"
    bridge = TransformerBridge.boot_transformers(name, hf_model=to_hf(model), tokenizer=model.tokenizer, device="cpu")
    if processed:
        bridge.enable_compatibility_mode(disable_warnings=True, fold_value_biases=False)
    else:
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    bridge.cfg.default_prepend_bos = False  # text as Forma encodes it by default: no BOS added
    return bridge.eval()


# --- the dashboard's pages (Streamlit's AppTest) and private zoos ----------------------------------------------
PYDOC_WORDS = ["Return", "the", "number", "of", "items", "in", "list", "file", "."]


def page(name: str):
    """A dashboard page in Streamlit's AppTest."""
    from streamlit.testing.v1 import AppTest

    from dashboards.pages import page_file

    return AppTest.from_file(str(page_file(name)), default_timeout=60)


def open_explorer_tab(at, title: str):
    """The explorer rerun with `title`'s tab open (only the open tab is computed, as a click on it does)."""
    at.session_state["explorer_tab"] = title
    return at.run()


def explorer_charts(at) -> dict:
    """Every explorer tab opened in turn, then the first again: {chart key: chart} in the tabs' order."""
    charts = {}
    titles = [tab.label for tab in at.tabs]
    for title in titles:
        open_explorer_tab(at, title)
        assert not at.exception, (title, at.exception)
        charts.update({chart.key: chart for chart in at.get("plotly_chart")})
    open_explorer_tab(at, titles[0])
    return charts


def texts(at) -> str:
    """An AppTest's messages and text, as one string."""
    return " ".join(str(e.value) for e in [*at.info, *at.warning, *at.error, *at.markdown, *at.text])


def rendered(source: object) -> str:
    """What a reader sees of an element's Markdown: rendered as CommonMark (with GitHub's tables), tags dropped.
    A page escapes a run's text (dashboards.display.plain), so the run's own words are found here, not in the source."""
    import html

    from markdown_it import MarkdownIt

    return html.unescape(re.sub(r"<[^>]+>", "", MarkdownIt("commonmark").enable("table").render(str(source)))).strip()


DECIMAL = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?![\w.])")


def long_numbers(text: str, most: int = 6) -> list[str]:
    """The decimals in `text` written with more than `most` significant digits."""
    return [hit for hit in DECIMAL.findall(text) if len(hit.replace(",", "").replace(".", "").lstrip("0")) > most]


def tiny_pydoc(zoo_copy: Path, seed: int = 0) -> HookedTransformer:
    tokenizer = word_level(PYDOC_WORDS)
    cfg = ModelConfig(d_vocab=tokenizer.get_vocab_size(), d_model=32, n_layers=2, n_heads=4, n_ctx=32)
    model = HookedTransformer(cfg, seed=seed, tokenizer=tokenizer)
    model.save(zoo_copy / "pydoc")
    return model


def zoo_with_transcoders(root: Path) -> Path:
    """A private zoo: the recipes, a tiny word-level 'pydoc' and top-k transcoders for it with top contexts."""
    from lab.analysis.activations.store import save_activations
    from lab.analysis.transcoders.measures import top_contexts

    zoo_copy = root / "models"
    for name in zoo_names():
        (zoo_copy / name).mkdir(parents=True)
        shutil.copy(folders.DEFAULT_ZOO_DIR / name / "model.toml", zoo_copy / name / "model.toml")
    tokenizer = word_level(PYDOC_WORDS)
    cfg = ModelConfig(d_vocab=tokenizer.get_vocab_size(), d_model=32, n_layers=3, n_heads=4, n_ctx=32)
    model = HookedTransformer(cfg, seed=0, tokenizer=tokenizer).eval()
    model.save(zoo_copy / "pydoc")
    transcoders = random_transcoders(model, activation="topk")
    folder = zoo_copy / "pydoc" / "transcoders" / "topk"
    transcoders.save(folder, built_from(model_fingerprint(model), 0))
    windows = torch.randint(0, cfg.d_vocab, (16, 12), generator=torch.Generator().manual_seed(0))
    store = save_activations(model, windows, transcoders.cfg.hooks(), root / "harvest", positions="all", progress=False)
    save_file(top_contexts(transcoders, store) | {"windows": windows}, str(folder / "contexts.safetensors"))
    return zoo_copy


# --- recipes, runs, the guide's pages, command lines -----------------------------------------------------------
TINY_MARKOV = """
[world]
kind = "markov"
vocab_size = 8
order = 1
seed = 0
n_sequences = 64
val_sequences = 16

[model]
d_model = 16
n_layers = 1
n_heads = 2
n_ctx = 8

[train]
steps = 6
batch_size = 8
seq_len = 8
lr = 1e-2
min_lr = 1e-3
warmup_steps = 1
eval_interval = 3
eval_batches = 1
checkpoint_interval = 2
"""


def write_recipe(zoo_dir, name: str, text: str) -> None:
    (zoo_dir / name).mkdir(exist_ok=True)
    (zoo_dir / name / "model.toml").write_text(text)


def tiny_real_track(root: Path) -> tuple[Path, Path]:
    """What the scoreboard's real-model track runs on at a test's size: a tiny random model saved as a folder
    (root/tiny), its vocabulary holding the word pieces the induction prompts are drawn from (INDUCTION_IDS), and a
    slice of the real corpus (root/corpus: the json package's docstrings in a 300-piece BPE's ids, as `forma corpus
    real` writes them). Returns (folder, corpus)."""
    from lab.data.real_corpus import collect_documents, write_corpus
    from lab.data.stdlib_corpus import train_bpe
    from lab.zoo.graphs import INDUCTION_IDS

    cfg = ModelConfig(d_vocab=INDUCTION_IDS[1], d_model=16, n_layers=2, n_heads=2, n_ctx=32)
    HookedTransformer(cfg, seed=0).save(root / "tiny")
    documents = collect_documents(packages=(), stdlib_prefixes=("json/",), reference=False)
    tokenizer = train_bpe("\n\n\n".join(doc.text for doc in documents), vocab_size=300)
    write_corpus(root / "corpus", documents, tokenizer, seed=0, fraction=0.3)
    return root / "tiny", root / "corpus"


def tiny_real_profile(**changes):
    """The real-model track's profile at a test's size (experiments.scoreboard.config.RealProfile): induction alone,
    3 prompts, no graph unless `changes` asks for one, the lenses and head detectors on one layer."""
    from experiments.scoreboard.config import RealProfile, RealSizes

    sizes = RealSizes(
        layers=(1,),
        eval_windows=4,
        fit_windows=2,
        length=8,
        tuned_iterations=1,
        jacobian_windows=1,
        jacobian_length=4,
        head_sequences=3,
        head_span=4,
        n_boot=50,
    )
    base = dict(
        prompts=3,
        induction_span=5,
        ig_steps=2,
        effect_tokens=2,
        graph_prompts=0,
        graph_features=8,
        capital_candidates=4,
        n_boot=50,
        tasks=("induction",),
        lenses=sizes,
    )
    return RealProfile(**(base | changes))


def real_track_run(folder: Path, corpus: Path, profile, monkeypatch) -> Path:
    """`forma run scoreboard --model FOLDER --corpus CORPUS --quick` into FORMA_RUNS_DIR, with `profile` as both real
    profiles (as `forma run` reads them) and every prompt tried taken as answered (a random model answers none:
    experiments.scoreboard.real.answered). Returns the run folder it wrote (runs/scoreboard_real/<stamp>/)."""
    import experiments.scoreboard.real as real_track
    from experiments.scoreboard.config import Config
    from lab.cli.parser import main
    from lab.runs import latest_run

    monkeypatch.setattr(Config, "REAL_PROFILES", (profile, profile))
    monkeypatch.setattr(real_track, "answered", lambda model, tokens, answers: torch.ones(len(tokens), dtype=bool))
    assert main(["run", "scoreboard", "--quick", "--model", str(folder), "--corpus", str(corpus)]) == 0
    return latest_run("scoreboard_real")


def figure():
    import plotly.graph_objects as go

    return go.Figure(go.Scatter(x=list(range(200)), y=[i * i for i in range(200)]))


def toy_run(cfg: dict, out: Path) -> dict:
    """A small experiment that writes one of each kind of artefact: an 8 kB table, then a figure (the 4.8 MB
    plotly bundle, an 8 kB JSON, a 9 kB HTML page)."""
    from lab.runs import save_figure, save_table

    save_table([{"step": i, "loss_nats": 1 / (i + 1)} for i in range(500)], out, "table")
    save_figure(figure(), out, "curve")
    return {"n": 500, "seconds": 0.1}


DOCS = REPO / "docs"
RUN_MARK = "<!-- run -->"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", flags=re.S | re.M)


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """(language, code, line number) of every fenced block; bash blocks only when marked to run."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        language, code = match.group(1), match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if language == "python" or (language == "bash" and before == RUN_MARK):
            found.append((language, code, line))
    return found


def one_error_line(err: str, command: str) -> str:
    """The `forma COMMAND: error: …` line of a command's stderr, after checking it is the only such line and that no
    traceback came with it."""
    lines = [line for line in err.splitlines() if line.startswith(f"forma {command}: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --- χ² survival function (scipy is not a dependency) ---------------------------------------------------------
def _regularized_lower_gamma_series(a: float, x: float) -> float:
    """P(a, x) = γ(a, x)/Γ(a) = e^{−x} x^a / Γ(a) · Σ_n x^n / (a (a+1) … (a+n))."""
    term = total = 1.0 / a
    denominator = a
    for _ in range(10_000):
        denominator += 1.0
        term *= x / denominator
        total += term
        if abs(term) < abs(total) * 1e-15:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _regularized_upper_gamma_fraction(a: float, x: float) -> float:
    """Q(a, x) = Γ(a, x)/Γ(a) by Lentz's continued fraction (Numerical Recipes §6.2)."""
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_sf(statistic: float, dof: int) -> float:
    """P(χ²_dof ≥ statistic) = Q(dof/2, statistic/2)."""
    a, x = dof / 2.0, statistic / 2.0
    if x <= 0:
        return 1.0
    if x < a + 1.0:
        return 1.0 - _regularized_lower_gamma_series(a, x)
    return _regularized_upper_gamma_fraction(a, x)


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson goodness of fit; cells with expected count < 5 are pooled into one."""
    expected = counts.sum() * probs
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return chi2_sf(statistic, len(expected) - 1)


# --- the real model: SmolLM2-135M-Instruct, built once per checkout ------------------------------------------------
SMOLLM2 = "smollm2"


def smollm2_folder() -> Path:
    """models/smollm2/, built from the wheel's GGUF the first time a test asks for it (seconds), then kept: the
    suite reads the checkout's real model as a user does."""
    from lab.folders import DEFAULT_ZOO_DIR
    from lab.zoo.building import build

    folder = DEFAULT_ZOO_DIR / SMOLLM2
    if not (folder / "model.safetensors").is_file():
        build(SMOLLM2, out=folder)
    return folder


def smollm2_gguf() -> Path:
    """The GGUF file the wheel ships (its size and hash checked), for transformers' own reading of it."""
    from lab.zoo.imports import load_source, source_file

    return source_file(load_source(SMOLLM2))


def transformers_from_gguf():
    """(model, tokenizer) as transformers makes them from the same GGUF (`gguf_file=`): its own dequantization,
    its own tokenizer conversion."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    return model, tokenizer


# --- markup in files from outside (tests/faults/test_markup_from_files.py, tests/browser) ----------------------
def markup_in(source: str) -> list[str]:
    """The Markdown constructs (images, links, raw HTML, emphasis, headings, code) that `source` would render,
    as CommonMark with GitHub's tables reads it (the literal text of what Streamlit adds, `:red[…]` and `$…$`, is
    checked by the caller)."""
    from markdown_it import MarkdownIt

    found = []
    for token in MarkdownIt("commonmark").enable("table").parse(str(source)):
        for child in [token, *(token.children or [])]:
            if child.type in (
                "image",
                "link_open",
                "html_inline",
                "html_block",
                "strong_open",
                "em_open",
                "heading_open",
                "code_inline",
                "fence",
            ):
                found.append(child.type)
    return found


MARKUP = (
    "![x](http://127.0.0.1:9/leak.png) <img src=x onerror=alert(1)> <b>bold</b> "
    '<a href="http://host/x">x</a><b>y</b> <i>i</i> <span style="color:red">s</span> &lt;b&gt;'
)
MARKUP_WORDS = (
    "![x](http://127.0.0.1:9/leak.png)",
    "<img src=x onerror=alert(1)>",
    "<b>bold</b>",
    '<a href="http://host/x">x</a><b>y</b>',
    '<i>i</i> <span style="color:red">s</span> &lt;b&gt;',
)
MEASURED = REPO / "docs" / "measured"
MARKUP_FORBIDDEN = {"image", "link_open", "html_inline", "html_block"}  # what a string from a file must never become


# A saved figure whose every string carries MARKUP: plotly renders <a>, <b> and styled spans in each of them.
POISONED_FIGURE = {
    "data": [
        {
            "type": "bar",
            "x": [f"method {MARKUP}", "other"],
            "y": [1, 2],
            "name": f"series {MARKUP}",
            "hovertext": [MARKUP, MARKUP],
            "text": [MARKUP, ""],
        }
    ],
    "layout": {
        "title": {"text": f"title {MARKUP}"},
        "xaxis": {"title": {"text": MARKUP}},
        "yaxis": {"title": {"text": MARKUP}, "tickvals": [1, 2], "ticktext": [MARKUP, "two"]},
        "legend": {"title": {"text": MARKUP}},
        "annotations": [{"text": f"note {MARKUP}", "x": 0, "y": 1, "showarrow": False}],
    },
}


def poison(value, keep: tuple[str, ...] = ()):
    """Every string value of parsed JSON (not its keys, nor the values under `keep`) with MARKUP appended."""
    if isinstance(value, str):
        return f"{value} {MARKUP}"
    if isinstance(value, list):
        return [poison(v, keep) for v in value]
    if isinstance(value, dict):
        return {k: v if k in keep else poison(v, keep) for k, v in value.items()}
    return value


def poisoned_folders(root: Path) -> Path:
    """A private zoo (a tiny pydoc with top-k transcoders, its card, its description, the prompt's graph with a
    supernode) and one run of every experiment that docs/measured holds, every string of theirs poisoned. The
    strings a file's loader checks against the code (a transcoder config's activation, a model fingerprint) stay:
    those are refused, not shown."""
    zoo_copy = zoo_with_transcoders(root)
    for results in sorted((MEASURED / "runs").glob("*.json")):
        if results.name.endswith(".provenance.json"):
            continue
        folder = root / "runs" / results.stem / "2026-01-01T00-00-00Z"
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps(poison(json.loads(results.read_text()))))
        provenance = json.loads((MEASURED / "runs" / f"{results.stem}.provenance.json").read_text())
        (folder / "provenance.json").write_text(json.dumps(poison(provenance, keep=("experiment",))))
        (folder / "config.json").write_text(json.dumps({"seed": 0, "note": MARKUP, "model": f"pydoc {MARKUP}"}))
        (folder / "poisoned.json").write_text(json.dumps(POISONED_FIGURE))
    card = json.loads((MEASURED / "cards" / "pydoc.json").read_text())
    (zoo_copy / "pydoc" / "card.json").write_text(json.dumps(poison(card, keep=("name", "kind"))))
    recipe = zoo_copy / "pydoc" / "model.toml"
    text = recipe.read_text()
    recipe.write_text(text.replace('description = "', f'description = "{MARKUP.replace(chr(34), "")} ', 1))
    transcoders = zoo_copy / "pydoc" / "transcoders" / "topk"
    source = json.loads((transcoders / "source.json").read_text())
    (transcoders / "source.json").write_text(json.dumps(source | {"note": MARKUP}))
    (transcoders / "quality.json").write_text(
        json.dumps({"held_out": {"fvu": [0.1, 0.2, 0.3]}, "loss": {"recovered": 0.5}, "note": MARKUP})
    )
    return zoo_copy


def poison_graph(zoo_copy: Path) -> None:
    """The graph the graphs page saved for its default prompt: its meta's strings and a supernode named MARKUP."""
    from lab.analysis.graphs.graph import GRAPHS_DIR, Graph

    (folder,) = list((zoo_copy / "pydoc" / "transcoders" / "topk" / GRAPHS_DIR).iterdir())
    graph = Graph.load(folder)
    graph.meta = poison(graph.meta)
    graph.supernodes = [{"name": f"group {MARKUP}", "nodes": graph.node_ids()[:1]}]
    graph.save_supernodes(folder)
