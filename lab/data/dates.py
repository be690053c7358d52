"""A toy translation world: dates written in words → ISO 8601 dates.

    "the third of march two thousand and five"     →  2005-03-03
    "march the twenty first nineteen eighty four"  →  1984-03-21
    "june ninth nineteen oh seven"                 →  1907-06-09

The source is word-level (one id per word); the target is character-level: <bos>, the ten characters
of YYYY-MM-DD, <eos>. Both use `lab.data.tokenizers.word_level` (target characters are space-separated).
Solving it takes reordering (the year comes last in the words, first in the ISO form) and
composition (a year's digits come from two or three words), which cross-attention does visibly.

Every calendar day from 1900-01-01 to 2099-12-31 is an entity. The held-out days are drawn first, and
no held-out day appears in training in any written form (entity-disjoint), so held-out exact match
measures translating unseen dates, not recalling seen strings.
"""

import datetime
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lab.data.tokenizers import word_level

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
ORDINAL_ONES = [
    "",
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
    "thirteenth",
    "fourteenth",
    "fifteenth",
    "sixteenth",
    "seventeenth",
    "eighteenth",
    "nineteenth",
]
MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
FORMS = ("the {day} of {month} {year}", "{month} the {day} {year}", "{month} {day} {year}")
FIRST, LAST = datetime.date(1900, 1, 1), datetime.date(2099, 12, 31)
TARGET_CHARS = list("0123456789-")


def cardinal(n: int) -> str:
    """1 … 99 in words: 'seven', 'forty two'."""
    if n < 20:
        return ONES[n]
    return TENS[n // 10] + (f" {ONES[n % 10]}" if n % 10 else "")


def ordinal(n: int) -> str:
    """1 … 31 as an ordinal: 'first', 'twentieth', 'thirty first'."""
    if n < 20:
        return ORDINAL_ONES[n]
    if n % 10 == 0:
        return TENS[n // 10][:-1] + "ieth"  # twenty → twentieth, thirty → thirtieth
    return f"{TENS[n // 10]} {ORDINAL_ONES[n % 10]}"


def year_words(year: int) -> str:
    """1900 'nineteen hundred', 1907 'nineteen oh seven', 1984 'nineteen eighty four',
    2000 'two thousand', 2005 'two thousand and five', 2042 'two thousand and forty two'."""
    century, rest = divmod(year, 100)
    if century == 19:
        return "nineteen " + ("hundred" if rest == 0 else f"oh {ONES[rest]}" if rest < 10 else cardinal(rest))
    if century == 20:
        return "two thousand" + (f" and {cardinal(rest)}" if rest else "")
    raise ValueError(f"the dates world covers 1900–2099, got {year}")


def date_words(date: datetime.date, form: int) -> str:
    return FORMS[form].format(day=ordinal(date.day), month=MONTHS[date.month - 1], year=year_words(date.year))


def iso_chars(date: datetime.date) -> str:
    """The target text: the ISO date's characters separated by spaces ('2 0 0 5 - 0 3 - 0 3')."""
    return " ".join(date.isoformat())


@dataclass
class TranslationData:
    """(source ids, target ids) pairs; targets are <bos> … <eos>."""

    train: list[tuple[list[int], list[int]]]
    held_out: list[tuple[list[int], list[int]]]
    src_tokenizer: Any  # tokenizers.Tokenizer
    tgt_tokenizer: Any
    world: dict[str, Any]  # enough to rebuild the world


def source_vocabulary() -> list[str]:
    words = ONES + TENS[2:] + ORDINAL_ONES[1:] + [ordinal(n) for n in (20, 30)] + MONTHS
    return words + ["the", "of", "oh", "hundred", "thousand", "and"]


def dates_world(n_train: int, n_held_out: int, seed: int = 0) -> TranslationData:
    """`n_train` training pairs (distinct days, each in one form drawn uniformly) and `n_held_out` pairs
    for held-out days that never occur in training."""
    n_days = (LAST - FIRST).days + 1
    if n_train + n_held_out > n_days:
        raise ValueError(f"n_train + n_held_out = {n_train + n_held_out} exceeds the {n_days} days in 1900–2099")
    rng = np.random.default_rng(seed)
    days = rng.permutation(n_days)[: n_held_out + n_train]  # held-out first: disjoint by construction
    forms = rng.integers(len(FORMS), size=len(days))
    src_tokenizer, tgt_tokenizer = word_level(source_vocabulary()), word_level(TARGET_CHARS)
    pairs = []
    for day, form in zip(days.tolist(), forms.tolist()):
        date = FIRST + datetime.timedelta(days=day)
        pairs.append(
            (
                src_tokenizer.encode(date_words(date, form)).ids,
                tgt_tokenizer.encode(f"<bos> {iso_chars(date)} <eos>").ids,
            )
        )
    world = {
        "kind": "dates",
        "n_train": n_train,
        "n_held_out": n_held_out,
        "seed": seed,
        "forms": list(FORMS),
        "first": FIRST.isoformat(),
        "last": LAST.isoformat(),
    }
    return TranslationData(pairs[n_held_out:], pairs[:n_held_out], src_tokenizer, tgt_tokenizer, world)


@torch.inference_mode()
def exact_match(model: Any, pairs: list[tuple[list[int], list[int]]], batch_size: int = 512) -> float:
    """Fraction of pairs whose greedy translation (KV-cached decoding) equals the target token for token.

    Pairs are decoded in groups of equal source and target length, so no batch needs padding.
    """
    groups: dict[tuple[int, int], list[tuple[list[int], list[int]]]] = {}
    for src, tgt in pairs:
        groups.setdefault((len(src), len(tgt)), []).append((src, tgt))
    correct = 0
    for (_, tgt_len), group in groups.items():
        for start in range(0, len(group), batch_size):
            src = torch.tensor([s for s, _ in group[start : start + batch_size]])
            tgt = torch.tensor([t for _, t in group[start : start + batch_size]])
            out = model.generate(src, tgt_len - 1, bos_token_id=int(tgt[0, 0]))
            correct += int((out.cpu() == tgt).all(dim=1).sum())
    return correct / len(pairs)
