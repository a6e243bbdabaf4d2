"""The HTML report in a real headless Debian chromium, driven over the DevTools protocol.

Why the DevTools protocol rather than ``--dump-dom`` plus console logging on stderr: the
protocol reports uncaught exceptions and console errors as structured events (nothing to
grep out of chromium's own noisy stderr), and it lets the test measure rendered boxes and
click the legend. chromium picks its own port (``--remote-debugging-port=0``) and writes it to
``DevToolsActivePort`` in the fresh profile directory, so there is no port race.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.binaries import binaries_required, require_binary
from support.report_fixtures import RunSpec, write_run

from otel_train.cli import main

try:
    import websocket  # websocket-client, a dev dependency
except ImportError:  # pragma: no cover - CI must never pass by skipping
    if binaries_required():
        raise
    pytest.skip("websocket-client is not installed", allow_module_level=True)

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1")


def wait_for(predicate, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


class Page:
    """One DevTools session on chromium's first tab; collects errors as they arrive."""

    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id, self.errors, self.events = 0, [], []
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._event(message)

    def _event(self, message: dict[str, Any]) -> None:
        method, params = message.get("method", ""), message.get("params", {})
        self.events.append(method)
        if method == "Runtime.exceptionThrown":
            self.errors.append(params["exceptionDetails"].get("exception", {}).get(
                "description", params["exceptionDetails"].get("text")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(str(params.get("args")))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append(params["entry"].get("text"))

    def open(self, path: Path) -> None:
        self.events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        while "Page.loadEventFired" not in self.events:
            self._event(json.loads(self.ws.recv()))

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    binary = require_binary("chromium")
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 60,
                 "chromium's DevToolsActivePort")
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            target = next(t for t in json.load(r) if t["type"] == "page")
        session = Page(target["webSocketDebuggerUrl"])
        yield session
        session.ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def html_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("html")
    run = write_run(RunSpec(ranks=4, steps=150, spike_steps=(37, 90)), root)
    out = root / "report.html"
    assert main(["report", str(run), "--html", str(out), "--timelines", "3"]) == 0
    return out


def test_the_harness_sees_console_errors(page: Page, tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>console.error('boom'); notDefined();</script>"
                      "</body></html>", encoding="utf-8")
    page.errors.clear()
    page.open(broken)
    page.eval("1")  # drain the events that arrived with the load
    assert any("boom" in e for e in page.errors)
    assert any("notDefined" in e for e in page.errors)


def test_report_renders_without_console_errors(page: Page, html_report: Path) -> None:
    page.errors.clear()
    page.open(html_report)
    assert page.eval("document.body.dataset.ready") == "true"  # the inline script ran
    assert page.errors == []


def test_every_plot_is_present_and_drawn(page: Page, html_report: Path) -> None:
    page.open(html_report)
    plots = page.eval("""Array.from(document.querySelectorAll('svg.plot')).map(function (s) {
        var box = s.getBoundingClientRect();
        return [s.dataset.plot, box.width, box.height, s.querySelectorAll('rect').length]; })""")
    kinds = [p[0] for p in plots]
    assert kinds.count("gantt") == 3
    assert {"distributions", "phases", "over-time"} <= set(kinds)
    assert all(width > 500 and height > 40 and rects > 0 for _, width, height, rects in plots)


def test_gantt_shows_every_rank(page: Page, html_report: Path) -> None:
    page.open(html_report)
    labels = page.eval("""Array.from(document.querySelectorAll('svg[data-plot=gantt]')[0]
        .querySelectorAll('text')).map(function (t) { return t.textContent; })""")
    assert {f"rank {r}" for r in range(4)} <= set(labels)


def test_nothing_is_fetched_from_the_network(page: Page, html_report: Path) -> None:
    page.open(html_report)
    assert page.eval("performance.getEntriesByType('resource').length") == 0
    html = html_report.read_text(encoding="utf-8")
    assert "src=" not in html and "<link" not in html


def test_legend_click_hides_that_phase_everywhere(page: Page, html_report: Path) -> None:
    page.open(html_report)
    hidden = page.eval("""(function () {
        document.querySelector('.legend span[data-kind=data_wait]').click();
        var marks = Array.from(document.querySelectorAll('.ph-data_wait'));
        var others = Array.from(document.querySelectorAll('.ph-forward'));
        return [marks.length, marks.every(function (m) {
                    return getComputedStyle(m).display === 'none'; }),
                others.some(function (m) { return getComputedStyle(m).display === 'none'; })];
    })()""")
    assert hidden[0] > 0 and hidden[1] is True and hidden[2] is False
