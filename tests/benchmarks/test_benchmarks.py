"""The benchmarks' own arithmetic and plumbing: the FLOP count against torch's counter, the peak-memory
reading against an allocation of known size, and benchmarks.real_sizes end to end at toy sizes (the file
it writes holds every figure the summary reads)."""

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import real_sizes, timing
from lab import HookedTransformer, ModelConfig
from tests.builders import REPO

GPT2_LIKE = ModelConfig(d_vocab=97, d_model=64, n_layers=2, n_heads=4, n_ctx=32, mlp="gelu_tanh")
LLAMA_LIKE = ModelConfig(
    d_vocab=97,
    d_model=64,
    n_layers=2,
    n_heads=8,
    n_kv_heads=2,
    n_ctx=32,
    d_mlp=96,
    positions="rotary",
    norm="rmsnorm",
    mlp="swiglu",
    bias=False,
)


def attention_flops(cfg: ModelConfig, batch: int, tokens: int) -> int:
    """The FLOPs of one of attention's two products (q kᵀ or A v) over every layer: 2·T·h·d_head per token."""
    return batch * tokens * cfg.n_layers * 2 * tokens * cfg.n_heads * cfg.d_head


@pytest.mark.parametrize("cfg", [GPT2_LIKE, LLAMA_LIKE], ids=["gpt2-like", "llama-like-gqa-swiglu"])
def test_forward_flops_equal_torchs_count_of_the_forward(cfg):
    """forward_flops is exactly what torch's FlopCounterMode counts for one forward pass, so the FLOP/s
    figure counts the work the model really does. On the explicit attention path the scores are a matmul it
    counts; A v, when no hook changed the pattern, is the fused kernel's (reading an activation changes no
    number), which it does not count: forward_flops less A v's products."""
    model = HookedTransformer(cfg, seed=0).eval()
    model.set_explicit_paths(True)
    tokens = torch.randint(0, cfg.d_vocab, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(tokens)
    assert timing.forward_flops(model.cfg, 3, 20) - attention_flops(model.cfg, 3, 20) == counter.get_total_flops()


@pytest.mark.parametrize("cfg", [GPT2_LIKE, LLAMA_LIKE], ids=["gpt2-like", "llama-like-gqa-swiglu"])
@pytest.mark.parametrize("explicit", [False, True], ids=["fused-attention", "explicit-attention"])
def test_the_products_alone_are_the_forwards_own_matrix_products(cfg, explicit):
    """timing.MatrixProducts records every matrix product one forward dispatches (op, operand shapes, strides and
    dtypes) and replays them alone on operands laid out alike: replaying records the same calls again, and torch's
    FlopCounterMode counts as many FLOPs in the replay as in the forward (all but the fused attention kernel's,
    which it does not count: A v on the explicit path, the scores and A v on the fused one)."""
    model = HookedTransformer(cfg, seed=0).eval()
    model.set_explicit_paths(explicit)
    tokens = torch.randint(0, cfg.d_vocab, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        with FlopCounterMode(display=False) as forward:
            model(tokens)
        products = timing.MatrixProducts(lambda: model(tokens))
        with FlopCounterMode(display=False) as alone:
            products()
        again = timing.MatrixProducts(products)
    assert len(products.calls) >= 4 * cfg.n_layers + 1  # q·k·v, W_O, the MLP's two or more, ×layers; the unembedding
    assert again.calls == products.calls
    assert products.flops == forward.get_total_flops() == alone.get_total_flops() > 0
    uncounted = attention_flops(model.cfg, 3, 20) * (1 if explicit else 2)
    assert products.flops == timing.forward_flops(model.cfg, 3, 20) - uncounted


def test_peak_memory_sees_an_allocation_of_known_size():
    """A call that fills 64 MiB and frees it reads as a peak of 64 MiB, not much less or more; a call that
    allocates nothing reads as (close to) nothing, even right after the big one."""
    size = 64 * 2**20
    big = timing.peak_memory(lambda: torch.empty(size, dtype=torch.uint8).fill_(1), "cpu")
    if big is None:
        pytest.skip("no /proc/self/clear_refs or glibc here: peak memory is reported as unknown (None)")
    assert size - 2**20 <= big <= size + 16 * 2**20  # other pages of the process may come and go by a few kB
    assert timing.peak_memory(lambda: None, "cpu") <= 4 * 2**20


def test_shape_rejects_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="n_kv_heads"):
        real_sizes.Shape("llama", 2, 128, 8, 3, 352, 1000, 128, 2, 64)
    with pytest.raises(ValueError, match="family"):
        real_sizes.Shape("bert", 2, 128, 8, 8, 352, 1000, 128, 2, 64)


@pytest.mark.slow
def test_real_sizes_quick_writes_every_figure_the_summary_reads(tmp_path, monkeypatch, capsys):
    """`python -m benchmarks.real_sizes --quick` runs both families end to end and writes real_sizes.json with
    every section, ratio, target and peak for each shape; the summary table renders from that file alone."""
    monkeypatch.setattr(timing, "RESULTS", tmp_path)
    real_sizes.main(["--quick", "--rounds", "1"])
    results = json.loads((tmp_path / "real_sizes.json").read_text())
    assert set(results["shapes"]) == {"gpt2_small", "llama_like"}
    assert results["machine"]["load_average_1_5_15"] and results["load_average_at_end"]
    for shape in results["shapes"].values():
        assert set(shape["ratios"]) == {
            "forward_vs_hf_sdpa",
            "cache_all_vs_bridge",
            "cache_one_vs_bridge",
            "generation_speed_vs_hf",
            "training_step_vs_hf",
            "forward_utilisation",
        }
        assert all(ratio > 0 for ratio in shape["ratios"].values())
        assert set(shape["meets_target"]) == set(real_sizes.TARGETS)
        assert shape["forward"]["max_abs_logit_diff"] < 1e-4  # the same weights: the same model
        assert shape["generation"]["same_tokens_as_hf"]  # greedy on the same weights: the same continuation
        for section in ("forward", "run_with_cache", "generation", "training"):
            assert all(v is None or v >= 0 for v in shape[section]["peak_memory_bytes"].values())
        cache = shape["run_with_cache"]
        assert cache["cache_all_bytes"]["forma"] > 0 and cache["cache_all_bytes"]["bridge"] > 0
        assert cache["forward_vs_bridge_cache_all"] == (
            cache["timing"]["forma_forward"]["median_s"] / cache["timing"]["bridge_cache_all"]["median_s"]
        )
        assert all(
            row["peak_memory_bytes"] is None or row["peak_memory_bytes"] >= 0 for row in cache["timing"].values()
        )
    lines = real_sizes.summary_lines(results)
    rows = [line for line in lines if line.startswith("| gpt2_small") or line.startswith("| llama_like")]
    assert len(rows) == 2 * (len(real_sizes.ROWS) + 1)
    assert any("≤ 0.9×" in row for row in rows) and any("≥ 1.2×" in row for row in rows)
    assert "wrote" in capsys.readouterr().out


def test_gpu_script_without_a_gpu_says_so_and_runs_nothing(tmp_path):
    """benchmarks/gpu.sh on a machine without CUDA (here: CUDA hidden) lists what it would run — reporting a
    benchmark module this checkout lacks instead of failing on it — then says there is no GPU and exits 0,
    having written no result."""
    import os
    import subprocess
    import sys

    root = REPO
    before = sorted((root / "benchmarks" / "results").glob("*_cuda.json"))
    env = os.environ | {"PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(root / "benchmarks" / "gpu.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "no CUDA GPU here" in done.stderr and "nothing was run" in done.stderr
    for module in GPU_BENCHMARKS.keys() - {"harvest_saelens"}:
        assert f"benchmarks.{module}: will run on the GPU" in done.stdout
    assert (
        "benchmarks.harvest_saelens: will run on the GPU" in done.stdout
        or "benchmarks.harvest_saelens: no SAE environment" in done.stdout
    )
    for module in ("patching", "activations"):
        if not (root / "benchmarks" / f"{module}.py").is_file():
            assert f"benchmarks.{module}: not in this checkout, skipped" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert sorted((root / "benchmarks" / "results").glob("*_cuda.json")) == before and not any(tmp_path.iterdir())


class Reached(Exception):
    """Raised by a stand-in for a benchmark's first model builder, with the arguments it was given."""


GPU_BENCHMARKS = {  # benchmark module: (its first model builder, the arguments of a CPU-only smoke run)
    "peers": ("gpt2", ["--rounds", "1", "--only", "forward"]),
    "real_sizes": ("hf_model", ["--quick", "--rounds", "1"]),
    "patching": ("models", ["--quick"]),
    "harvest": ("hf_model", ["--quick"]),
    "harvest_saelens": ("models", ["--quick"]),
}


@pytest.mark.parametrize("module", sorted(GPU_BENCHMARKS))
def test_each_gpu_benchmark_hands_its_device_to_the_models(module, monkeypatch):
    """`python -m benchmarks.<module> --device cuda:7 ...` parses --device and hands it, as given, to the
    function that builds the models (here a stand-in that stops the run: no GPU is needed to see it)."""
    import importlib

    bench = importlib.import_module(f"benchmarks.{module}")
    builder, argv = GPU_BENCHMARKS[module]

    def reached(*args, **kwargs):
        raise Reached(*args, *kwargs.values())

    monkeypatch.setattr(bench, builder, reached)
    with pytest.raises(Reached) as hit:
        bench.main([*argv, "--device", "cuda:7"])
    assert "cuda:7" in hit.value.args


def test_harvests_memory_phases_run_on_the_device_they_are_given(monkeypatch):
    """benchmarks.harvest measures peaks in fresh processes: each is started with the run's --device, and a
    phase started so builds its model there."""
    import subprocess

    from benchmarks import harvest

    started = []

    def run(cmd, **kwargs):
        started.append(cmd)
        phase = {
            "peak_rss_bytes": 2,
            "peak_gpu_bytes": 1,
            "cache_tensor_bytes": 1,
            "model_bytes": 1,
            "seconds": 1.0,
            "tokens": 128,
            "tokens_per_s": 128.0,
            "rows": 128,
            "shards": 1,
            "bytes_written": 1,
            "rss_trace_mb": [],
        }
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(phase))

    monkeypatch.setattr(harvest.subprocess, "run", run)
    memory = harvest.bench_memory("tiny", "blocks.0.hook_resid_post", 1, 2, "float32", "cuda:7")
    assert [cmd[cmd.index("--device") + 1] for cmd in started] == ["cuda:7", "cuda:7"]
    assert memory["peak_measure"] == "peak_gpu" and memory["harvest_peak_gpu_mb"] == 1 / 2**20

    def reached(*args, **kwargs):
        raise Reached(*args, *kwargs.values())

    monkeypatch.setattr(harvest, "hf_model", reached)
    for phase in (
        ["cache", "tiny", "blocks.0.hook_resid_post", "1"],
        ["harvest", "tiny", "blocks.0.hook_resid_post", "1", "2", "float32"],
    ):
        with pytest.raises(Reached) as hit:
            harvest.main(["--device", "cuda:7", "--phase", *phase])
        assert "cuda:7" in hit.value.args


def test_a_run_off_the_cpu_writes_its_own_results_file():
    assert timing.result_name("harvest", "cpu") == "harvest"
    assert timing.result_name("harvest", "cuda") == timing.result_name("harvest", "cuda:1") == "harvest_cuda"


def test_the_gpu_script_runs_every_benchmark_of_the_real_sizes_issue_with_a_device():
    """benchmarks/gpu.sh's list names every benchmark that measures Forma at real sizes against its peers
    (GPU_BENCHMARKS), and each of those takes --device, so the script runs it on the GPU (`--device cuda`)
    rather than skipping it."""
    import re

    root = REPO
    script = (root / "benchmarks" / "gpu.sh").read_text()
    listed = re.search(r"^BENCHMARKS=\(\n(.*?)^\)", script, flags=re.S | re.M).group(1)
    modules = [line.strip().strip('"').split()[0] for line in listed.splitlines() if line.strip()]
    assert set(GPU_BENCHMARKS) <= set(modules), set(GPU_BENCHMARKS) - set(modules)
    for module in GPU_BENCHMARKS:
        assert '"--device"' in (root / "benchmarks" / f"{module}.py").read_text(), module
    assert '-m "benchmarks.$module" --device cuda $args' in script


def test_the_peak_memory_call_is_not_one_of_the_timed_rounds(monkeypatch):
    """interleaved(memory=...) reads each contender's peak memory in a call of its own, after the warm-up and
    before the timed rounds: that call starts from a trimmed heap, so it would time page faults, not the work."""
    calls, order = {"a": 0, "b": 0}, []
    monkeypatch.setattr(timing, "peak_memory", lambda fn, device: (order.append("peak"), fn(), 7)[-1])
    monkeypatch.setattr(
        timing.Clocked, "__call__", lambda self: (order.append("timed"), self.fn(), setattr(self, "seconds", 1.0))[1]
    )

    def contender(name):
        return lambda: calls.__setitem__(name, calls[name] + 1)

    out = timing.interleaved({"a": contender("a"), "b": contender("b")}, rounds=3, warmup=1, memory="cpu")
    assert calls == {"a": 1 + 1 + 3, "b": 1 + 1 + 3}  # warm-up, the peak reading, three timed rounds
    assert order == ["peak", "peak"] + ["timed"] * 6
    assert {name: (row["rounds"], row["peak_memory_bytes"]) for name, row in out.items()} == {"a": (3, 7), "b": (3, 7)}


def test_each_round_starts_with_another_contender():
    """No contender always runs first: round r starts r places on, so an order effect spreads over all of them."""
    order = []
    timing.interleaved({name: (lambda name=name: order.append(name)) for name in "abc"}, rounds=4, warmup=0)
    assert order == list("abcbcacababc")


def test_patching_zoo_only_needs_a_full_runs_results_first(tmp_path, monkeypatch, capsys):
    from benchmarks import patching

    monkeypatch.setattr(patching, "RESULTS", tmp_path)
    with pytest.raises(SystemExit) as exit_:
        patching.main(["--zoo-only"])
    assert exit_.value.code == 2 and "there is none at" in capsys.readouterr().err


@pytest.mark.slow
def test_real_model_quick_writes_every_figure_the_summary_reads(tmp_path, monkeypatch, capsys):
    """`python -m benchmarks.real_model --quick` on a tiny LLaMA folder (random weights, a word-level tokenizer)
    runs every section end to end and writes real_model.json: each contender's median, rounds and peak memory,
    every ratio with its goal, the load average at the start and the end, and a profile for each goal missed; the
    summary's section renders from that file alone."""
    from benchmarks import real_model, summary
    from tests.builders import hf_model, word_tokenizer

    folder = tmp_path / "tiny-llama"
    hf_model("llama").save_pretrained(folder)
    word_tokenizer(folder)
    monkeypatch.setattr(timing, "RESULTS", tmp_path)
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    real_model.main(["--model", str(folder), "--quick", "--rounds", "1", "--warmup", "0"])
    r = json.loads((tmp_path / "real_model.json").read_text())
    assert r["complete"] and r["rounds"] == 1 and r["machine"]["load_average_1_5_15"] and r["load_average_at_end"]
    assert set(r["forward"]) == {"1x8", "2x16"}
    for section in (r["load"], *r["forward"].values(), r["run_with_cache"], r["generate"]):
        assert all(row["rounds"] == 1 and row["median_s"] > 0 for row in section["timing"].values())
        assert all(v is None or v >= 0 for v in section["peak_memory_bytes"].values())
    assert set(r["load"]["timing"]) == {"forma_load_model", "hf_from_pretrained", "hf_from_pretrained_and_tokenizer"}
    assert all(row["max_abs_logit_diff_vs_hf_sdpa"] < 1e-4 for row in r["forward"].values())  # the same weights
    assert r["generate"]["same_tokens_as_hf"] and r["generate"]["new_tokens"] == 4
    held = r["run_with_cache"]["cache_all"]
    assert held["forma"]["hooks"] > 0 and held["bridge"]["hooks"] > 0 and held["forma"]["bytes"] > 0
    assert set(r["ratios"]) == {
        "forward_1x8_vs_hf_sdpa",
        "forward_1x8_vs_hf_eager",
        "forward_2x16_vs_hf_sdpa",
        "forward_2x16_vs_hf_eager",
        "cache_all_vs_bridge",
        "generate_vs_hf",
        "load_vs_hf",
        "load_s",
    }
    assert r["ratios"]["cache_all_vs_bridge"] == (
        r["run_with_cache"]["timing"]["forma_cache_all"]["median_s"]
        / r["run_with_cache"]["timing"]["bridge_cache_all"]["median_s"]
    )
    goals = {name for name in r["ratios"] if real_model.goal_of(name)}
    assert set(r["meets_target"]) == goals and len(goals) == 5
    assert set(r["profile"]) == {name for name, met in r["meets_target"].items() if not met}
    lines = summary.real_model_lines(r)
    assert lines[0].startswith("## The real model") and "--quick" in lines[0]
    assert sum(line.startswith("| forward ") for line in lines) == 4
    assert f"{r['ratios']['generate_vs_hf']:.3f}×" in "\n".join(lines)
    assert "## The real model" in (tmp_path / "summary.md").read_text()
    assert "wrote" in capsys.readouterr().out
