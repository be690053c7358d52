"""Matrix products whose bits do not depend on the number of threads.

torch's CPU matrix products are MKL's sgemm. On a CPU with AVX-512, MKL splits a long inner dimension among the
threads and adds the partial sums, so `a @ b` at one thread and at two differ in the last bits
(tests/lab/test_thread_invariant.py, on a 7 × 4096 by 4096 × 64 product).
MKL's strict conditional numerical reproducibility (`MKL_CBWR=AUTO,STRICT`: the fastest code path the CPU has,
with sums in one order at any thread count) takes that away. MKL reads the setting once, at its first call, so
Forma sets it on `import lab`, before torch's first matrix product, unless MKL_CBWR is already set.

A process that ran a matrix product before importing lab keeps MKL's default; `thread_invariant()` says whether
the running MKL is in strict mode, and training warns once when it is not.
"""

import ctypes
import functools
import os
import warnings
from pathlib import Path

STRICT_MODE = "AUTO,STRICT"
MKL_CBWR_STRICT = 0x10000  # mkl_cbwr.h: the strict flag of the mode MKL runs in
MKL_CBWR_ALL = -1  # mkl_cbwr.h: the whole mode, branch and flags


def ask_for_strict_mode() -> None:
    """Set MKL_CBWR for MKL to read at its first call (a value the user set is kept)."""
    os.environ.setdefault("MKL_CBWR", STRICT_MODE)


@functools.cache
def _mkl_mode_reader():
    """MKL's mode reader in torch's CPU library, or None where torch has no MKL (another BLAS, another platform)."""
    import torch

    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        reader = ctypes.CDLL(str(library)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    reader.argtypes, reader.restype = [ctypes.c_int], ctypes.c_int
    return reader


def thread_invariant() -> bool | None:
    """Whether torch's matrix products give the same bits at any thread count: True in MKL's strict mode, False
    in another, None where torch runs no MKL (nothing is known then)."""
    reader = _mkl_mode_reader()
    if reader is None:
        return None
    return bool(reader(MKL_CBWR_ALL) & MKL_CBWR_STRICT)


def warn_unless_thread_invariant() -> None:
    """A warning (once per place) when MKL runs outside strict mode: the bits then depend on the thread count."""
    if thread_invariant() is False:
        warnings.warn(
            f"MKL is not in strict mode (MKL_CBWR={os.environ.get('MKL_CBWR', 'unset')}), so this training's bits "
            f"depend on the thread count: import lab before torch's first matrix product, or set "
            f"MKL_CBWR={STRICT_MODE}",
            RuntimeWarning,
            stacklevel=3,
        )
