"""Multiple-choice calibration of a real language model on Forma's real question set (lab.data.questions), in
Kadavath et al. 2022's format (arXiv 2207.05221, §3): the question, its options "(A) …" to "(D) …", then
"Answer: (", and the model's next-token probabilities of the letters A–D renormalised over the four.

Settings: zero-shot or k-shot (k solved questions, drawn from the seed among those not evaluated, before the
question), each plain or wrapped in the model's chat template (the question as the user's turn, the reply
beginning "Answer: ("; a shot as a user turn and the assistant's "Answer: (B)"). The prompts of one setting share
their first tokens (the shots, the template's system turn): they run once, and every question's own tokens run
on their keys and values, in batches of prompts of one length (no padding), the letters read at the last token;
`tests/real/test_calibration_real.py` holds that this equals each prompt run alone.

Every number comes from lab.metrics (accuracy, ECE with 15 equal-width bins, Brier, each with its bootstrap
interval); `real_track` measures the four settings on a seeded subset of the multiple-choice questions. The run of
the real-model track, through `forma run calibration --model smollm2`, is `experiments.calibration.real`'s.
"""

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lab.data.questions import LETTERS, Question, load_questions
from lab.metrics.calibration import brier, ece_fields
from lab.metrics.discrimination import bootstrap_ci
from lab.model.kv_cache import KVCache, KVCacheEntry

SETTINGS = (("zero-shot", 0, False), ("zero-shot, chat", 0, True), ("few-shot", 5, False), ("few-shot, chat", 5, True))
DEFAULT_QUESTIONS = 300  # the seeded subset of the multiple-choice questions each setting reads


def question_block(question: Question) -> str:
    """Kadavath et al.'s question: "Question: …", the options "(A) …" to "(D) …", one a line."""
    options = "".join(f"\n({letter}) {option}" for letter, option in zip(LETTERS, question.options))
    return f"Question: {question.text}{options}"


def kadavath_prompt(question: Question, shots: Sequence[Question] = ()) -> str:
    """The plain prompt: each shot answered ("Answer: (B)"), a blank line after it, then the question and
    "Answer: (" — where the letter comes next."""
    solved = "".join(f"{question_block(shot)}\nAnswer: ({shot.label})\n\n" for shot in shots)
    return f"{solved}{question_block(question)}\nAnswer: ("


def chat_prompt(tokenizer: Any, question: Question, shots: Sequence[Question] = ()) -> str:
    """The prompt in the tokenizer's chat template: each shot a user turn and the assistant's "Answer: (B)", the
    question the last user turn, and the assistant's reply begun with "Answer: (" ."""
    messages = []
    for shot in shots:
        messages += [
            {"role": "user", "content": question_block(shot)},
            {"role": "assistant", "content": f"Answer: ({shot.label})"},
        ]
    messages.append({"role": "user", "content": question_block(question)})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{text}Answer: ("


def token_ids(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """The prompt's ids: a chat prompt's special tokens are in its text already, so none is added to it."""
    return list(tokenizer.encode(text, add_special_tokens=not chat))


def answer_letter_ids(
    tokenizer: Any, prompt: list[int], chat: bool, text: str, letters: Sequence[str] = LETTERS
) -> list[int]:
    """The ids of "A" … "D" (or of `letters`) as the next token after `prompt` (whose text is `text`): each the one
    token the prompt followed by that letter adds. A ValueError when a letter merges with the prompt's end or is
    several."""
    ids = []
    for letter in letters:
        extended = token_ids(tokenizer, text + letter, chat)
        if extended[: len(prompt)] != prompt or len(extended) != len(prompt) + 1:
            raise ValueError(f"the letter {letter} after the prompt is not one token of its own: it cannot be read")
        ids.append(extended[-1])
    return ids


@dataclass
class Readings:
    """Per question: the probabilities of A–D renormalised over the four ([n, 4]), the letters' share of the
    whole next-token distribution (label mass), and the correct letter's index."""

    probabilities: np.ndarray
    label_mass: np.ndarray
    answer_index: np.ndarray

    @property
    def confidence(self) -> np.ndarray:
        return self.probabilities.max(axis=1)

    @property
    def correct(self) -> np.ndarray:
        return self.probabilities.argmax(axis=1) == self.answer_index


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many first tokens every prompt shares, leaving each at least one of its own."""
    length = min(len(p) for p in prompts) - 1
    for i in range(length):
        if len({p[i] for p in prompts}) > 1:
            return i
    return max(length, 0)


def expanded_cache(cache: KVCache, batch: int) -> KVCache:
    """A batch-1 cache's keys and values seen by `batch` rows (views: the prefix is never written into)."""
    return KVCache(
        [
            KVCacheEntry(e.keys.expand(batch, *e.keys.shape[1:]), e.values.expand(batch, *e.values.shape[1:]))
            for e in cache.entries
        ]
    )


@torch.inference_mode()
def next_letter_log_probs(model: Any, prompts: list[list[int]], letters: list[int], batch_size: int) -> np.ndarray:
    """[n, 4] log-probabilities of `letters` as each prompt's next token: the shared prefix run once, then each
    prompt's own tokens on its keys and values, in batches of equal length (no padding), the final norm and the
    unembedding at the last token only (`next_token_logits`)."""
    start = shared_prefix(prompts)
    prefix = KVCache.empty(model.cfg.n_layers)
    if start:
        model.next_token_logits(torch.tensor([prompts[0][:start]]), kv_cache=prefix)
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(prompts):
        by_length.setdefault(len(ids), []).append(index)
    out = np.empty((len(prompts), len(letters)))
    for _, members in sorted(by_length.items()):
        for begin in range(0, len(members), batch_size):
            chunk = members[begin : begin + batch_size]
            tokens = torch.tensor([prompts[i][start:] for i in chunk])
            cache = expanded_cache(prefix, len(chunk)) if start else None
            logits = model.next_token_logits(tokens, kv_cache=cache)
            out[chunk] = logits.double().log_softmax(-1)[:, letters].numpy()
    return out


def read_letters(
    model: Any,
    tokenizer: Any,
    questions: Sequence[Question],
    shots: Sequence[Question] = (),
    chat: bool = False,
    batch_size: int = 16,
) -> Readings:
    """Kadavath et al.'s multiple-choice reading of each question by `model` (a HookedTransformer) with
    `tokenizer`: zero-shot, or after `shots`; plain, or in the chat template (`chat`)."""
    if not questions or any(q.form != "mc" for q in questions):
        raise ValueError("read_letters needs one or more multiple-choice questions (form 'mc')")
    texts = [chat_prompt(tokenizer, q, shots) if chat else kadavath_prompt(q, shots) for q in questions]
    prompts = [token_ids(tokenizer, text, chat) for text in texts]
    letters = answer_letter_ids(tokenizer, prompts[0], chat, texts[0])
    log_p = next_letter_log_probs(model, prompts, letters, batch_size)
    probabilities = np.exp(log_p - log_p.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    answer = np.array([LETTERS.index(q.label) for q in questions])
    return Readings(probabilities, np.exp(log_p).sum(axis=1), answer)


def split_questions(questions: Sequence[Question], n: int, n_shots: int, seed: int) -> tuple[list, list]:
    """(n questions to evaluate, n_shots others to show solved), drawn from the seed; the shots never evaluated."""
    if n + n_shots > len(questions):
        raise ValueError(f"{n} questions and {n_shots} shots need {n + n_shots}; the set has {len(questions)}")
    drawn = random.Random(f"{seed}/kadavath").sample(range(len(questions)), n + n_shots)
    return [questions[i] for i in drawn[:n]], [questions[i] for i in drawn[n:]]


def letter_shares(indices: np.ndarray) -> dict[str, float]:
    """The share of `indices` (0-3) that is each letter A-D."""
    counts = np.bincount(indices, minlength=len(LETTERS))
    return {letter: float(count / len(indices)) for letter, count in zip(LETTERS, counts)}


def setting_summary(readings: Readings, n_boot: int, seed: int) -> dict[str, Any]:
    """Accuracy, ECE (15 equal-width bins, with its noise floor) and Brier, each with its bootstrap interval,
    and the letters' mean label mass; from lab.metrics on the readings' confidence and correctness."""
    confidence, correct = readings.confidence, readings.correct.astype(np.float64)
    accuracy = bootstrap_ci(np.mean, correct, n_boot=n_boot, seed=seed)
    score = bootstrap_ci(lambda c, y: brier(c, y).score, confidence, correct, n_boot=n_boot, seed=seed)
    return {
        "n": len(correct),
        "accuracy": accuracy.value,
        "accuracy_ci95": [accuracy.low, accuracy.high],
        "chance": 1 / len(LETTERS),
        "mean_confidence": float(confidence.mean()),
        **ece_fields(confidence, correct, "ece", 15, "equal_width", n_boot=n_boot, seed=seed),
        "brier": score.value,
        "brier_ci95": [score.low, score.high],
        "label_mass": float(readings.label_mass.mean()),
        # the share of questions whose chosen (right) letter is each of A-D: a model answering by position
        # chooses one letter far more often than the right letters come
        "chosen_letters": letter_shares(readings.probabilities.argmax(axis=1)),
        "right_letters": letter_shares(readings.answer_index),
    }


def real_track(
    model: Any,
    tokenizer: Any,
    n_questions: int = DEFAULT_QUESTIONS,
    n_boot: int = 500,
    seed: int = 0,
    settings: Sequence[tuple[str, int, bool]] = SETTINGS,
) -> tuple[dict[str, Any], dict[str, Readings]]:
    """(results, readings by setting): each setting of (name, shots, chat) measured on the same seeded
    `n_questions` of the multiple-choice set, its shots drawn from the questions not evaluated."""
    questions = load_questions(form="mc")
    most_shots = max(shots for _, shots, _ in settings)
    evaluated, shown = split_questions(questions, n_questions, most_shots, seed)
    results: dict[str, Any] = {"n_questions": n_questions, "seed": seed, "settings": {}, "timing": {}}
    readings = {}
    for name, n_shots, chat in settings:
        began = time.perf_counter()
        readings[name] = read_letters(model, tokenizer, evaluated, shown[:n_shots], chat)
        results["timing"][f"{name}_s"] = time.perf_counter() - began
        results["settings"][name] = {"shots": n_shots, "chat": chat, **setting_summary(readings[name], n_boot, seed)}
    results["prompt_example"] = kadavath_prompt(evaluated[0], shown[: min(most_shots, 1)])
    results["questions"] = [q.id for q in evaluated]
    return results, readings
