"""Streaming reader of OTLP JSON lines: the embedded exporter's run directory and the
collector file exporter's output read the same.

Every line of a ``traces*.jsonl``, ``metrics*.jsonl`` or ``logs*.jsonl`` file is one OTLP
export request. The readers here yield one flat record at a time and never hold more than
one line, so memory stays bounded however long the run was.

A line that is not one whole, well-typed request (torn by a killed writer, not UTF-8, not
JSON, a field of the wrong type) damages only itself: the readers count it and name it
(:class:`Damage`, or a :class:`DamagedFileWarning` per file where the caller passes none),
keep the whole requests a torn line still holds, and read on.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

from otel_train import semconv
from otel_train.analysis import legacy, typed
from otel_train.analysis.parallel import start_chunks

T = TypeVar("T")


def decode_value(value: dict[str, Any]) -> Any:
    """The Python value of one OTLP ``AnyValue`` (ints arrive as strings in OTLP JSON)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        flag = value["boolValue"]
        if flag is True or flag is False:
            return flag
        raise TypeError(f"boolValue {flag!r} is not true or false")  # bool("false") is True
    if "arrayValue" in value:
        return [decode_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return decode_attributes(value["kvlistValue"].get("values", []))
    return None


def decode_attributes(attributes: Iterable[dict[str, Any]] | None) -> dict[str, Any]:
    """``{a["key"]: decode_value(a.get("value", {})) for a in attributes}``: a value of one
    string, integer or double (nearly every attribute) decoded here, without the call."""
    out = {}
    for a in attributes or ():
        key = a["key"]
        value = a.get("value", {})
        if value.__class__ is dict and len(value) == 1:
            if "stringValue" in value:
                out[key] = value["stringValue"]
                continue
            if "intValue" in value:
                out[key] = int(value["intValue"])
                continue
            if "doubleValue" in value:
                out[key] = float(value["doubleValue"])
                continue
        out[key] = decode_value(value)
    return out


RawAttributes = dict[str, dict[str, Any]]


def raw_attributes(attributes: Iterable[dict[str, Any]] | None) -> RawAttributes:
    """Key -> undecoded ``AnyValue``: the passes over every span decode only the values
    they read (:func:`attribute`), not every value of every span."""
    return {a["key"]: a.get("value", {}) for a in attributes or ()}


def pick_attributes(attributes: Iterable[dict[str, Any]] | None,
                    keys: frozenset[str]) -> RawAttributes:
    """:func:`raw_attributes` of only ``keys``: cheaper than the whole map where a pass
    reads a few of many attributes of every span."""
    picked = {}
    for a in attributes or ():
        key = a["key"]
        if key in keys:
            picked[key] = a.get("value", {})
    return picked


def attribute(attributes: RawAttributes, key: str, default: Any = None) -> Any:
    """``decode_attributes(...).get(key, default)`` of :func:`raw_attributes`' mapping."""
    value = attributes.get(key)
    return default if value is None else decode_value(value)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while streaming.

    Decoded export requests are acyclic, so reference counting frees them; but allocating
    millions of them triggers full collections, each of which walks every object alive in the
    process (torch alone holds millions), which made the reading four times slower.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def signal_files(run_dir: Path, pattern: str) -> list[Path]:
    """The files of one signal (``semconv.TRACES_GLOB`` ...), rank files in rank order."""
    return sorted(Path(run_dir).glob(pattern))


# --- damaged lines: counted, named, and the rest read ---------------------------------------

#: what decoding a line of the wrong shape raises (JSONDecodeError and UnicodeDecodeError are
#: ValueErrors): a damaged line, never a traceback
DAMAGE_ERRORS = (ValueError, TypeError, LookupError, AttributeError, ArithmeticError,
                 RecursionError)
#: damaged lines of a file named in its message (the others are counted)
NAMED_LINES = 3


class DamagedFileWarning(UserWarning):
    """Lines of a telemetry file that could not be read whole; the rest was read."""


@dataclass
class FileDamage:
    """The damaged lines of one file: how many, the first few by number and what was wrong,
    and whether the file is truncated (its last line ends mid-request, without a newline)."""

    path: Path
    lines: int = 0
    named: list[tuple[int, str]] = field(default_factory=list)
    truncated_at: int | None = None

    def add(self, number: int, reason: str) -> None:
        self.lines += 1
        if len(self.named) < NAMED_LINES:
            self.named.append((number, reason))

    def truncate(self, number: int) -> None:
        """The last line, ``number``, ends mid-request."""
        self.lines += 1
        self.truncated_at = number

    def merge(self, other: FileDamage) -> None:
        self.lines += other.lines
        self.named = sorted(self.named + other.named)[:NAMED_LINES]
        if other.truncated_at is not None:
            self.truncated_at = other.truncated_at

    def message(self) -> str:
        """``traces.rank-0.jsonl: 2 damaged lines (line 5: torn; line 9: not JSON) ...``."""
        parts = []
        others = self.lines - (self.truncated_at is not None)
        if others:
            named = "; ".join(f"line {n}: {reason}" for n, reason in self.named)
            more = f"; +{others - len(self.named)} more" if others > len(self.named) else ""
            parts.append(f"{others} damaged line{'s' if others > 1 else ''} ({named}{more}), "
                         "the other lines read")
        if self.truncated_at is not None:
            parts.append(f"truncated: its last line, line {self.truncated_at}, ends mid-request "
                         "(its writer was killed while writing it, or is still writing it), "
                         "the lines before it read")
        return f"{self.path}: " + "; ".join(parts)


@dataclass
class Damage:
    """The damaged lines the readers found, by file in reading order. A caller that reports
    them itself passes one to the readers; without one, each reader warns
    (:class:`DamagedFileWarning`) once per damaged file it read."""

    files: dict[Path, FileDamage] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.files)

    @property
    def lines(self) -> int:
        return sum(f.lines for f in self.files.values())

    def add_file(self, found: FileDamage) -> None:
        known = self.files.get(found.path)
        if known is None:
            self.files[found.path] = found
        else:
            known.merge(found)

    def add(self, path: Path, number: int, reason: str) -> None:
        found = FileDamage(path)
        found.add(number, reason)
        self.add_file(found)

    def merge(self, other: Damage) -> None:
        for found in other.files.values():
            self.add_file(found)

    def messages(self) -> list[str]:
        return [found.message() for found in self.files.values()]


def _settle(found: FileDamage, damage: Damage | None) -> None:
    """One file read: its damage to the caller's ``damage``, else a warning."""
    if not found.lines:
        return
    if damage is None:
        warnings.warn(found.message(), DamagedFileWarning, stacklevel=3)
    else:
        damage.add_file(found)


@contextlib.contextmanager
def skip_damaged(path: Path, offset: int, damage: Damage | None = None) -> Iterator[None]:
    """Around the use of one line's requests (its byte ``offset`` in ``path``, as
    :func:`iter_span_batches` yields it): a field of the wrong type found there damages
    that line, counted in ``damage`` (else warned), and ends the block without a traceback.
    What the block changed before the error stays changed: build into a fresh part, and
    merge it as the block's last statement."""
    try:
        yield
    except DAMAGE_ERRORS as err:
        found = FileDamage(path)
        found.add(line_number(path, offset), wrong_type(err))
        _settle(found, damage)


def wrong_type(err: BaseException) -> str:
    return f"a field of the wrong type ({type(err).__name__}: {err})"


def line_number(path: Path, offset: int) -> int:
    """The number of the line at byte ``offset`` of ``path`` (only where one is damaged: it
    reads the file up to there)."""
    number = 1
    with open(path, "rb") as handle:
        while offset > 0:
            block = handle.read(min(offset, 1 << 20))
            if not block:
                break
            number += block.count(b"\n")
            offset -= len(block)
    return number


# --- the lines of a file, each one export request -------------------------------------------


def _lines(path: Path, decode: Callable[[dict[str, Any]], list[T]], damage: Damage | None,
           needles: tuple[bytes, ...] | None = None,
           fast: Callable[[bytes], list[T] | None] | None = None
           ) -> Iterator[tuple[int, int, list[T]]]:
    """(line number, byte offset, items) of each line of ``path`` that holds some: ``decode``
    turns one export request into items (a field of the wrong type raises). A line that is
    not one whole request is damaged: counted in ``damage`` (else warned), the whole
    requests on it kept (a restarted writer appends on the line its killed one tore).
    ``needles``: lines holding none of these bytes are not parsed. ``fast``: the items of a
    line (upgraded: legacy.py) decoded another way (typed.py), the same as ``decode``'s,
    or None where that way cannot read it whole: then json and ``decode`` read it."""
    found = FileDamage(path)
    offset = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(file_lines(handle), 1):
            at = offset
            offset += len(line)
            if needles is not None and not any(needle in line for needle in needles):
                continue
            items = None if fast is None else fast(legacy.upgrade(line))
            if items is None:
                items = _line_items(line, number, decode, found)
            if items:
                yield number, at, items
    _settle(found, damage)


def file_lines(handle: BinaryIO, block: int = 1 << 20) -> Iterator[bytes]:
    """The lines of a binary file, as iterating over it gives them (each with its newline,
    the last as it ends), read a block at a time: a file object reads a long line (an export
    request is often megabytes) in small pieces it joins, some ten times as slow."""
    pieces: list[bytes] = []
    while chunk := handle.read(block):
        start, end = 0, chunk.find(b"\n")
        while end >= 0:
            if pieces:  # a line begun in an earlier block
                pieces.append(chunk[start:end + 1])
                yield b"".join(pieces)
                pieces = []
            else:
                yield chunk[start:end + 1]
            start = end + 1
            end = chunk.find(b"\n", start)
        if start < len(chunk):
            pieces.append(chunk[start:])
    if pieces:
        yield b"".join(pieces)


def _line_items(line: bytes, number: int, decode: Callable[[dict[str, Any]], list[T]],
                found: FileDamage) -> list[T]:
    """The items of line ``number``; its damage, if any, counted in ``found``."""
    line = legacy.upgrade(line)  # a run recorded under the names before 0.2.0
    try:  # bytes: json decodes them as UTF-8, so invalid bytes damage this line only
        request = json.loads(line)
    except ValueError:
        return _salvage(line, number, decode, found)
    return _decoded(request, number, decode, found)


def _decoded(request: Any, number: int, decode: Callable[[dict[str, Any]], list[T]],
             found: FileDamage) -> list[T]:
    if type(request) is not dict:
        found.add(number, f"not an export request (a JSON {type(request).__name__})")
        return []
    try:
        return decode(request)
    except DAMAGE_ERRORS as err:
        found.add(number, wrong_type(err))
        return []


def _salvage(line: bytes, number: int, decode: Callable[[dict[str, Any]], list[T]],
             found: FileDamage) -> list[T]:
    """The items of the whole requests on a line that does not parse as one (none of a
    blank line, which is no damage)."""
    if not line.strip():
        return []
    try:
        text, utf8 = line.decode("utf-8"), True
    except UnicodeDecodeError as err:
        text = line.decode("utf-8", errors="replace")
        utf8 = err.reason == "unexpected end of data"  # cut inside a character: torn
    items: list[T] = []
    kept = 0
    for request in _whole_requests(text):
        try:
            items += decode(request)
        except DAMAGE_ERRORS:
            continue
        kept += 1
    if not line.endswith(b"\n") and text.lstrip().startswith("{") and utf8:
        found.truncate(number)
        return items
    reason = "not UTF-8" if not utf8 else "torn" if _REQUEST_START.search(text) else "not JSON"
    if kept:
        reason += f", {kept} whole request{'s' if kept > 1 else ''} on it read"
    found.add(number, reason)
    return items


def _whole_requests(text: str) -> Iterator[dict[str, Any]]:
    """The requests of a torn line that parse whole: each ends the line or is followed by
    the start of the next."""
    decoder = json.JSONDecoder()
    for match in _REQUEST_START.finditer(text):
        try:
            request, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if not text[end:].strip() or _REQUEST_START.match(text, end):
            yield request


_REQUEST_START = re.compile(r'\{"resource(?:Spans|Metrics|Logs)"')


def _whole(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [request]


def iter_requests(paths: Iterable[Path], damage: Damage | None = None
                  ) -> Iterator[dict[str, Any]]:
    """One decoded export request per line; damaged lines counted in ``damage`` (else
    warned), the whole requests on a torn line kept."""
    for path in paths:
        for _, _, requests in _lines(path, _whole, damage):
            yield from requests


def _resources(request: dict[str, Any], key: str, run_id: str | None
               ) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(decoded resource attributes, raw entry) of one request, only run ``run_id``'s."""
    for entry in request.get(key, ()):
        resource = _run_resource(entry.get("resource", {}), run_id)
        if resource is not None:
            yield resource, entry


def _run_resource(resource: Any, run_id: str | None) -> dict[str, Any] | None:
    """The decoded attributes of a raw ``resource``; None where it is not run ``run_id``'s."""
    attributes = decode_attributes(resource.get("attributes"))
    if run_id is None or str(attributes.get(semconv.RES_RUN_ID, run_id)) == run_id:
        return attributes
    return None


def _typed_batches(run_id: str | None) -> Callable[[bytes], list[typed.Batch] | None] | None:
    """The fast decoding of a traces line into span batches (typed.py), None where it is
    off: the ``fast`` of :func:`_lines`."""
    if not typed.enabled():
        return None
    return lambda line: typed.span_batches(line, run_id, lambda r: _run_resource(r, run_id))


@dataclass(slots=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: list[tuple[str, str]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


#: where a trace's spans are: trace id -> [(file index, byte offset of the line)]
LineIndex = dict[str, list[tuple[int, int]]]


def iter_spans(paths: Iterable[Path], names: frozenset[str] | None = None,
               line_filter: tuple[str, ...] | None = None,
               run_id: str | None = None, damage: Damage | None = None) -> Iterator[Span]:
    """Spans of the given files; ``names`` keeps only those names (attributes of the others
    are never decoded); ``line_filter`` skips lines that contain none of those strings;
    ``run_id`` keeps only that run's resources (a collector's files hold every run);
    damaged lines are counted in ``damage`` (else warned)."""
    needles = None if line_filter is None else tuple(n.encode() for n in line_filter)

    def decode(request: dict[str, Any]) -> list[Span]:
        return [_span(raw, resource) for raw, resource in _raw_spans(request, run_id)
                if names is None or raw.get("name") in names]

    for path in paths:
        for _, _, spans in _lines(path, decode, damage, needles):
            yield from spans


def iter_span_batches(path: Path, run_id: str | None = None, damage: Damage | None = None
                      ) -> Iterator[tuple[int, dict[str, Any], list[Any]]]:
    """(byte offset of its line, decoded resource attributes, raw spans as in the file) of
    every scope's spans in one file, run ``run_id``'s: for the passes over every span,
    which build no :class:`Span` and decode only what they read (a loop over a batch costs
    far less per span than a generator yielding each); the offsets let a later pass read a
    trace's lines only (:func:`spans_at`). A raw span is the dict json makes of it, or,
    where msgspec read its line, a :class:`~otel_train.analysis.typed.TypedSpan` read the
    same way (``span.get("name")``, ``span["attributes"]``: the same values), whose
    attributes are decoded only when asked for. Damaged lines are counted in ``damage``
    (else warned); a wrongly typed field of a span is the caller's to find
    (:func:`skip_damaged`)."""
    for _, at, batches in _lines(path, lambda request: _span_batches(request, run_id), damage,
                                 fast=_typed_batches(run_id)):
        for resource, spans in batches:
            yield at, resource, spans


def _span_batches(request: dict[str, Any], run_id: str | None
                  ) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    batches = []
    for resource, resource_spans in _resources(request, "resourceSpans", run_id):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            spans = scope_spans.get("spans") or []
            if type(spans) is not list:  # the callers loop over it as a list of spans
                raise TypeError(f"spans is a JSON {type(spans).__name__}, not a list")
            batches.append((resource, spans))
    return batches


def _raw_spans(request: dict[str, Any], run_id: str | None
               ) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(raw span, decoded resource attributes) of one export request, run ``run_id``'s."""
    for resource, resource_spans in _resources(request, "resourceSpans", run_id):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for raw in scope_spans.get("spans", ()):
                yield raw, resource


def spans_at(paths: list[Path], index: LineIndex, trace_ids: set[str],
             run_id: str | None = None, workers: int | None = None) -> list[Span]:
    """The spans of ``trace_ids``, reading only the lines ``index`` (file index in
    ``paths``, offset from :func:`iter_span_batches`) says hold them, in file and line
    order; the files split over ``workers`` processes as in pass one."""
    return start_spans_at(paths, index, trace_ids, run_id, workers)()


def start_spans_at(paths: list[Path], index: LineIndex, trace_ids: set[str],
                   run_id: str | None = None,
                   workers: int | None = None) -> Callable[[], list[Span]]:
    """:func:`spans_at` started in the workers; the function returned waits for it."""
    files, offsets = _lines_of(paths, index, trace_ids)
    results = start_chunks(spans_in_lines, files, offsets, trace_ids, run_id,
                           workers=workers)
    return lambda: [span for part in results() for span in part]


class Fold(Protocol):
    """What the spans of some traces are folded into as they are read, in each worker
    (:func:`start_fold_at`): never the spans themselves."""

    def add(self, span: Span) -> None: ...

    def merge(self, other: Any) -> Any: ...


F = TypeVar("F", bound=Fold)


def start_fold_at(paths: list[Path], index: LineIndex, trace_ids: set[str],
                  fold: Callable[[], F], run_id: str | None = None,
                  workers: int | None = None) -> Callable[[], F]:
    """The spans of ``trace_ids`` (read as :func:`spans_at` reads them) folded into
    ``fold()`` as they are read, in the workers, and the workers' folds merged: what a
    reader that needs a few numbers of each span holds, whatever the number of spans."""
    files, offsets = _lines_of(paths, index, trace_ids)
    results = start_chunks(fold_in_lines, files, offsets, trace_ids, run_id, fold,
                           workers=workers)

    def merged() -> F:
        out, parts = fold(), results()
        for k, part in enumerate(parts):
            out = out.merge(part)
            parts[k] = None  # its memory freed as it is merged (a step of many ranks is large)
        return out

    return merged


def _lines_of(paths: list[Path], index: LineIndex, trace_ids: set[str]
              ) -> tuple[list[Path], list[list[int]]]:
    offsets: dict[int, list[int]] = {}
    for i, offset in sorted({loc for t in trace_ids for loc in index.get(t, ())}):
        offsets.setdefault(i, []).append(offset)
    return [paths[i] for i in offsets], list(offsets.values())


def spans_in_lines(files: list[tuple[int, Path]], offsets: list[list[int]],
                   trace_ids: set[str], run_id: str | None) -> list[Span]:
    """The spans of ``trace_ids`` on the lines at ``offsets[k]`` of each (k, path). These
    lines were read by the pass that indexed them, which named those not whole; a line
    whose spans of these traces have a field of the wrong type (a span that pass decoded
    none of) is left out, and warned of here."""
    spans: list[Span] = []
    for line in _span_lines(files, offsets, trace_ids, run_id):
        spans += line
    return spans


def fold_in_lines(files: list[tuple[int, Path]], offsets: list[list[int]],
                  trace_ids: set[str], run_id: str | None, fold: Callable[[], F]) -> F:
    """:func:`spans_in_lines`' spans folded into ``fold()``, one line's at a time."""
    out = fold()
    for line in _span_lines(files, offsets, trace_ids, run_id):
        for span in line:
            out.add(span)
    return out


def _span_lines(files: list[tuple[int, Path]], offsets: list[list[int]],
                trace_ids: set[str], run_id: str | None) -> Iterator[list[Span]]:
    """The spans of ``trace_ids``, a line's at a time (a damaged line's none)."""
    fast = _typed_batches(run_id)
    # a TypedSpan's absent trace id is UNSET, where json's dict says "" (get's default)
    typed_ids = trace_ids | {typed.UNSET} if "" in trace_ids else trace_ids
    for k, path in files:
        wrong = FileDamage(path)
        with open(path, "rb") as handle:
            for offset in offsets[k]:
                handle.seek(offset)
                text = next(file_lines(handle, 1 << 16), b"")  # readline: as slow as above
                batches = None if fast is None else fast(legacy.upgrade(text))
                try:
                    if batches is None:  # json's dicts, where msgspec did not read it
                        line = [_span(raw, resource) for request in
                                _line_items(text, 0, _whole, FileDamage(path))
                                for raw, resource in _raw_spans(request, run_id)
                                if raw.get("traceId", "") in trace_ids]
                    else:
                        line = [_typed_span(raw, resource) for resource, spans in batches
                                for raw in spans if raw.traceId in typed_ids]
                except DAMAGE_ERRORS as err:
                    wrong.add(line_number(path, offset), wrong_type(err))
                    continue
                yield line
        _settle(wrong, None)


#: the attributes the report does arithmetic on, with their types: converted as a span is
#: read, so that a value of the wrong type damages its line there (named, the rest read)
#: rather than raising later, in the report's arithmetic
_TYPED_ATTRIBUTES = {semconv.ATTR_RANK: int, semconv.ATTR_STEP: int,
                     semconv.ATTR_MICRO_BATCH: int,
                     semconv.ATTR_COLLECTIVE_GPU_DURATION: float,
                     semconv.ATTR_COLLECTIVE_TOTAL_S: float,
                     semconv.ATTR_COLLECTIVE_BYTES: int}


def _span(raw: dict[str, Any], resource: dict[str, Any]) -> Span:
    if raw.__class__ is typed.TypedSpan:
        return _typed_span(raw, resource)
    attributes = decode_attributes(raw.get("attributes"))
    for key, kind in _TYPED_ATTRIBUTES.items():
        if key in attributes:
            attributes[key] = kind(attributes[key])
    return Span(
        name=raw.get("name", ""),
        trace_id=raw.get("traceId", ""),
        span_id=raw.get("spanId", ""),
        parent_id=raw.get("parentSpanId", "") or "",
        start_ns=int(raw.get("startTimeUnixNano", 0)),
        end_ns=int(raw.get("endTimeUnixNano", 0)),
        attributes=attributes,
        resource=resource,
        links=links_of(raw),
    )


def _typed_span(raw: typed.TypedSpan, resource: dict[str, Any]) -> Span:
    """:func:`_span` of a span msgspec decoded: the same, its fields read directly (its
    ``get`` is a Python call, and this runs for every span of the slowest steps)."""
    attributes = raw.attributes
    attributes = decode_attributes(typed.decode_raw(attributes) if attributes else None)
    for key, kind in _TYPED_ATTRIBUTES.items():
        if key in attributes:
            attributes[key] = kind(attributes[key])
    unset = typed.UNSET
    name, trace_id, span_id, parent_id, start, end = (
        raw.name, raw.traceId, raw.spanId, raw.parentSpanId, raw.startTimeUnixNano,
        raw.endTimeUnixNano)
    return Span(
        name="" if name is unset else name,
        trace_id="" if trace_id is unset else trace_id,
        span_id="" if span_id is unset else span_id,
        parent_id="" if parent_id is unset else parent_id,
        start_ns=0 if start is unset else int(start),
        end_ns=0 if end is unset else int(end),
        attributes=attributes,
        resource=resource,
        links=links_of(raw) if raw.links else [],
    )


def links_of(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(trace id, span id) of each link of a raw span."""
    return [(lk.get("traceId", ""), lk.get("spanId", "")) for lk in raw.get("links", ())]


@dataclass(slots=True)
class MetricPoint:
    """One data point of one metric in one export; ``kind`` is histogram, sum or gauge."""

    name: str
    kind: str
    unit: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    time_ns: int
    start_ns: int
    value: float = 0.0
    count: int = 0
    bucket_counts: list[int] = field(default_factory=list)
    bounds: list[float] = field(default_factory=list)
    exemplars: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rank(self) -> int | None:
        rank = self.attributes.get(semconv.ATTR_RANK, self.resource.get(semconv.RES_RANK))
        return None if rank is None else int(rank)


def iter_metric_points(paths: Iterable[Path], run_id: str | None = None,
                       damage: Damage | None = None) -> Iterator[MetricPoint]:
    """The data points of the given files, run ``run_id``'s; damaged lines are counted in
    ``damage`` (else warned)."""
    def decode(request: dict[str, Any]) -> list[MetricPoint]:
        return [point for resource, resource_metrics in
                _resources(request, "resourceMetrics", run_id)
                for scope_metrics in resource_metrics.get("scopeMetrics", ())
                for metric in scope_metrics.get("metrics", ())
                for point in _points(metric, resource)]

    for path in paths:
        for _, _, points in _lines(path, decode, damage):
            yield from points


def _points(metric: dict[str, Any], resource: dict[str, Any]) -> Iterator[MetricPoint]:
    for kind in ("histogram", "sum", "gauge", "exponentialHistogram"):
        if kind in metric:
            break
    else:
        return  # summaries are not part of the contract
    for raw in metric[kind].get("dataPoints", ()):
        point = MetricPoint(
            name=_text(metric.get("name", "")), kind=kind, unit=_text(metric.get("unit", "")),
            attributes=decode_attributes(raw.get("attributes")), resource=resource,
            time_ns=int(raw.get("timeUnixNano", 0)), start_ns=int(raw.get("startTimeUnixNano", 0)),
            exemplars=raw.get("exemplars", []),
        )
        if kind == "histogram":
            point.value = float(raw.get("sum", 0.0))
            point.count = int(raw.get("count", 0))
            point.bucket_counts = [int(c) for c in raw.get("bucketCounts", ())]
            point.bounds = [float(b) for b in raw.get("explicitBounds", ())]
        elif kind == "exponentialHistogram":
            # OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=
            # base2_exponential_bucket_histogram: the same histogram, its buckets as bounds
            point.kind = "histogram"
            point.value = float(raw.get("sum", 0.0))
            point.count = int(raw.get("count", 0))
            point.bounds, point.bucket_counts = _exponential_buckets(raw)
        else:
            point.value = float(raw["asDouble"] if "asDouble" in raw else raw.get("asInt", 0))
        yield _checked(point)


def _checked(point: MetricPoint) -> MetricPoint:
    """``point``, once its rank and exemplars are seen to convert: their readers convert
    them later, where a wrong type would no longer damage only its line."""
    _ = point.rank
    for exemplar in point.exemplars:
        float(exemplar.get("asDouble", exemplar.get("asInt", 0)))
        if not isinstance(exemplar.get("traceId", ""), str) or \
                not isinstance(exemplar.get("spanId", ""), str):
            raise TypeError("an exemplar's traceId or spanId is not a string")
    return point


def _exponential_buckets(raw: dict[str, Any]) -> tuple[list[float], list[int]]:
    """An exponential histogram point's buckets as explicit ones: bounds and counts (one
    more count than bounds, the last above every bound). Positive bucket ``i`` holds values
    in (base**i, base**(i + 1)], base = 2**(2**-scale); zero and negative values go in the
    first bucket, at or below the first positive bucket's lower bound. Durations and sizes
    are never negative."""
    base = 2.0 ** (2.0 ** -int(raw.get("scale", 0)))
    positive = raw.get("positive") or {}
    offset = int(positive.get("offset", 0))
    counts = [int(c) for c in positive.get("bucketCounts", ())]
    negative = sum(int(c) for c in (raw.get("negative") or {}).get("bucketCounts", ()))
    low = int(raw.get("zeroCount", 0)) + negative
    bounds = [base ** offset] + [base ** (offset + k + 1) for k in range(len(counts))]
    return bounds, [low, *counts, 0]


@dataclass(slots=True)
class LogRecord:
    time_ns: int
    severity: str
    body: Any
    trace_id: str
    span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    #: OpenTelemetry's EventName: otel-train's own records name their event there and in
    #: the body (runs before 0.3.0: the body only)
    event_name: str = ""


def iter_log_records(paths: Iterable[Path], run_id: str | None = None,
                     damage: Damage | None = None) -> Iterator[LogRecord]:
    """The log records of the given files, run ``run_id``'s; damaged lines are counted in
    ``damage`` (else warned)."""
    def decode(request: dict[str, Any]) -> list[LogRecord]:
        return [_log_record(raw, resource) for resource, resource_logs in
                _resources(request, "resourceLogs", run_id)
                for scope_logs in resource_logs.get("scopeLogs", ())
                for raw in scope_logs.get("logRecords", ())]

    for path in paths:
        for _, _, records in _lines(path, decode, damage):
            yield from records


def _log_record(raw: dict[str, Any], resource: dict[str, Any]) -> LogRecord:
    return LogRecord(
        time_ns=int(raw.get("timeUnixNano", 0) or raw.get("observedTimeUnixNano", 0)),
        severity=_text(raw.get("severityText", "")),
        body=decode_value(raw.get("body", {})),
        trace_id=_text(raw.get("traceId", "") or ""),
        span_id=_text(raw.get("spanId", "") or ""),
        attributes=decode_attributes(raw.get("attributes")),
        resource=resource,
        event_name=_text(raw.get("eventName", "") or ""),
    )


def _text(value: Any) -> str:
    """A field that must be a string (its readers call string methods on it)."""
    if type(value) is not str:
        raise TypeError(f"{value!r} is not a string")
    return value


def resolve_run_dir(path: Path, run_id: str | None = None) -> Path:
    """``path`` itself when it holds telemetry, else its run ``run_id`` or newest run.
    FileNotFoundError names what was asked when there is none: a path that does not exist,
    a run id that no run under ``path`` has, a directory without telemetry."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is a file, not a run directory (give the directory "
                                "that holds it)")
    if run_id and _holds_telemetry(path / run_id):
        return path / run_id
    if _holds_telemetry(path):
        return path
    runs = [d for d in path.iterdir() if d.is_dir() and _holds_telemetry(d)]
    if run_id and runs:
        raise FileNotFoundError(f"no run {run_id!r} under {path} (its runs: "
                                f"{_some(sorted(d.name for d in runs))})")
    if not runs:
        raise FileNotFoundError(f"no {semconv.TRACES_GLOB} or {semconv.METRICS_GLOB} in {path}")
    return max(runs, key=lambda d: d.stat().st_mtime)


def _holds_telemetry(path: Path) -> bool:
    return bool(signal_files(path, semconv.TRACES_GLOB) or
                signal_files(path, semconv.METRICS_GLOB))


def no_such_run(run_dir: Path, run_id: str) -> str:
    """What to say where ``run_dir``'s files hold nothing of run ``run_id``: the runs they
    hold (as the metrics files name them: the smallest signal to read)."""
    held = run_ids(run_dir)
    return f"no telemetry of run {run_id!r} in {run_dir}" + (
        f" (its files hold runs: {_some(held)})" if held else "")


def run_ids(run_dir: Path) -> list[str]:
    """The run ids that the resources of ``run_dir``'s metrics files name."""
    points = iter_metric_points(signal_files(run_dir, semconv.METRICS_GLOB), damage=Damage())
    return sorted({str(p.resource[semconv.RES_RUN_ID]) for p in points
                   if semconv.RES_RUN_ID in p.resource})


def _some(names: list[str], limit: int = 5) -> str:
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
