"""Token-level calibration of English next-token predictions (the pydoc model), layer by layer."""

from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from experiments.calibration.config import Config
from lab.analysis.lens import logit_lens
from lab.metrics.calibration import ece_fields, reliability
from lab.model.transformer import HookedTransformer


# --------------------------------------------------------------------------------------------
# Token-level calibration of English next-token predictions (the pydoc model), layer by layer
# --------------------------------------------------------------------------------------------
def pydoc_model(out: Path) -> tuple[HookedTransformer, str]:
    """The pydoc zoo model, or — when it is not trained — its quick recipe trained into the run folder."""
    from lab.folders import is_trained
    from lab.zoo.building import build

    if is_trained("pydoc"):
        return HookedTransformer.from_pretrained("pydoc"), "zoo model pydoc"
    directory = build("pydoc", quick=True, progress=False, out=Path(out) / "pydoc-quick")
    return HookedTransformer.load(directory), (
        "pydoc quick recipe trained into the run folder (pydoc-quick/): models/pydoc/model.safetensors is missing"
    )


def heldout_english(model: HookedTransformer, n_windows: int) -> Int[Tensor, "window pos"]:
    """The first n_windows × n_ctx tokens of the pydoc corpus's held-out documents, as windows."""
    from lab.data.stdlib_corpus import split_text, stdlib_docstrings
    from lab.folders import zoo_dir
    from lab.zoo.recipes import load_recipe

    fraction = load_recipe("pydoc")["world"].get("held_out_fraction", 0.05)
    _, held_out = split_text(stdlib_docstrings(cache=zoo_dir() / "pydoc" / "corpus.txt"), fraction)
    n_ctx, need = model.cfg.n_ctx, n_windows * model.cfg.n_ctx
    ids = model.tokenizer.encode(held_out[: need * 16]).ids  # ≥ 1 byte per token: 16 bytes per token is ample
    if len(ids) < need:
        ids = model.tokenizer.encode(held_out).ids
    n = min(n_windows, len(ids) // n_ctx)
    if n == 0:
        raise ValueError("the held-out English text is shorter than one context window")
    return torch.tensor(ids[: n * n_ctx]).view(n, n_ctx)


def token_level(cfg: Config, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Confidence = the top next-token probability, correct = the top token is the next token; for the model
    and through the logit lens at each layer's input (layer n_layers is the model's own prediction)."""
    model, source = pydoc_model(out)  # may train, so outside inference mode
    windows = heldout_english(model, cfg.token_windows)
    confidence, correct, target_lp = [], [], []
    with torch.inference_mode():
        for start in range(0, len(windows), 4):
            tokens = windows[start : start + 4]
            log_p = logit_lens(model, tokens)[:, :, :-1].double()  # [layer, batch, pos − 1, d_vocab]
            target = tokens[:, 1:]
            top_lp, top = log_p.max(dim=-1)
            confidence.append(top_lp.exp().flatten(1))
            correct.append((top == target).flatten(1))
            index = target[None, ..., None].expand(log_p.shape[0], -1, -1, 1)
            target_lp.append(log_p.gather(-1, index)[..., 0].flatten(1))
    c, y, lp = (torch.cat(x, dim=1).numpy() for x in (confidence, correct, target_lp))
    by_layer = []
    for layer in range(c.shape[0]):
        by_layer.append(
            {
                "layer": layer,
                "n_tokens": int(c.shape[1]),
                "accuracy": float(y[layer].mean()),
                "mean_confidence": float(c[layer].mean()),
                "nll_nats": float(-lp[layer].mean()),
                **ece_fields(c[layer], y[layer], "ece", n_boot=cfg.n_boot, seed=cfg.seed),
                **ece_fields(
                    c[layer], y[layer], "ece_10_equal_mass", 10, "equal_mass", n_boot=cfg.n_boot, seed=cfg.seed
                ),
            }
        )
    final = by_layer[-1]
    block = {
        "model": source,
        "n_windows": int(len(windows)),
        "n_ctx": model.cfg.n_ctx,
        "d_vocab": model.cfg.d_vocab,
        **{k: v for k, v in final.items() if k != "layer"},
        "by_layer": by_layer,
        "note": "intervals resample tokens, which are not independent within a window: they are too narrow",
    }
    diagram = reliability(c[-1], y[-1])
    curve = [
        {"bin": int(b), "count": int(n), "confidence": float(x), "accuracy": float(a)}
        for b, n, x, a in zip(diagram.bin, diagram.count, diagram.confidence, diagram.accuracy)
    ]
    return block, curve
