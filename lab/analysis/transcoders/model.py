"""Transcoders: sparse features that read each MLP's input and write its output (Dunefsky et al. 2024; Ameisen et
al. 2025, "Circuit Tracing"), per layer or cross-layer, in one class.

    pre_l   = x_l W_enc[l] + b_enc[l]                               x_l: the MLP's input at layer l (input_hook)
    a_l     = σ(pre_l)                                              ReLU, top-k of the ReLU, or JumpReLU
    ŷ_l'    = Σ_{l ≤ l'} a_l W_dec[l → l'] + b_dec[l']              y_l': the MLP's output (output_hook)

A per-layer transcoder (cross_layer = False) decodes layer l's features into layer l's output alone; a cross-layer
transcoder (CLT) decodes them into every later layer's output too. The input is what the MLP reads before its own
weights, `blocks.{l}.ln2.hook_normalized` by default (the residual stream divided by the norm's scale: linear in the
residual stream once the scale is frozen, as the attribution graph needs), the output `blocks.{l}.hook_mlp_out`.

Saved as a folder: transcoders.safetensors (W_enc, b_enc, b_dec, log_threshold, W_dec.{l}), config.json and
source.json (what they were built from: the model's fingerprint and the training step, `built_from`), which loading
them against a model checks; nothing is pickled. `to_circuit_tracer` writes circuit-tracer's per-layer format
(layer_{l}.safetensors).
"""

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from lab.configs import Record, check_fields, need
from lab.files import atomic_write, atomic_write_text
from lab.outside_files import MAX_JSON_BYTES, read_json, read_text, regular_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "transcoders.safetensors"
SOURCE_FILE = "source.json"
SOURCE_FORMAT = "forma-transcoder-source/1"
DIGEST_VALUES = 4096  # values of each weight tensor the fingerprint hashes (evenly strided): cheap at any size
ACTIVATIONS = ("relu", "topk", "jumprelu")


@dataclass(frozen=True)
class TranscoderConfig(Record):
    """The shape and kind of a set of transcoders, one per layer of a model."""

    d_model: int
    n_layers: int
    d_features: int  # features per layer
    activation: Literal["relu", "topk", "jumprelu"] = "relu"
    k: int = 0  # top-k: the features kept active per layer and row
    cross_layer: bool = False
    threshold: float = 0.01  # JumpReLU: the initial threshold θ of every feature
    bandwidth: float = 0.01  # JumpReLU: the width ε of the straight-through estimator's window
    input_hook: str = "blocks.{layer}.ln2.hook_normalized"
    output_hook: str = "blocks.{layer}.hook_mlp_out"
    seed: int = 0
    # The model's layers the transcoders read, in order (transcoder i reads layer layers[i]); None: 0 … n_layers − 1,
    # every layer of a model of n_layers layers. A subset is a cheaper profile; attribution graphs need every layer.
    layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("d_model", "n_layers", "d_features"):
            need(self, getattr(self, name) > 0, "must be a positive integer", name)
        need(
            self,
            self.activation != "topk" or 0 < self.k <= self.d_features,
            f"top-k needs 0 < k <= d_features ({self.d_features})",
            "k",
        )
        need(self, self.threshold > 0 and self.bandwidth > 0, "JumpReLU's threshold and bandwidth must be positive")
        for name in ("input_hook", "output_hook"):
            need(self, "{layer}" in getattr(self, name), "must name the layer as {layer}", name)
        if self.layers is not None:
            need(self, len(self.layers) == self.n_layers, f"must name n_layers ({self.n_layers}) layers", "layers")
            need(
                self,
                all(0 <= a < b for a, b in zip(self.layers, self.layers[1:])) and min(self.layers) >= 0,
                "must be distinct non-negative layers in increasing order",
                "layers",
            )

    def model_layers(self) -> list[int]:
        """The model's layer each transcoder reads, by transcoder: `layers`, else 0 … n_layers − 1."""
        return list(range(self.n_layers)) if self.layers is None else list(self.layers)

    def hook(self, which: Literal["input", "output"], layer: int) -> str:
        """The hook transcoder `layer` reads (input) or writes (output), at the model's layer model_layers()[layer]."""
        model_layer = layer if self.layers is None else self.layers[layer]
        return (self.input_hook if which == "input" else self.output_hook).format(layer=model_layer)

    def hooks(self) -> list[str]:
        """Every hook a harvest for these transcoders needs: each layer's input and output (once each: with the same
        hook for both, the transcoders are sparse autoencoders of it)."""
        return list(
            dict.fromkeys(self.hook(which, layer) for layer in range(self.n_layers) for which in ("input", "output"))
        )


class _JumpReLU(torch.autograd.Function):
    """a = pre · H(pre − θ): the gradient reaches pre where the feature is active, and θ through the
    straight-through estimator −θ/ε · K((pre − θ)/ε) with K the unit rectangle (Rajamanoharan et al. 2024)."""

    @staticmethod
    def forward(ctx, pre: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, theta)
        ctx.bandwidth = bandwidth
        return pre * (pre > theta)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        pre, theta = ctx.saved_tensors
        window = ((pre - theta).abs() < ctx.bandwidth / 2).to(pre.dtype)
        grad_theta = (-(theta / ctx.bandwidth) * window * grad).sum_to_size(theta.shape)
        return grad * (pre > theta), grad_theta, None


class _Step(torch.autograd.Function):
    """H(pre − θ), the L0 of JumpReLU, with the same estimator for θ (pre gets no gradient)."""

    @staticmethod
    def forward(ctx, pre: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, theta)
        ctx.bandwidth = bandwidth
        return (pre > theta).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor, None]:
        pre, theta = ctx.saved_tensors
        window = ((pre - theta).abs() < ctx.bandwidth / 2).to(pre.dtype)
        return None, (-(1.0 / ctx.bandwidth) * window * grad).sum_to_size(theta.shape), None


class Transcoders(nn.Module):
    """One transcoder per layer (or one cross-layer transcoder) for a model of `cfg.n_layers` layers."""

    def __init__(self, cfg: TranscoderConfig):
        super().__init__()
        self.cfg = cfg
        L, d, f = cfg.n_layers, cfg.d_model, cfg.d_features
        generator = torch.Generator().manual_seed(cfg.seed)
        # Decoder rows of norm 0.1 and the encoder their transpose (a common start: features begin as directions).
        decoders = []
        for layer in range(L):
            width = L - layer if cfg.cross_layer else 1
            W = torch.randn(f, width, d, generator=generator)
            decoders.append(nn.Parameter(0.1 * W / W.norm(dim=-1, keepdim=True) / math.sqrt(width)))
        self.W_dec = nn.ParameterList(decoders)  # W_dec[l]: [features, output layers l..(l or L−1), d_model]
        self.W_enc = nn.Parameter(torch.stack([W[:, 0].T.clone() * 10 / math.sqrt(d) for W in decoders]))  # [L, d, f]
        self.b_enc = nn.Parameter(torch.zeros(L, f))
        self.b_dec = nn.Parameter(torch.zeros(L, d))
        self.log_threshold = nn.Parameter(
            torch.full((L, f), math.log(cfg.threshold)), requires_grad=cfg.activation == "jumprelu"
        )

    # --- the map ------------------------------------------------------------------------------------------------
    def encode(self, x: Tensor, layer: int | None = None) -> Tensor:
        """Pre-activations: x [..., L, d_model] → [..., L, features]; with `layer`, x [..., d_model] → [..., f]."""
        if layer is None:
            return torch.einsum("...ld,ldf->...lf", x, self.W_enc) + self.b_enc
        return x @ self.W_enc[layer] + self.b_enc[layer]

    def activate(self, pre: Tensor, layer: int | None = None) -> Tensor:
        """σ(pre) for pre [..., L, f] (or [..., f] of one `layer`)."""
        kind = self.cfg.activation
        if kind == "relu":
            return F.relu(pre)
        if kind == "topk":
            values, index = pre.topk(self.cfg.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, index, F.relu(values))
        theta = self.log_threshold.exp() if layer is None else self.log_threshold[layer].exp()
        return _JumpReLU.apply(pre, theta, self.cfg.bandwidth)

    def l0(self, pre: Tensor, layer: int | None = None) -> Tensor:
        """JumpReLU's differentiable L0 of each row: Σ_features H(pre − θ), [..., L] for pre [..., L, f] (or [...]
        for pre [..., f] of one `layer`)."""
        theta = self.log_threshold.exp() if layer is None else self.log_threshold[layer].exp()
        return _Step.apply(pre, theta, self.cfg.bandwidth).sum(-1)

    def decode(self, acts: Tensor) -> Tensor:
        """Outputs [..., L, d_model] from activations [..., L, f]."""
        L = self.cfg.n_layers
        if not self.cfg.cross_layer:
            W = torch.stack([W[:, 0] for W in self.W_dec])  # [L, f, d]
            return torch.einsum("...lf,lfd->...ld", acts, W) + self.b_dec
        out = self.b_dec.expand(*acts.shape[:-2], L, self.cfg.d_model).clone()
        for layer, W in enumerate(self.W_dec):
            out[..., layer:, :] += torch.einsum("...f,fkd->...kd", acts[..., layer, :], W)
        return out

    def forward(self, x: Tensor) -> Tensor:
        return self.decode(self.activate(self.encode(x)))

    def decoder(self, layer: int, features: Tensor, target: int) -> Tensor:
        """The decoder vectors [len(features), d_model] that layer `layer`'s features write into layer `target`'s
        output (zeros for target < layer, and for target ≠ layer in a per-layer transcoder)."""
        if target < layer or (not self.cfg.cross_layer and target != layer):
            return torch.zeros(len(features), self.cfg.d_model, dtype=self.b_dec.dtype, device=self.b_dec.device)
        return self.W_dec[layer][features, target - layer]

    def decoder_norms(self) -> Tensor:
        """‖W_dec‖ of each feature over every layer it writes to: [L, f] (the L1 penalty's weights)."""
        return torch.stack([W.pow(2).sum(dim=(1, 2)).sqrt() for W in self.W_dec])

    # --- files --------------------------------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, Tensor]:
        tensors = {"W_enc": self.W_enc, "b_enc": self.b_enc, "b_dec": self.b_dec, "log_threshold": self.log_threshold}
        tensors |= {f"W_dec.{layer}": W for layer, W in enumerate(self.W_dec)}
        return {name: t.detach().cpu().contiguous() for name, t in tensors.items()}

    def load_state_tensors(self, tensors: dict[str, Tensor], source: str) -> None:
        expected = self.state_tensors()
        if set(tensors) != set(expected):
            raise ValueError(f"{source}: holds {sorted(tensors)}, transcoders of this config hold {sorted(expected)}")
        for name, t in tensors.items():
            if t.shape != expected[name].shape:
                raise ValueError(f"{source}: {name} has shape {tuple(t.shape)}, expected {tuple(expected[name].shape)}")
        with torch.no_grad():
            self.W_enc.copy_(tensors["W_enc"])
            self.b_enc.copy_(tensors["b_enc"])
            self.b_dec.copy_(tensors["b_dec"])
            self.log_threshold.copy_(tensors["log_threshold"])
            for layer, W in enumerate(self.W_dec):
                W.copy_(tensors[f"W_dec.{layer}"])

    def save(self, directory: str | Path, source: dict[str, Any] | None = None) -> Path:
        """config.json and transcoders.safetensors in `directory`, and source.json where `source` (`built_from`)
        says what they were built from, each written atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = self.state_tensors()
        atomic_write(directory / WEIGHTS_FILE, lambda path: save_file(tensors, str(path)))
        atomic_write_text(directory / CONFIG_FILE, self.cfg.to_json() + "\n")
        if source is not None:
            atomic_write_text(directory / SOURCE_FILE, json.dumps(source, indent=2) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path, model: nn.Module | None = None) -> "Transcoders":
        """The set in `directory`; with `model`, only if they were built from it (`check_source`): a ValueError
        naming what differs otherwise."""
        directory = Path(directory)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise FileNotFoundError(f"{directory} holds no {name}: not a transcoders folder")
        path = directory / CONFIG_FILE
        try:
            cfg = TranscoderConfig.from_json(read_text(path, directory, MAX_JSON_BYTES, "config"))
        except (ValueError, TypeError) as err:  # a config's own complaint names its field, not its file
            raise (err if str(path) in str(err) else ValueError(f"{path}: {err}")) from None
        if model is not None:
            check_source(directory, cfg, model)
        weights = regular_file(directory / WEIGHTS_FILE, directory, what="transcoders' weights")
        if weights.stat().st_size < 2 * weight_values(cfg):  # before memory is taken for them
            raise ValueError(
                f"{weights} holds {weights.stat().st_size:,} bytes, too few for the {weight_values(cfg):,} weights "
                f"its {CONFIG_FILE} describes (d_features {cfg.d_features:,}): malformed or truncated, or not that "
                "config's"
            )
        transcoders = cls(cfg)
        try:
            tensors = load_file(str(weights))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"malformed or truncated {directory / WEIGHTS_FILE}: {err}") from err
        transcoders.load_state_tensors(tensors, str(directory / WEIGHTS_FILE))
        return transcoders.eval()

    def to_circuit_tracer(self, directory: str | Path) -> list[Path]:
        """circuit-tracer's per-layer files (its `load_relu_transcoder` format): layer_{l}.safetensors with W_enc
        [f, d], W_dec [f, d], b_enc, b_dec and, for JumpReLU, activation_function.threshold. Per-layer ReLU and
        JumpReLU transcoders only: circuit-tracer reads no top-k, and its cross-layer format is another."""
        if self.cfg.cross_layer or self.cfg.activation == "topk":
            raise ValueError(
                "circuit-tracer's per-layer format holds ReLU and JumpReLU per-layer transcoders only, "
                f"not {'cross-layer' if self.cfg.cross_layer else 'top-k'} ones"
            )
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for layer in range(self.cfg.n_layers):
            tensors = {
                "W_enc": self.W_enc[layer].T,
                "W_dec": self.W_dec[layer][:, 0],
                "b_enc": self.b_enc[layer],
                "b_dec": self.b_dec[layer],
            }
            if self.cfg.activation == "jumprelu":
                tensors["activation_function.threshold"] = self.log_threshold[layer].exp()
            tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
            path = directory / f"layer_{layer}.safetensors"
            save_file(tensors, str(path))
            paths.append(path)
        return paths


def weight_values(cfg: TranscoderConfig) -> int:
    """The number of values a set of config `cfg` holds (W_enc, b_enc, b_dec, log_threshold, each layer's W_dec),
    counted without making them."""
    L, d, f = cfg.n_layers, cfg.d_model, cfg.d_features
    decoders = f * d * (L * (L + 1) // 2 if cfg.cross_layer else L)
    return L * d * f + L * f + L * d + L * f + decoders


# --- what a set was built from ---------------------------------------------------------------------------------
def model_fingerprint(model: nn.Module) -> dict[str, Any]:
    """What transcoders record of the model they were built from: its d_model and n_layers, a SHA-256 of its config
    (the tokenizer's label aside), and a SHA-256 of its weights' names, shapes and DIGEST_VALUES evenly strided
    values of each — cheap at any size, and different for another model of the same shape."""
    cfg = model.cfg
    config = {k: v for k, v in cfg.to_dict().items() if k != "tokenizer"} if hasattr(cfg, "to_dict") else repr(cfg)
    weights = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // DIGEST_VALUES)][:DIGEST_VALUES]
        weights.update(f"{name} {tuple(tensor.shape)}\n".encode())
        weights.update(sample.to(torch.float32).cpu().numpy().tobytes())
    return {
        "d_model": int(cfg.d_model),
        "n_layers": int(cfg.n_layers),
        "config_sha256": hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest(),
        "weights_sha256": weights.hexdigest(),
    }


def built_from(fingerprint: dict[str, Any], step: int) -> dict[str, Any]:
    """source.json's record: the model's fingerprint (`model_fingerprint`) and the training step the set's weights
    are of."""
    return {"format": SOURCE_FORMAT, "model": fingerprint, "step": int(step)}


def check_source(directory: Path, cfg: TranscoderConfig, model: nn.Module) -> None:
    """A ValueError unless the set in `directory` (of config `cfg`) was built from `model`: its shapes, then
    source.json's fingerprint, each mismatch named."""
    shape = {"d_model": int(model.cfg.d_model), "n_layers": int(model.cfg.n_layers)}
    for key, value in shape.items():
        if getattr(cfg, key) != value and (key == "d_model" or cfg.layers is None):
            raise ValueError(f"{directory}: transcoders of {key} {getattr(cfg, key)}, the model has {key} {value}")
    if cfg.layers is not None and max(cfg.layers) >= shape["n_layers"]:
        raise ValueError(
            f"{directory}: transcoders of layer {max(cfg.layers)}, the model has n_layers {shape['n_layers']}"
        )
    path = directory / SOURCE_FILE
    if not path.is_file():
        raise ValueError(
            f"{directory} records no model it was built from ({SOURCE_FILE}); build them again for this model "
            "(forma transcoders NAME --overwrite)"
        )
    source = read_json(path, directory, max_bytes=MAX_JSON_BYTES, what="transcoders' source")
    if not (
        isinstance(source, dict) and source.get("format") == SOURCE_FORMAT and isinstance(source.get("model"), dict)
    ):
        raise ValueError(f"{path} is not a {SOURCE_FORMAT} record")
    then, now = source["model"], model_fingerprint(model)
    changed = [k for k in now if then.get(k) != now[k]]
    if changed:
        what = {"config_sha256": "config", "weights_sha256": "weights"}
        differs = ", ".join(
            f"its {what.get(k, k)} ({str(then.get(k))[:12]!r} then, {str(now[k])[:12]!r} now)" for k in changed
        )
        raise ValueError(
            f"{directory} was built from another model: {differs}; build them again for this model "
            "(forma transcoders NAME --overwrite)"
        )
