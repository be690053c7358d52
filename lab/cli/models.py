"""The commands about one model: `forma hooks` (its hook points and their shapes), `forma trust` (how far to
trust its numbers), `forma build` (a zoo model built from its recipe, resumable) and `forma transcoders` (its
transcoders, in one process or as torchrun's ranks, resumable)."""

import argparse
import json
import math
import signal
import sys
from pathlib import Path


def cmd_hooks(args: argparse.Namespace) -> int:
    """Print every hook point of a model with the shape it carries for a one-sequence input."""
    from lab.folders import model_folder

    folder = model_folder(args.model)  # an unknown name is refused at once, not after torch has loaded
    import torch

    from lab.load import load_model

    model = load_model(folder)
    if args.tokens < 1:
        raise ValueError(f"--tokens must be at least 1, got {args.tokens}")
    tokens = torch.zeros(1, args.tokens, dtype=torch.long)  # longer than n_ctx: the model's own error
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: True)  # per-head results too
    for name in model.hook_dict:
        print(f"{name:40s} {list(cache[name].shape)}")
    return 0


def cmd_trust(args: argparse.Namespace) -> int:
    """Check how far to trust a model's numbers; write trust.json beside it (or to --out). Exit 1 if a check fails."""
    from lab.folders import trust_report_path

    trust_report_path(args.model, args.out)  # an unknown model, or nowhere to write, is refused before torch loads
    from lab.trust import run_trust, summary_lines

    report, path = run_trust(args.model, args.out)
    print("\n".join(summary_lines(report)))
    print(f"wrote {path}")
    return 0 if report["passed"] else 1


def cmd_build(args: argparse.Namespace) -> int:
    """Build a zoo model into models/NAME/: a model trained here is trained from models/NAME/model.toml (an
    interrupted build — Ctrl-C, SIGTERM, a crash — continues with --resume); a pretrained one (smollm2) is made
    from the file its package ships, checked by size and SHA-256 first. The previous model stays in place until
    the new one is complete."""
    from lab.folders import PRETRAINED, recipe_kind, zoo_dir
    from lab.progress import PROGRESS_FILE, recording
    from lab.zoo.building import build

    pretrained = recipe_kind(zoo_dir() / args.name) == PRETRAINED
    if pretrained and (args.quick or args.resume):
        raise ValueError(f"{args.name} is made from a file, not trained: no --quick profile, nothing to resume")
    if args.quick and not args.resume and not args.replace:
        refuse_quick_over_full(args.name)
    again = f"forma build {args.name}{' --quick' if args.quick else ''} --resume"
    job = f"forma build {args.name}{' --quick' if args.quick else ''}"
    progress_file = zoo_dir() / args.name / PROGRESS_FILE  # what the dashboard and `forma demo` read
    try:
        with recording(progress_file, job):  # the training bar itself says where it is (unless --no-progress)
            directory = build(
                args.name, quick=args.quick, progress=not args.no_progress, resume=args.resume, dtype=args.dtype
            )
        progress_file.unlink(missing_ok=True)
    except KeyboardInterrupt as interrupted:
        # In the training loop `train` stops at the step boundary with a checkpoint (TrainingInterrupted says
        # where); anywhere else a signal ends the build as Ctrl-C does (lab.cli.stopping.interrupting_signals).
        hint = f"build it again with `forma build {args.name}`" if pretrained else f"continue with `{again}`"
        print(f"forma build: {str(interrupted) or 'interrupted'}; {hint}", file=sys.stderr)
        return 128 + getattr(interrupted, "signum", signal.SIGINT)
    print(f"{'built' if pretrained else 'trained'} {args.name} into {directory}")
    return 0


def refuse_quick_over_full(name: str) -> None:
    """A ValueError (exit 2) when the zoo's `name` is a model of the full recipe: a --quick build would put a smaller
    model in its place without asking. --replace asks for it; another zoo keeps both."""
    from lab.folders import zoo_entry

    entry = zoo_entry(name)
    if entry.trained and isinstance(entry.card, dict) and entry.card.get("quick") is False:
        raise ValueError(
            f"{name} is a model of the full recipe; a --quick build would replace it with a smaller one. Add "
            f"--replace to replace it, or build the quick one in another zoo: FORMA_ZOO_DIR=/tmp/zoo forma build "
            f"{name} --quick (copy models/{name}/model.toml there first)"
        )


def cmd_transcoders(args: argparse.Namespace) -> int:
    """Train transcoders for a zoo model (a harvest of every layer's MLP input and output at every position of
    --windows windows of 64 tokens, kept on disk while training), measure them on held-out windows and keep them,
    with each feature's top contexts, in models/NAME/transcoders/KIND/. A model trained here reads its own world; a
    pretrained one (smollm2) reads the corpus `forma corpus real --out DIR` wrote (--corpus DIR: train.npy for
    training, held_out.npy's documents for the measures). Where the harvests would take more than --disk-budget GB,
    none is made: each batch streams from the model; it says which and why. --layers 0,1: those layers alone.

    In one process, or as the ranks of torchrun (`torchrun --nproc-per-node K -m lab.cli transcoders NAME ...`):
    the ranks share the harvests, and train data-parallel (--parallel data: every rank every layer on its slice of
    each batch, gradients all-reduced) or module-parallel (--parallel modules: each rank its share of the layers);
    rank 0 measures and writes. Interrupted (any rank, any way), the same command resumes from the last
    checkpoint (every --checkpoint-interval steps); --overwrite starts afresh. docs/distributed.md."""
    from lab.cli.datasets import process_group
    from lab.folders import is_trained, zoo_dir

    folder = zoo_dir() / args.name
    corpus = transcoder_corpus(args.name, args.corpus)  # before torch loads: a bad --corpus is refused at once
    if not is_trained(args.name):
        raise ValueError(f"{args.name} is not trained yet: run `forma build {args.name}` first")
    from lab.zoo.transcoders import build_transcoders, load_quality, preset

    cfg, training = preset(args.kind, folder, args.features, args.steps, args.checkpoint_interval, args.layers)
    with process_group("cpu") as (rank, world):
        out = build_transcoders(
            folder,
            cfg,
            training,
            args.kind,
            n_windows=args.windows,
            eval_windows=args.held_out_windows,
            corpus=corpus,
            disk_budget=args.disk_budget * 1e9,
            parallel=args.parallel,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
    if out is None:  # a rank other than 0: rank 0 writes and reports
        return 0
    quality = load_quality(out)
    for layer, fvu, l0, dead in zip(quality["layers"], *(quality["held_out"][k] for k in ("fvu", "l0", "dead"))):
        print(f"layer {layer}: FVU {fvu:.3f}  L0 {l0:.1f}  dead {dead:.1%}")
    replaced = "every MLP" if cfg.layers is None else f"the MLPs of layers {', '.join(map(str, cfg.layers))}"
    print(f"loss recovered with {replaced} replaced: {recovered_words(quality['loss'])}")
    if "route" in quality:
        print(f"{quality['route']['route']}: {quality['route']['why']}")
    print(f"wrote {out}" + (f" ({world} ranks, {args.parallel}-parallel)" if world > 1 else ""))
    return 0


def cmd_graphs(args: argparse.Namespace) -> int:
    """Attribution graphs of a zoo model's prompts whose answer is known (lab/zoo/graphs.py; for smollm2: "The
    capital of Italy is" → " Rome", indirect-object identification, induction on repeated random tokens, a two-hop
    fact), each within a feature budget, over the model's transcoder set for every layer (`forma transcoders NAME`).
    For each: the model's rank of the answer, the graph's exactness (node inputs less edges and bias, the local
    replacement's logits less the model's, a feature removed in the frozen replacement less minus its edges), the
    replacement and completeness scores, and the top features ablated in the full model against the graph's
    prediction with attention and norms live and frozen; then Italy's features swapped for France's at the
    subject in the full model, " Rome" against " Paris". Writes the report as JSON (--out), with the set's held-out
    quality and training, and prints a table."""
    from lab.files import atomic_write_text
    from lab.folders import zoo_dir
    from lab.zoo.graphs import graphs_report, report_lines
    from lab.zoo.transcoders import GRAPHS_REPORT, TRANSCODERS_DIR, open_set

    folder = zoo_dir() / args.name / TRANSCODERS_DIR / args.kind
    model, transcoders = open_set(zoo_dir() / args.name, args.kind, every_layer=True)
    out = Path(args.out) if args.out else folder / GRAPHS_REPORT
    _, report = graphs_report(
        model,
        transcoders,
        max_feature_nodes=args.max_feature_nodes,
        top=args.top,
        progress=lambda what: print(f"graphs: {what} …", file=sys.stderr, flush=True),
    )
    report["set"] = set_record(folder)
    atomic_write_text(out, json.dumps(report, indent=2) + "\n")
    print("\n".join(report_lines(report)))
    print(f"wrote {out}")
    return 0


def set_record(folder: Path) -> dict:
    """What the graphs were made with: the transcoder set's held-out quality, its training and the model it read."""
    from lab.outside_files import read_json_object

    def read(name: str) -> dict:
        return read_json_object(folder / f"{name}.json", what=f"the transcoder set's {name}.json")

    return {"quality": read("quality"), "training": read("training")["training"], "source": read("source")}


def recovered_words(loss: dict[str, float]) -> str:
    """The loss recovered as a share, or in words why there is none: where zero-ablating the MLPs does not raise the
    loss (an untrained model), the share has no denominator."""
    if math.isfinite(loss["recovered"]):
        return f"{loss['recovered']:.1%}"
    return (
        f"undefined: zero-ablating them does not raise the loss (cross-entropy {loss['ce_model']:.3f} nats, "
        f"{loss['ce_zero_ablated']:.3f} zero-ablated, {loss['ce_replaced']:.3f} replaced)"
    )


def transcoder_corpus(name: str, corpus: str | None) -> Path | None:
    """The corpus a zoo model's transcoders read: a pretrained model's --corpus, checked (`check_corpus`); none for
    a model trained here, which reads its own world. A ValueError (exit 2) in one line otherwise."""
    from lab.data.real_corpus import check_corpus
    from lab.folders import PRETRAINED, recipe_kind, zoo_dir

    pretrained = recipe_kind(zoo_dir() / name) == PRETRAINED
    if not pretrained:
        if corpus is not None:
            raise ValueError(f"{name} was trained here and reads its own world: --corpus is for a pretrained model")
        return None
    if corpus is None:
        raise ValueError(
            f"{name} is pretrained: give the corpus its transcoders read, --corpus DIR (written by "
            "`forma corpus real --out DIR`)"
        )
    return check_corpus(corpus)
