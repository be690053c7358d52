"""lab.thread_invariant: on `import lab`, MKL's matrix products give the same bits at any thread count (its strict
mode), in a process that imported torch first too; a process whose MKL chose its mode before lab was imported is
told so when it trains. Each case runs in a fresh Python, since MKL reads its mode once."""

import os
import subprocess
import sys

from tests.builders import REPO

PRODUCTS = """
import torch
a, b = torch.randn(7, 4096), torch.randn(4096, 64)  # a long inner dimension: MKL splits it among threads
products = []
for n in (1, 2, 3):
    torch.set_num_threads(n)
    products.append(a @ b)
from lab.thread_invariant import thread_invariant
print(all(torch.equal(products[0], p) for p in products[1:]), thread_invariant())
"""


def python(code: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | env
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environment, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() + done.stderr


def test_import_lab_after_torch_makes_matrix_products_the_same_at_one_two_and_three_threads():
    assert python("import torch\nimport lab\n" + PRODUCTS).splitlines()[0] == "True True"


def test_a_mode_the_user_set_is_kept():
    assert python("import lab\n" + PRODUCTS, MKL_CBWR="AUTO").splitlines()[0].endswith("False")


def test_a_process_whose_mkl_chose_its_mode_before_lab_was_imported_is_warned():
    code = """
import torch
torch.randn(2, 2) @ torch.randn(2, 2)  # MKL reads its mode here, before lab sets it
from lab.thread_invariant import thread_invariant, warn_unless_thread_invariant
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    warn_unless_thread_invariant()
print(thread_invariant(), [str(w.message) for w in caught])
"""
    out = python(code)
    assert out.startswith("False") and "depend on the thread count" in out and "MKL_CBWR=AUTO,STRICT" in out
