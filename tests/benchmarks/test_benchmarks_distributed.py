"""benchmarks/distributed.py's plumbing: the summary's section shows the figures its results file holds (and says
why a 2-rank run is missing, on a machine with one GPU, and why training is not timed on a GPU), and
benchmarks/gpu.sh runs it with --device cuda. The
timed launches themselves run only in the benchmark."""

import json
import re

from benchmarks import summary
from tests.builders import REPO


def test_the_summary_shows_the_scaling_the_results_file_holds():
    results = json.loads((summary.RESULTS / "distributed.json").read_text())
    text = "\n".join(summary.distributed_lines(results))
    assert [kind for kind, _, _ in summary.DISTRIBUTED] == ["harvest", "sweep", "train_data", "train_modules"]
    for kind, unit, what in summary.DISTRIBUTED:  # the CPU file holds every workload
        section = results[kind]
        assert section["scaling"] == section["ranks_2"][f"{unit}_per_s"] / section["ranks_1"][f"{unit}_per_s"]
        assert (
            f"| {what}, {unit}/s | {section['ranks_1'][f'{unit}_per_s']:.1f} | "
            f"{section['ranks_2'][f'{unit}_per_s']:.1f} | {section['scaling']:.2f}× | ≥ 1.8× |"
        ) in text
    assert results["machine"]["threads_per_rank"] == 1 and results["target_scaling"] == 1.8
    assert results["training_skipped"] is None
    one_gpu = {k: v for k, v in results.items() if not k.startswith("train_")} | dict(
        skipped="2 ranks need 2 GPUs; this machine has 1",
        device="cuda",
        training_skipped="the transcoder trainer runs on the CPU only",
        harvest={"tokens": 1, "ranks_1": results["harvest"]["ranks_1"], "scaling": None},
        sweep={"pairs": 1, "ranks_1": results["sweep"]["ranks_1"], "scaling": None},
    )
    text = "\n".join(summary.distributed_lines(one_gpu))
    assert "| — | — |" in text and "2 ranks not run: 2 ranks need 2 GPUs; this machine has 1." in text
    assert not [line for line in text.splitlines() if line.startswith("| transcoder training")]
    assert "Transcoder training not timed: the transcoder trainer runs on the CPU only." in text


def test_the_gpu_script_runs_it_on_the_gpu():
    script = (REPO / "benchmarks" / "gpu.sh").read_text()
    listed = re.search(r"^BENCHMARKS=\(\n(.*?)^\)", script, flags=re.DOTALL | re.MULTILINE).group(1)
    assert any(line.strip().strip('"').split()[0] == "distributed" for line in listed.splitlines() if line.strip())
    assert '"--device"' in (REPO / "benchmarks" / "distributed.py").read_text()
