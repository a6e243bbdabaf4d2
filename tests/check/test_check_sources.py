"""What ``otel-train check`` was asked to read and could not (a path, a run id, a server) is
named, with exit status 2, and what the other sources show is still printed: never a PASS
over a source that was not read."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.pipeline_fixtures import free_port
from support.report_fixtures import RunSpec, write_run

from otel_train.check.render import verdict_line
from otel_train.check.verdicts import PASS, CheckResult
from otel_train.cli import main

RUN_ID = "check-sources"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(RunSpec(ranks=2, steps=20, run_id=RUN_ID, spike_steps=()),
                     tmp_path_factory.mktemp("runs"))


def check_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    status = main(["check", *args, "--json"])
    out, err = capsys.readouterr()
    return status, json.loads(out) if out else {}, err


def row(body: dict, item: str) -> dict:
    return next(c for c in body["checks"] if c["id"] == item)


def test_a_run_id_no_run_has_exits_2_naming_it(real_run: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    status, body, err = check_json(capsys, str(real_run.parent), "--run-id", "nope")
    assert status == 2 and body["checks"] == []
    assert f"not read: no run 'nope' under {real_run.parent} (its runs: {RUN_ID})" in err
    status, _, err = check_json(capsys, str(real_run), "--run-id", "nope")
    assert status == 2
    assert f"no telemetry of run 'nope' in {real_run} (its files hold runs: {RUN_ID})" in err


def test_a_missing_path_exits_2_naming_it(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    status, body, err = check_json(capsys, str(tmp_path / "nope"))
    assert status == 2 and body["ok"] is False
    assert err == f"otel-train check: not read: {tmp_path / 'nope'} does not exist\n"


def test_an_unreachable_prometheus_is_named_and_the_run_dir_still_checked(
        real_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    status, body, err = check_json(capsys, str(real_run), "--prometheus", url)
    assert status == 2 and body["ok"] is False
    assert row(body, "trace_coverage")["status"] == PASS  # what the run directory showed
    assert body["not_read"] == [f"Prometheus at {url} is unreachable: [Errno 111] "
                                "Connection refused"]
    assert f"otel-train check: not read: Prometheus at {url} is unreachable" in err


def test_the_table_says_incomplete_not_pass_over_an_unread_source(
        real_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(real_run), "--prometheus", f"http://127.0.0.1:{free_port()}"]) \
        == 2
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "INCOMPLETE: 10 passed, 0 failed, 2 not applicable; not read: 1 source"


def test_verdicts_over_an_unread_source_are_never_pass() -> None:
    passed = [CheckResult("trace_coverage", PASS, "evidence")]
    assert verdict_line(passed, []).startswith("[green]PASS[/]")
    assert verdict_line(passed, ["Prometheus at x is unreachable"]).startswith(
        "[bold red]INCOMPLETE[/]: 1 passed")


@pytest.fixture
def not_prometheus() -> Iterator[str]:
    """A web server that answers every GET with an HTML page."""
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the handler's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>hello</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_a_server_that_is_not_prometheus_is_named(
        real_run: Path, not_prometheus: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, body, _ = check_json(capsys, str(real_run), "--prometheus", not_prometheus)
    assert status == 2 and row(body, "trace_coverage")["status"] == PASS
    assert body["not_read"] == [
        f"Prometheus at {not_prometheus} answered /api/v1/query_exemplars with something that "
        "is not JSON (is it Prometheus's HTTP API?)"]
