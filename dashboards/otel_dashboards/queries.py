"""Every query of the generated dashboards, by language, and Grafana-style interpolation.

Tests (and anyone checking a Grafana upgrade) read the committed JSON through ``queries``:
what is checked is exactly what Grafana imports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

JSON_DIR = Path(__file__).resolve().parent.parent / "json"

#: data source plugin type -> query language of its targets
LANGUAGES = {"prometheus": "promql", "tempo": "traceql", "loki": "logql"}


@dataclass(frozen=True)
class Query:
    dashboard: str  # file name
    panel: str  # panel title
    ref: str  # refId
    lang: str  # promql | traceql | logql
    text: str  # as committed, with $variables
    instant: bool = False

    @property
    def id(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref}"


def _target_text(target: Mapping) -> str | None:
    return target.get("expr") or target.get("query")


def dashboards(json_dir: Path = JSON_DIR) -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(json_dir.glob("*.json"))}


def panels(board: Mapping) -> Iterator[Mapping]:
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep their panels inside


def queries(json_dir: Path = JSON_DIR) -> list[Query]:
    found = []
    for name, board in dashboards(json_dir).items():
        for panel in panels(board):
            for target in panel.get("targets", []):
                source = (target.get("datasource") or panel.get("datasource") or {}).get("type")
                text = _target_text(target)
                if source in LANGUAGES and text:
                    found.append(
                        Query(
                            name,
                            panel["title"],
                            target["refId"],
                            LANGUAGES[source],
                            text,
                            bool(target.get("instant")),
                        )
                    )
        for variable in board.get("templating", {}).get("list", []):
            if variable.get("type") == "query":
                found.append(
                    Query(
                        name, f"variable {variable['name']}", "var", "variable", variable["query"]
                    )
                )
    return found


_VARIABLE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*(?::[a-z]+)?\}|[A-Za-z_][A-Za-z0-9_]*)")


def interpolate(text: str, values: Mapping[str, str]) -> str:
    """Replace ``$name`` and ``${name}`` as Grafana does; an unknown variable is an error."""

    def replace(match: re.Match) -> str:
        name = match.group(1).strip("{}").split(":")[0]
        if name not in values:
            raise KeyError(f"no value for ${name} in {text!r}")
        return values[name]

    return _VARIABLE.sub(replace, text)


#: variable query functions of Grafana's Prometheus data source -> the PromQL inside them
_VARIABLE_FUNCTIONS = re.compile(r"^(label_values|query_result)\((.*)\)$", re.S)


def variable_promql(text: str) -> str | None:
    """The PromQL a Prometheus template-variable query runs (None for ``label_values(label)``)."""
    match = _VARIABLE_FUNCTIONS.match(text.strip())
    if not match:
        return text
    function, inner = match.groups()
    if function == "query_result":
        return inner
    selector, _, _label = inner.rpartition(",")
    return selector.strip() or None
