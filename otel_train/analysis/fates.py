"""How each rank's run ended: finished, crashed (and in which step, with what), vanished
(killed: its run span never came), or stopped after another rank failed.

A rank that raises ends its ``training.run`` span with status error and the exception's type and
(scrubbed) message; one killed outright (SIGKILL, the kernel's OOM killer) ends nothing, and
only its last ``training.rank_step`` says when it was last seen; its peers then fail in their
next collective (gloo's connection closed) or are stopped by the launcher (torchrun's
SIGTERM: status ``preempted``). The first rank to fail is the one to name; what happened to
the others after it is its consequence, said as such.
"""

from __future__ import annotations

from otel_train.analysis.report_model import RankFate

OK, ERROR, PREEMPTED = "ok", "error", "preempted"
CRASHED, VANISHED, STOPPED, FAILED_AFTER = "crashed", "vanished", "stopped", "failed_after"


def rank_fates(world: int, runs: dict[int, tuple[str, str, int, int]],
               last_steps: dict[int, tuple[int, int]]) -> list[RankFate]:
    """The ranks whose run did not end well, first failure first.

    ``runs``: rank -> (status, status message, steps, end ns) of its ``training.run`` span;
    ``last_steps``: rank -> (step, end ns) of its last ``training.rank_step``."""
    failures: list[tuple[int, RankFate]] = []
    for rank in sorted(set(range(world)) | set(runs) | set(last_steps)):
        step, seen_ns = last_steps.get(rank, (-1, 0))
        if rank in runs:
            status, message, steps, end_ns = runs[rank]
            if status == ERROR:
                failures.append((end_ns, RankFate(rank, CRASHED, steps, message or None, step)))
        elif rank in last_steps:
            failures.append((seen_ns, RankFate(rank, VANISHED, step + 1, None, step)))
    if not failures:
        return []
    # a rank that sent nothing at all while others failed: killed before its first export
    # (or its instrumentation did not start): the likeliest first failure
    silent = sorted(set(range(world)) - set(runs) - set(last_steps))
    failures += [(0, RankFate(rank, VANISHED, 0, None, -1)) for rank in silent]
    failures.sort(key=lambda f: (f[0], f[1].rank))
    first = failures[0][1]
    out = [first]
    for _, fate in failures[1:]:
        if fate.fate == CRASHED:
            fate.fate = FAILED_AFTER
        fate.after = first.rank
        out.append(fate)
    for rank, (status, message, steps, _) in sorted(runs.items()):
        if status == PREEMPTED:
            out.append(RankFate(rank, STOPPED, steps, message or None,
                                last_steps.get(rank, (-1, 0))[0], after=first.rank))
    return out
