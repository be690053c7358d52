"""The encoder–decoder: torch.nn.Transformer on identical weights, masks, the KV cache, hooks, checkpoints, the
dates world and its zoo recipe, and the explorer's cross-attention view."""

import datetime
import json
import math
import shutil
from collections import Counter

import pytest
import torch
from torch import nn

from lab.data.dates import date_words, dates_world, exact_match, ordinal, year_words
from lab.folders import DEFAULT_ZOO_DIR, zoo_names
from lab.model.embeddings import sinusoidal_table
from lab.model.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from lab.model.kv_cache import KVCache
from lab.model.transformer import HookedTransformer
from lab.train.batches import PairBatches
from lab.train.config import TrainConfig
from lab.train.loop import summed_loss, train
from lab.zoo.building import build
from lab.zoo.recipes import load_recipe
from tests.builders import REPO

SRC_VOCAB, TGT_VOCAB, D_MODEL, N_CTX = 30, 20, 32, 32


def tiny(**changes) -> EncoderDecoder:
    base = dict(
        d_vocab_src=SRC_VOCAB,
        d_vocab_tgt=TGT_VOCAB,
        d_model=D_MODEL,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        n_ctx=N_CTX,
    )
    return EncoderDecoder(EncoderDecoderConfig(**(base | changes)), seed=1).eval()


@pytest.fixture
def src() -> torch.Tensor:
    return torch.randint(0, SRC_VOCAB, (3, 9), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def tgt() -> torch.Tensor:
    return torch.randint(0, TGT_VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))


# --- torch.nn.Transformer on identical weights -------------------------------------------------
@pytest.mark.filterwarnings("ignore:enable_nested_tensor")  # torch's note that pre-LN skips its fast path
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_matches_torch_transformer_on_identical_weights(norm_first, src, tgt):
    torch.manual_seed(0)
    reference = nn.Transformer(
        d_model=D_MODEL,
        nhead=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=64,
        dropout=0.0,
        batch_first=True,
        norm_first=norm_first,
    ).eval()
    src_embed, tgt_embed = nn.Embedding(SRC_VOCAB, D_MODEL), nn.Embedding(TGT_VOCAB, D_MODEL)
    out_proj = nn.Linear(D_MODEL, TGT_VOCAB)
    with torch.no_grad():  # fresh LayerNorms are the identity: randomise them so a misplaced one cannot hide
        for name, p in reference.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    model = EncoderDecoder.from_torch(reference, src_embed, tgt_embed, out_proj, n_ctx=N_CTX)
    assert model.cfg.block == ("pre_ln" if norm_first else "post_ln") and model.cfg.mlp == "relu"
    pe = sinusoidal_table(N_CTX, D_MODEL)
    S, T = src.shape[1], tgt.shape[1]
    with torch.no_grad():
        expected = out_proj(
            reference(
                src_embed(src) + pe[:S],
                tgt_embed(tgt) + pe[:T],
                tgt_mask=nn.Transformer.generate_square_subsequent_mask(T),
                tgt_is_causal=True,
            )
        )
        fused = model(src, tgt)
        _, cache = model.run_with_cache(src, tgt)  # asks for every pattern: the explicit attention path
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["unembed.hook_out"], expected, atol=1e-5, rtol=0)


# --- what each stack may see -------------------------------------------------------------------
@pytest.mark.parametrize("block", ["post_ln", "pre_ln"])
def test_the_decoder_cannot_see_future_target_tokens(block, src, tgt):
    model = tiny(block=block)
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % TGT_VOCAB
    with torch.no_grad():
        before, after = model(src, tgt), model(src, changed)
        _, cache = model.run_with_cache(src, tgt, names_filter="decoder.0.attn.hook_pattern")
    torch.testing.assert_close(after[:, :4], before[:, :4], atol=1e-6, rtol=0)
    assert (after[:, 4:] - before[:, 4:]).abs().max() > 1e-4
    future = torch.triu(torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool), diagonal=1)
    assert cache["decoder.0.attn.hook_pattern"][..., future].abs().max() == 0


def test_the_encoder_sees_every_source_token(src, tgt):
    model = tiny()
    changed = src.clone()
    changed[:, -1] = (changed[:, -1] + 1) % SRC_VOCAB
    with torch.no_grad():
        first_before, first_after = model.encode(src)[:, 0], model.encode(changed)[:, 0]
        _, cache = model.run_with_cache(
            src, tgt, names_filter=["encoder.0.attn.hook_pattern", "decoder.0.cross_attn.hook_pattern"]
        )
    assert (first_after - first_before).abs().max() > 1e-4  # position 0 reads the last source token
    assert cache["encoder.0.attn.hook_pattern"].shape == (3, 4, 9, 9)
    assert cache["encoder.0.attn.hook_pattern"].min() > 0  # no mask: every key has weight
    assert cache["decoder.0.cross_attn.hook_pattern"].shape == (3, 4, 7, 9)  # target queries × source keys


def test_fused_and_explicit_attention_agree_in_every_stack(src, tgt):
    model = tiny(block="pre_ln")
    with torch.no_grad():
        fused = model(src, tgt)
        explicit = model.run_with_hooks(
            src,
            tgt,
            fwd_hooks=[
                (f"{stack}.{l}.{attn}.hook_pattern", lambda pattern, hook: None)
                for stack, attn in (("encoder", "attn"), ("decoder", "attn"), ("decoder", "cross_attn"))
                for l in range(2)
            ],
        )
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=0)


# --- decoding ------------------------------------------------------------------------------------
def test_cached_decoding_equals_recompute(src, tgt):
    model = tiny()
    with torch.no_grad():
        full = model(src, tgt)
        encoder_out = model.encode(src)
        cache = KVCache.empty(model.cfg.n_decoder_layers)
        steps = [model.decode(tgt[:, :3], encoder_out, cache)]  # a prefix, then one token at a time
        steps += [model.decode(tgt[:, t : t + 1], encoder_out, cache) for t in range(3, tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    cached = model.generate(src, 12, bos_token_id=2, use_kv_cache=True)
    recomputed = model.generate(src, 12, bos_token_id=2, use_kv_cache=False)
    assert cached.shape == (3, 13) and torch.equal(cached, recomputed)


def _reference_generate(model, src, max_new_tokens, bos, eos, use_kv_cache, temperature, seed):
    """Sequence-to-sequence decoding written out: encode once, then feed the decoder its newest token (or the whole
    prefix), sampling each next token with `sample_next`; rows that emit eos keep emitting it."""
    from lab.model.decoding import sample_next

    with torch.no_grad():
        encoder_out = model.encode(src)
        tokens = torch.full((encoder_out.shape[0], 1), bos, dtype=torch.long)
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        cache = KVCache.empty(model.cfg.n_decoder_layers) if use_kv_cache else None
        done = torch.zeros(encoder_out.shape[0], dtype=torch.bool)
        new = tokens
        for _ in range(max_new_tokens):
            next_token = sample_next(model.decode(new, encoder_out, cache)[:, -1], temperature, generator=generator)
            if eos is not None:
                next_token = torch.where(done, eos, next_token)
                done |= next_token == eos
            tokens = torch.cat((tokens, next_token[:, None]), dim=1)
            new = next_token[:, None] if use_kv_cache else tokens
            if eos is not None and bool(done.all()):
                break
    return tokens


@pytest.mark.parametrize("use_kv_cache", [True, False])
@pytest.mark.parametrize("temperature, seed, eos", [(0.0, None, None), (1.5, 7, None), (1.5, 7, 5), (0.0, None, 5)])
def test_generate_is_the_written_out_decoding_loop(src, use_kv_cache, temperature, seed, eos):
    """EncoderDecoder.generate draws exactly the tokens of the loop written out above (same seed, same tokens)."""
    model = tiny()
    expected = _reference_generate(model, src, 10, 2, eos, use_kv_cache, temperature, seed)
    out = model.generate(
        src, 10, bos_token_id=2, eos_token_id=eos, use_kv_cache=use_kv_cache, temperature=temperature, seed=seed
    )
    assert torch.equal(out, expected)
    if eos is None:
        assert out.shape == (3, 11)


def test_generate_stops_at_eos_and_checks_its_inputs(src):
    model = tiny()
    eos = int(model.generate(src, 1, bos_token_id=2)[0, 1])  # what row 0 emits first
    out = model.generate(src, 10, bos_token_id=2, eos_token_id=eos)
    assert (out[0, 1:] == eos).all()  # a row that emitted <eos> keeps emitting it
    with pytest.raises(ValueError, match="n_ctx"):
        model.generate(src, N_CTX, bos_token_id=2)
    with pytest.raises(ValueError, match=r"source token ids must lie in \[0, 30\)"):
        model.encode(src + SRC_VOCAB)
    with pytest.raises(ValueError, match="integer ids"):
        model.encode(src.float())


# --- hooks and checkpoints -----------------------------------------------------------------------
def test_hook_names_and_scoped_hooks(src, tgt):
    model = tiny()
    for name in (
        "hook_src_embed",
        "hook_src_pos_embed",
        "encoder.0.attn.hook_pattern",
        "encoder.1.hook_resid_post",
        "encoder.0.hook_resid_mid",
        "encoder_ln_final.hook_normalized",
        "hook_encoder_out",
        "hook_tgt_embed",
        "decoder.0.attn.hook_pattern",
        "decoder.1.cross_attn.hook_pattern",
        "decoder.0.hook_resid_mid",
        "decoder.0.hook_cross_attn_out",
        "decoder.0.hook_resid_mid_cross",
        "decoder.1.hook_resid_post",
        "decoder.0.ln_cross.hook_normalized",
        "decoder_ln_final.hook_scale",
        "unembed.hook_out",
    ):
        assert name in model.hook_dict, name
    with torch.no_grad():
        plain = model(src, tgt)
        silent = model.run_with_hooks(src, tgt, fwd_hooks=[(n, lambda x, hook: None) for n in model.hook_dict])
    torch.testing.assert_close(silent, plain, atol=1e-5, rtol=0)

    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(src, tgt, fwd_hooks=[("decoder.0.cross_attn.hook_pattern", boom)])
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())  # cleaned up after the raise
    with pytest.raises(KeyError, match="did you mean"):
        model.run_with_cache(src, tgt, names_filter="decoder.0.cross_attn.hook_patern")


def test_save_load_round_trip_and_strict_config(tmp_path, src, tgt):
    world = dates_world(20, 5)
    model = tiny(block="pre_ln", positions="learned")
    model.src_tokenizer, model.tgt_tokenizer = world.src_tokenizer, world.tgt_tokenizer
    model.save(tmp_path / "m")
    loaded = EncoderDecoder.from_pretrained(tmp_path / "m")
    assert loaded.cfg == model.cfg and loaded.tgt_tokenizer.get_vocab() == world.tgt_tokenizer.get_vocab()
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt), model(src, tgt), atol=0, rtol=0)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(config | {"n_layer": 2}))
    with pytest.raises(ValueError, match=r"unknown keys \['n_layer'\]"):
        EncoderDecoder.load(tmp_path / "m")
    with pytest.raises(ValueError, match="malformed config"):  # not a decoder-only folder, and says so
        HookedTransformer.load(tmp_path / "m")
    with pytest.raises(ValueError, match="positions must be one of"):
        EncoderDecoderConfig(
            d_vocab_src=5,
            d_vocab_tgt=5,
            d_model=8,
            n_heads=2,
            n_encoder_layers=1,
            n_decoder_layers=1,
            n_ctx=8,
            positions="rotary",
        )
    with pytest.raises(ValueError, match="not divisible"):
        EncoderDecoderConfig(
            d_vocab_src=5, d_vocab_tgt=5, d_model=10, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, n_ctx=8
        )


# --- the dates world and its zoo recipe ----------------------------------------------------------
def test_dates_are_written_as_people_say_them():
    assert [ordinal(n) for n in (1, 2, 3, 12, 20, 21, 30, 31)] == [
        "first",
        "second",
        "third",
        "twelfth",
        "twentieth",
        "twenty first",
        "thirtieth",
        "thirty first",
    ]
    assert [year_words(y) for y in (1900, 1907, 1984, 2000, 2005, 2042)] == [
        "nineteen hundred",
        "nineteen oh seven",
        "nineteen eighty four",
        "two thousand",
        "two thousand and five",
        "two thousand and forty two",
    ]
    assert date_words(datetime.date(2005, 3, 3), 0) == "the third of march two thousand and five"


def test_held_out_days_never_occur_in_training():
    world = dates_world(3000, 300, seed=3)
    unk = world.src_tokenizer.token_to_id("<unk>")
    train_days = {tuple(t) for _, t in world.train}
    held_out_days = {tuple(t) for _, t in world.held_out}
    assert len(train_days) == 3000 and len(held_out_days) == 300 and not train_days & held_out_days
    assert all(unk not in s for s, _ in world.train + world.held_out)


@pytest.mark.slow
def test_quick_dates_recipe_learns_to_translate_unseen_days(tmp_path, monkeypatch, one_thread):
    for name in zoo_names():  # a private zoo: building never touches models/
        (tmp_path / name).mkdir()
        shutil.copy(DEFAULT_ZOO_DIR / name / "model.toml", tmp_path / name / "model.toml")
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path))
    directory = build("dates", quick=True, progress=False)
    card = json.loads((directory / "card.json").read_text())
    # The quick profile reaches ≈ 99% in 300 steps; the full recipe's number is in models/dates/MODEL.md.
    assert card["held_out_exact_match"] >= 0.5, card
    model = EncoderDecoder.from_pretrained("dates")
    assert all(isinstance(t, str) for t in model.translate("the third of march two thousand and five"))
    world = dates_world(**{k: v for k, v in load_recipe("dates")["world"].items() if k != "kind"})
    assert exact_match(model, world.held_out[:100]) >= 0.5
    with pytest.raises(FileNotFoundError, match="nothing to resume for dates"):
        build("dates", quick=True, progress=False, resume=True)
    # The source-blind plateau: the chain-rule entropy of a uniform day's "YYYY-MM-DD<eos>", counted over every
    # day of the world, per predicted character; and the first step training's loss fell below half of it.
    days = [datetime.date(1900, 1, 1) + datetime.timedelta(days=d) for d in range(card["source_blind_days"])]
    assert days[-1] == datetime.date(2099, 12, 31)
    texts = [d.isoformat() + "$" for d in days]
    total = 0.0
    for t in range(len(texts[0])):
        prefixes = Counter(x[:t] for x in texts)
        total -= sum(n * math.log(n / prefixes[x[:t]]) for x, n in Counter(x[: t + 1] for x in texts).items())
    assert card["source_blind_nats_per_char"] == pytest.approx(total / len(texts) / len(texts[0]), rel=1e-12)
    metrics = (directory / "train" / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["train_loss_nats"] for line in metrics]
    step = card["first_step_below_half_source_blind"]
    assert losses[step - 1] < card["source_blind_nats_per_char"] / 2 <= min(losses[: step - 1], default=math.inf)


# --- training: the one loop of lab.train ---------------------------------------------------------
def test_the_training_loop_trains_and_resumes_an_encoder_decoder_to_the_bit(tmp_path, user_threads):
    world = dates_world(200, 20)
    data = PairBatches(world.train, world.held_out)
    batch = data.get_batch("train", 0, 8, 16, seed=0)
    assert batch.source.shape[0] == 8 and torch.equal(batch.targets, batch.tokens[:, 1:])
    cfg = TrainConfig(
        steps=8, batch_size=8, seq_len=16, lr=3e-3, min_lr=3e-4, warmup_steps=2, eval_interval=4, eval_batches=1
    )

    def fresh(seed: int = 0) -> EncoderDecoder:
        return EncoderDecoder(
            EncoderDecoderConfig(
                d_vocab_src=world.src_tokenizer.get_vocab_size(),
                d_vocab_tgt=world.tgt_tokenizer.get_vocab_size(),
                d_model=16,
                n_heads=2,
                n_encoder_layers=1,
                n_decoder_layers=1,
                n_ctx=16,
            ),
            seed=seed,
        )

    # The loop's loss on a batch is the model's own mean teacher-forced loss.
    model = fresh()
    mean = summed_loss(model(*batch.inputs), batch.targets) / batch.targets.numel()
    torch.testing.assert_close(mean, model.loss(batch.source, batch.tokens), rtol=1e-6, atol=0)

    straight = train(model, cfg, data, tmp_path / "straight", progress=False)
    assert straight.history[-1]["train_loss_nats"] < straight.history[0]["train_loss_nats"]
    train(fresh(), cfg, data, tmp_path / "resumed", progress=False, stop_after=3)
    resumed_model = fresh(seed=5)  # a different init: the weights must come from the checkpoint
    resumed = train(resumed_model, cfg, data, tmp_path / "resumed", resume=True, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(resumed_model.state_dict().values(), model.state_dict().values()))
    assert [{k: v for k, v in r.items() if k != "elapsed_s"} for r in resumed.history] == [
        {k: v for k, v in r.items() if k != "elapsed_s"} for r in straight.history
    ]
    assert EncoderDecoder.load(tmp_path / "resumed" / "checkpoint").cfg == model.cfg
    with pytest.raises(ValueError, match="longer than seq_len = 8"):
        train(fresh(), cfg.replace(seq_len=8), data, progress=False)


# --- the explorer's cross-attention view ---------------------------------------------------------
def test_explorer_shows_cross_attention_for_an_encoder_decoder(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    for name in zoo_names():
        (tmp_path / name).mkdir()
        shutil.copy(DEFAULT_ZOO_DIR / name / "model.toml", tmp_path / name / "model.toml")
    world = dates_world(20, 5)
    cfg = EncoderDecoderConfig(
        d_vocab_src=world.src_tokenizer.get_vocab_size(),
        d_vocab_tgt=world.tgt_tokenizer.get_vocab_size(),
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=2,
        n_ctx=16,
    )
    EncoderDecoder(cfg, src_tokenizer=world.src_tokenizer, tgt_tokenizer=world.tgt_tokenizer).save(tmp_path / "dates")
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path))
    at = AppTest.from_file(str(REPO / "dashboards" / "explorer.py"), default_timeout=60)
    at.run()
    at.selectbox(key="model_choice").select("dates").run()
    assert not at.exception, at.exception
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]
    assert chart["type"] == "heatmap"
    assert len(chart["x"]) == 8  # "the third of march two thousand and five": 8 source words
    at.text_input(key="source").input("march the first nineteen oh five").run()
    at.slider(key="cross_layer").set_value(0).run()
    assert not at.exception, at.exception
    assert len(json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]["x"]) == 6
