"""The `forma` command line."""

import argparse
import sys

import lab


def cmd_hooks(args: argparse.Namespace) -> int:
    """Print every hook point of a model with the shape it carries for a one-sequence input."""
    import torch

    from lab import HookedTransformer

    model = HookedTransformer.from_pretrained(args.model)
    tokens = torch.zeros(1, min(args.tokens, model.cfg.n_ctx), dtype=torch.long)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    for name in model.hook_dict:
        print(f"{name:40s} {list(cache[name].shape)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forma", description=lab.__doc__)
    parser.add_argument("--version", action="version", version=f"forma {lab.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    hooks = sub.add_parser("hooks", help="list a model's hook points and their shapes",
                           description=cmd_hooks.__doc__)
    hooks.add_argument("model", help="zoo name, Forma model folder, or local Hugging Face folder")
    hooks.add_argument("--tokens", type=int, default=8, help="length of the probe sequence (default 8)")
    hooks.set_defaults(func=cmd_hooks)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"forma {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
