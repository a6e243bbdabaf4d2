"""The ``otel-train`` command: ``demo``, ``report``, ``check``.

Each subcommand lives in its own module and registers itself through a
``register(subparsers)`` function, so this file only lists them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: module path of each subcommand; each module defines ``register(subparsers)``
SUBCOMMANDS = (
    "otel_train.demo",
    "otel_train.analysis.cli",
    "otel_train.check.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-train",
        description="OpenTelemetry observability for distributed PyTorch training.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            continue  # a subcommand not built yet in this checkout
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
