"""The commands about runs and the documents' numbers: `forma run` (an experiment into its run folder) and
`forma cards` (reference cards and runs recorded into docs/measured/, every marked number rewritten)."""

import argparse
import dataclasses
import sys
from pathlib import Path


def cmd_run(args: argparse.Namespace) -> int:
    """Run an experiment, write config.json, provenance.json, figures and results.json into its run folder, and
    print the run's headlines (what it supports, and what it cannot, in words) and the folder."""
    import experiments
    from lab.headlines import lines as headline_lines

    given = _given_options(args)
    from lab.progress import PROGRESS_FILE, recording
    from lab.runs import read_results, run_and_record

    module = experiments.load(args.name)
    fields = {f.name for f in dataclasses.fields(module.Config)}
    cfg = module.Config(**{k: v for k, v in given.items() if k in fields and v is not None})
    name = experiments.run_name(args.name, cfg)  # runs/NAME_real/ for a real-model track
    job = f"forma run {args.name}{' --quick' if args.quick else ''}{f' --model {args.model}' if args.model else ''}"
    # What the run reads from outside (a model, a CSV) is read and checked before its folder is made: a refused
    # input leaves nothing behind, and is said once.
    inputs = module.read_inputs(cfg) if hasattr(module, "read_inputs") else None

    def run_with_progress(config: object, folder: Path) -> dict:
        # The experiment's own trainings show no bar; the job's line (stderr) and its progress file (which
        # the dashboard and `forma demo` read) say which stage it is in, and how far.
        with recording(folder / PROGRESS_FILE, job, echo=True):
            return module.run(config, folder) if inputs is None else module.run(config, folder, inputs)

    folder = run_and_record(
        name, cfg, run_with_progress, out=args.out, seed=getattr(cfg, "seed", None), overwrite=args.overwrite
    )
    (folder / PROGRESS_FILE).unlink(missing_ok=True)  # results.json is there now: the run's state is in it
    if args.quick:  # the numbers below are the small profile's, and say so before they appear
        print(
            f"A quick run (the small profile, for tests and the demo): `forma run {args.name}` is the full experiment."
        )
    print("\n".join(headline_lines(read_results(folder))))
    print(f"results in {folder}")
    return 0


def _given_options(args: argparse.Namespace) -> dict:
    """The experiment's options as given (None or False where not), refused where the arguments alone settle it,
    before torch loads: an option the experiment does not take, a model that is neither a folder nor a trained zoo
    model, and a file that is not there (or not a regular file)."""
    import experiments
    from lab.folders import model_folder
    from lab.outside_files import regular_file

    given = {
        "seed": args.seed,
        "quick": args.quick,
        "model": args.model,
        "mmlu": args.mmlu,
        "qa": args.qa,
        "corpus": args.corpus,
        "workers": args.workers,
    }
    entry = experiments.experiment(args.name)
    takes = {"seed", "quick", *entry.options}
    unsupported = [k for k, v in given.items() if v not in (None, False) and k not in takes]
    if unsupported:
        raise ValueError(f"experiment {args.name!r} takes no --{unsupported[0]}")
    if args.model is not None:
        model_folder(args.model)
    if args.corpus is not None and not Path(args.corpus).is_dir():
        raise ValueError(f"--corpus {args.corpus}: no such folder (`forma corpus real --out DIR` writes one)")
    for option, what in entry.files:
        if given[option] is not None:
            regular_file(given[option], what=what)
    return given


def cmd_cards(args: argparse.Namespace) -> int:
    """Record reference measurements into docs/measured/ and rewrite every marked number of README.md,
    models/*/MODEL.md and docs/*.md from the file it cites.

    --model NAME copies models/NAME/card.json (a default-recipe card: `forma build NAME`) to
    docs/measured/cards/NAME.json; --run copies a finished default-profile run's results.json and
    provenance.json to docs/measured/runs/. Quick cards, quick runs and unfinished runs are refused.
    A number is written <!-- measured FILE FIELD FORMAT -->0.065<!-- /measured --> (lab/measured.py).
    Exit 1 when a document still has a problem: a marker whose file or field is missing, or a bare
    measured-looking number in a "Measured" section or a README/MODEL.md table."""
    from lab.folders import zoo_dir
    from lab.measured import REPO, check_document, documents, record_card, record_run, rewrite_document
    from lab.runs import latest_run

    if args.check and (args.model or args.run):
        raise ValueError("--check records nothing: give it without --model and --run")
    for name in args.model:
        print(f"recorded {record_card(zoo_dir() / name).relative_to(REPO)}")
    for given in args.run:
        folder = Path(given)
        if not folder.is_dir():
            folder = latest_run(given)
            if folder is None:
                raise FileNotFoundError(
                    f"--run {given}: not a run folder, and no finished run of an experiment of that name"
                )
        print(f"recorded {record_run(folder).relative_to(REPO)} (from {folder})")
    problems = []
    for document in documents():
        if not args.check and rewrite_document(document):
            print(f"rewrote {document.relative_to(REPO)}")
        problems += check_document(document)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"every marked number of {len(documents())} documents matches its file")
    return 1 if problems else 0
