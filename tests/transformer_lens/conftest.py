"""TransformerLens's own test files, run on Forma's HookedTransformer and on TransformerLens 3.9's (the reference)
over the same tiny weights, in the SAE environment (transformer-lens 3.9: `make test-sae`).

Each ported file (PORTED) is collected twice, as `FILE::reference::…` and `FILE::forma::…`: its module is
imported once per implementation with `tests.transformer_lens.under_test` set to it, so that its module-level
code (`model = HookedTransformer.from_pretrained(...)`) and its test functions run as TransformerLens wrote them,
only the model under test substituted. An upstream test that cannot pass on a tiny stand-in checkpoint is an
expected failure on both implementations, with its reason (expected.py); strict, so that one that starts to pass
is noticed. Every outcome is recorded, and a run of the whole folder writes the table docs/measured/
transformer_lens.json (upstream file, tests, passing on the reference, passing on Forma) that docs/ecosystem.md
and README.md quote; test_table.py, collected last, holds the run to that file and to the promise that every test
that passes on the reference passes on Forma.
"""

import json
import sys
import traceback
from pathlib import Path

import pytest

from tests.transformer_lens.expected import BOTH, FORMA_GAPS, PORTED
from tests.transformer_lens.models import ALIASES, CHECKPOINTS, IMPLEMENTATIONS, checkpoint
from tests.transformer_lens.run_record import COLLECTED, COMPLETE, HERE, TABLE, complete, outcomes, record, table
from tests.transformer_lens.under_test import implementation



def pytest_configure(config):
    """As upstream's tests/conftest.py: torch's generator seeded for the session."""
    import torch

    config.stash[COMPLETE] = True
    torch.manual_seed(42)


def pytest_pycollect_makemodule(module_path, parent):
    if Path(module_path).resolve().parent == HERE and Path(module_path).name in PORTED:
        return Ported.from_parent(parent, path=Path(module_path))
    return None


class Ported(pytest.File):
    """One upstream test file: a module per implementation."""

    def collect(self):
        for name in IMPLEMENTATIONS:
            yield Twin.from_parent(self, path=self.path, name=name, nodeid=f"{self.nodeid}::{name}")


class Twin(pytest.Module):
    """The upstream file imported for one implementation (its own module object, imported afresh)."""

    def _getobj(self):
        name = f"tests.transformer_lens.{self.path.stem}"
        sys.modules.pop(name, None)
        try:
            with implementation(self.name):
                seed()  # the module's own code draws the same numbers for both implementations
                return super()._getobj()
        finally:
            sys.modules.pop(name, None)  # the other implementation's import starts afresh

    def collect(self):
        try:
            return list(super().collect())
        except Exception:  # its module-level code failed for this implementation: one failing item says why
            return [ImportFailed.from_parent(self, name="import", reason=traceback.format_exc(limit=-6))]


class ImportFailed(pytest.Item):
    originalname, fixturenames = "import", ()

    def __init__(self, *, reason: str, **kwargs):
        super().__init__(**kwargs)
        self.reason = reason

    def runtest(self):
        raise RuntimeError(f"the ported file's module-level code failed:\n{self.reason}")

    def reportinfo(self):
        return self.path, 0, f"{self.name}: import"


def seed() -> None:
    """torch's and Python's generators seeded: each test (and each module's import) of a ported file draws the same
    numbers on both implementations, so a model built from a TransformerLens config has the same weights on both."""
    import random

    import torch

    random.seed(42)
    torch.manual_seed(42)


def pytest_runtest_setup(item):
    if upstream_id(item.nodeid) is not None:
        seed()


def upstream_id(nodeid: str) -> tuple[str, str, str] | None:
    """(file, implementation, test) of a ported test's node id; None for any other node."""
    parts = nodeid.split("::")
    if len(parts) < 3 or not parts[0].startswith("tests/transformer_lens/") or parts[1] not in IMPLEMENTATIONS:
        return None
    return Path(parts[0]).name, parts[1], "::".join(parts[2:])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Mark the expected failures (on both implementations), and move test_table.py's checks last."""
    for item in items:
        found = upstream_id(item.nodeid)
        if found is None:
            continue
        file, implementation, test = found
        reason = BOTH.get(f"{file}::{test}")
        if reason is None and implementation == "forma" and f"{file}::{test}" in FORMA_GAPS:
            reason = f"Forma's HookedTransformer has no {FORMA_GAPS[f'{file}::{test}']}"
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
    items.sort(key=lambda item: Path(item.nodeid.split("::")[0]).name == "test_table.py")
    COLLECTED.update(found for item in items if (found := upstream_id(item.nodeid)) is not None)


def pytest_deselected(items):
    for item in items:
        if upstream_id(item.nodeid) is not None:
            item.config.stash[COMPLETE] = False


def pytest_runtest_logreport(report):
    found = upstream_id(report.nodeid)
    if found is not None:
        record(found, report)


def pytest_sessionfinish(session, exitstatus):
    """A run of the whole folder writes its table (docs/measured/transformer_lens.json)."""
    if complete(session.config):
        TABLE.write_text(json.dumps(table(outcomes()), indent=1, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def gpt2_model(request):
    """TransformerLens's acceptance fixture (tests/acceptance/conftest.py): gpt2 with the default weight processing,
    of the implementation under test."""
    return IMPLEMENTATIONS[request.node.getparent(Twin).name].from_pretrained("gpt2", device="cpu")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one intra-op thread each (tests/conftest.py's one_thread)."""
    yield


@pytest.fixture(autouse=True, scope="session")
def _the_stand_ins_by_name():
    """`AutoTokenizer` / `AutoModelForCausalLM.from_pretrained` of an upstream model name give its stand-in's tokenizer
    and Hugging Face model: both are the model under test. Every call, of any name, reads local files only and runs
    no code of the folder's (local_files_only=True, trust_remote_code=False): nothing is fetched from a hub."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    patch = pytest.MonkeyPatch()
    for auto in (AutoTokenizer, AutoModelForCausalLM):
        original = auto.from_pretrained.__func__

        def from_pretrained(cls, name, *args, original=original, **kwargs):
            if isinstance(name, str) and (name in CHECKPOINTS or name in ALIASES):
                name = str(checkpoint(name))
            return original(cls, name, *args, **(kwargs | {"local_files_only": True, "trust_remote_code": False}))

        patch.setattr(auto, "from_pretrained", classmethod(from_pretrained))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    """Upstream's tests/conftest.py fixture: GPT-2's tokenizer, here its stand-in's."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained("gpt2")


@pytest.fixture(scope="module")
def gpt2_hooked_processed(request):
    """Upstream's tests/conftest.py fixture: gpt2 processed, of the implementation under test."""
    return IMPLEMENTATIONS[request.node.getparent(Twin).name].from_pretrained("gpt2", device="cpu")
