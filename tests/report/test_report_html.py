"""The HTML report in a real headless Debian chromium, driven over the DevTools protocol.

Why the DevTools protocol rather than ``--dump-dom`` plus console logging on stderr: the
protocol reports uncaught exceptions and console errors as structured events (nothing to
grep out of chromium's own noisy stderr), and it lets the test measure rendered boxes and
click the legend. chromium picks its own port (``--remote-debugging-port=0``) and writes it to
``DevToolsActivePort`` in the fresh profile directory, so there is no port race.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.binaries import binaries_required, require_binary
from support.report_fixtures import RunSpec, write_run

from otel_train.analysis import svg
from otel_train.analysis.build import build_report
from otel_train.analysis.html import render_html, rounded
from otel_train.analysis.report_model import Report
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
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(RunSpec(ranks=4, steps=150, spike_steps=(37, 90)),
                     tmp_path_factory.mktemp("html"))


@pytest.fixture(scope="module")
def report(run_dir: Path) -> Report:
    return build_report(run_dir)


@pytest.fixture(scope="module")
def html_report(run_dir: Path) -> Path:
    run = run_dir
    out = run_dir.parent / "report.html"
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


# --- issue 51 item 4: which rank, at a glance -------------------------------------------------

PER_RANK_ROWS = """Array.from(document.querySelectorAll('table[data-table=per-rank] tr[data-rank]'))
    .map(function (tr) {
        return {rank: +tr.dataset.rank, straggler: tr.dataset.straggler === 'true',
                steps: +tr.children[1].textContent,
                mean: +tr.querySelector('td.mean').dataset.ms,
                parts: Array.from(tr.querySelectorAll('td[data-part]')).map(function (td) {
                    return [td.dataset.part, +td.dataset.ms]; }),
                pct: Array.from(tr.querySelectorAll('td[data-part-pct]')).map(function (td) {
                    return +td.dataset.pct; }),
                max: tr.children[tr.children.length - 2].textContent}; })"""


def test_per_rank_table_parts_add_up_to_the_mean_step(page: Page, html_report: Path,
                                                      report: Report) -> None:
    page.open(html_report)
    rows = page.eval(PER_RANK_ROWS)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    expected = {row.rank: sum(row.phase_mean_s.values()) * 1e3 for row in report.rank_rows}
    for row in rows:
        assert abs(sum(ms for _, ms in row["parts"]) - row["mean"]) <= 0.05 + 1e-9
        assert abs(sum(row["pct"]) - 100.0) <= 0.1 + 1e-9
        assert abs(row["mean"] - expected[row["rank"]]) <= 0.05 + 1e-9
        # a part zero on every rank (compile, in the steady state) is left out
        assert [key for key, _ in row["parts"]] == [
            "data_wait", "forward", "backward", "optimizer", "exposed_comm"]
    # the straggler (rank 2 waits for data; the others wait for it in the all-reduce)
    assert report.straggler == 2
    assert [r["rank"] for r in rows if r["straggler"]] == [2]
    straggler = next(r for r in rows if r["straggler"])
    others = [r for r in rows if not r["straggler"]]
    assert dict(straggler["parts"])["data_wait"] > 3 * max(dict(r["parts"])["data_wait"]
                                                           for r in others)
    assert page.eval("document.querySelector('tr[data-straggler=true] .badge').textContent"
                     ) == "straggler"


def test_warmup_steps_are_apart_from_the_per_rank_numbers(page: Page, html_report: Path,
                                                          report: Report) -> None:
    page.open(html_report)
    rows = page.eval(PER_RANK_ROWS)
    warm = [s.step for s in report.warmup_steps]
    assert warm == [0, 60]  # the first step (compiles 3 s) and the recompile
    # steady steps only: 150 less the two warm-up steps, and no 3 s compile step as a max
    assert all(r["steps"] == 148 for r in rows)
    assert all(r["max"] == "2.09 s" for r in rows)
    # the mean with step 0's 3 s compile in it would be ~20 ms longer a step
    assert all(r["mean"] < 220 for r in rows)
    listed = page.eval("""Array.from(document.querySelectorAll(
        'table[data-table=warmup] tr td:first-child')).map(function (td) {
            return +td.textContent; })""")
    assert listed == warm
    titles = page.eval("""Array.from(document.querySelectorAll('h2, h3')).map(function (h) {
        return h.textContent; })""")
    assert sum("steady state" in t and "without warm-up steps 0, 60" in t for t in titles) >= 3
    # the over-time chart shades the bins holding a warm-up step
    shaded = page.eval("""Array.from(document.querySelectorAll(
        'svg[data-plot=over-time] g.warmup-bin')).map(function (g) { return g.dataset.steps; })""")
    assert shaded == ["0", "60"]


def test_straggler_is_marked_on_every_per_rank_chart(page: Page, html_report: Path) -> None:
    page.open(html_report)
    marks = page.eval("""Array.from(document.querySelectorAll('svg.plot')).filter(function (s) {
            return s.querySelector('g.rank-row'); }).map(function (s) {
        var marked = Array.from(s.querySelectorAll('[data-straggler=true]'));
        var key = s.querySelector('.straggler-key');
        return [s.dataset.plot, marked.map(function (g) { return g.dataset.rank; }),
                marked.length ? marked[0].textContent : '', key ? key.textContent : ''];
    })""")
    kinds = [kind for kind, *_ in marks]
    assert {"gantt", "distributions", "phases"} <= set(kinds) and kinds.count("gantt") == 3
    for kind, ranks, label, key in marks:
        assert ranks == ["2"], kind
        assert "straggler" in label and "rank 2" in label, kind
        # the key says why it is named: the others wait for it in collectives
        assert "rank 2" in key and "wait for it in collectives" in key, kind


def test_every_chart_has_round_ticks_with_units(page: Page, html_report: Path) -> None:
    page.open(html_report)
    axes = page.eval("""Array.from(document.querySelectorAll('svg.plot g.axis')).map(function (a) {
        return [a.closest('svg').dataset.plot,
                a.querySelectorAll('line.tick').length,
                Array.from(a.querySelectorAll('text')).map(function (t) {
                    return [t.textContent, parseFloat(getComputedStyle(t).fontSize)]; })]; })""")
    plots = {kind for kind, _, _ in axes}
    assert {"gantt", "distributions", "phases", "over-time"} <= plots
    for kind, ticks, texts in axes:
        assert ticks >= 4, kind
        assert all(size >= 10 for _, size in texts), kind
        labels = [t for t, _ in texts]
        title = labels[-1]
        if kind == "over-time" and title.startswith("step"):
            values = [float(v) for v in labels[:-1]]
        else:
            unit = re.search(r"\((µs|ms|s)\)$", title)
            assert unit, (kind, title)
            assert all(v.endswith(" " + unit.group(1)) for v in labels[:-1]), (kind, labels)
            values = [float(v.split()[0]) for v in labels[:-1]]
        # round values, evenly spaced
        steps = {round(b - a, 9) for a, b in zip(values, values[1:])}
        assert len(steps) == 1, (kind, values)
        assert _is_round(steps.pop()), (kind, values)


def test_the_stacked_bars_are_the_mean_step(page: Page, html_report: Path,
                                            report: Report) -> None:
    """The per-rank stacked chart stacks the disjoint parts: a bar is as long as the mean
    step (every rank's about the same in a synchronous run), and has a legend."""
    page.open(html_report)
    widths = page.eval("""Array.from(document.querySelectorAll(
        'svg[data-plot=phases] g.rank-row')).map(function (g) {
        return [+g.dataset.rank, Array.from(g.querySelectorAll('rect[class^=ph-]'))
            .reduce(function (sum, r) { return sum + r.width.baseVal.value; }, 0)]; })""")
    ticks = page.eval("""Array.from(document.querySelectorAll(
        'svg[data-plot=phases] g.axis text')).map(function (t) { return t.textContent; })""")
    per_px = (float(ticks[-2].split()[0]) - float(ticks[0].split()[0])) / svg.PLOT_W
    for rank, width in widths:
        row = next(r for r in report.rank_rows if r.rank == rank)
        assert abs(width * per_px - sum(row.phase_mean_s.values()) * 1e3) < 1.0
    legend = page.eval("""Array.from(document.querySelectorAll('.legend.per-rank span'))
        .map(function (s) { return s.dataset.kind; })""")
    assert legend == ["data_wait", "forward", "backward", "optimizer", "exposed_comm"]


# --- without a browser -----------------------------------------------------------------------


def test_rounded_parts_add_up_to_the_rounded_total() -> None:
    values = [7.85, 50.02, 99.72, 20.04, 37.64, 0.004]
    for decimals in (0, 1, 2):
        out = rounded(values, decimals)
        assert round(sum(out), 6) == round(round(sum(values), decimals), 6)
        assert all(abs(a - b) < 10 ** -decimals for a, b in zip(out, values, strict=True))
    shares = rounded([100 / 3] * 3, 1, 100.0)
    assert round(sum(shares), 6) == 100.0


@pytest.mark.parametrize("lo,hi", [(0, 0.215), (0, 3.19), (0.17, 0.21), (0, 1e-4), (0, 149),
                                   (0, 1), (0, 0.0011), (12, 13)])
def test_nice_ticks_are_round_and_enough(lo: float, hi: float) -> None:
    ticks = svg.nice_ticks(lo, hi)
    assert len(ticks) >= 4 and ticks[0] <= lo and ticks[-1] >= hi
    assert _is_round(ticks[1] - ticks[0])


def _is_round(step: float) -> bool:
    """1, 2, 2.5 or 5 times a power of ten."""
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    return any(abs(mantissa - m) < 1e-6 for m in (1, 2, 2.5, 5))


def test_untimed_time_is_split_in_the_table_and_chart(report: Report) -> None:
    """Where the run records what untimed time was (sources/gaps.py), the table and the
    stacked chart show its parts, still adding up to the step."""
    rows = []
    for row in report.rank_rows:
        phases = dict(row.phase_mean_s, forward=row.phase_mean_s["forward"] - 0.012,
                      untimed=0.012)
        split = {"device_wait": 0.007, "host_busy": 0.003, "not_explained": 0.002}
        rows.append(dataclasses.replace(row, phase_mean_s=phases, untimed_split_s=split))
    html = render_html(dataclasses.replace(report, rank_rows=rows))
    table = html[html.index('data-table="per-rank"'):]
    table = table[:table.index("</table>")]
    assert [k for k, _ in svg.part_keys(dataclasses.replace(report, rank_rows=rows))] == [
        "data_wait", "forward", "backward", "optimizer", "exposed_comm", "device_wait",
        "host_busy", "not_explained"]
    for tr in re.findall(r'<tr data-rank="(\d+)"[^>]*>(.*?)</tr>', table):
        parts = [float(v) for v in re.findall(r'data-part="\w+" data-ms="([\d.]+)"', tr[1])]
        mean = float(re.search(r'class="mean" data-ms="([\d.]+)"', tr[1]).group(1))
        assert len(parts) == 8 and abs(sum(parts) - mean) < 0.05
        pct = [float(v) for v in re.findall(r'data-pct="([\d.]+)"', tr[1])]
        assert abs(sum(pct) - 100) <= 0.1
    assert 'class="ph-device_wait"' in html and "blocked on device" in html


def test_no_straggler_no_marks(report: Report) -> None:
    html = render_html(dataclasses.replace(report, straggler=None, straggler_signal=None))
    assert 'data-straggler="true"' not in html and "straggler-band" not in html
    assert 'class="badge"' not in html
