"""``otel-train demo``: a small instrumented distributed training run on the CPU.

Launches N ranks with gloo, trains a small transformer language model (sharded with FSDP2
``fully_shard``, or wrapped in DDP) compiled with ``torch.compile``, on a DataLoader with
worker processes, writes telemetry to a run directory and prints a per-phase, per-rank
summary read back from the exported traces, where the files are and what to run next.

At a terminal it shows only that; when its output is captured (scripts, CI, tests) it also
passes on every rank's JSON log lines (stderr) and ends with a JSON result line (stdout).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, TextIO

# torch warns at import when numpy is missing, and a plain `pip install` has none; the demo
# never converts to numpy. Spawned ranks import torch before this module, so they get the
# same filter through PYTHONWARNINGS (_quiet_numpy_in_children).
_NUMPY_WARNING = "Failed to initialize NumPy"
warnings.filterwarnings("ignore", message=_NUMPY_WARNING, category=UserWarning)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from otel_train import config  # noqa: E402

VOCAB = 256


class TinyLM(nn.Module):
    """A decoder-only transformer language model, small enough to train on two CPU cores."""

    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4, seq_len: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True,
                                       norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len),
                             persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        mask = self.mask[: tokens.shape[1], : tokens.shape[1]]
        for block in self.blocks:
            h = block(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))


class CopyTask(Dataset):
    """Random token sequences of a repeating pattern: learnable, deterministic per index."""

    def __init__(self, size: int, seq_len: int) -> None:
        self.size, self.seq_len = size, seq_len

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(index)
        period = int(torch.randint(2, 8, (1,), generator=g))
        pattern = torch.randint(0, VOCAB, (period,), generator=g)
        return pattern.repeat(self.seq_len // period + 2)[: self.seq_len + 1]


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0  # not a number: the same message as out of range
    if not 0 <= value <= 60:  # nan too
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of seconds from 0 to 60")
    return value


#: torch.compile backends every torch 2 has, known without importing torch._dynamo (a second
#: and a half); another name is looked up in this torch's list
_KNOWN_BACKENDS = frozenset({"inductor", "eager", "aot_eager", "cudagraphs"})


def _argument_error(args: argparse.Namespace, output_dir_given: bool) -> str | None:
    """What is wrong with the arguments that their types cannot see (how they go together,
    the backend, the output folder), found before the ranks are spawned: inside them it was
    a traceback per rank after 10-30 s of start-up, or no error at all."""
    if args.slow_rank is not None and args.slow_rank >= args.ranks:
        ranks = f"ranks 0 to {args.ranks - 1}" if args.ranks > 1 else "rank 0 only"
        return f"--slow-rank {args.slow_rank} names no rank: --ranks {args.ranks} runs {ranks}"
    if args.compile:
        wrong = _backend_error(args.backend)
        if wrong:
            return wrong
    return _output_dir_error(Path(args.output_dir), output_dir_given)


def _backend_error(name: str) -> str | None:
    """Why ``name`` is no torch.compile backend of this torch, or None."""
    if name in _KNOWN_BACKENDS:
        return None
    try:
        every = set(torch.compiler.list_backends(exclude_tags=()))  # the debugging ones too
        shown = sorted(set(torch.compiler.list_backends()) | _KNOWN_BACKENDS)
    except Exception:  # where it failed, torch.compile says what is wrong in the ranks
        return None
    if name in every:
        return None
    return (f"--backend {name!r} is not a torch.compile backend of this torch (such as "
            f"{', '.join(shown)})")


def _output_dir_error(path: Path, given: bool) -> str | None:
    """Why no run directory can be made under ``path``, or None. It is made here, as each
    rank would make it first thing, so that a file in its way or a read-only disk is one
    line now rather than a traceback per rank."""
    # config.load() read OTEL_TRAIN_OUTPUT_DIR (the only module that reads otel-train's
    # variables): its folder or the default
    what = "--output-dir" if given else "the output folder (OTEL_TRAIN_OUTPUT_DIR or default)"
    if path.exists() and not path.is_dir():
        return f"{what} {path} is a file, not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"{what} {path} cannot be made: {err.strerror or err}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{what} {path} is not writable"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model: nn.Module = TinyLM(seq_len=args.seq_len)
    if args.parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    if args.compile:
        model = torch.compile(model, backend=args.backend)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def _rank_main(rank: int, args: argparse.Namespace, port: int, results: Any) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.ranks),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if not args.log_lines:
        sys.stderr = QuietStderr(sys.stderr)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // args.ranks))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    import otel_train

    try:
        model, opt = _build(args)
        data = CopyTask(args.steps * args.batch_size * args.ranks, args.seq_len)
        sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
        loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                            num_workers=args.workers, persistent_workers=args.workers > 0)
        inst = otel_train.instrument(model, optimizer=opt, run_id=args.run_id,
                                     output_dir=args.output_dir)
        with warnings.catch_warnings(record=True) as caught:  # to say why, if it did not start
            warnings.simplefilter("always", otel_train.ConfigWarning)
            inst.start()
        for w in caught:  # shown as they would have been
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        try:
            _train(model, opt, loader, args, rank)
        except BaseException as err:
            inst.stop(err)
            raise
        inst.stop(None)
        results.put({"rank": rank, "run_id": inst.run_id,
                     "run_dir": str(inst.run_dir) if inst.run_dir else None,
                     "dropped": inst.dropped,
                     "why": "; ".join(str(w.message) for w in caught
                                      if issubclass(w.category, otel_train.ConfigWarning))
                            or "unknown"})
    finally:
        dist.destroy_process_group()


def _train(model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader,
           args: argparse.Namespace, rank: int) -> None:
    import structlog

    log = structlog.get_logger("demo")
    progress = _progress(rank, args.steps)
    for step, batch in enumerate(loader):
        if step >= args.steps:
            break
        if args.slow_rank == rank and step % 5 == 4:
            time.sleep(args.slow_s)  # a deliberate straggler, for the report to find
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0:
            log.info("demo.loss", loss=round(float(loss.detach()), 4))
        progress(step)


def _progress(rank: int, total: int) -> Any:
    if rank != 0:
        return lambda step: None
    from rich.progress import Progress

    bar = Progress(transient=False)
    task = bar.add_task("training (rank 0)", total=total)
    bar.start()

    def advance(step: int) -> None:
        bar.update(task, completed=step + 1)
        if step + 1 >= total:
            bar.stop()

    return advance


# --- summary -----------------------------------------------------------------------------


def print_summary(run_dir: Path) -> None:
    """The steady state per rank (the report's rows: warm-up and compile steps apart): the
    mean step and its parts, which are disjoint and add up to it (docs/telemetry.md, "The
    step's parts"); then the steady throughput, the goodput and the warm-up steps."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from otel_train.analysis import terminal
    from otel_train.analysis.build import build_report

    report = build_report(run_dir, top=0, timelines=0)
    columns = terminal.phase_columns(report)  # the parts some rank spends time in
    table = Table(title=f"Mean time per step (ms), steady state ({report.steady_steps} steps, "
                  f"warm-up apart), run {run_dir.name}: the parts add up to the step",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ["rank", "step", *(header for header, _, _ in columns)]:
        table.add_column(header, justify="right")
    for row in report.rank_rows:
        table.add_row(str(row.rank), f"{terminal.step_mean_s(row) * 1e3:.1f}",
                      *(f"{terminal.column_s(row, kind, key) * 1e3:.1f}"
                        for _, kind, key in columns))
    console = Console(stderr=False)
    console.print(table)
    lines = [*terminal.throughput_lines(report), *terminal.goodput_lines(report),
             *terminal.warmup_lines(report)]
    for line in lines:
        console.print(line, markup=False)


# --- command -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    args.compile = not args.no_compile
    output_dir_given = args.output_dir is not None
    with warnings.catch_warnings():  # each rank warns of a bad setting itself
        warnings.simplefilter("ignore", config.ConfigWarning)
        default_dir = config.load().output_dir
    args.output_dir = str(Path(args.output_dir or default_dir).resolve())
    wrong = _argument_error(args, output_dir_given)  # the counts' own checks are their types
    if wrong:
        print(f"otel-train demo: {wrong}", file=sys.stderr)
        return 2
    # A person at a terminal reads progress and the summary; scripts and tests that capture
    # the output also get every rank's JSON log lines and a final JSON result line.
    if args.log_lines is None:
        args.log_lines = not sys.stderr.isatty()
    port = _free_port()
    print(f"otel-train demo: {args.ranks} ranks, {args.parallel}"
          f"{' + torch.compile' if args.compile else ''}, {args.steps} steps",
          file=sys.stderr)
    _quiet_numpy_in_children()
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_rank_main, args=(args, port, results), nprocs=args.ranks, join=True,
                       start_method="spawn")
    by_rank = {r["rank"]: r for r in (results.get() for _ in range(args.ranks))}
    result = {k: v for k, v in by_rank[0].items() if k not in ("rank", "why")}
    if result["run_dir"]:
        run_dir = Path(result["run_dir"])
        print_summary(run_dir)
        print_next_steps(run_dir, result)
    uninstrumented = {r: v["why"] for r, v in sorted(by_rank.items()) if v["run_id"] is None}
    result["uninstrumented_ranks"] = sorted(uninstrumented)
    if not sys.stdout.isatty():
        print(json.dumps(result))
    for rank, why in uninstrumented.items():
        print(f"otel-train demo: rank {rank} trained uninstrumented: {why}", file=sys.stderr)
    return 1 if uninstrumented else 0


def _quiet_numpy_in_children() -> None:
    """The numpy warning filter, for the spawned ranks (which import torch first thing)."""
    ignore = f"ignore:{_NUMPY_WARNING}:UserWarning"
    current = os.environ.get("PYTHONWARNINGS", "")
    if ignore not in current:
        os.environ["PYTHONWARNINGS"] = f"{current},{ignore}" if current else ignore


def print_next_steps(run_dir: Path, result: dict[str, Any]) -> None:
    """Where the telemetry is and the two commands that read it."""
    prog = _prog()
    root = _shown_path(run_dir.parent)
    dropped = f"; dropped: {result['dropped']}" if result.get("dropped") else ""
    print(f"\ntelemetry: {_shown_path(run_dir)}/ (traces, metrics and logs of every rank"
          f"{dropped})\n"
          f"next:\n"
          f"  {prog} report {root}    where the step time went, per rank and phase\n"
          f"  {prog} check {root}     the production attribution checklist\n")


def _prog() -> str:
    """How the user ran otel-train (``.venv/bin/otel-train`` as in the README, or from PATH),
    so the printed commands can be pasted as they are."""
    argv0 = Path(sys.argv[0] if sys.argv else "otel-train")
    if argv0.name != "otel-train":
        return "otel-train"  # python -m otel_train.cli
    on_path = shutil.which("otel-train")
    if on_path and Path(on_path).resolve() == argv0.resolve():
        return "otel-train"
    return _shown_path(argv0)


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


class QuietStderr(io.TextIOBase):
    """A rank's stderr for a person at a terminal: JSON log lines at info or debug level
    (otel-train's own and the demo's loss lines, all exported to the run's logs too) are
    dropped; everything else (warnings, errors, tracebacks) passes through."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._pending = ""
        self._lock = threading.Lock()  # the emitter thread logs too

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._pending = (self._pending + text).split("\n")
            for line in lines:
                if not _is_info_log_line(line):
                    self._stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding


def _is_info_log_line(line: str) -> bool:
    if not line.startswith("{"):
        return False
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("level") in ("debug", "info")


#: what ``otel-train demo --help`` says: the module's docstring in plain words (a terminal
#: shows reST markup as it is written)
DESCRIPTION = """\
A small instrumented distributed training run on the CPU.

Launches N ranks with gloo, trains a small transformer language model (sharded
with FSDP2's fully_shard, or wrapped in DDP) compiled with torch.compile, on a
DataLoader with worker processes, writes telemetry to a run directory and
prints a per-phase, per-rank summary read back from the exported traces, where
the files are and what to run next.

At a terminal it shows only that; when its output is captured (scripts, CI,
tests) it also passes on every rank's JSON log lines (stderr) and ends with a
JSON result line (stdout)."""


def register(subparsers: Any) -> None:
    from otel_train.cli import integer_at_least

    p = subparsers.add_parser("demo", help="train a small model on N CPU ranks, instrumented",
                              description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=integer_at_least(1), default=2,
                   help="number of ranks (default 2)")
    p.add_argument("--steps", type=integer_at_least(1), default=30,
                   help="training steps (default 30)")
    p.add_argument("--parallel", choices=("fsdp2", "ddp"), default="fsdp2",
                   help="shard the model with FSDP2 (the default) or replicate it with DDP")
    p.add_argument("--ddp", dest="parallel", action="store_const", const="ddp",
                   help="shorthand for --parallel ddp")
    p.add_argument("--no-compile", action="store_true", help="run eagerly")
    p.add_argument("--backend", default="inductor",
                   help="torch.compile backend (default inductor)")
    p.add_argument("--batch-size", type=integer_at_least(1), default=8,
                   help="sequences per batch on each rank (default 8)")
    p.add_argument("--seq-len", type=integer_at_least(1), default=32,
                   help="tokens per sequence (default 32)")
    p.add_argument("--workers", type=integer_at_least(0), default=2,
                   help="DataLoader worker processes per rank (default 2)")
    p.add_argument("--output-dir", help="root of run directories "
                   "(default $OTEL_TRAIN_OUTPUT_DIR or ./otel-train-runs)")
    p.add_argument("--run-id", help="run id (default: the launcher's, or rank 0's broadcast)")
    p.add_argument("--slow-rank", type=integer_at_least(0), default=None,
                   help="make this rank (below --ranks) sleep --slow-s every 5th step (a "
                   "straggler)")
    p.add_argument("--slow-s", type=_seconds, default=0.2,
                   help="how long the --slow-rank sleeps (default 0.2 s)")
    p.add_argument("--log-lines", action=argparse.BooleanOptionalAction, default=None,
                   help="show every rank's JSON log lines (default: only when stderr is not "
                   "a terminal); they are in the run's logs either way")
    p.set_defaults(func=run)
