"""The process group under torchrun, and what every distributed workload of Forma is made of.

One process (no group) is rank 0 of a world of 1, and every function here then does the one-process thing, so a
workload has one code path. The engine is torch.distributed (torchrun: gloo on CPU, NCCL on GPU); nothing here
schedules anything itself.

    init_distributed, rank_world, close_distributed   join the group torchrun describes, who am I, leave it
                                                      (a rank ends when its launcher dies: `end_with_launcher`)
    barrier                                           wait until every rank has come
    all_ranks_sum, any_rank                           a sum and a flag across ranks (the training loop's DDP)
    all_gather_json, all_gather_rows                  small JSON values and tensor rows from every rank, in rank
                                                      order, on every rank (no pickle: bytes and tensors only)
    plan_parts, share                                 N items cut into parts whose bounds never depend on the world
                                                      size; a rank's contiguous share of a list
    record_plan                                       a resumable job's arguments, written once to DIR/plan.json
                                                      and compared on every rerun (a changed one is named)
    claim_parts                                       which parts are done already (on any rank's disk) and which
                                                      ones this rank is to do now

A resumable workload over N items (lab.analysis.activations.harvest, lab.analysis.sweeps) reads:

    record_plan(out_dir, {...its arguments...}, overwrite=overwrite, what="harvest")
    parts = plan_parts(n, unit=batch_size)                    # the same at any world size
    kept, mine = claim_parts(len(parts), done=lambda i: part_file(i).is_file())
    for i in mine: do(parts[i])                               # written atomically: present means done
    everything = all_gather_json(...) / all_gather_rows(...)  # what kept + mine hold, gathered
    if rank == 0: write the merged manifest / tables

A killed rank (SIGKILL included) loses at most the part it was doing — less where a part resumes itself, as an
activation set does shard by shard — and the same command run again does only what is missing, shared out afresh
over however many ranks it now has. Because the parts do not depend on the world size, neither does anything a
workload computes from them: K ranks write what one process writes.
"""

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from lab.files import atomic_write_text
from lab.progress import bar

LAUNCHER_POLL_S = 0.5  # how often a rank looks whether its launcher still runs
TERM_GRACE_S = 10.0  # how long a rank told to end by SIGTERM has before SIGKILL ends it
PARTS = 256  # parts a job is cut into at most: enough to share out evenly over up to a few hundred ranks
PLAN_FILE = "plan.json"

T = TypeVar("T")


def init_distributed(device: str = "cpu", timeout_s: float | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...) when
    WORLD_SIZE > 1 — gloo on CPU, NCCL on CUDA, each rank on the GPU of its LOCAL_RANK — and return (rank, world
    size). timeout_s: how long a collective waits for the slowest rank (torch's default when None); a workload
    whose ranks meet only at the end passes a long one."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as err:
        raise ValueError(f"WORLD_SIZE must be an integer, got {os.environ['WORLD_SIZE']!r}") from err
    if world > 1 and not dist.is_initialized():
        options = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
        if torch.device(device).type == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            if local >= torch.cuda.device_count():
                raise ValueError(
                    f"local rank {local} has no GPU: this machine has {torch.cuda.device_count()}; "
                    "start at most that many processes per node (--nproc-per-node)"
                )
            torch.cuda.set_device(local)
            dist.init_process_group(backend="nccl", **options)
        else:
            dist.init_process_group(backend="gloo", **options)
        end_with_launcher()
    return rank_world()


def end_with_launcher() -> None:
    """End this process when the process that started it (torchrun's launcher) has died: a daemon thread looks every
    LAUNCHER_POLL_S whether this process's parent has changed (a killed parent's children are handed to another),
    and then sends this process SIGTERM — and SIGKILL TERM_GRACE_S later, where a handler or a collective holds the
    first. A launcher killed any way, SIGKILL included, leaves no rank running unsupervised; nothing is lost, since
    every file is written atomically and the same command resumes."""
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(LAUNCHER_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(TERM_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="forma-launcher-watch", daemon=True).start()


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    """Every rank waits here until all have come (nothing, in one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def close_distributed() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_ranks_sum(value: Tensor, world: int) -> float:
    if world > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value.item()


def any_rank(flag: bool, world: int, device: torch.device) -> bool:
    """True on every rank when it is True on any (so that all ranks stop after the same step)."""
    if world == 1:
        return flag
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def collective_device() -> torch.device:
    """Where the group's collectives take their tensors: this rank's GPU under NCCL, else the CPU."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_rows(rows: Tensor) -> Tensor:
    """Every rank's `rows` ([n_r, *shape]; the same shape and dtype on every rank, n_r free), concatenated in rank
    order on every rank, on the CPU. The bytes travel unchanged: NaN and −0.0 arrive as they left."""
    _, world = rank_world()
    if world == 1:
        return rows.cpu()
    device = collective_device()
    count = torch.tensor([rows.shape[0]], dtype=torch.long, device=device)
    counts = [torch.empty_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    sizes = [int(c.item()) for c in counts]
    padded = torch.zeros((max(sizes), *rows.shape[1:]), dtype=rows.dtype, device=device)
    padded[: rows.shape[0]] = rows
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return torch.cat([g[:n].cpu() for g, n in zip(gathered, sizes)])


def all_gather_json(value: Any) -> list[Any]:
    """Every rank's `value` (anything json.dumps takes), in rank order, on every rank: sent as UTF-8 bytes, read
    back with json.loads (nothing a rank sends is ever unpickled)."""
    _, world = rank_world()
    if world == 1:
        return [json.loads(json.dumps(value))]
    data = torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)
    device = collective_device()
    count = torch.tensor([data.numel()], dtype=torch.long, device=device)
    counts = [torch.empty_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    sizes = [int(c.item()) for c in counts]
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[: data.numel()] = data.to(device)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return [json.loads(bytes(g[:n].cpu().numpy())) for g, n in zip(gathered, sizes)]


def plan_parts(n: int, *, unit: int = 1, most: int = PARTS) -> list[range]:
    """Items 0 … n − 1 cut into at most `most` contiguous parts of nearly equal size whose bounds fall on
    multiples of `unit` (a batch: a part never splits one) — a function of (n, unit, most) alone, never of the
    world size, so that every world size does the same parts."""
    if n < 0 or unit < 1 or most < 1:
        raise ValueError(f"plan_parts needs n ≥ 0, unit ≥ 1 and most ≥ 1, got {n}, {unit}, {most}")
    units = -(-n // unit)
    k = min(most, units)
    bounds = [min(n, units * j // k * unit) for j in range(k + 1)] if k else [0]
    return [range(a, b) for a, b in pairwise(bounds)]


def share(items: Sequence[T], rank: int, world: int) -> Sequence[T]:
    """Rank `rank`'s contiguous share of `items`: the shares of ranks 0 … world − 1 are in order, cover the items
    once, and differ in length by one at most. (A trainer of one dictionary per hook site gives each rank its
    share of the sites this way.)"""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} out of range for a world of {world}")
    return items[len(items) * rank // world : len(items) * (rank + 1) // world]


def claim_parts(n_parts: int, done: Callable[[int], bool]) -> tuple[list[int], list[int]]:
    """(kept, mine): the parts done already that this rank holds, and the parts it is to do now.

    Each rank asks `done(i)` of its own disk; a part any rank reports done is kept by one of the ranks that report
    it (on a shared filesystem every rank sees every part, and they take turns), and the parts no rank has are
    shared out evenly (`share`). Every part is in exactly one rank's kept + mine. A collective: every rank calls
    it."""
    rank, world = rank_world()
    here = [i for i in range(n_parts) if done(i)]
    reporters: dict[int, list[int]] = {}
    for r, parts in enumerate(all_gather_json(here)):
        for i in parts:
            reporters.setdefault(i, []).append(r)
    kept = sorted(i for i, ranks in reporters.items() if ranks[i % len(ranks)] == rank)
    todo = [i for i in range(n_parts) if i not in reporters]
    return kept, list(share(todo, rank, world))


def parts_bar(total: int, unit: str, what: str, progress: bool) -> Any:
    """The progress bar (`lab.progress.bar`) of this rank's parts: shown on rank 0 only (when `progress`), labelled
    `what` and, across ranks, with the world's size."""
    rank, world = rank_world()
    return bar(total, what if world == 1 else f"{what}, rank 0 of {world}", unit=unit, show=progress and rank == 0)


def record_plan(directory: str | Path, plan: dict[str, Any], *, overwrite: bool = False, what: str = "job") -> None:
    """Write `plan` (a job's arguments, JSON) to directory/plan.json, or check it against the one a first run wrote
    there: a rerun with other arguments is a ValueError naming the first that differs, unless `overwrite` (then the
    new plan replaces the old). Every rank may call it: each writes the same bytes atomically."""
    directory = Path(directory)
    path = directory / PLAN_FILE
    plan = json.loads(json.dumps(plan))
    if path.is_file() and not overwrite:
        try:
            recorded = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"malformed {path} ({err}); start afresh with overwrite") from err
        differing = [k for k in sorted(set(recorded) | set(plan)) if recorded.get(k) != plan.get(k)]
        if differing:
            key = differing[0]
            raise ValueError(
                f"{directory} holds a {what} begun with other arguments ({key}: {recorded.get(key)!r} "
                f"then, {plan.get(key)!r} now); rerun it with the same arguments to resume it, or "
                "start afresh with overwrite"
            )
        return
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(plan, indent=2) + "\n")
