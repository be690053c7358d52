"""`forma questions`: build the real question set (lab.data.questions) from the packages that ship its facts."""

import argparse
from pathlib import Path


def cmd_questions(args: argparse.Namespace) -> int:
    """Build the question set of real facts (countries' capitals, currencies, official languages, regions,
    subregions and demonyms; short answer, multiple choice and true/false) from the countryinfo package, checked
    against CLDR (babel), into FILE (default: the set Forma ships, lab/data/questions.json). The same seed writes
    the same bytes. Needs countryinfo and babel at the versions constraints.txt pins (the `dev` extra); loading
    the shipped set (lab.data.questions.load_questions) needs neither. --check writes nothing: it rebuilds and
    compares with FILE (exit 1 when they differ). docs/questions.md states the rules."""
    from lab.data.questions import SHIPPED, build_questions, questions_text, read_question_set
    from lab.files import atomic_write_text
    from lab.outside_files import InputError, read_bytes

    path = Path(args.out) if args.out else SHIPPED
    if path.exists() and not args.check:
        try:
            read_question_set(path)  # only a question set is overwritten: nothing else of the user's is lost
        except InputError as err:
            raise ValueError(f"{path} is there and is not a question set; not overwritten ({err})") from None
    meta, questions = build_questions(args.seed)
    text = questions_text(meta, questions)
    sizes = ", ".join(f"{form} {sum(counts.values()):,}" for form, counts in meta["counts"].items())
    if args.check:
        same = read_bytes(path, what="question set") == text.encode()
        print(f"{path}: {'the same bytes as' if same else 'differs from'} a rebuild with seed {args.seed} ({sizes})")
        return 0 if same else 1
    atomic_write_text(path, text)
    versions = ", ".join(f"{name} {source['version']}" for name, source in meta["sources"].items())
    print(f"wrote {len(questions):,} questions ({sizes}) to {path}, from {versions}")
    return 0
