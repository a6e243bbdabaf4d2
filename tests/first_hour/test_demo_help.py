"""``otel-train demo --help``, what a new user reads first: plain text, every option explained."""

from __future__ import annotations

import re

import pytest

from otel_train.cli import main


@pytest.fixture
def demo_help(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_demo_help_shows_no_rest_markup(demo_help: str) -> None:
    assert "``" not in demo_help
    assert not re.search(r":(func|class|meth|mod|attr|data|envvar):`", demo_help), demo_help
    assert "torch.compile" in demo_help and "gloo" in demo_help  # the description is there


def test_every_demo_option_has_help(demo_help: str) -> None:
    lines = demo_help.split("options:\n", 1)[1].splitlines()
    options = [i for i, line in enumerate(lines) if line.startswith("  -")]
    assert len(options) >= 14, lines
    for i in options:
        # argparse puts the help after the option, or on the next line, indented
        same_line = re.match(r"  -\S.*?\S {2,}\S", lines[i])
        next_line = i + 1 < len(lines) and re.match(r" {20,}\S", lines[i + 1])
        assert same_line or next_line, f"no help for {lines[i].strip()!r}"
