"""Keep freed tensor memory in the process, so that repeated caching does not page-fault afresh.

`run_with_cache` keeps every cached activation alive until the cache is dropped, so each call
allocates its activations in new memory (≈ 100 MB for a 4-layer d_model 256 model on 8 × 128 tokens).
glibc's malloc hands large freed blocks back to the operating system — its mmap and trim
thresholds adapt only up to 32 MB and 64 MB — and the next call then pays a page fault for every
4 KB page it touches again: about a tenth of the forward pass on CPU (measured by
`benchmarks/forward.py`). Fixing both thresholds keeps up to `keep_bytes` of freed memory for reuse,
the glibc form of the allocator tuning PyTorch's CPU performance guide recommends (which otherwise
means preloading jemalloc or tcmalloc). Blocks larger than 32 MB are still mapped and unmapped on
their own, and what is kept is bounded by `keep_bytes`.

Forma applies this once, on `import lab`; elsewhere than glibc it does nothing. Set the environment
variable FORMA_KEEP_FREED_MEMORY=0 to leave the allocator as it is.
"""

import ctypes
import ctypes.util
import functools
import os

M_TRIM_THRESHOLD = -1  # <malloc.h>: free memory kept at the top of the heap before it is returned
M_MMAP_THRESHOLD = -3  # <malloc.h>: allocations at least this large get their own mapping
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit systems


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has mallopt and malloc_trim); None elsewhere."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is None or not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
            return None
    except OSError:
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def keep_freed_memory(keep_bytes: int = 1 << 30) -> bool:
    """Ask glibc to keep up to `keep_bytes` of freed heap for reuse; True when the allocator took it.

    Both thresholds must be set together: fixing the trim threshold alone also freezes the mmap
    threshold at its 128 KB start, which sends every activation to its own mapping.
    """
    libc = _glibc()
    if libc is None or os.environ.get("FORMA_KEEP_FREED_MEMORY", "1") == "0":
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, int(keep_bytes))
    )


def release_freed_memory() -> None:
    """Hand the memory freed so far back to the OS now (glibc's malloc_trim; elsewhere nothing).

    For long streams that should stay near one batch's footprint: malloc_trim(0) after each batch cut
    the peak of streaming 640 pydoc-sized batches from 235–290 MB to 195 MB
    (benchmarks/activations.py, 2 busy cores).
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
