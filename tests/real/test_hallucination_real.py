"""The hallucination experiment's real-model track on smollm2 (experiments.hallucination.real): the readings of
batched, right-padded prompts equal each prompt run alone; the pretrained model's chat replies about invented
persons are read and classified; and fine-tuning stopped after a step and resumed from its checkpoint ends on the
same bits as one uninterrupted run."""

import dataclasses

import numpy as np
import pytest
import torch

from experiments.hallucination.biographies import build_corpus
from experiments.hallucination.config import REAL_QUICK
from experiments.hallucination.real import (
    city_ids,
    classify_reply,
    finetune,
    pretrained_behaviour,
    read_prompts,
    trainable,
)
from lab.folders import is_trained
from lab.model.transformer import HookedTransformer
from tests.builders import smollm2_folder

pytestmark = pytest.mark.real

TINY = dataclasses.replace(REAL_QUICK, steps=2, batch_size=2, n_chat=2)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return HookedTransformer.from_pretrained("smollm2" if is_trained("smollm2") else smollm2_folder()).eval()


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(8, 0.5, 2, 4, seed=0)


def test_batched_readings_equal_each_prompt_alone(model, corpus):
    cities = city_ids(model.tokenizer)
    prompts = [corpus.prompt(i) for i in range(3)]
    probs, greedy = read_prompts(model, prompts, cities)
    for row, text in enumerate(prompts):
        ids = model.tokenizer.encode(text, add_special_tokens=False)
        with torch.inference_mode():
            dist = model(torch.tensor([ids]))[0, -1].double().softmax(-1)
        np.testing.assert_allclose(probs[row], dist[cities].numpy(), atol=1e-5)
        top = int(dist.argmax())
        assert greedy[row] == (cities.index(top) if top in cities else -1)


def test_the_pretrained_models_replies_about_invented_persons_are_classified(model, corpus):
    before = pretrained_behaviour(model, corpus, city_ids(model.tokenizer), n_chat=2)
    assert len(before["chat"]) == 2 and all(c["reply"] for c in before["chat"])
    assert all(c["class"] == classify_reply(c["reply"]) for c in before["chat"])
    assert sum(before["chat_share"].values()) == pytest.approx(1.0)
    assert before["verdict"] in ("abstains", "hallucinates", "mixed")
    assert 0.0 <= before["city_mass"] <= 1.0


def test_fine_tuning_resumed_from_its_checkpoint_ends_on_the_same_bits(model, corpus, tmp_path):
    names = trainable(model, TINY.trained_blocks)
    start = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
    assert all(not p.requires_grad for n, p in model.named_parameters() if n not in names)
    assert not any(n.startswith(("embed", "unembed")) for n in names)

    def reset():
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in start:
                    p.copy_(start[n])

    reset()
    finetune(model, corpus, TINY, 0, tmp_path / "whole")
    whole = {n: p.detach().clone() for n, p in model.named_parameters() if n in start}
    assert any(not torch.equal(whole[n], start[n]) for n in start)
    reset()
    first = finetune(model, corpus, TINY, 0, tmp_path / "parts", stop_after=1)
    reset()  # the checkpoint, not the model in memory, carries the resumed run
    second = finetune(model, corpus, TINY, 0, tmp_path / "parts")
    assert first["steps"] == 1 and second["resumed"] and second["steps"] == TINY.steps
    for n in start:
        assert torch.equal(dict(model.named_parameters())[n].detach(), whole[n]), n
