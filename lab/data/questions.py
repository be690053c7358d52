"""Real questions, offline: facts about the world's countries in three forms — short answer, multiple choice
(A–D) and true/false — for the experiments that ask a real language model what it knows (Kadavath et al. 2022's
calibration, the monitor).

Source. The facts are the `countryinfo` package's (PyPI, MIT licence, pinned in constraints.txt): a country's
capital, currency, official language, region, subregion and demonym. Its currencies and languages are ISO codes;
their English names are CLDR's, read through `babel` (BSD-3-Clause; CLDR's data under the Unicode licence), which
is also the second source that currencies and languages are checked against. Both licences allow the derived set
to ship: lab/data/questions.json, built by `forma questions` (that command needs both packages, pinned in the
`dev` extra; loading the shipped set needs neither). Every question names its source: package, version, field,
the ISO 3166-1 alpha-3 code of the record and the value as the package holds it.

Rules: what makes a subject, and an answer, checked. A subject (a country) is kept when

S1. it has ISO alpha-2 and alpha-3 codes, and the package resolves its alpha-3 code to this very record (one
    subject per code: "Burma" is an alias of "Myanmar", "Wales" of the United Kingdom);
S2. it is a territory in use on REFERENCE_DATE: CLDR lists a currency in use there then (the Netherlands
    Antilles, Serbia and Montenegro and Antarctica are not);
S3. its name, folded to ASCII (A1), has no comma and no bracket: ISO's inverted and qualified forms ("Virgin
    Islands, British", "Saint Martin (French part)") are not how a sentence names a place.

An answer (one fact: a subject's value of one kind) is kept when

A1. it is one value: a capital that is one non-empty string without "/", ",", ";" or " and "; exactly one language
    code; exactly one currency code that is legal tender (A4; the United States' USN and USS are fund codes, not a
    second currency); a non-empty region, subregion and demonym;
A2. it is ASCII once folded: NFKD, combining marks removed ("Bogotá" → "Bogota", "Chișinău" → "Chisinau"); a
    value still not printable ASCII is dropped (so are subjects, under S3). The value as the package holds it stays
    in the question's source;
A3. it is not ambiguous: a capital or a demonym that two subjects of S1–S2 share (after folding, whatever the
    case) is dropped for all of them — "Kingston" is Jamaica's and Norfolk Island's, "Jerusalem" two subjects'
    (a currency, a language or a region shared is one thing shared, and stays);
A4. a second source agrees where there is one: the currency is the one and only tender CLDR lists in use in the
    territory on REFERENCE_DATE, and one of the package's codes (Croatia's kuna, replaced by the euro in 2023, is
    dropped); the language is the one and only official language (de facto included) CLDR lists for the territory.

Forms. Every fact gives one question of each form. Multiple choice: the answer and three distractors of the same
kind (other capitals, other currencies, …), distinct from the answer and from each other (whatever the case), in an
order drawn from the seed; exactly one option is correct. True/false: a statement that the subject's value is the
answer (true) or the first distractor (false); within each kind, half the facts (rounded down) are true, which
half drawn from the seed. A short-answer question carries the same distractors, for scoring by likelihood. The
random draws are seeded per fact (and per kind for the true/false halves), so the same seed writes the same bytes.
"""

import datetime
import importlib.metadata
import json
import random
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lab.outside_files import InputError, read_json_object

SHIPPED = Path(__file__).with_name("questions.json")
DEFAULT_SEED = 0
# The day currencies are read as "in use" (S2, A4): a fixed day, so that a rebuild next year gives the same set.
REFERENCE_DATE = datetime.date(2025, 1, 1)
PACKAGES = ("countryinfo", "babel")  # what a rebuild needs (pinned in constraints.txt and the `dev` extra)
FORMS = ("short", "mc", "tf")
KINDS = ("capital", "currency", "language", "region", "subregion", "demonym")
LETTERS = ("A", "B", "C", "D")
N_DISTRACTORS = 3
# How each kind is asked (short answer, multiple choice) and stated (true/false).
ASKED = {
    "capital": "What is the capital of {subject}?",
    "currency": "What is the currency of {subject}?",
    "language": "What is the official language of {subject}?",
    "region": "In which region of the world is {subject}?",
    "subregion": "In which subregion of the world is {subject}?",
    "demonym": "What are people from {subject} called?",
}
STATED = {
    "capital": "The capital of {subject} is {value}.",
    "currency": "The currency of {subject} is the {value}.",
    "language": "The official language of {subject} is {value}.",
    "region": "{subject} is in the region {value}.",
    "subregion": "{subject} is in the subregion {value}.",
    "demonym": "People from {subject} are called {value}.",
}
FIELDS = {  # the countryinfo field each kind reads
    "capital": "capital",
    "currency": "currencies",
    "language": "languages",
    "region": "region",
    "subregion": "subregion",
    "demonym": "demonym",
}
UNIQUE_KINDS = ("capital", "demonym")  # A3: a value two subjects share is ambiguous
SEPARATORS = ("/", ",", ";", " and ")  # A1: a capital written with one of these names several


@dataclass(frozen=True)
class Source:
    """Where an answer came from: `package` `version`'s `field` in the record of ISO alpha-3 code `key`, which
    holds `value` (before folding to ASCII, or the ISO code that `checked_with` named)."""

    package: str
    version: str
    field: str
    key: str
    value: str
    checked_with: str  # the second source that agreed and named the value (A4), or ""


@dataclass(frozen=True)
class Question:
    """One question. `subject` is the country's name as it appears, verbatim, in `text` (so a patching or
    attribution method can find its tokens); `answer` the fact's value; `distractors` three wrong values of the
    same kind. `text` is a question (short, mc) or a statement (tf); `options` the four choices A–D (mc only);
    `claim` the value a tf statement asserts; `label` what a correct reply is: the answer (short), a letter (mc),
    "True" or "False" (tf)."""

    id: str
    form: str
    kind: str
    subject: str
    text: str
    answer: str
    distractors: tuple[str, ...]
    options: tuple[str, ...]
    claim: str
    label: str
    source: Source

    @property
    def prompt(self) -> str:
        """The question as plain text, ending where the reply begins."""
        if self.form == "mc":
            choices = "".join(f"\n{letter}. {option}" for letter, option in zip(LETTERS, self.options))
            return f"{self.text}{choices}\nAnswer:"
        if self.form == "tf":
            return f"True or false: {self.text}\nAnswer:"
        return f"{self.text}\nAnswer:"


@dataclass(frozen=True)
class CountryFact:
    """A checked fact: `subject`'s value of `kind` is `answer`."""

    kind: str
    subject: str
    answer: str
    source: Source


def ascii_fold(text: str) -> str | None:
    """`text` in printable ASCII: NFKD, combining marks removed, spaces collapsed (A2); None when that is not
    enough ("Nukuʻalofa"'s ʻokina is a letter, not a mark)."""
    decomposed = unicodedata.normalize("NFKD", text)
    folded = " ".join("".join(ch for ch in decomposed if not unicodedata.combining(ch)).split())
    if not folded or not folded.isascii() or not folded.isprintable():
        return None
    return folded


def package_values(kind: str, raw: Any) -> list[str]:
    """The record's values of `kind` as the package holds them (A1's shapes): the codes of a currency or a
    language field, a capital unless written with a separator, a non-empty region, subregion or demonym."""
    if kind in ("currency", "language"):
        return [code for code in raw if isinstance(code, str) and code] if isinstance(raw, list) else []
    if not isinstance(raw, str) or not raw.strip():
        return []
    if kind == "capital" and any(separator in raw for separator in SEPARATORS):
        return []
    return [raw.strip()]


def installed_versions() -> dict[str, str]:
    """The installed version of each package a rebuild needs; a ValueError saying what to install when one is
    missing (the shipped set loads without them)."""
    try:
        return {name: importlib.metadata.version(name) for name in PACKAGES}
    except importlib.metadata.PackageNotFoundError as missing:
        raise ValueError(
            f"rebuilding the question set needs {' and '.join(PACKAGES)}, pinned in constraints.txt "
            f"(pip install -c constraints.txt -e '.[dev]'); {missing.name} is not installed. The shipped set, "
            f"{SHIPPED.name}, loads without them"
        ) from None


def licence(package: str) -> str:
    """A package's licence as its metadata states it."""
    meta = importlib.metadata.metadata(package)
    return meta.get("License-Expression") or meta.get("License") or "not stated"


def read_subjects() -> list[dict[str, Any]]:
    """countryinfo's records that are subjects under S1 and S2, by ISO alpha-3 code."""
    from babel.numbers import get_territory_currencies
    from countryinfo import CountryInfo

    kept = []
    for record in CountryInfo.all().values():
        iso = record.get("ISO") or {}
        alpha2, alpha3 = iso.get("alpha2"), iso.get("alpha3")
        if not alpha2 or not alpha3 or CountryInfo(alpha3).name() != record["name"]:
            continue  # S1
        if not get_territory_currencies(alpha2, REFERENCE_DATE):
            continue  # S2
        kept.append(record)
    return sorted(kept, key=lambda record: record["ISO"]["alpha3"])


def named_value(kind: str, values: list[str], alpha2: str) -> tuple[str, str, str] | None:
    """(the value as a question gives it, the package's value it came from, the second source that agreed and
    named it) when the record holds one value of `kind` (A1) that the second source, where there is one, agrees
    with (A4); None otherwise. A currency is the one CLDR lists as tender in use on REFERENCE_DATE, among the
    package's codes (the United States' USN and USS are fund codes, not a second currency); a language is the
    package's one code, CLDR's one official language; each named in English by CLDR."""
    import babel
    from babel.core import Locale, get_cldr_version
    from babel.languages import get_official_languages
    from babel.numbers import get_currency_name, get_territory_currencies

    checked_with = f"babel {babel.__version__} (CLDR {get_cldr_version()})"
    if kind == "currency":
        in_use = get_territory_currencies(alpha2, REFERENCE_DATE)
        if len(in_use) != 1 or in_use[0] not in values:
            return None
        return get_currency_name(in_use[0], locale="en"), in_use[0], checked_with
    if len(values) != 1:
        return None
    if kind == "language":
        name = Locale("en").languages.get(values[0])
        if get_official_languages(alpha2, de_facto=True) != (values[0],) or not name:
            return None
        return name, values[0], checked_with
    return values[0], values[0], ""


def candidate_facts(records: list[dict[str, Any]], version: str) -> list[CountryFact]:
    """Every fact of the subjects under S1–S2 whose value holds A1, A2 and A4, the subject's name as the package
    writes it (S3 and A3 are applied by `checked_facts`)."""
    found = []
    for record in records:
        alpha2, alpha3 = record["ISO"]["alpha2"], record["ISO"]["alpha3"]
        for kind in KINDS:
            named = named_value(kind, package_values(kind, record.get(FIELDS[kind])), alpha2)
            answer = None if named is None else ascii_fold(named[0])
            if answer is None:
                continue
            source = Source("countryinfo", version, FIELDS[kind], alpha3, named[1], named[2])
            found.append(CountryFact(kind, record["name"], answer, source))
    return found


def checked_facts() -> list[CountryFact]:
    """The facts that hold every rule of the module's docstring, by kind and ISO alpha-3 code."""
    version = installed_versions()["countryinfo"]
    candidates = candidate_facts(read_subjects(), version)
    holders: dict[tuple[str, str], set[str]] = {}
    for fact in candidates:
        holders.setdefault((fact.kind, fact.answer.casefold()), set()).add(fact.source.key)
    kept = []
    for fact in candidates:
        subject = ascii_fold(fact.subject)
        if subject is None or any(mark in subject for mark in ",()[]"):
            continue  # S3
        if fact.kind in UNIQUE_KINDS and len(holders[fact.kind, fact.answer.casefold()]) > 1:
            continue  # A3
        kept.append(CountryFact(fact.kind, subject, fact.answer, fact.source))
    return sorted(kept, key=lambda fact: (KINDS.index(fact.kind), fact.source.key))


def value_pools(facts: list[CountryFact]) -> dict[str, list[str]]:
    """Each kind's distinct values (whatever the case), sorted: where distractors are drawn from."""
    pools: dict[str, dict[str, str]] = {kind: {} for kind in KINDS}
    for fact in facts:
        pools[fact.kind].setdefault(fact.answer.casefold(), fact.answer)
    return {kind: sorted(values.values()) for kind, values in pools.items()}


def true_statements(facts: list[CountryFact], seed: int) -> set[tuple[str, str]]:
    """(kind, key) of the facts whose true/false question is true: half of each kind (rounded down), drawn from
    the seed."""
    chosen = set()
    for kind in KINDS:
        keys = sorted(fact.source.key for fact in facts if fact.kind == kind)
        random.Random(f"{seed}/{kind}/tf").shuffle(keys)
        chosen.update((kind, key) for key in keys[: len(keys) // 2])
    return chosen


def fact_questions(fact: CountryFact, pool: list[str], seed: int, true: bool) -> list[Question]:
    """The fact's three questions (short, mc, tf); its distractors and option order drawn from the seed."""
    rng = random.Random(f"{seed}/{fact.kind}/{fact.source.key}")
    others = [value for value in pool if value.casefold() != fact.answer.casefold()]
    if len(others) < N_DISTRACTORS:
        raise ValueError(f"{fact.kind}: {len(others)} other values, too few for {N_DISTRACTORS} distractors")
    distractors = tuple(rng.sample(others, N_DISTRACTORS))
    options = [fact.answer, *distractors]
    rng.shuffle(options)
    claim = fact.answer if true else distractors[0]
    asked = ASKED[fact.kind].format(subject=fact.subject)
    stated = STATED[fact.kind].format(subject=fact.subject, value=claim)
    forms = {  # form: (text, options, claim, label)
        "short": (asked, (), "", fact.answer),
        "mc": (asked, tuple(options), "", LETTERS[options.index(fact.answer)]),
        "tf": (stated, (), claim, str(true)),
    }
    return [
        Question(
            f"{fact.kind}/{fact.source.key}/{form}",
            form,
            fact.kind,
            fact.subject,
            text,
            fact.answer,
            distractors,
            choices,
            claimed,
            label,
            fact.source,
        )
        for form, (text, choices, claimed, label) in forms.items()
    ]


def build_questions(seed: int = DEFAULT_SEED) -> tuple[dict[str, Any], list[Question]]:
    """(the set's description, its questions by form, kind and ISO code), from the installed packages."""
    from babel.core import get_cldr_version

    versions = installed_versions()
    facts = checked_facts()
    pools = value_pools(facts)
    true = true_statements(facts, seed)
    questions = [
        question
        for fact in facts
        for question in fact_questions(fact, pools[fact.kind], seed, (fact.kind, fact.source.key) in true)
    ]
    questions.sort(key=lambda q: (FORMS.index(q.form), KINDS.index(q.kind), q.source.key))
    meta = {
        "built_by": f"forma questions --seed {seed}",
        "seed": seed,
        "reference_date": REFERENCE_DATE.isoformat(),
        "sources": {name: {"version": versions[name], "licence": licence(name)} for name in PACKAGES},
        "cldr": get_cldr_version(),
        "counts": {
            form: {kind: sum(q.form == form and q.kind == kind for q in questions) for kind in KINDS} for form in FORMS
        },
    }
    return meta, questions


def questions_text(meta: dict[str, Any], questions: list[Question]) -> str:
    """The set as the file holds it: JSON, one question a line, keys sorted, ASCII."""
    rows = ",\n".join(json.dumps(asdict(question), sort_keys=True) for question in questions)
    return f'{{"meta": {json.dumps(meta, sort_keys=True)},\n"questions": [\n{rows}\n]}}\n'


def read_question_set(path: str | Path = SHIPPED) -> tuple[dict[str, Any], list[Question]]:
    """(description, questions) of a question set file, each record checked to be a Question."""
    data = read_json_object(path, what="question set")
    if not isinstance(data.get("meta"), dict) or not isinstance(data.get("questions"), list):
        raise InputError(f"{path} is not a question set: it needs a 'meta' object and a 'questions' list")
    questions = []
    for i, row in enumerate(data["questions"]):
        try:
            fields = {**row, "source": Source(**row["source"])}
            for name in ("distractors", "options"):
                fields[name] = tuple(row[name])
            question = Question(**fields)
        except (TypeError, KeyError) as err:
            raise InputError(f"{path}: question {i} is not a question record ({err})") from None
        if question.form not in FORMS or question.kind not in KINDS:
            raise InputError(f"{path}: question {i} has form {question.form!r}, kind {question.kind!r}")
        questions.append(question)
    return data["meta"], questions


def load_questions(form: str | None = None, kind: str | None = None, path: str | Path = SHIPPED) -> list[Question]:
    """The questions of one form ("short", "mc", "tf") and kind (see KINDS), or of all when None, from the shipped
    set (or `path`), in the file's order."""
    if form is not None and form not in FORMS:
        raise ValueError(f"no question form {form!r}: the forms are {', '.join(FORMS)}")
    if kind is not None and kind not in KINDS:
        raise ValueError(f"no question kind {kind!r}: the kinds are {', '.join(KINDS)}")
    _, questions = read_question_set(path)
    return [q for q in questions if form in (None, q.form) and kind in (None, q.kind)]
