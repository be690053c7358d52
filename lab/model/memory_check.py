"""Whether a model's weights fit where torch would allocate them, checked before building it."""

from pathlib import Path

import torch


def check_fits_in_memory(what: str, n_params: int, n_buffer_elements: int = 0) -> None:
    """Refuse, before allocating, a model whose weights cannot fit where they would be allocated (torch's
    default device and dtype): a clear error at once instead of minutes of building or an allocator's
    failure. Shapes on the meta device cost nothing and are always allowed."""
    device, dtype = torch.get_default_device(), torch.get_default_dtype()
    if device.type == "meta":
        return
    needed = (n_params + n_buffer_elements) * dtype.itemsize
    available = available_memory(device)
    if available is not None and needed > available:
        raise ValueError(
            f"{what} of {n_params:,} parameters needs {needed / 2**30:,.1f} GiB ({dtype}) but "
            f"{device} has {available / 2**30:,.1f} GiB available: make the model smaller (or build it "
            "under `with torch.device('meta')` to count its parameters)"
        )


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on `device`: a GPU's free memory, or on CPU what Linux reports available
    (MemAvailable), capped by the cgroup's limit when the process runs in one; None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    free: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free.append(int(line.split()[1]) * 1024)
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(free) if free else None
