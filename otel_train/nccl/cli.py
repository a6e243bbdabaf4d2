"""``otel-train nccl-plugin``: build the NCCL profiler plugin and print its path.

For launchers, before the training processes start (NCCL loads the plugin when the first
communicator is created, once per process)::

    export NCCL_PROFILER_PLUGIN=$(otel-train nccl-plugin)
"""

from __future__ import annotations

import argparse
import sys

from otel_train import nccl


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "nccl-plugin", help="build otel-train's NCCL profiler plugin, print its path",
        description="Builds otel-train's NCCL profiler plugin with the system's C compiler "
                    "(once per version, into $OTEL_TRAIN_CACHE_DIR or ~/.cache/otel-train) "
                    "and prints its path, for NCCL_PROFILER_PLUGIN. Exit status 1 when it "
                    "cannot be built.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        print(nccl.plugin_path())
    except (nccl.PluginUnavailable, OSError) as err:  # OSError: its source is not installed
        print(f"otel-train nccl-plugin: {one_line(str(err))}", file=sys.stderr)
        return 1
    return 0


def one_line(text: str) -> str:
    """A compiler's complaint of several lines as one, as every otel-train error is (a
    launcher's script that shows the last line of stderr shows all of it)."""
    return " | ".join(line.strip() for line in text.splitlines() if line.strip()) or text
