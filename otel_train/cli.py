"""The ``otel-train`` command: ``demo``, ``report``, ``check``, ``nccl-plugin``.

Each subcommand lives in its own module and registers itself through a
``register(subparsers)`` function, so this file only lists them. Only the module of the
subcommand being run is imported: ``demo`` needs torch (seconds to import), ``report`` and
``check`` only read files and must start at once, also where torch is not installed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import NoReturn

from otel_train import __version__

#: name -> (module defining ``register(subparsers)``, the line ``otel-train --help`` shows)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("otel_train.demo", "train a small model on N CPU ranks, instrumented"),
    "report": ("otel_train.analysis.cli", "attribution report of a run's exported telemetry"),
    "check": ("otel_train.check.cli", "verify the production attribution checklist"),
    "compare": ("otel_train.analysis.compare", "compare runs: which is faster, by how much, "
                "where the time went; a CI gate"),
    "nccl-plugin": ("otel_train.nccl.cli", "build otel-train's NCCL profiler plugin, print "
                    "its path (for NCCL_PROFILER_PLUGIN)"),
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line, ``otel-train <command>: <what is
    wrong>``, as the commands' own errors are (not the usage block, which buries the line
    that matters under the options). The subcommands' parsers are of this class too."""

    #: the command named on the command line, for errors the top-level parser reports about
    #: its arguments (``unrecognized arguments``)
    named_command: str | None = None

    def error(self, message: str) -> NoReturn:
        prog = f"{self.prog} {self.named_command}" if self.named_command else self.prog
        self.exit(2, f"{prog}: {message} (see {prog} --help)\n")


def integer_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer of ``minimum`` or more (counts, sizes, ranks)."""
    def read(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, not {value}")
        return value

    return read


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with ``command``'s full arguments; the others are listed by name only."""
    parser = Parser(
        prog="otel-train",
        description="OpenTelemetry observability for distributed PyTorch training.",
    )
    parser.named_command = command if command in SUBCOMMANDS else None
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, summary) in SUBCOMMANDS.items():
        if name == command:
            importlib.import_module(module_name).register(subparsers)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the top level takes no option values)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
