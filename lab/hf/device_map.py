"""Device maps: where each Forma module that holds weights lives when `lab.hf.loading.load_hf` spreads a model (a
device, the CPU, or "disk" in an offload folder), read from what Hugging Face's from_pretrained takes
(`forma_device_map`), and whether Forma can run that placement (`check_placement`)."""

from typing import Any

import torch

from lab.hf.family import Family
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer

AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate computes these from free memory


def forma_device_map(
    model: HookedTransformer,
    family: Family,
    hf_model: Any,
    device_map: Any,
    max_memory: dict | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """Each Forma module that holds weights (embed, pos_embed, blocks.{l}, ln_final, unembed) and its place:
    a device, "cpu" or "disk".

    `device_map` is what Hugging Face's from_pretrained takes: one of AUTO_MAPS (computed by accelerate on
    the Forma model, whole blocks never split), one device for everything, or a dict from module names to
    places. A dict's keys name Hugging Face modules ("model.layers.3", "lm_head", "" for the rest) or
    Forma's ("blocks.3"); a module takes the place of the longest key that names it or a module above it."""
    if isinstance(device_map, str) and device_map in AUTO_MAPS:
        device_map = _infer_device_map(model, device_map, max_memory, dtype)
    elif max_memory is not None:
        raise ValueError(f"max_memory goes with device_map {' | '.join(AUTO_MAPS)}; a given map places every module")
    elif isinstance(device_map, dict):
        known = {name for name, _ in hf_model.named_modules()} | {name for name, _ in model.named_modules()}
        unknown = sorted(str(key) for key in device_map if key not in known)
        if unknown:
            raise ValueError(
                f"device_map names modules that neither the Hugging Face model nor Forma's has: {unknown[:5]}"
            )
    else:
        device_map = {"": device_map}
    owners = {}
    for forma, hf_name in family.modules.items():
        for layer in range(model.cfg.n_layers) if "{l}" in forma else [None]:
            name = forma.format(l=layer)
            if any(True for _ in model.get_submodule(name).parameters()):
                owners[name] = hf_name.format(l=layer)
    return {forma: place_of(device_map, (forma, hf_name)) for forma, hf_name in owners.items()}


def _infer_device_map(model: HookedTransformer, how: str, max_memory: dict | None, dtype: torch.dtype) -> dict:
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    no_split = sorted({type(block).__name__ for block in model.blocks})
    if how != "sequential":
        max_memory = get_balanced_memory(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split,
            dtype=dtype,
            low_zero=how == "balanced_low_0",
        )
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split, dtype=dtype)


def place_of(device_map: dict, names: tuple[str, str]) -> Any:
    """The place the map gives a module known by either of `names` (Forma's, Hugging Face's)."""

    def covers(key: str, name: str) -> bool:
        return key == "" or key == name or name.startswith(key + ".")

    keys = [key for key in device_map if any(covers(key, name) for name in names)]
    inside = [key for key in device_map if any(key.startswith(name + ".") for name in names)]
    chosen = ([max(keys, key=len)] if keys else []) + inside  # the covering key, and any for parts of the module
    if not chosen:
        raise ValueError(f"device_map gives no place for {names[1]} (Forma's {names[0]})")
    places = {_place_name(device_map[key]) for key in chosen}
    if len(places) > 1:
        raise ValueError(
            f"device_map puts parts of {names[1]} on {sorted(places)}: Forma keeps each block (and "
            "the embedding, final norm and unembedding) whole on one device"
        )
    return device_map[chosen[0]]


def _place_name(place: Any) -> str:
    if place == "disk":
        return place
    try:
        return str(torch.device(place))
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device_map place {place!r} is not a device, 'cpu' or 'disk'") from err


def check_devices(where: Any) -> None:
    """Every device that `where` names (one device, or a device_map's places; "disk" and the AUTO_MAPS aside)
    exists on this machine: a ValueError naming the first that does not, before anything is loaded onto it."""
    places = where.values() if isinstance(where, dict) else [where]
    for place in places:
        if place is None or (isinstance(place, str) and place in (*AUTO_MAPS, "disk")):
            continue
        device = torch.device(_place_name(place))
        if device.type in ("cpu", "meta"):
            continue
        backend = getattr(torch, device.type, None)
        count = backend.device_count() if hasattr(backend, "device_count") else 0
        if (device.index or 0) >= count:
            have = (
                f"no {device.type} device"
                if count == 0
                else f"1 {device.type} device ({device.type}:0)"
                if count == 1
                else f"{count} {device.type} devices ({device.type}:0 … {device.type}:{count - 1})"
            )
            raise ValueError(f"device {place!r} is not on this machine, which has {have}")


def check_placement(placement: dict[str, Any], cfg: ModelConfig, offload_folder: Any) -> str:
    """The execution (main) device of a placement, after checking that Forma can run it: ValueError naming
    what cannot be."""
    places = {name: _place_name(place) for name, place in placement.items()}
    if "meta" in places.values():
        raise ValueError(
            "device_map puts modules on the meta device, which holds no values: use 'cpu' or 'disk' to offload them"
        )
    accelerators = [place for place in places.values() if place not in ("cpu", "disk")]
    main = places["embed"] if places["embed"] not in ("cpu", "disk") else (accelerators or ["cpu"])[0]
    offloaded = ("disk",) if main == "cpu" else ("cpu", "disk")
    if places["embed"] in offloaded:
        raise ValueError(
            f"device_map offloads the token embedding to {places['embed']!r}: Forma puts the token ids "
            "where the embedding is, so it must live on a device (give its module one, or more memory "
            "with max_memory)"
        )
    if cfg.tied_embeddings and (main if places["unembed"] in offloaded else places["unembed"]) != places["embed"]:
        raise ValueError(
            "the unembedding is tied to the token embedding: device_map must run lm_head on the "
            f"embedding's device ({places['embed']}), not {places['unembed']!r}"
        )
    if "disk" in places.values() and offload_folder is None:
        disk = [name for name, place in places.items() if place == "disk"]
        raise ValueError(f"device_map puts {disk[:4]} on disk: pass offload_folder= (a folder for their weights)")
    return main
