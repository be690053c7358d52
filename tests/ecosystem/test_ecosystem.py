"""The interpretability tools researchers already use run on Forma models: nnsight through the explicit-paths
switch, tuned-lens on the exported Hugging Face model, CircuitsVis from a Forma cache, offline.
(TransformerLens's own analysis code: tests/ecosystem/test_tl_protocol.py; SAELens: tests/sae/test_saelens.py.)"""

import os
import re
from pathlib import Path

import pytest
import torch

from lab import HookedTransformer, ModelConfig
from lab.analysis.lens import logit_lens
from lab.hf.convert import to_hf

ARCHITECTURES = {
    "gpt2": dict(mlp="gelu_tanh"),
    "llama": dict(positions="rotary", norm="rmsnorm", mlp="swiglu", n_kv_heads=2, bias=False),
}
CHROMIUM = "/usr/bin/chromium"


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(kind: str = "gpt2") -> HookedTransformer:
    model = HookedTransformer(
        ModelConfig(d_vocab=64, d_model=32, n_layers=3, n_heads=4, n_ctx=32, **ARCHITECTURES[kind]), seed=0
    ).eval()
    with torch.no_grad():  # a learned-looking final norm, so that no lens is the identity map
        model.ln_final.w.normal_(1.0, 0.2, generator=torch.Generator().manual_seed(1))
    return model


TOKENS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


# --- nnsight ------------------------------------------------------------------------------------
def test_nnsight_reaches_the_explicit_paths_only_with_the_switch():
    from nnsight import NNsight

    model = tiny()
    wrapped = NNsight(model)
    with pytest.raises(Exception, match="ran past it"):  # nnsight's OutOfOrderError: the fused path never calls it
        with wrapped.trace(TOKENS):
            wrapped.blocks[0].attn.hook_pattern.output.save()
    model.set_explicit_paths(True)
    logits, cache = model.run_with_cache(TOKENS)
    with wrapped.trace(TOKENS):
        scale = wrapped.blocks[0].ln1.hook_scale.output.save()
        pattern = wrapped.blocks[1].attn.hook_pattern.output.save()
        out = wrapped.output.save()
    assert torch.equal(scale, cache["blocks.0.ln1.hook_scale"])
    assert torch.equal(pattern, cache["blocks.1.attn.hook_pattern"])
    assert torch.equal(out, logits)


def test_an_nnsight_patch_equals_the_same_patch_through_run_with_hooks():
    from nnsight import NNsight

    model = tiny("llama")
    model.set_explicit_paths(True)
    wrapped = NNsight(model)
    with wrapped.trace(TOKENS):
        point = wrapped.blocks[0].ln2.hook_scale
        point.output = point.output * 2
        patched = wrapped.output.save()
    reference = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.ln2.hook_scale", lambda x, hook: x * 2)])
    assert torch.equal(patched, reference)
    assert (patched - model(TOKENS)).abs().max() > 1e-3


# --- tuned-lens ---------------------------------------------------------------------------------
@pytest.fixture
def tuned_lens_without_its_probe(monkeypatch):
    """tuned-lens 0.2 asks `isinstance(model, transformer_lens.HookedTransformer)` whenever TransformerLens
    imports, and TransformerLens 4 raises ImportError for that removed name; the documented workaround
    turns the probe off."""
    from tuned_lens import model_surgery

    monkeypatch.setattr(model_surgery, "_transformer_lens_available", False)


def test_tuned_lens_needs_the_workaround_beside_transformer_lens_4(monkeypatch):
    """With its probe on — as tuned-lens sets it whenever TransformerLens imports — it fails on any model.
    (Set here, not read: docs/ecosystem.md's example, run earlier in the same process, switches it off.)"""
    from tuned_lens import model_surgery
    from tuned_lens.nn import LogitLens

    monkeypatch.setattr(model_surgery, "_transformer_lens_available", True)
    with pytest.raises(ImportError, match="HookedTransformer"):
        LogitLens.from_model(to_hf(tiny()))


@pytest.mark.parametrize("kind", sorted(ARCHITECTURES))
def test_tuned_lens_logit_lens_equals_formas(kind, tuned_lens_without_its_probe):
    from tuned_lens.nn import LogitLens

    model = tiny(kind)
    hf = to_hf(model)
    lens = LogitLens.from_model(hf)
    with torch.no_grad():
        hidden = hf(TOKENS, output_hidden_states=True).hidden_states  # [embeddings, after block 0, ...]
        ours = logit_lens(model, TOKENS)  # [layer + 1, batch, pos, vocab] log-probabilities
        for layer in range(model.cfg.n_layers):  # within float round-off
            assert (lens(hidden[layer], layer).log_softmax(-1) - ours[layer]).abs().max() <= 1e-5


def test_a_tuned_lens_trains_on_the_exported_model(tuned_lens_without_its_probe):
    from tuned_lens.nn import TunedLens

    model = tiny()
    hf = to_hf(model)
    lens = TunedLens.from_model(hf, bias=True)
    optimizer = torch.optim.Adam(lens.parameters(), lr=1e-2)
    data = torch.randint(0, 64, (32, 12), generator=torch.Generator().manual_seed(1))
    losses = []
    for step in range(20):
        with torch.no_grad():
            out = hf(data[(step % 4) * 8 : (step % 4 + 1) * 8], output_hidden_states=True)
            target = out.logits.log_softmax(-1)
        loss = sum(
            torch.sum(target.exp() * (target - lens(h, l).log_softmax(-1)), -1).mean()  # KL(final ‖ lens_l)
            for l, h in enumerate(out.hidden_states[:-1])
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


# --- CircuitsVis --------------------------------------------------------------------------------
LOADS_FROM_NETWORK = [
    r"<script[^>]*\ssrc\s*=",
    r"<link[^>]*\shref\s*=\s*[\"']?https?:",
    r"\bfrom\s*[\"']https?:",
    r"\bimport\s*\(\s*[\"']https?:",
    r"url\(\s*[\"']?https?:",
    r"unpkg\.com|jsdelivr|cdnjs",
]


def attention_page(model: HookedTransformer) -> str:
    """What docs/ecosystem.md writes: blocks.0's attention as a self-contained page (html.local_src)."""
    import circuitsvis as cv

    _, cache = model.run_with_cache(TOKENS[:1], names_filter="blocks.0.attn.hook_pattern")
    html = cv.attention.attention_patterns(
        tokens=[f"t{int(t)}" for t in TOKENS[0]], attention=cache["blocks.0.attn.hook_pattern"][0]
    )
    return f"<!doctype html><html><head><meta charset='utf-8'></head><body>{html.local_src}</body></html>"


def test_circuitsvis_html_loads_nothing_from_the_network():
    import circuitsvis as cv

    page = attention_page(tiny())
    assert not [p for p in LOADS_FROM_NETWORK if re.search(p, page)]
    cdn = str(cv.attention.attention_patterns(tokens=["a", "b"], attention=torch.ones(1, 2, 2) / 2))
    assert re.search(LOADS_FROM_NETWORK[2], cdn)  # the checks can fail: str(html) imports from unpkg.com


@pytest.mark.browser
def test_circuitsvis_html_renders_with_the_network_blocked(tmp_path):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI needs Debian's chromium at /usr/bin/chromium (.ci/run installs it)")
        pytest.skip("Debian chromium is not installed (apt-get install chromium); CI runs this")
    from playwright.sync_api import sync_playwright

    path = tmp_path / "attention.html"
    path.write_text(attention_page(tiny()))
    remote, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        try:
            page = browser.new_page()
            page.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if route.request.url.startswith("file:")
                    else (remote.append(route.request.url), route.abort())
                ),
            )
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto(path.as_uri())
            page.wait_for_function("document.querySelectorAll('[id^=circuits-vis] *').length > 20", timeout=30_000)
            drawn = page.evaluate("document.querySelector('[id^=circuits-vis]').innerText")
        finally:
            browser.close()
    assert remote == [] and errors == []
    assert "t" + str(int(TOKENS[0, 0])) in drawn  # the tokens are on the page
