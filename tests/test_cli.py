"""The `forma` command line: truthful help, clear errors, exit codes."""

import subprocess
import sys

import pytest

from lab.cli import main
from lab import HookedTransformer
from tests.conftest import tiny_config


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "hooks" in capsys.readouterr().out


def test_hooks_lists_names_and_shapes(tmp_path, capsys):
    HookedTransformer(tiny_config()).save(tmp_path)
    assert main(["hooks", str(tmp_path), "--tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "blocks.1.attn.hook_pattern" in out and "[1, 4, 5, 5]" in out


def test_unknown_model_is_a_clear_error_with_exit_code_2(capsys):
    assert main(["hooks", "no-such-model"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "lab.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("forma ")
