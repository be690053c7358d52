"""An arbitrary-fact world: the setting of Kalai & Vempala's hallucination bound (docs/definitions.md §2).

Kalai & Vempala, "Calibrated Language Models Must Hallucinate" (STOC 2024, arXiv 2311.14648).

* Persons have two-part names (first, last) drawn from Faker's en_US pools, so a model that learns the
  name grammar can invent persons that do not exist (docs/definitions.md §2 traps: names must be multi-token).
* Each (person, attribute) pair has one true value drawn uniformly from that attribute's value space,
  independently of everything else: the facts are *arbitrary*, nothing about them can be inferred.
* Factoids Y = persons × attributes × values; facts F ⊂ Y are the true ones; H = Y \\ F are the
  hallucinations, |H| = |Y| − |F|. (A well-formed factoid about a first × last name pair that is not a
  person is false too; `n_factoids_all_names` counts that larger Y.)
* Popularity: weight w_f = ⌊X_f⌋ with X_f ~ Pareto(γ, x_m = 1) (numpy's `pareto` is Lomax, so
  X = Lomax + 1); the true distribution is p(f) = w_f / Σ w. γ = 1 has infinite mean, which is why
  every report should quote the measured monofact rate rather than γ (Miao & Kearns, arXiv 2502.08666).
* The training set is n i.i.d. draws *with replacement* from p. Its monofact rate
  MF = #{facts seen exactly once} / n is the Good–Turing estimate of the missing mass
  p({f : f unseen}) (`true_missing_mass`).

Random streams are split with `numpy.random.SeedSequence(seed).spawn`, so changing n_train does not
change the persons, the facts or their popularity.
"""

import numbers
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
from faker import Faker
from numpy.typing import NDArray

from lab.configs import Record, check_fields, need

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
DAYS_PER_MONTH = 28  # every month gets days 1..28: a clean 12 × 28 = 336-value birthday space
OPTION_LETTERS = ("A", "B", "C", "D", "E", "F", "G", "H")

# Sentence forms per attribute; "{name}" is "{first} {last}". Every token is separated by spaces so a
# word-level tokenizer sees the same words as `word_vocabulary()` lists.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "birthday": (
        "{name} was born on {value} .",
        "The birthday of {name} is {value} .",
        "{name} celebrates a birthday on {value} .",
    ),
    "city": ("{name} lives in {value} .", "The home city of {name} is {value} .", "{name} resides in {value} ."),
}
GENERIC_TEMPLATES = ("The {attribute} of {name} is {value} .", "{name} has {attribute} {value} .")
QUESTIONS: dict[str, str] = {"birthday": "When was {name} born ?", "city": "Where does {name} live ?"}
GENERIC_QUESTION = "What is the {attribute} of {name} ?"
QUIZ_WORDS = ("Question", "Answer", ":", ")", "True", "False")

_ATTRIBUTE_PATTERN = re.compile(r"^[a-z][a-z_]*$")
_NAME_PATTERN = re.compile(r"^[A-Za-z]+$")


class Person(NamedTuple):
    first: str
    last: str

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


class Fact(NamedTuple):
    """A factoid (person, attribute, value); in `FactWorld.facts` it is a true one."""

    person_index: int
    attribute: str
    value: str


class Cloze(NamedTuple):
    """A statement cut before its value: its words, the positions of the name's two words (all the value depends
    on: the mechanism's ground truth) and the value that comes next."""

    words: list[str]
    name_positions: tuple[int, int]
    value: str


# --- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FactWorldConfig(Record):
    """Size, shape and randomness of a fact world."""

    n_first_names: int = 100
    n_last_names: int = 100
    n_persons: int = 1000
    attributes: tuple[str, ...] = ("birthday",)
    pareto_gamma: float = 1.5  # shape of the popularity law; smaller = heavier tail, higher MF
    n_train: int = 10_000  # i.i.d. training documents, drawn with replacement from p
    seed: int = 0
    n_values: int = 100  # size of every value space other than birthday's (city, generic)

    def __post_init__(self) -> None:
        check_fields(self)  # types from the annotations; attributes as a list (JSON, TOML) becomes a tuple

        for name in ("n_first_names", "n_last_names", "n_persons", "n_train"):
            value = getattr(self, name)
            need(self, value > 0, f"{name} must be a positive integer, got {value!r}")
        need(self, self.seed >= 0, f"seed must be a non-negative integer, got {self.seed!r}")
        need(self, self.n_values >= 2, f"n_values must be an integer ≥ 2, got {self.n_values!r}")
        need(self, self.pareto_gamma > 0, f"pareto_gamma must be a finite number > 0, got {self.pareto_gamma!r}")
        n_names = self.n_first_names * self.n_last_names
        need(
            self,
            self.n_persons <= n_names,
            f"n_persons ({self.n_persons}) exceeds n_first_names × n_last_names ({n_names}), "
            f"the number of distinct two-part names",
        )
        need(self, len(self.attributes) > 0, "attributes must name at least one attribute")
        need(
            self,
            len(set(self.attributes)) == len(self.attributes),
            f"attributes must be distinct, got {self.attributes!r}",
        )
        for attribute in self.attributes:
            need(
                self,
                bool(_ATTRIBUTE_PATTERN.match(attribute)),
                f"attributes must be lower-case words ([a-z_]+), got {attribute!r}",
            )

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {"attributes": list(self.attributes)}


# --- names and value spaces -------------------------------------------------------------------


_STALL_DRAWS = 50_000  # give up after this many draws in a row bring nothing new


def _faker_pool_size(fake: Faker, pool: str, accept: re.Pattern[str]) -> int | None:
    """How many accepted words a Faker provider's list `pool` holds, if a provider exposes it."""
    for provider in fake.providers:
        words = getattr(provider, pool, None)
        if words is not None:
            return sum(1 for word in words if accept.match(word))
    return None


def _distinct_faker_words(
    draw: Any, n: int, field_name: str, accept: re.Pattern[str], pool_size: int | None = None
) -> list[str]:
    """Call `draw()` until `n` distinct accepted strings appear; sorted. Raises if the pool is short."""
    if pool_size is not None and n > pool_size:
        raise ValueError(
            f"FactWorldConfig: {field_name} = {n} but Faker's en_US pool holds only "
            f"{pool_size} usable single-word values"
        )
    found: set[str] = set()
    stalled = 0
    while stalled < _STALL_DRAWS:
        word = draw()
        if accept.match(word) and word not in found:
            found.add(word)
            stalled = 0
            if len(found) == n:
                return sorted(found)
        else:
            stalled += 1
    raise ValueError(
        f"FactWorldConfig: {field_name} = {n} but Faker's en_US pool gave only "
        f"{len(found)} distinct usable values before {_STALL_DRAWS} fruitless draws"
    )


def faker_names(n_first: int, n_last: int, seed: int) -> tuple[list[str], list[str]]:
    """`n_first` first names and `n_last` last names, single alphabetic words, sorted.

    Faker's pools are weighted, so asking for nearly the whole pool (en_US: 690 first names, 1000
    last names) takes tens of thousands of draws; a few hundred is quick.
    """
    fake = Faker("en_US")
    fake.seed_instance(seed)
    first = _distinct_faker_words(
        fake.first_name, n_first, "n_first_names", _NAME_PATTERN, _faker_pool_size(fake, "first_names", _NAME_PATTERN)
    )
    last = _distinct_faker_words(
        fake.last_name, n_last, "n_last_names", _NAME_PATTERN, _faker_pool_size(fake, "last_names", _NAME_PATTERN)
    )
    return first, last


def value_space(attribute: str, n_values: int, seed: int) -> tuple[str, ...]:
    """All values an attribute can take: birthday → "{Month} {day}", city → Faker cities, else
    "{attribute}_{i}"."""
    if attribute == "birthday":
        return tuple(f"{month} {day}" for month in MONTHS for day in range(1, DAYS_PER_MONTH + 1))
    if attribute == "city":
        fake = Faker("en_US")
        fake.seed_instance(seed)
        city_pattern = re.compile(r"^[A-Za-z]+( [A-Za-z]+)*$")
        return tuple(_distinct_faker_words(fake.city, n_values, "n_values", city_pattern))
    return tuple(f"{attribute}_{i}" for i in range(n_values))


def templates_for(attribute: str) -> tuple[str, ...]:
    return TEMPLATES.get(attribute, GENERIC_TEMPLATES)


def _question_for(attribute: str) -> str:
    return QUESTIONS.get(attribute, GENERIC_QUESTION)


# --- the world --------------------------------------------------------------------------------


class FactWorld:
    """Persons, their arbitrary true facts, the popularity law p over facts and a training sample."""

    def __init__(self, cfg: FactWorldConfig) -> None:
        self.cfg = cfg
        person_rng, value_rng, popularity_rng, train_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(4)
        )
        self.first_names, self.last_names = faker_names(cfg.n_first_names, cfg.n_last_names, cfg.seed)
        self.persons = self._draw_persons(person_rng)
        self._person_by_name = {person.name: i for i, person in enumerate(self.persons)}
        self.value_spaces = {a: value_space(a, cfg.n_values, cfg.seed) for a in cfg.attributes}
        self.facts = self._draw_facts(value_rng)
        self._fact_index = {(f.person_index, f.attribute): i for i, f in enumerate(self.facts)}
        self.popularity = self._draw_popularity(popularity_rng)
        self.p: NDArray[np.float64] = self.popularity / self.popularity.sum()
        self.train_fact_indices: NDArray[np.int64] = train_rng.choice(
            len(self.facts), size=cfg.n_train, replace=True, p=self.p
        ).astype(np.int64)
        self.train_counts: NDArray[np.int64] = np.bincount(self.train_fact_indices, minlength=len(self.facts))

    def _draw_persons(self, rng: np.random.Generator) -> list[Person]:
        """Distinct (first, last) pairs, sampled without replacement from the name grid."""
        n_last = len(self.last_names)
        flat = np.sort(rng.choice(len(self.first_names) * n_last, size=self.cfg.n_persons, replace=False))
        return [Person(self.first_names[i // n_last], self.last_names[i % n_last]) for i in flat]

    def _draw_facts(self, rng: np.random.Generator) -> list[Fact]:
        """One uniformly drawn true value per (person, attribute); index = person · |A| + attribute."""
        facts = []
        for person_index in range(len(self.persons)):
            for attribute in self.cfg.attributes:
                values = self.value_spaces[attribute]
                facts.append(Fact(person_index, attribute, values[int(rng.integers(len(values)))]))
        return facts

    def _draw_popularity(self, rng: np.random.Generator) -> NDArray[np.float64]:
        """w_f = max(1, ⌊X_f⌋), X_f ~ classical Pareto(γ, x_m = 1) = numpy's Lomax + 1."""
        weights = np.maximum(1.0, np.floor(rng.pareto(self.cfg.pareto_gamma, len(self.facts)) + 1.0))
        if not np.isfinite(weights.sum()):
            raise ValueError(
                f"FactWorldConfig: pareto_gamma = {self.cfg.pareto_gamma} is so small "
                f"that the popularity weights overflow; use a larger value"
            )
        return weights

    # --- the Good–Turing quantities ---
    def monofact_rate(self) -> float:
        """MF = #(training examples whose fact occurs exactly once) / n."""
        return float((self.train_counts == 1).sum() / self.cfg.n_train)

    def true_missing_mass(self) -> float:
        """p-mass of the facts that never occur in the training sample."""
        return float(self.p[self.train_counts == 0].sum())

    # --- factoids ---
    @property
    def n_factoids(self) -> int:
        """|Y| = persons × Σ_a |values(a)|."""
        return len(self.persons) * sum(len(v) for v in self.value_spaces.values())

    @property
    def n_hallucinations(self) -> int:
        """|H| = |Y| − |F|."""
        return self.n_factoids - len(self.facts)

    @property
    def n_factoids_all_names(self) -> int:
        """|Y| when every first × last name pair, person or not, counts as a subject."""
        n_names = len(self.first_names) * len(self.last_names)
        return n_names * sum(len(v) for v in self.value_spaces.values())

    def enumerate_factoids(self) -> Iterator[Fact]:
        """Every well-formed factoid about a person: person × attribute × value, in index order."""
        for person_index in range(len(self.persons)):
            for attribute in self.cfg.attributes:
                for value in self.value_spaces[attribute]:
                    yield Fact(person_index, attribute, value)

    def person_index(self, person: int | str | tuple[str, str]) -> int | None:
        """Index of a person given by index, "First Last" or (first, last); None if no such person."""
        if isinstance(person, numbers.Integral) and not isinstance(person, bool):
            return int(person) if 0 <= person < len(self.persons) else None
        name = " ".join(person) if isinstance(person, tuple) else person
        return self._person_by_name.get(name)

    def true_value(self, person: int | str | tuple[str, str], attribute: str) -> str:
        index = self.person_index(person)
        if index is None or (index, attribute) not in self._fact_index:
            raise KeyError(f"no fact for person {person!r} and attribute {attribute!r}")
        return self.facts[self._fact_index[(index, attribute)]].value

    def is_true(self, person: int | str | tuple[str, str], attribute: str, value: str) -> bool:
        """Whether the factoid is in F (judged against the world, never the training set)."""
        index = self.person_index(person)
        key = (index, attribute)
        return index is not None and key in self._fact_index and self.facts[self._fact_index[key]].value == value

    def classify_bare(self, text: str) -> Literal["fact", "hallucination", "malformed"]:
        """Judge a bare-form string "{first} {last} {attribute} {value} .".

        Well-formed means: both names from the name pools, a known attribute, a value from its value
        space and the final ".". A well-formed factoid that is not in F — including one about a name
        pair that is not a person — is a hallucination; anything else is malformed (reported apart).
        """
        words = text.split()
        if len(words) < 5 or words[-1] != ".":
            return "malformed"
        first, last, attribute, value = words[0], words[1], words[2], " ".join(words[3:-1])
        if (
            first not in self.first_names
            or last not in self.last_names
            or attribute not in self.value_spaces
            or value not in self.value_spaces[attribute]
        ):
            return "malformed"
        return "fact" if self.is_true((first, last), attribute, value) else "hallucination"

    # --- text ---
    def render(self, fact: Fact, form: Literal["bare", "template"] = "bare", template: int = 0) -> str:
        """One factoid as text: bare "{first} {last} {attribute} {value} ." or a sentence template."""
        person = self.persons[fact.person_index]
        if form == "bare":
            return f"{person.name} {fact.attribute} {fact.value} ."
        if form == "template":
            forms = templates_for(fact.attribute)
            return forms[template % len(forms)].format(name=person.name, attribute=fact.attribute, value=fact.value)
        raise ValueError(f"form must be 'bare' or 'template', got {form!r}")

    def cloze(self, fact: Fact, template: int = 0) -> Cloze:
        """`render`'s template statement of `fact` up to its value, with the positions of the name's two words: a
        prompt whose next word is the value, a function of the name alone."""
        forms = templates_for(fact.attribute)
        form = forms[template % len(forms)]
        if "{value}" not in form or form.index("{name}") > form.index("{value}"):
            raise ValueError(f"template {form!r} does not name the person before the value")
        marker = form[: form.index("{value}")].format(name="{first} {last}", attribute=fact.attribute).split()
        first, person = marker.index("{first}"), self.persons[fact.person_index]
        return Cloze(marker[:first] + [person.first, person.last] + marker[first + 2 :], (first, first + 1), fact.value)

    def documents(
        self, form: Literal["bare", "template"] = "bare", seed: int = 0, fact_indices: Sequence[int] | None = None
    ) -> list[str]:
        """The n_train training documents in draw order (or the facts `fact_indices`, e.g. held-out draws);
        `seed` picks each document's template."""
        if form not in ("bare", "template"):
            raise ValueError(f"form must be 'bare' or 'template', got {form!r}")
        indices = self.train_fact_indices if fact_indices is None else fact_indices
        rng = np.random.default_rng(seed)
        choices = rng.integers(0, 1 << 30, size=len(indices))
        return [self.render(self.facts[i], form, int(c)) for i, c in zip(indices, choices)]

    def heldout_fact_indices(self, n: int) -> NDArray[np.int64]:
        """n fresh i.i.d. draws from p, with replacement, from a random stream of their own (the fifth child
        of the world's SeedSequence; the training sample is the fourth): draws independent of the training
        sample, not a set of facts kept out of it. Being draws from the same p, most of them repeat facts the
        training sample also holds — a share 1 − p(unseen facts) in expectation —, so their loss estimates the
        expected loss on new draws from p, not the loss on unseen facts; `heldout_record` counts the overlap.
        A claim about facts the model never saw needs the facts with no training draw (`train_counts == 0`)."""
        if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        rng = np.random.default_rng(np.random.SeedSequence(self.cfg.seed, spawn_key=(4,)))
        return rng.choice(len(self.facts), size=int(n), replace=True, p=self.p).astype(np.int64)

    def heldout_overlap(self, heldout: NDArray[np.int64]) -> dict[str, Any]:
        """How a held-out draw meets the training sample: draws, distinct facts and persons, and how many of
        those also occur in training."""
        heldout = np.asarray(heldout, dtype=np.int64)
        seen = self.train_counts > 0
        facts = np.unique(heldout)
        persons = np.unique([self.facts[i].person_index for i in facts])
        train_persons = {self.facts[i].person_index for i in np.flatnonzero(seen)}
        return {
            "draws": int(len(heldout)),
            "draws_of_facts_in_training": int(seen[heldout].sum()),
            "distinct_facts": int(len(facts)),
            "distinct_facts_in_training": int(seen[facts].sum()),
            "distinct_persons": int(len(persons)),
            "distinct_persons_in_training": int(sum(int(p) in train_persons for p in persons)),
        }

    def heldout_record(self, heldout: NDArray[np.int64], what: str = "statements") -> dict[str, Any]:
        """`heldout_overlap` of these held-out draws, the count of their draws of training facts that independent
        draws give in expectation (n·(1 − p(unseen facts)), `expected_draws_of_facts_in_training`), and how they
        were drawn, in words (`how`): what a card or a run records beside a held-out loss."""
        overlap = self.heldout_overlap(heldout)
        n, shared = overlap["draws"], overlap["draws_of_facts_in_training"]
        expected = n * (1 - self.true_missing_mass())
        return overlap | {
            "expected_draws_of_facts_in_training": expected,
            "how": (
                f"{n:,} held-out {what} drawn i.i.d. from p on a random stream of their own, independent of the "
                f"{self.cfg.n_train:,} training draws — independent draws, not unseen facts: {shared:,} of the {n:,} "
                f"({shared / n:.0%}; {expected:,.0f} expected of independent draws) are of facts that also occur in "
                f"training ({overlap['distinct_facts_in_training']:,} of their {overlap['distinct_facts']:,} distinct "
                f"facts, {overlap['distinct_persons_in_training']:,} of their {overlap['distinct_persons']:,} "
                "persons), "
                f"so their loss estimates the expected loss on new draws from p"
            ),
        }

    def quiz_items(self, persons: Iterable[int], n_options: int = 4, seed: int = 0) -> list[dict[str, Any]]:
        """Lettered multiple choice, one per (person, attribute): the true value among n_options − 1
        distinct wrong values drawn uniformly from the value space, in random order."""
        if not 2 <= n_options <= len(OPTION_LETTERS):
            raise ValueError(f"n_options must be in [2, {len(OPTION_LETTERS)}], got {n_options}")
        rng = np.random.default_rng(seed)
        items = []
        for person_index in persons:
            person = self.persons[person_index]
            for attribute in self.cfg.attributes:
                values = self.value_spaces[attribute]
                if n_options > len(values):
                    raise ValueError(f"n_options ({n_options}) exceeds the {len(values)} values of {attribute!r}")
                truth = self.true_value(person_index, attribute)
                wrong = [v for v in values if v != truth]
                picks = rng.choice(len(wrong), size=n_options - 1, replace=False)
                options = [truth] + [wrong[i] for i in picks]
                order = rng.permutation(n_options)
                options = [options[i] for i in order]
                items.append(
                    {
                        "question": _question_for(attribute).format(name=person.name, attribute=attribute),
                        "options": options,
                        "answer_index": options.index(truth),
                        "person": int(person_index),
                        "attribute": attribute,
                    }
                )
        return items

    def true_false_claims(self, persons: Iterable[int], seed: int = 0) -> list[tuple[str, bool]]:
        """For each (person, attribute): the true claim and one claim with a uniformly drawn wrong
        value, as the attribute's first template, shuffled; half are true."""
        rng = np.random.default_rng(seed)
        claims: list[tuple[str, bool]] = []
        for person_index in persons:
            for attribute in self.cfg.attributes:
                truth = self.true_value(person_index, attribute)
                wrong = [v for v in self.value_spaces[attribute] if v != truth]
                false_value = wrong[int(rng.integers(len(wrong)))]
                claims.append((self.render(Fact(person_index, attribute, truth), "template"), True))
                claims.append((self.render(Fact(person_index, attribute, false_value), "template"), False))
        order = rng.permutation(len(claims))
        return [claims[i] for i in order]

    def split_persons(self, fractions: Sequence[float], seed: int = 0) -> list[NDArray[np.int64]]:
        """Entity-disjoint splits: a random permutation of persons cut at the cumulative fractions.

        Fractions must be positive and sum to at most 1; any remainder is left out of every split.
        """
        shares = np.asarray(fractions, dtype=np.float64)
        if shares.ndim != 1 or len(shares) == 0 or np.any(shares <= 0) or shares.sum() > 1 + 1e-9:
            raise ValueError(f"fractions must be positive and sum to at most 1, got {fractions!r}")
        order = np.random.default_rng(seed).permutation(len(self.persons))
        cuts = np.round(np.concatenate([[0.0], np.cumsum(shares)]) * len(self.persons)).astype(int)
        cuts = np.minimum(cuts, len(self.persons))
        return [np.sort(order[a:b]).astype(np.int64) for a, b in zip(cuts[:-1], cuts[1:])]

    def quiz_prompt(self, item: dict[str, Any]) -> str:
        """ "Question : … ? A ) v B ) v … Answer :" — the letter after "Answer :" is the answer."""
        options = " ".join(f"{OPTION_LETTERS[i]} ) {v}" for i, v in enumerate(item["options"]))
        return f"Question : {item['question']} {options} Answer :"

    def word_vocabulary(self) -> list[str]:
        """Every word any string above can contain: SPECIAL_TOKENS first (so <pad> is id 0), then the
        sorted set of names, attribute words, value words, template, question and quiz words."""
        words: set[str] = set(self.first_names) | set(self.last_names) | set(self.cfg.attributes)
        words |= set(OPTION_LETTERS) | set(QUIZ_WORDS)
        for attribute, values in self.value_spaces.items():
            for value in values:
                words.update(value.split())
            for text in (*templates_for(attribute), _question_for(attribute)):
                filled = text.format(name="", attribute=attribute, value="")
                words.update(filled.split())
        words -= set(SPECIAL_TOKENS)
        return list(SPECIAL_TOKENS) + sorted(words)

    def summary(self) -> dict[str, Any]:
        """Provenance and the headline numbers, JSON-ready."""
        return {
            "config": self.cfg.to_dict(),
            "n_persons": len(self.persons),
            "n_facts": len(self.facts),
            "n_factoids": self.n_factoids,
            "n_hallucinations": self.n_hallucinations,
            "monofact_rate": self.monofact_rate(),
            "true_missing_mass": self.true_missing_mass(),
            "n_distinct_train_facts": int((self.train_counts > 0).sum()),
        }
