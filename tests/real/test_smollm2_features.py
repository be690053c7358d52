"""A transcoder feature's card on smollm2 over held-out documents of the real corpus (a slice, as
tests/real/test_smollm2_transcoders.py writes it): the card's numbers against direct recomputation on the real model
(RMSNorm, rotary, grouped heads), and the Transcoder features page on it, reading the corpus folder it is given.
The transcoders are an untrained set of layers 0 and 1 (the card's properties hold for any weights), built from
this model."""

import pytest
import streamlit as st
import torch

from lab.analysis.transcoders.features import feature_card, virtual_weights
from lab.analysis.transcoders.model import TranscoderConfig, Transcoders, built_from, model_fingerprint
from lab.load import load_model
from lab.zoo.transcoders import corpus_windows
from tests.builders import page

pytestmark = pytest.mark.real


@torch.no_grad()
def test_a_features_card_on_held_out_documents_and_its_page(zoo, corpus, monkeypatch, tmp_path):
    model = load_model(zoo).eval()
    cfg = TranscoderConfig(d_model=model.cfg.d_model, n_layers=2, d_features=256, layers=(0, 1))
    transcoders = Transcoders(cfg).eval()
    windows = corpus_windows(corpus, 8, 64, split="val")
    card = feature_card(model, transcoders, 1, 7, windows, n_top=3)
    assert sum(card.counts) == card.positions == windows.numel()
    hook = cfg.hook("input", 1)
    _, cache = model.run_with_cache(windows, names_filter=[hook])
    every = transcoders.activate(transcoders.encode(cache[hook].float(), 1), 1)[..., 7]
    torch.testing.assert_close(
        torch.tensor([c.activation for c in card.top]), every.flatten().sort(descending=True).values[:3]
    )
    for c in card.top:
        assert c.tokens[c.pos - c.start] == int(windows[c.window, c.pos])
    reads, _ = virtual_weights(transcoders, 1, 7)
    torch.testing.assert_close(reads[0], transcoders.W_dec[0][:, 0] @ transcoders.W_enc[1][:, 7])
    assert all(c.layer == 0 for c in card.reads_from) and card.writes_to == []
    logits = (transcoders.W_dec[1][7, 0] * model.ln_final.w) @ model.W_U
    top = (logits - logits.mean()).float().topk(3).indices.tolist()
    assert [t for t, _ in card.promoted[:3]] == top

    transcoders.save(zoo / "transcoders" / "untrained", built_from(model_fingerprint(model), 0))
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo.parent))
    monkeypatch.chdir(tmp_path)  # no corpus/real where the page looks first
    st.cache_resource.clear()
    at = page("features")
    at.default_timeout = 600
    at.run()
    assert not at.exception, at.exception
    assert "forma corpus real" in " ".join(str(i.value) for i in at.info)  # no corpus/real here: it says so
    at.text_input(key="feature_corpus").input(str(corpus)).run()
    assert not at.exception, at.exception
    assert not at.warning, [w.value for w in at.warning]
    assert [h.value for h in at.header] == ["Feature 0 of layer 0"]
    assert "held-out documents of the corpus" in " ".join(str(c.value) for c in at.caption)
    st.cache_resource.clear()
