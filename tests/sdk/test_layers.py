"""What crosses threads and processes is defined once (otel_train/wire), and the two sides of
export meet only there: the training process's side (otel_train/export) and the exporter's
side (otel_train/exporter) never import each other, the NCCL plugin's loader (otel_train/nccl)
neither, and the wire module none of them. Read from the sources' imports (function-level
ones included), so an import added anywhere, even a lazy one, is caught."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import otel_train

PACKAGE = Path(otel_train.__file__).parent

#: folder -> the otel_train modules it must never import (prefixes)
FORBIDDEN = {
    "wire": ("otel_train.export", "otel_train.exporter", "otel_train.nccl", "otel_train.emitter",
             "otel_train.sources", "otel_train.tracker", "otel_train.instrument",
             "otel_train.recorder", "otel_train.config", "torch"),
    "export": ("otel_train.exporter", "otel_train.nccl", "otel_train.emitter",
               "otel_train.sources"),
    "exporter": ("otel_train.export", "otel_train.nccl", "otel_train.emitter",
                 "otel_train.sources", "otel_train.tracker", "torch"),
    "nccl": ("otel_train.export", "otel_train.exporter", "otel_train.emitter"),
}


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, absolute (``from . import x`` resolved)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def violations(folder: str) -> list[str]:
    out = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for name in sorted(imports_of(path)):
            for banned in FORBIDDEN[folder]:
                if name == banned or name.startswith(banned + "."):
                    out.append(f"{path.relative_to(PACKAGE)} imports {name}")
    return out


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_arrow_runs_back_between_export_exporter_nccl_and_wire(folder: str) -> None:
    assert (PACKAGE / folder).is_dir()
    assert violations(folder) == []


def test_the_check_sees_a_lazy_import(tmp_path, monkeypatch) -> None:
    # the test proves itself: a function-level import of the other side is a violation
    fake = tmp_path / "otel_train"
    (fake / "export").mkdir(parents=True)
    (fake / "export" / "sneaky.py").write_text(
        "def f():\n    from otel_train.exporter import providers\n    return providers\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert violations("export") == ["export/sneaky.py imports otel_train.exporter",
                                    "export/sneaky.py imports otel_train.exporter.providers"]


def test_no_instrument_is_named_by_a_bound_method() -> None:
    # instruments cross by id (wire/messages.py): nothing takes one off a method's __self__
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if "__self__" in p.read_text()]
    assert offenders == []
