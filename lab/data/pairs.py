"""Two datasets of clean/corrupted prompt pairs for `forma patch` (lab.analysis.sweeps's JSONL format: clean,
corrupted, answer, wrong), made for smollm2's tokenizer and shipped in lab/data/pairs/:

    ioi.jsonl        indirect object identification (Wang et al. 2022, "Interpretability in the wild", §2): "When
                     Mary and John went to the store, John gave a drink to" → " Mary" (the indirect object), wrong
                     " John" (the subject); corrupted by swapping the repeated subject for the other name ("…, Mary
                     gave a drink to", whose answer is " John"), the paper's ABB → ABA corruption
    capitals.jsonl   a fact recalled: "The capital of France is" → " Paris", wrong the capital of the corrupted
                     prompt's country ("The capital of Germany is" → " Berlin"), built from the real question set's
                     capitals (lab.data.questions.load_questions), each fact's question id kept in the row

Rules, checked against the tokenizer the pairs are made for (a candidate that breaks one is dropped, never
respelled): R1 the answer and the wrong answer are one token each, with their leading space; R2 the clean and the
corrupted prompt are as many tokens long (patching swaps activations position by position); R3 the answer and the
wrong answer differ; R4 a capital that is its country's own name (Singapore, Luxembourg, Gibraltar) is copied from
the prompt, not recalled, and is left out. Every random choice is drawn from one seeded `random.Random`, so the same
seed and tokenizer write the same bytes (`write_pairs`)."""

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab.data.questions import load_questions
from lab.files import atomic_write_text

SHIPPED_DIR = Path(__file__).with_name("pairs")
DEFAULT_SEED = 0
N_IOI = 96
# Each capital appears as the clean fact this many times, with different corrupted countries: the question set has
# about 40 single-token capitals, and a sweep wants more pairs than that.
CORRUPTIONS_PER_FACT = 2

# The IOI paper's sentence shapes (Wang et al. 2022, appendix: "BABA"/"ABBA" templates), written with the
# indirect object first: {io} and {s} are introduced, then {s} is repeated as the one who gives.
TEMPLATES = (
    "When {io} and {s} went to the {place}, {s} gave a {thing} to",
    "Then, {io} and {s} went to the {place}. {s} gave a {thing} to",
    "After {io} and {s} went to the {place}, {s} gave a {thing} to",
    "While {io} and {s} were working at the {place}, {s} gave a {thing} to",
    "When {io} and {s} got a {thing} at the {place}, {s} decided to give it to",
    "Friends {io} and {s} found a {thing} at the {place}. {s} gave it to",
)
NAMES = (
    "Mary", "John", "Tom", "James", "Anna", "Paul", "Sarah", "David", "Lisa", "Michael", "Emma", "Daniel", "Kate",
    "Mark", "Laura", "Peter", "Alice", "George", "Rachel", "Steve", "Linda", "Kevin", "Jessica", "Brian", "Amy",
    "Richard", "Helen", "Robert", "Grace", "Thomas",
)  # fmt: skip
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "station", "park", "house", "market")
THINGS = ("drink", "ring", "book", "bone", "basketball", "computer", "necklace", "snack", "kiss", "letter")
CAPITAL_PROMPT = "The capital of {country} is"

Encode = Callable[[str], list[int]]


def one_token(encode: Encode, word: str) -> bool:
    """Whether " word" (with its leading space, as it follows a prompt) is one token (R1)."""
    return len(encode(" " + word)) == 1


def ioi_pairs(encode: Encode, n: int = N_IOI, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """n IOI pairs, drawn from TEMPLATES × two distinct single-token NAMES × PLACES × THINGS."""
    rng = random.Random(seed)
    names = [name for name in NAMES if one_token(encode, name)]
    pairs: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(pairs) < n:
        io, s = rng.sample(names, 2)
        template, place, thing = rng.choice(TEMPLATES), rng.choice(PLACES), rng.choice(THINGS)
        clean = template.format(io=io, s=s, place=place, thing=thing)
        # The repeated subject swapped for the indirect object: the first "{s}" is the introduction, kept.
        head, _, tail = template.rpartition("{s}")
        corrupted = head.format(io=io, s=s, place=place, thing=thing) + io + tail.format(place=place, thing=thing)
        if clean in seen or len(encode(clean)) != len(encode(corrupted)):  # R2
            continue
        seen.add(clean)
        pairs.append({"clean": clean, "corrupted": corrupted, "answer": " " + io, "wrong": " " + s})
    return pairs


def capital_pairs(encode: Encode, seed: int = DEFAULT_SEED, per_fact: int = CORRUPTIONS_PER_FACT) -> list[dict]:
    """For each capital of the shipped question set that passes R1 and R4, `per_fact` pairs whose corrupted
    prompt names another such country as many tokens long (R2), drawn without repeats."""
    rng = random.Random(seed)
    facts = [
        q
        for q in load_questions("short", "capital")
        if one_token(encode, q.answer) and q.answer.casefold() != q.subject.casefold()
    ]
    width = {q.id: len(encode(CAPITAL_PROMPT.format(country=q.subject))) for q in facts}
    pairs = []
    for fact in facts:
        others = [q for q in facts if q.id != fact.id and width[q.id] == width[fact.id] and q.answer != fact.answer]
        for other in rng.sample(others, min(per_fact, len(others))):
            pairs.append(
                {
                    "clean": CAPITAL_PROMPT.format(country=fact.subject),
                    "corrupted": CAPITAL_PROMPT.format(country=other.subject),
                    "answer": " " + fact.answer,
                    "wrong": " " + other.answer,
                    "subject": fact.subject,
                    "question": fact.id,
                    "corrupted_question": other.id,
                }
            )
    return pairs


def pairs_text(pairs: list[dict[str, Any]]) -> str:
    """A dataset as JSONL: one pair a line, keys in a fixed order."""
    return "".join(json.dumps(pair, ensure_ascii=False) + "\n" for pair in pairs)


def write_pairs(encode: Encode, folder: str | Path = SHIPPED_DIR, seed: int = DEFAULT_SEED) -> dict[str, Path]:
    """Write ioi.jsonl and capitals.jsonl into `folder` for the tokenizer `encode` (text → token ids, no special
    tokens), from `seed`; the paths written, by name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, pairs in (("ioi", ioi_pairs(encode, seed=seed)), ("capitals", capital_pairs(encode, seed=seed))):
        path = folder / f"{name}.jsonl"
        atomic_write_text(path, pairs_text(pairs))
        written[name] = path
    return written
