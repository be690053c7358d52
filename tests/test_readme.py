"""The README's Python examples run exactly as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_a_hook_api_example():
    assert any("run_with_cache" in block and "run_with_hooks" in block for block in python_blocks())


def test_readme_examples_run():
    for block in python_blocks():
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
