"""How far to trust a model's numbers: the checks behind `forma trust MODEL`.

Each check compares two computations that should agree and reports the largest disagreement:
- Hugging Face: our logits against the same weights run by transformers, for every shape `lab.hf.convert.to_hf` exports
  (GPT-2, GPT-NeoX / Pythia, LLaMA, Qwen2, Mistral; `lab.hf.convert.export_family` says which);
- attention: the fused scaled_dot_product_attention path against the explicit softmax path;
- KV cache: cached greedy decoding against recomputing the prefix at every step;
- hooks: hook points that never fire in a forward pass (a name that would silently cache nothing);
- precision: float32 against bfloat16 (max |Δ log p|, KL, top-1 agreement).
"""

import copy
from pathlib import Path
from typing import Any

import torch

from lab.folders import trust_report_path
from lab.hf.convert import to_hf
from lab.hf.family import UnsupportedArchitecture
from lab.load import load_model
from lab.model.decoding import decode
from lab.model.transformer import HookedTransformer
from lab.runs import write_json

ATTENTION_TOL = 1e-4
HF_TOL = 1e-4  # and HF_RTOL of the largest |logit|: float32 round-off over many layers grows with the logits' size
HF_RTOL = 1e-5
CACHE_TOL = 1e-4


def _tokens(model: HookedTransformer, batch: int, length: int, seed: int) -> torch.Tensor:
    length = min(length, model.cfg.n_ctx)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.d_vocab, (batch, length), generator=generator).to(model.W_E.device)


@torch.inference_mode()
def check_hugging_face(model: HookedTransformer, tokens: torch.Tensor) -> dict[str, Any]:
    try:
        hf = to_hf(model).to(tokens.device)
    except UnsupportedArchitecture as err:
        return {"applicable": False, "reason": str(err)}
    theirs = hf(tokens).logits.float()
    diff = (theirs - model(tokens).float()).abs().max().item()
    tolerance = hf_tolerance(theirs)
    return {
        "applicable": True,
        "architecture": hf.config.model_type,
        "max_abs_logit_diff": diff,
        "tolerance": tolerance,
        "passed": diff <= tolerance,
    }


def hf_tolerance(logits: torch.Tensor) -> float:
    """How far Forma's logits may stand from transformers' on the same weights: HF_TOL, plus HF_RTOL of the largest
    |logit| transformers gives."""
    return HF_TOL + HF_RTOL * logits.abs().max().item()


@torch.inference_mode()
def check_attention_paths(model: HookedTransformer, tokens: torch.Tensor) -> dict[str, Any]:
    fast = model(tokens)
    explicit = model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith("hook_pattern"), lambda x, hook: x)])
    diff = (fast - explicit).abs().max().item()
    return {"max_abs_logit_diff": diff, "tolerance": ATTENTION_TOL, "passed": diff <= ATTENTION_TOL}


def check_kv_cache(model: HookedTransformer, prompt: torch.Tensor, new_tokens: int) -> dict[str, Any]:
    new_tokens = max(1, min(new_tokens, model.cfg.n_ctx - prompt.shape[1]))
    cached = decode(model, prompt, new_tokens, temperature=0, use_kv_cache=True)
    fresh = decode(model, prompt, new_tokens, temperature=0, use_kv_cache=False)
    same = bool(torch.equal(cached.tokens, fresh.tokens))
    diff = (cached.logits - fresh.logits).abs().max().item()
    return {
        "new_tokens": new_tokens,
        "same_tokens": same,
        "max_abs_logit_diff": diff,
        "tolerance": CACHE_TOL,
        "passed": same and diff <= CACHE_TOL,
    }


@torch.inference_mode()
def check_hooks_fire(model: HookedTransformer, tokens: torch.Tensor) -> dict[str, Any]:
    fired: set[str] = set()

    def record(x: torch.Tensor, hook: Any) -> None:
        fired.add(hook.name)

    model.run_with_hooks(tokens, fwd_hooks=[(lambda name: True, record)])
    silent = sorted(set(model.hook_dict) - fired)
    return {"n_hooks": len(model.hook_dict), "never_fired": silent, "passed": not silent}


@torch.inference_mode()
def check_bfloat16(model: HookedTransformer, tokens: torch.Tensor) -> dict[str, Any]:
    reference = model(tokens).float().log_softmax(-1)
    low = copy.deepcopy(model).to(torch.bfloat16)
    drifted = low(tokens).float().log_softmax(-1)
    kl = (reference.exp() * (reference - drifted)).sum(-1)
    return {
        "max_abs_logprob_diff": (reference - drifted).abs().max().item(),
        "mean_kl_nats": kl.mean().item(),
        "max_kl_nats": kl.max().item(),
        "top1_agreement": (reference.argmax(-1) == drifted.argmax(-1)).float().mean().item(),
    }


def trust_report(model: HookedTransformer, seed: int = 0) -> dict[str, Any]:
    """Every check on one model; `passed` is the conjunction of the pass/fail checks."""
    model = model.eval()
    tokens = _tokens(model, batch=4, length=64, seed=seed)
    prompt = _tokens(model, batch=2, length=min(8, max(1, model.cfg.n_ctx // 2)), seed=seed + 1)
    report = {
        "config": model.cfg.to_dict(),
        "hugging_face": check_hugging_face(model, tokens),
        "attention_paths": check_attention_paths(model, tokens),
        "kv_cache": check_kv_cache(model, prompt, new_tokens=32),
        "hooks": check_hooks_fire(model, tokens),
        "bfloat16": check_bfloat16(model, tokens),
    }
    verdicts = [section["passed"] for section in report.values() if isinstance(section, dict) and "passed" in section]
    report["passed"] = all(verdicts)
    return report


def run_trust(name_or_path: str | Path, out: Path | None = None) -> tuple[dict[str, Any], Path]:
    """Load a zoo name, Forma folder or local HF folder, check it, and write trust.json beside it (or to `out`).
    Where the report cannot be written — a read-only model folder — is a ValueError naming the folder and the
    way out (--out), said before the model is loaded."""
    folder, target = trust_report_path(name_or_path, out)
    model = load_model(folder)  # as trained: its logits are compared with Hugging Face's
    report = trust_report(model)
    write_json(target, report)
    return report, target


def summary_lines(report: dict[str, Any]) -> list[str]:
    def mark(ok: bool | None) -> str:
        return "ok  " if ok else "FAIL" if ok is not None else "n/a "

    hf = report["hugging_face"]
    lines = [
        f"{mark(hf.get('passed') if hf['applicable'] else None)} Hugging Face logits: "
        + (
            f"max |Δ| {hf['max_abs_logit_diff']:.2e}, within {hf['tolerance']:.1e} ({hf['architecture']})"
            if hf["applicable"]
            else hf["reason"]
        ),
        f"{mark(report['attention_paths']['passed'])} fused vs explicit attention: max |Δ logits| "
        f"{report['attention_paths']['max_abs_logit_diff']:.2e}",
        f"{mark(report['kv_cache']['passed'])} KV cache vs recompute: same tokens {report['kv_cache']['same_tokens']}, "
        f"max |Δ logits| {report['kv_cache']['max_abs_logit_diff']:.2e}",
        f"{mark(report['hooks']['passed'])} hook points firing: "
        f"{report['hooks']['n_hooks'] - len(report['hooks']['never_fired'])}"
        f"/{report['hooks']['n_hooks']}"
        + (f" (silent: {report['hooks']['never_fired'][:5]})" if report["hooks"]["never_fired"] else ""),
        f"info bfloat16 drift: mean KL {report['bfloat16']['mean_kl_nats']:.2e} nats, top-1 agreement "
        f"{report['bfloat16']['top1_agreement']:.3f}, max |Δ log p| {report['bfloat16']['max_abs_logprob_diff']:.3f}",
    ]
    return lines
