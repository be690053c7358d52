"""The overview's hook example (docs/overview.md), run on the real model: its reads and writes as written, with
smollm2 and text in place of the random model and token ids it builds."""

import re

import pytest

from tests.builders import DOCS, smollm2_folder

pytestmark = pytest.mark.real


def test_the_overviews_hook_example_runs_on_smollm2():
    smollm2_folder()
    overview = (DOCS / "overview.md").read_text()
    example = next(b for b in re.findall(r"```python\n(.*?)```", overview, re.S) if "run_with_cache" in b)
    built = re.search(r"cfg = ModelConfig\(.*?\ntokens = [^\n]*\n", example, re.S)
    assert built, "the overview's example builds a model and its tokens"
    real = (
        'model = HookedTransformer.from_pretrained("smollm2")\n'
        'tokens = model.to_tokens(["The capital of Italy is", "When Mary and John went to the store, John gave"])\n'
    )
    namespace: dict = {}
    exec(compile(example.replace(built.group(0), real), "docs/overview.md", "exec"), namespace)
    assert namespace["pattern"].shape[1] == 9 and namespace["ablated"].shape == namespace["logits"].shape
