"""The benchmarks' own arithmetic and plumbing: the FLOP count against torch's counter, the peak-memory
reading against an allocation of known size, and benchmarks.real_sizes end to end at toy sizes (the file
it writes holds every figure the summary reads)."""

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import real_sizes, timing
from lab import HookedTransformer, ModelConfig

GPT2_LIKE = ModelConfig(d_vocab=97, d_model=64, n_layers=2, n_heads=4, n_ctx=32, mlp="gelu_tanh")
LLAMA_LIKE = ModelConfig(d_vocab=97, d_model=64, n_layers=2, n_heads=8, n_kv_heads=2, n_ctx=32, d_mlp=96,
                         positions="rotary", norm="rmsnorm", mlp="swiglu", bias=False)


@pytest.mark.parametrize("cfg", [GPT2_LIKE, LLAMA_LIKE], ids=["gpt2-like", "llama-like-gqa-swiglu"])
def test_forward_flops_equal_torchs_count_of_the_forward(cfg):
    """forward_flops is exactly what torch's FlopCounterMode counts for one forward pass, so the utilisation
    figure divides by the work the model really does. On the explicit attention path the scores and A v are
    matmuls it counts (it does not count the CPU's fused attention kernel)."""
    model = HookedTransformer(cfg, seed=0).eval()
    model.set_explicit_paths(True)
    tokens = torch.randint(0, cfg.d_vocab, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(tokens)
    assert timing.forward_flops(model.cfg, 3, 20) == counter.get_total_flops()


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
        assert set(shape["ratios"]) == {"forward_vs_hf_sdpa", "cache_all_vs_bridge", "cache_one_vs_bridge",
                                        "generation_speed_vs_hf", "training_step_vs_hf", "forward_utilisation"}
        assert all(ratio > 0 for ratio in shape["ratios"].values())
        assert set(shape["meets_target"]) == set(real_sizes.TARGETS)
        assert shape["forward"]["max_abs_logit_diff"] < 1e-4  # the same weights: the same model
        assert shape["generation"]["same_tokens_as_hf"]  # greedy on the same weights: the same continuation
        for section in ("forward", "run_with_cache", "generation", "training"):
            assert all(v is None or v >= 0 for v in shape[section]["peak_memory_bytes"].values())
        cache = shape["run_with_cache"]
        assert cache["cache_all_bytes"]["forma"] > 0 and cache["cache_all_bytes"]["bridge"] > 0
        assert all(row["peak_memory_bytes"] is None or row["peak_memory_bytes"] >= 0 for row in cache["timing"].values())
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
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    before = sorted((root / "benchmarks" / "results").glob("*_cuda.json"))
    env = os.environ | {"PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path)}
    done = subprocess.run(["bash", str(root / "benchmarks" / "gpu.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "no CUDA GPU here" in done.stderr and "nothing was run" in done.stderr
    assert "benchmarks.real_sizes: will run on the GPU" in done.stdout
    for module in ("patching", "activations"):
        if not (root / "benchmarks" / f"{module}.py").is_file():
            assert f"benchmarks.{module}: not in this checkout, skipped" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert sorted((root / "benchmarks" / "results").glob("*_cuda.json")) == before and not any(tmp_path.iterdir())
