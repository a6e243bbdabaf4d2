"""Waits on a condition with a deadline, never on a rate or a fixed delay.

A loaded machine (CI's two cores, shared) runs every background thread late: a test that
sleeps "long enough" for a drain, a scrape or a pass to have happened fails there one run in
a few. A test waits instead for what it needs to be true, observed, with a deadline far past
what an unloaded machine takes (the deadline only bounds a failure's wait).

- ``wait_for``: poll a probe until it answers, fail naming what was awaited at the deadline
- ``emitter_passes``: passes of an ``instrument()``'s emitter thread that began after the
  call: everything recorded before it has then been drained and handed to the pipeline
  (sent to the exporter process, where there is one)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float,
             interval: float = 0.2, on_timeout: Callable[[], str] | None = None) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
        except Exception as exc:  # a server not up yet: keep polling
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} "
                                 f"(last: {last!r}){extra}")
        time.sleep(interval)


def emitter_passes(inst: Any, count: int = 1, timeout: float = 60.0) -> int:
    """Wait until ``count`` whole passes of ``inst``'s emitter thread have begun and ended
    after this call; return its pass count then.

    The emitter counts a pass (``wakeups``) after it has drained the buffer and committed
    what the drain made to the pipeline. A pass under way at the call ends first (counted
    once, having begun before it); each one counted after that began after the call, so
    after the first of them everything recorded before the call has been handed on. The
    emitter is woken at each poll: a sleeping one would otherwise come back only at its next
    interval, or after ``KEEPALIVE_S`` once a drain found nothing."""
    emitter = inst.emitter
    target = emitter.wakeups + 1 + count

    def passed() -> int | None:
        if emitter.wakeups >= target:
            return emitter.wakeups
        emitter._wake.set()  # what the recorder's wake calls
        return None

    return wait_for(f"{count} emitter pass(es) after pass {target - 1 - count}", passed,
                    timeout, interval=0.01)
