"""The emitter's seam to where spans are built is one Protocol (``emitter/pipeline.py``),
and both pipelines hold to it: the exporter process's (``export/remote.py``) and the
in-process one (``exporter/providers.py``). Every member exists on both with a signature the
emitter's calls fit (names, kinds and defaults of every parameter, read with
``inspect.signature``; ``runtime_checkable``'s isinstance checks names only), the data
members on real instances; and the emitter and ``instrument()`` call nothing on a pipeline
that the Protocol does not name."""

from __future__ import annotations

import ast
import collections
import inspect
from pathlib import Path

import pytest

import otel_train
from otel_train import config as config_mod
from otel_train import identity
from otel_train.emitter.pipeline import Pipeline, ReportsExporterDrops
from otel_train.export.remote import RemotePipeline
from otel_train.exporter.providers import Pipeline as InProcessPipeline

PACKAGE = Path(otel_train.__file__).parent
IMPLEMENTATIONS = (RemotePipeline, InProcessPipeline)


def _methods(protocol: type) -> list[str]:
    return sorted(name for name, value in vars(protocol).items()
                  if not name.startswith("_") and inspect.isfunction(value))


def _data(protocol: type) -> list[str]:
    return sorted(protocol.__dict__.get("__annotations__", {}))


def signature_mismatches(protocol: type, cls: type, names: list[str]) -> list[str]:
    """Why ``cls``'s methods ``names`` would not take every call ``protocol``'s allow: a
    missing method, a parameter missing, renamed, moved, of another kind or with another
    default, or an extra one without a default."""
    out = []
    for name in names:
        impl = getattr(cls, name, None)
        if impl is None or not callable(impl):
            out.append(f"{cls.__name__}.{name}: missing")
            continue
        want = list(inspect.signature(getattr(protocol, name)).parameters.values())
        have = list(inspect.signature(impl).parameters.values())
        for i, param in enumerate(want):
            if i >= len(have):
                out.append(f"{cls.__name__}.{name}: no parameter {param.name!r}")
                continue
            got = have[i]
            if (got.name, got.kind) != (param.name, param.kind):
                out.append(f"{cls.__name__}.{name}: parameter {i} is {got.name!r} "
                           f"({got.kind.description}), not {param.name!r} "
                           f"({param.kind.description})")
            elif got.default != param.default:
                out.append(f"{cls.__name__}.{name}: {param.name!r} defaults to "
                           f"{got.default!r}, not {param.default!r}")
        for extra in have[len(want):]:
            if extra.default is inspect.Parameter.empty and extra.kind not in (
                    inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                out.append(f"{cls.__name__}.{name}: extra parameter {extra.name!r} "
                           "without a default")
    return out


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__module__)
def test_both_pipelines_have_every_method_with_a_fitting_signature(cls: type) -> None:
    assert _methods(Pipeline), "the Protocol names no method"
    assert signature_mismatches(Pipeline, cls, _methods(Pipeline)) == []


def test_only_the_exporter_process_s_pipeline_reports_the_exporter_s_drops() -> None:
    # the emitter adds the exporter process's own losses where its pipeline has them
    # (accounts.py): the in-process pipeline has no exporter process
    names = _methods(ReportsExporterDrops)
    assert names == ["exporter_dropped", "exporter_dropped_read"]
    assert signature_mismatches(ReportsExporterDrops, RemotePipeline, names) == []
    assert all(not hasattr(InProcessPipeline, name) for name in names)


def test_the_data_members_are_there_on_real_pipelines_of_both_kinds(tmp_path) -> None:
    cfg = config_mod.load(exporter="none", output_dir=tmp_path)
    ident = identity.Identity("protocol", 0, 0, 1, "host", 1)
    assert _data(Pipeline) == ["dropped", "kind", "meter"]
    for pipeline in (InProcessPipeline(cfg, ident, None), RemotePipeline(cfg, ident, None)):
        try:
            assert isinstance(pipeline.kind, str) and pipeline.kind == "none"
            assert isinstance(pipeline.dropped, collections.Counter)
            for create in ("create_counter", "create_histogram", "create_gauge"):
                assert callable(getattr(pipeline.meter, create)), (type(pipeline), create)
            assert isinstance(pipeline, ReportsExporterDrops) == (
                type(pipeline) is RemotePipeline)
        finally:
            assert pipeline.shutdown(10.0)


def _pipeline_members_used(path: Path, names: tuple[str, ...]) -> set[tuple[str, int]]:
    """(attribute, line) of every ``<name>.<attribute>`` and ``self.<name>.<attribute>`` in a
    module, for each of ``names`` (what the module calls a pipeline)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            value = node.value
            if (isinstance(value, ast.Name) and value.id in names) or (
                    isinstance(value, ast.Attribute) and value.attr in names
                    and isinstance(value.value, ast.Name) and value.value.id == "self"):
                found.add((node.attr, node.lineno))
    return found


def test_the_emitter_and_instrument_call_nothing_the_protocol_does_not_name() -> None:
    members = set(_methods(Pipeline)) | set(_data(Pipeline)) | set(
        _methods(ReportsExporterDrops))
    files = [*sorted((PACKAGE / "emitter").glob("*.py")), PACKAGE / "instrument.py"]
    outside = sorted(f"{path.relative_to(PACKAGE)}:{line}: .{attr}" for path in files
                     for attr, line in _pipeline_members_used(path, ("pipeline", "_pipeline"))
                     if attr not in members)
    assert outside == [], "\n".join(outside)
    # the check sees what it looks for
    used = _pipeline_members_used(PACKAGE / "emitter" / "core.py", ("pipeline",))
    assert {"commit", "backlog", "nudge", "span", "collectives"} <= {a for a, _ in used}
