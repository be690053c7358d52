"""The real-model track's world: a synthetic biography corpus of invented persons whose monofact rate is set by
design (docs/definitions.md §2), with the world distribution p over prompts that the corpus samples.

Names. Each person's name is two invented words from a seeded syllable grammar (consonant–vowel syllables, two
for a first name, two or three for a last name, capitalised): `invented_names(k, seed)` draws them without
replacement, skipping any word that is a word of the real question set (`lab.data.questions`: countries, capitals,
currencies, languages, …) or of the cities below, so that no name is a real place or a real question's answer. The
grammar is not checked against every real person's name; it is a stated rule, not a guarantee of non-existence.

Facts. One attribute, the birth city, drawn uniformly from CITIES (16 real cities, each one token in SmolLM2's
tokenizer after a space: the model's probability of every value is one next-token reading). A fact is rendered as
the sentence "First Last was born in City." (PROMPT + " City.").

The monofact rate by design. A corpus of n training sentences holds `n_single` persons whose sentence appears
exactly once and `n_repeated` persons whose sentence appears `repeats` times, n = n_single + repeats·n_repeated, so
MF = n_single / n exactly (`lab.metrics.hallucination.monofact_rate` on the counts says so; a test holds it).
Held-out persons are drawn from the same grammar and the same uniform city law, independently, and never appear in
training; they are the same persons at every rate (one seed), so that rates differ only in their corpora.

The world p over prompts (the law a fresh draw follows) is defined so that its unseen mass equals the Good–Turing
estimate MF: MF spread evenly over the held-out persons, and 1 − MF over the trained persons in proportion to their
counts. Factoids are (person, city) pairs of every person, trained or held out: |F| = persons, |H| = persons × 15.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from lab.metrics.hallucination import monofact_rate

CITIES = (
    "Paris",
    "London",
    "Berlin",
    "Tokyo",
    "Madrid",
    "Rome",
    "Cairo",
    "Lima",
    "Oslo",
    "Vienna",
    "Dublin",
    "Boston",
    "Sydney",
    "Toronto",
    "Chicago",
    "Moscow",
)
PROMPT = "{name} was born in"  # the training sentence up to its value; the sentence is PROMPT + " City."
ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "st", "th")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
CODAS = ("", "", "", "n", "r", "l", "s", "k", "th", "m")


def _word(rng: np.random.Generator, syllables: int) -> str:
    parts = [ONSETS[rng.integers(len(ONSETS))] + VOWELS[rng.integers(len(VOWELS))] for _ in range(syllables)]
    return ("".join(parts) + CODAS[rng.integers(len(CODAS))]).capitalize()


def invented_names(k: int, seed: int, forbidden: Iterable[str] = ()) -> list[str]:
    """k distinct two-word names "First Last" from the syllable grammar, seeded; no word of either part is in
    `forbidden` (compared in lower case) or one of CITIES."""
    banned = {w.lower() for w in forbidden} | {c.lower() for c in CITIES}
    rng = np.random.default_rng([seed, 7])
    names: list[str] = []
    seen: set[str] = set()
    for _ in range(1000 * k + 1000):
        if len(names) == k:
            return names
        first, last = _word(rng, 2), _word(rng, int(rng.integers(2, 4)))
        name = f"{first} {last}"
        if first.lower() in banned or last.lower() in banned or name in seen:
            continue
        seen.add(name)
        names.append(name)
    raise ValueError(f"the name grammar gave fewer than {k} distinct names")


def question_words() -> set[str]:
    """Every word (letters only, lower case) of the real question set's texts, answers and distractors."""
    from lab.data.questions import load_questions

    words: set[str] = set()
    for q in load_questions():
        for text in (q.text, q.answer, q.subject, *q.distractors, *q.options):
            words.update("".join(ch if ch.isalpha() else " " for ch in text).lower().split())
    return words


@dataclass(frozen=True)
class Corpus:
    """One monofact rate's corpus: the trained persons (singletons first, then the repeated ones) and their
    training counts, the held-out persons, each person's city, and the world p over all persons' prompts."""

    names: tuple[str, ...]  # trained persons, then held-out persons
    cities: tuple[int, ...]  # each person's true city, an index into CITIES
    counts: np.ndarray  # training count of each person (0 for the held-out)
    repeats: int

    @property
    def n_train(self) -> int:
        return int(self.counts.sum())

    @property
    def monofact_rate(self) -> float:
        return monofact_rate(self.counts[self.counts > 0])

    @property
    def kind(self) -> np.ndarray:
        """Each person's kind: "single" (seen once), "repeated", "heldout"."""
        return np.where(self.counts == 0, "heldout", np.where(self.counts == 1, "single", "repeated"))

    @property
    def p(self) -> np.ndarray:
        """The world's law over persons (their prompts): MF on the held-out evenly, 1 − MF ∝ count on the trained."""
        mf = self.monofact_rate
        heldout = self.counts == 0
        p = (1.0 - mf) * self.counts / self.n_train
        p[heldout] = mf / heldout.sum()
        return p

    def prompt(self, person: int) -> str:
        return PROMPT.format(name=self.names[person])

    def sentence(self, person: int) -> str:
        return f"{self.prompt(person)} {CITIES[self.cities[person]]}."

    def training_sentences(self) -> list[str]:
        """Every training sentence, each person's as often as its count, in person order (batches shuffle them)."""
        return [self.sentence(i) for i, c in enumerate(self.counts) for _ in range(int(c))]


def design(n_train: int, rate: float, repeats: int) -> tuple[int, int]:
    """(singletons, repeated persons) for a corpus of exactly n_train sentences whose MF is the nearest to `rate`
    that repeats divides: n_single + repeats·n_repeated = n_train."""
    if not 0.0 < rate < 1.0 or repeats < 2 or n_train < repeats:
        raise ValueError(f"need 0 < rate < 1, repeats ≥ 2 and n_train ≥ repeats; got {rate}, {repeats}, {n_train}")
    n_repeated = round(n_train * (1.0 - rate) / repeats)
    n_repeated = min(max(n_repeated, 1), (n_train - 1) // repeats)
    return n_train - repeats * n_repeated, n_repeated


def build_corpus(
    n_train: int, rate: float, repeats: int, n_heldout: int, seed: int, forbidden: Iterable[str] = ()
) -> Corpus:
    """The corpus at monofact rate ≈ `rate` (exactly design()'s), with n_heldout held-out persons. Names and cities
    come from one seeded pool: the held-out persons first (the same at every rate), then the trained ones."""
    n_single, n_repeated = design(n_train, rate, repeats)
    n_persons = n_single + n_repeated
    names = invented_names(n_heldout + n_train, seed, forbidden)
    cities = np.random.default_rng([seed, 11]).integers(len(CITIES), size=len(names))
    heldout = list(range(n_heldout))
    trained = list(range(n_heldout, n_heldout + n_persons))
    order = trained + heldout
    counts = np.array([1] * n_single + [repeats] * n_repeated + [0] * n_heldout, dtype=np.int64)
    return Corpus(tuple(names[i] for i in order), tuple(int(cities[i]) for i in order), counts, repeats)
