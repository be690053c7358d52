"""Claims 5 to 7: the cross-entropy gradient softmax(z) − onehot(y), composed affine layers collapsing into one,
and universal approximation by one hidden layer of sigmoids."""

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from experiments.equations.check import Check
from experiments.equations.seeded import F64, seeded_generator
from lab.model.mlp import ACTIVATIONS
from lab.model.transformer import next_token_loss


# ============================================================================================
# 5. Cross-entropy gradient
# ============================================================================================
def ce_gradient_formula(logits: Float[Tensor, "n d_vocab"], targets: Int[Tensor, " n"]) -> Float[Tensor, "n d_vocab"]:
    """∂ℓ/∂z = softmax(z) − onehot(y) for ℓ = −log softmax(z)_y."""
    return logits.softmax(-1) - F.one_hot(targets, logits.shape[-1]).to(logits.dtype)


def check_cross_entropy_gradient(
    loss_fn: Callable[[Tensor, Tensor], Tensor] = next_token_loss,
    formula: Callable[[Tensor, Tensor], Tensor] = ce_gradient_formula,
    seed: int = 0,
) -> Check:
    """Autograd through Forma's next-token loss against the closed form; the mean over N predictions scales
    each position's gradient by 1/N, and the last position (which predicts nothing) gets none."""
    g = seeded_generator(seed)
    batch, pos, d_vocab = 4, 16, 50
    logits = (3 * torch.randn(batch, pos, d_vocab, generator=g)).requires_grad_()
    tokens = torch.randint(0, d_vocab, (batch, pos), generator=g)
    (autograd,) = torch.autograd.grad(loss_fn(logits, tokens), logits)
    n = batch * (pos - 1)
    predicted = torch.zeros_like(autograd)
    flat = formula(logits.detach()[:, :-1].reshape(-1, d_vocab), tokens[:, 1:].reshape(-1))
    predicted[:, :-1] = flat.reshape(batch, pos - 1, d_vocab) / n
    error = float((autograd - predicted).abs().max() * n)
    tolerance = 1e-5
    return Check(
        name="cross_entropy_gradient",
        item=5,
        equation=r"\frac{\partial}{\partial z}\bigl(-\log\mathrm{softmax}(z)_y\bigr)=\mathrm{softmax}(z)-e_y",
        measured=error,
        expected=0.0,
        tolerance=tolerance,
        passed=error <= tolerance,
        what=["largest |N·autograd − (p − onehot)|"],
        note=f"max |N·autograd − (p − onehot)| over {batch}×{pos} positions, |V| = {d_vocab}, logits with std 3 "
        f"(N = {n} predictions)",
    )


# ============================================================================================
# 6. Composed affine layers collapse
# ============================================================================================
def _affine_stack(widths: tuple[int, ...], seed: int) -> list[nn.Linear]:
    torch.manual_seed(seed)  # nn.Linear draws from the global generator
    return [nn.Linear(a, b, dtype=F64) for a, b in zip(widths, widths[1:])]


def check_affine_collapse(widths: tuple[int, ...] = (16, 64, 48, 8), seed: int = 0) -> Check:
    """W₃(W₂(W₁x + b₁) + b₂) + b₃ = (W₃W₂W₁)x + (W₃W₂b₁ + W₃b₂ + b₃): depth adds nothing without a nonlinearity."""
    with torch.random.fork_rng(devices=[]):
        layers = _affine_stack(widths, seed)
    x = torch.randn(2000, widths[0], generator=seeded_generator(seed), dtype=F64)
    with torch.no_grad():
        deep = x
        for layer in layers:
            deep = layer(deep)
        W, b = torch.eye(widths[0], dtype=F64), torch.zeros(widths[0], dtype=F64)
        for layer in layers:  # fold each layer into one affine map
            W, b = layer.weight @ W, layer.weight @ b + layer.bias
        error = float((deep - (x @ W.T + b)).abs().max())
    tolerance = 1e-12
    return Check(
        name="affine_collapse",
        item=6,
        equation=r"W_3(W_2(W_1x+b_1)+b_2)+b_3=(W_3W_2W_1)\,x+(W_3W_2b_1+W_3b_2+b_3)",
        measured=error,
        expected=0.0,
        tolerance=tolerance,
        passed=error <= tolerance,
        what=["largest |deep(x) − (Wx + b)|"],
        note=f"max |deep(x) − (Wx + b)| over 2000 inputs, layers {list(widths)}, float64",
    )


def check_nonlinearity_breaks_collapse(
    activation: Callable[[Tensor], Tensor] = ACTIVATIONS["relu"],
    widths: tuple[int, ...] = (16, 64, 48, 8),
    seed: int = 0,
) -> Check:
    """With φ between the layers no affine map reproduces the network: the best least-squares affine fit
    leaves a residual. The same fit on the purely affine stack leaves none (the control)."""
    with torch.random.fork_rng(devices=[]):
        layers = _affine_stack(widths, seed)
    x = torch.randn(2000, widths[0], generator=seeded_generator(seed), dtype=F64)

    def relative_residual(with_activation: bool) -> float:
        with torch.no_grad():
            y = x
            for index, layer in enumerate(layers):
                y = layer(y)
                if with_activation and index < len(layers) - 1:
                    y = activation(y)
            design = torch.cat((x, torch.ones(len(x), 1, dtype=F64)), dim=1)
            fit = design @ torch.linalg.lstsq(design, y, driver="gelsd").solution
            return float((y - fit).norm() / (y - y.mean(0)).norm())

    nonlinear, control = relative_residual(True), relative_residual(False)
    threshold = 0.05
    return Check(
        name="nonlinearity_breaks_collapse",
        item=6,
        equation=r"\min_{W,b}\frac{\lVert W_3\varphi(W_2\varphi(W_1x+b_1)+b_2)+b_3-(Wx+b)\rVert}"
        r"{\lVert y-\bar y\rVert}>0",
        measured=[nonlinear, control],
        expected=[threshold, 0.0],
        tolerance=[0.0, 1e-10],
        passed=nonlinear > threshold and control <= 1e-10,
        what=["relative residual of the best affine fit, ReLU between the layers", "the same without ReLU"],
        rules=["more than", "within"],
        note=f"[relative residual of the best affine fit with ReLU between the layers, the same without] over "
        f"2000 inputs; pass: the first exceeds {threshold}, the second (the control) is 0",
    )


# ============================================================================================
# 7. Universal approximation
# ============================================================================================
def target_function(x: Float[Tensor, " n"]) -> Float[Tensor, " n"]:
    return torch.sin(2 * math.pi * x) + 0.3 * torch.cos(5 * math.pi * x)


def fit_sigmoid_network(
    n_neurons: int, x_train: Float[Tensor, " n_train"], x_test: Float[Tensor, " n_test"], iterations: int = 150
) -> tuple[float, Float[Tensor, " n_test"]]:
    """f(x) = Σ_i a_i σ(w_i x + b_i) + c fitted to `target_function` by least squares: sigmoids centred on a grid, the
    output layer solved exactly, then every parameter refined by L-BFGS. Returns (sup error on x_test, f(x_test))."""
    y = target_function(x_train)
    centres = (torch.arange(n_neurons, dtype=F64) + 0.5) / n_neurons
    w = torch.full((n_neurons,), 4.0 * n_neurons, dtype=F64)  # each sigmoid rises over ≈ one grid cell
    b = -w * centres
    features = torch.cat((torch.sigmoid(x_train[:, None] * w + b), torch.ones(len(x_train), 1, dtype=F64)), dim=1)
    solution = torch.linalg.lstsq(features, y[:, None], driver="gelsd").solution[:, 0]
    params = [p.clone().requires_grad_() for p in (w, b, solution[:-1], solution[-1:])]

    def net(x: Tensor) -> Tensor:
        w, b, a, c = params
        return torch.sigmoid(x[:, None] * w + b) @ a + c

    optimiser = torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=iterations,
        history_size=50,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
    )

    def closure() -> Tensor:
        optimiser.zero_grad()
        loss = (net(x_train) - y).pow(2).mean()
        loss.backward()
        return loss

    optimiser.step(closure)
    with torch.no_grad():
        prediction = net(x_test)
    return float((prediction - target_function(x_test)).abs().max()), prediction


def universal_approximation(widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> dict[str, Any]:
    x_train = torch.linspace(0, 1, 512, dtype=F64)
    x_test = torch.linspace(0, 1, 4001, dtype=F64)  # 8× finer than training: the sup is not just on the fit points
    errors, fits = [], []
    for n in widths:
        error, prediction = fit_sigmoid_network(n, x_train, x_test)
        errors.append(error)
        fits.append(prediction)
    return {"widths": list(widths), "sup_errors": errors, "x": x_test, "fits": fits}


def check_universal_approximation(result: dict[str, Any]) -> Check:
    """Cybenko 1989: one hidden layer of sigmoids approximates any continuous f on a compact set uniformly.
    Measured: sup |f − f_N| on [0, 1] for f(x) = sin 2πx + 0.3 cos 5πx as the width N doubles."""
    widths, errors = result["widths"], result["sup_errors"]
    slope = float(
        torch.linalg.lstsq(
            torch.stack((torch.log(torch.tensor(widths, dtype=F64)), torch.ones(len(widths), dtype=F64)), 1),
            torch.log(torch.tensor(errors, dtype=F64))[:, None],
            driver="gelsd",
        ).solution[0, 0]
    )
    half = len(widths) // 2
    falls = errors[-1] <= errors[0] / 20 and max(errors[half:]) < min(errors[:half]) and slope < -0.5
    return Check(
        name="universal_approximation",
        item=7,
        equation=r"\sup_{x\in[0,1]}\Bigl|f(x)-\sum_{i=1}^{N}a_i\,\sigma(w_ix+b_i)-c\Bigr|\xrightarrow[N\to\infty]{}0",
        measured=errors,
        expected=[0.0] * len(errors),
        tolerance=[errors[0] / 20] * len(errors),
        passed=falls,
        what=[f"sup error at N = {width}" for width in widths],
        rules=["shown"] * (len(errors) - 1) + ["within"],
        note=f"sup error on 4001 points for N = {widths} (least squares then L-BFGS on 512 points); log-log slope "
        f"{slope:.2f}. Pass: the widest is ≤ 1/20 of N = 1, every wide net (N ≥ {widths[half]}) beats every "
        f"narrow one, slope < −0.5. Not strictly monotone: L-BFGS finds local optima, the theorem is about "
        f"the best network of each width",
    )
