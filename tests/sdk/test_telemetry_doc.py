"""docs/telemetry.md, the telemetry contract users read, against ``otel_train/semconv.py``:
every name semconv defines is on the page, every name on the page is one semconv defines,
and the metrics table is semconv's ``METRICS`` row for row."""

from __future__ import annotations

import re

from support import REPO_ROOT

from otel_train import semconv

DOC = (REPO_ROOT / "docs" / "telemetry.md").read_text(encoding="utf-8")
#: the families of names the contract lists (semconv's constant prefixes)
FAMILIES = ("SPAN_", "RES_", "ATTR_", "EVENT_", "METRIC_", "LOG_", "CONSOLE_", "PHASE_",
            "SIGNAL_", "SCOPE_")
#: backticked tokens on the page that look like telemetry names
NAME = re.compile(r"`((?:training|collective|compile|profile|train|otel_train|code|exception)"
                  r"\.[a-z0-9_.<>]+)`")
#: names of other conventions the page mentions (resource attributes of the SDK's own)
OTHERS = {"service.name", "service.instance.id", "host.name", "process.pid"}


def _defined() -> set[str]:
    names = {v for k, v in vars(semconv).items()
             if k.startswith(FAMILIES) and isinstance(v, str)}
    return names | set(semconv.COLLECTIVE_OPS)


def _on_page(name: str) -> bool:
    if name.endswith("."):  # a family: `training.phase_total.<phase>`
        return f"`{name}<" in DOC
    return f"`{name}`" in DOC


def test_every_name_semconv_defines_is_on_the_page():
    missing = sorted(n for n in _defined() if not _on_page(n))
    assert missing == []


def test_every_name_on_the_page_is_one_semconv_defines():
    defined = _defined()
    prefixes = tuple(n for n in defined if n.endswith("."))
    unknown = sorted({n for n in NAME.findall(DOC)
                      if n not in defined and n not in OTHERS and not n.startswith(prefixes)})
    assert unknown == []


def test_the_metrics_table_is_semconv_s():
    rows = re.findall(r"^\| `([^`]+)` \| (\w+) \| `([^`]*)` \| `([^`]+)` \| (.*) \|$", DOC,
                      flags=re.M)
    assert [(n, k, u, p, d) for n, k, u, p, d in rows] == [
        (m.name, m.kind, m.unit, m.prometheus, m.description) for m in semconv.METRICS.values()]


def test_a_name_missing_from_the_page_would_be_found():
    assert not _on_page("training.step.duration_s")  # the name 0.2.0 replaced
    assert NAME.findall("`training.step.duration_s`") == ["training.step.duration_s"]
