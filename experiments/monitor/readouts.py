"""The probe's and P(IK)'s weights in the run folder (readouts.safetensors), which the dashboard generates with."""

import json
from pathlib import Path

import torch

from experiments.monitor.config import READOUT_FILE
from lab.analysis.monitor import LinearReadout
from lab.files import atomic_write


# --------------------------------------------------------------------------------------------
# The readouts, saved and loaded
# --------------------------------------------------------------------------------------------
def save_readouts(out: Path, probe: LinearReadout | None, p_ik: LinearReadout | None, signs: dict[str, int]) -> None:
    """The probe's and P(IK)'s weights (safetensors), their hooks, biases, positions and the signs (metadata)."""
    from safetensors.torch import save_file

    tensors, meta = {}, {"signs": signs}
    for name, readout in (("probe", probe), ("p_ik", p_ik)):
        if readout is not None:
            tensors[name] = readout.weight.contiguous()
            meta[name] = {"hook": readout.hook, "bias": readout.bias, "position": readout.position}
    if not tensors:
        tensors["none"] = torch.zeros(0)
    # One metadata key, its JSON's keys sorted: safetensors writes several keys in an order that differs from run
    # to run, and the same seed must give the same bytes.
    header = {"readouts": json.dumps(meta, sort_keys=True)}
    atomic_write(out / READOUT_FILE, lambda path: save_file(tensors, str(path), metadata=header))


def load_readouts(folder: Path) -> tuple[LinearReadout | None, LinearReadout | None, dict[str, int]]:
    """What `save_readouts` wrote: (probe, p_ik, signs)."""
    from safetensors import safe_open

    from lab.outside_files import parse_json, regular_file

    path = Path(folder) / READOUT_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {READOUT_FILE} in {folder}: run `forma run monitor` to make one")
    with safe_open(str(regular_file(path, folder, what="readouts file")), framework="pt") as f:
        header = f.metadata() or {}
        if "readouts" in header:
            meta = parse_json(header["readouts"], path)
        else:  # a file written before the metadata was one key: each entry its own JSON text
            meta = {name: parse_json(text, path) for name, text in header.items() if name in ("probe", "p_ik", "signs")}
        readouts = []
        for name in ("probe", "p_ik"):
            info = meta.get(name)
            readouts.append(
                None
                if info is None
                else LinearReadout(info["hook"], f.get_tensor(name), float(info["bias"]), info["position"])
            )
    return readouts[0], readouts[1], meta.get("signs", {})
