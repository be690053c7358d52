"""Nothing leaves the machine: the CLI (`forma trust`, `forma hooks`, `forma run calibration --model … --mmlu …`)
and the TransformerBridge run on local folders in a process whose sockets refuse every connection and record
the attempt — with the hub's offline switches unset, so that only Forma itself keeps the hub out."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests.builders import REPO, hf_model, letter_tokenizer

# Loaded by the subprocess's `site` at start-up (it is first on PYTHONPATH): every way Python opens a
# connection or resolves a name writes the attempt, with its stack, to FORMA_NETWORK_LOG and fails.
SITECUSTOMIZE = """
import os, socket, traceback

_LOG = os.environ["FORMA_NETWORK_LOG"]


def _refuse(what):
    def refuse(*args, **kwargs):
        with open(_LOG, "a") as log:
            log.write(f"{what} {args!r}\\n")
            log.write("".join(traceback.format_stack(limit=8)) + "\\n")
        raise OSError(f"the network is unavailable in this test ({what})")
    return refuse


socket.socket.connect = _refuse("connect")
socket.socket.connect_ex = _refuse("connect_ex")
socket.create_connection = _refuse("create_connection")
socket.getaddrinfo = _refuse("getaddrinfo")
socket.gethostbyname = _refuse("gethostbyname")
socket.gethostbyname_ex = _refuse("gethostbyname_ex")
"""

SCRIPT = """
import sys
from pathlib import Path

from lab.cli.parser import main
from lab.hf.loading import bridge

model, bare, csv_path, out = (Path(p) for p in sys.argv[1:5])
assert main(["trust", str(model)]) == 0
assert main(["hooks", str(model)]) == 0
assert main(["run", "calibration", "--quick", "--model", str(model), "--mmlu", str(csv_path), "--out", str(out)]) == 0
assert main(["hooks", str(bare)]) == 0  # no tokenizer: a converted model needs none
wrapped = bridge(model)
assert wrapped.tokenizer is not None
try:
    bridge(bare)
except FileNotFoundError as err:
    assert "tokenizer" in str(err)
else:
    raise AssertionError("a folder without a tokenizer was bridged")
print("all ran")
"""


@pytest.mark.slow
def test_no_connection_is_attempted(tmp_path):
    model, bare = tmp_path / "gpt2", tmp_path / "bare"
    hf_model("gpt2").save_pretrained(model)
    letter_tokenizer(model)
    hf_model("gpt2").save_pretrained(bare)
    csv_path = tmp_path / "mmlu.csv"
    rows = [f"w{i} w{i + 1} w{i + 2},w{i + 3},w{i + 4},w{i + 5},w{i + 6},{'ABCD'[i % 4]}" for i in range(40)]
    csv_path.write_text("question,A,B,C,D,answer\n" + "\n".join(rows) + "\n")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "network.log"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {
        "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}",
        "FORMA_NETWORK_LOG": str(log),
        "HF_HOME": str(tmp_path / "hf-home"),
        "FORMA_RUNS_DIR": str(tmp_path / "runs"),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(model), str(bare), str(csv_path), str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    attempts = log.read_text() if log.exists() else ""
    assert attempts == "", f"connection attempts:\n{attempts}"
    assert done.returncode == 0 and "all ran" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


def test_the_network_guard_records_an_attempt(tmp_path):
    """The guard the test above relies on: a connection attempt is recorded and refused."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "network.log"
    env = os.environ | {"PYTHONPATH": str(tmp_path), "FORMA_NETWORK_LOG": str(log)}
    code = (
        "import urllib.request\n"
        "try:\n    urllib.request.urlopen('http://example.com', timeout=1)\nexcept OSError:\n    pass\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert "example.com" in log.read_text()
