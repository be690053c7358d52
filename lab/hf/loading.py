"""Loading a local Hugging Face folder: `load_hf` converts it into a HookedTransformer (on one device, or
block by block into the places a device map gives), `bridge` wraps any other causal LM in TransformerLens's
TransformerBridge. Both read the folder through `lab.hf.folder`, strictly, and fetch nothing from a hub.

Big models: `load_hf(path, device_map=...)` converts one block at a time into a model whose parameters
start on the meta device, puts each block where the map says (a device, the CPU, or an offload folder
on disk) and lets accelerate move the offloaded ones in around their forward pass. The folder's
weights are read straight from its safetensors (transformers indexes them without loading anything),
so memory holds the placed model plus one block being converted, never a second copy of the model."""

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lab.files import check_writable
from lab.hf.convert import (
    assign,
    check_against_config,
    convert_into,
    empty_model,
    family_of,
    from_hf,
    model_config,
)
from lab.hf.device_map import check_devices, check_placement, forma_device_map, place_of
from lab.hf.family import Family, UnsupportedArchitecture
from lab.hf.folder import TOKENIZER_FILES, local_tokenizer, quiet_transformers, read_hf_config, read_hf_folder
from lab.model.transformer import HookedTransformer


def load_hf(
    path: str | Path,
    device: str | torch.device | None = None,
    *,
    dtype: torch.dtype | str = torch.float32,
    device_map: Any = None,
    max_memory: dict | None = None,
    offload_folder: str | Path | None = None,
) -> HookedTransformer:
    """A HookedTransformer from a local Hugging Face `save_pretrained` folder (with its tokenizer if present),
    in eval mode, its weights in `dtype` ("auto": the folder's own, as config.json records it).

    Either on one `device` (default the CPU), or spread by `device_map` (see `forma_device_map`): blocks on
    devices, on the CPU, or on disk in `offload_folder`, where accelerate loads each offloaded block's weights
    in around its forward pass. The folder must hold exactly what its config.json describes (see
    `read_hf_folder`). `offload_folder` must be new or empty: the weights offloaded into it are its only files."""
    path = Path(path)
    config = read_hf_config(path)
    family = family_of(config.model_type)
    if device_map is not None and device is not None:
        raise ValueError("give load_hf a device or a device_map, not both")
    check_devices(device_map if device_map is not None else device)
    dtype = _loaded_dtype(config, dtype)
    tokenizer = local_tokenizer(path)
    with fresh_offload_folder(offload_folder if device_map is not None else None):
        try:
            if device_map is None:
                return from_hf(read_hf_folder(path, dtype=dtype), tokenizer=tokenizer, dtype=dtype).to(device or "cpu")
            return _load_dispatched(path, family, tokenizer, dtype, device_map, max_memory, offload_folder)
        except UnsupportedArchitecture:
            raise
        except ValueError as err:
            raise ValueError(f"{path / 'config.json'}: {err}") from err


@contextmanager
def fresh_offload_folder(folder: str | Path | None) -> Iterator[None]:
    """Hold `folder` (when one is given) for offloaded weights: made when absent, taken when empty, and refused —
    a ValueError naming it — when it is a file, holds files (an activation set, a model folder: nothing in it is
    ever overwritten) or cannot be written. If loading fails, what it wrote there is removed again."""
    if folder is None:
        yield
        return
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"offload_folder {folder} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        held = sorted(p.name for p in folder.iterdir())
        raise ValueError(
            f"offload_folder {folder} is not empty (it holds {', '.join(held[:3])}"
            f"{f' and {len(held) - 3} more' if len(held) > 3 else ''}): offloaded weights go only into "
            "a new or empty folder of their own; give another, or empty this one"
        )
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"cannot create the offload_folder {folder}: {err.strerror or err}") from err
    try:
        check_writable(folder, "offload_folder")
        yield
    except BaseException:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            for leftover in folder.iterdir():
                shutil.rmtree(leftover) if leftover.is_dir() and not leftover.is_symlink() else leftover.unlink()
        raise


def _loaded_dtype(config: Any, dtype: torch.dtype | str) -> torch.dtype:
    """`dtype`, or for "auto" the one the folder's config.json records (float32 when it records none)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        raise ValueError(f"dtype must be a torch.dtype (torch.bfloat16, ...) or 'auto', got {dtype!r}")
    recorded = getattr(config, "dtype", None) or torch.float32
    return recorded if isinstance(recorded, torch.dtype) else getattr(torch, str(recorded))


def _load_dispatched(
    path: Path,
    family: Family,
    tokenizer: Any,
    dtype: torch.dtype,
    device_map: Any,
    max_memory: dict | None,
    offload_folder: str | Path | None,
) -> HookedTransformer:
    """Convert block by block into an empty model, placing each tensor as the map says, then dispatch."""
    from accelerate import dispatch_model
    from accelerate.utils import offload_weight, save_offload_index

    with tempfile.TemporaryDirectory(prefix="forma-hf-") as staging:
        # Everything "on disk": transformers checks the folder and indexes its safetensors, loading nothing.
        hf = read_hf_folder(path, dtype=dtype, device_map={"": "disk"}, offload_folder=staging)
        with quiet_transformers():
            check_against_config(hf)
        model = empty_model(model_config(family, hf.config), tokenizer)
        placement = forma_device_map(model, family, hf, device_map, max_memory, dtype)
        main = check_placement(placement, model.cfg, offload_folder)
        index: dict[str, Any] = {}

        def place(name: str, tensor: Tensor) -> None:
            where = place_of(placement, (name, name))
            if where == "disk":  # written to the offload folder; the parameter stays a shape, in its dtype
                offload_weight(tensor.to(dtype).contiguous(), name, str(offload_folder), index)
                assign(model, name, tensor, "meta", dtype)
            else:
                assign(model, name, tensor, where, dtype)

        convert_into(model, family, hf, place)
        save_offload_index(index, str(offload_folder))
    dispatch_model(
        model,
        device_map=placement,
        main_device=main,
        offload_dir=None if offload_folder is None else str(offload_folder),
    )
    model.hf_device_map = placement  # accelerate's name for where a dispatched model's modules live
    return family.set_defaults(model).eval()


def bridge(
    path: str | Path,
    device: str | None = None,
    *,
    dtype: torch.dtype | str | None = None,
    device_map: Any = None,
    max_memory: dict | None = None,
    offload_folder: str | Path | None = None,
) -> Any:
    """Any local HF causal LM wrapped by TransformerLens's TransformerBridge (hooked, not converted).

    `dtype`, `device_map`, `max_memory` and `offload_folder` go to Hugging Face's from_pretrained (accelerate
    places the model); without a device_map the model goes to `device` (default the CPU). The folder must
    hold its tokenizer: without one TransformerBridge would look the model's name up on a model hub, and
    nothing in Forma reaches the network. `offload_folder` must be new or empty, as for `load_hf`."""
    from transformer_lens.model_bridge import TransformerBridge

    path = Path(path)
    config = read_hf_config(path)
    tokenizer = local_tokenizer(path)
    if tokenizer is None:
        raise FileNotFoundError(
            f"{path} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): TransformerBridge needs one, and would "
            "otherwise fetch it from a model hub. Save it beside the model: tokenizer.save_pretrained(folder)"
        )
    if device_map is not None and device is not None:
        raise ValueError("give bridge a device or a device_map, not both")
    check_devices(device_map if device_map is not None else device)
    options: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
    if device_map is not None:
        options |= {
            "device_map": device_map,
            "max_memory": max_memory,
            "offload_folder": None if offload_folder is None else str(offload_folder),
        }
    with fresh_offload_folder(offload_folder if device_map is not None else None):
        hf = read_hf_folder(path, **options)
    if device_map is None:
        hf = hf.to(device or "cpu")
    name = config.architectures[0] if config.architectures else config.model_type
    # With a device_map the bridge reads the devices from the model; without one, it is told the device.
    return TransformerBridge.boot_transformers(
        name,
        hf_model=hf,
        tokenizer=tokenizer,
        trust_remote_code=False,
        device=None if device_map is not None else device or "cpu",
    )
