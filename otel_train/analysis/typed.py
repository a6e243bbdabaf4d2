"""The traces lines decoded by msgspec into typed objects: the fast way to read a span.

Decoding JSON is most of what reading the traces costs. The passes over every span read a
span's name, trace id and times, and the attributes of few spans (a rank step's, a
collective's); the attributes are most of a line's bytes. msgspec decodes a line into the
:class:`TypedSpan` objects below, leaving each span's attributes, events, links and status
as :class:`msgspec.Raw` (their bytes, checked as JSON but not made into Python objects)
until a reader asks for them, some ten times as fast as the standard library's ``json``.

A :class:`TypedSpan` is read as the dict ``json.loads`` makes of the span is
(``span.get("attributes")``, ``span["name"]``), with the same values, so the readers do not
know which they were given. A line that msgspec cannot decode into these types (damaged,
torn, not UTF-8, a field of the wrong type, a number it cannot hold) is not decoded here
(:func:`span_batches` says None) and the caller reads it with ``json`` as it always did,
which names what is wrong with it: the damaged lines read as before, word for word.

Without msgspec installed (it is a dependency, but a copy of the package without it still
works) every line is read with ``json``; so it is where ``JSON_ONLY`` is set (the tests
compare the two readers: forked workers inherit it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:
    import msgspec
    from msgspec import UNSET, Raw, UnsetType
except ImportError:  # pragma: no cover - msgspec is a dependency
    msgspec = None  # type: ignore[assignment]

#: a span's resource attributes decoded, and its spans: one (resource, scope) of a line
Batch = tuple[dict[str, Any], list[Any]]

if msgspec is not None:
    _ABSENT = Raw()  # a field the span does not have (a JSON value is never empty)
    #: what a Raw field that is there decodes to; msgspec refuses a few values json takes
    #: (1e400 as inf): those are decoded by json, as the line would have been
    _RAW_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)

    def decode_raw(raw: Raw) -> Any:
        """The Python value of a Raw field, as ``json.loads`` would have made it."""
        try:
            return msgspec.json.decode(raw)
        except _RAW_ERRORS:
            return json.loads(bytes(raw))

    class TypedSpan(msgspec.Struct, gc=False):
        """One span of an OTLP JSON line: the fields every pass reads typed, the others kept
        as their JSON bytes until asked for. Every field of OTLP's Span is named, so that
        :meth:`get` of any of them answers what the dict would."""

        name: str | UnsetType = UNSET
        traceId: str | UnsetType = UNSET  # noqa: N815 (OTLP JSON's names)
        spanId: str | UnsetType = UNSET  # noqa: N815
        parentSpanId: str | UnsetType = UNSET  # noqa: N815
        startTimeUnixNano: int | str | UnsetType = UNSET  # noqa: N815
        endTimeUnixNano: int | str | UnsetType = UNSET  # noqa: N815
        attributes: Raw = _ABSENT
        events: Raw = _ABSENT
        links: Raw = _ABSENT
        status: Raw = _ABSENT
        kind: Raw = _ABSENT
        flags: Raw = _ABSENT
        traceState: Raw = _ABSENT  # noqa: N815
        droppedAttributesCount: Raw = _ABSENT  # noqa: N815
        droppedEventsCount: Raw = _ABSENT  # noqa: N815
        droppedLinksCount: Raw = _ABSENT  # noqa: N815

        def get(self, key: str, default: Any = None) -> Any:
            """``dict.get`` of the span as ``json.loads`` makes it."""
            value = getattr(self, key, UNSET) if key in _FIELDS else UNSET
            if value is UNSET:
                return default
            if value.__class__ is Raw:
                return decode_raw(value) if value else default
            return value

        def ids(self) -> tuple[str, str, str, str]:
            """(name, traceId, spanId, parentSpanId), "" where the span has none: what the
            readers take of json's dict with ``get(key, "")``."""
            name, trace_id, span_id, parent_id = (self.name, self.traceId, self.spanId,
                                                  self.parentSpanId)
            return ("" if name is UNSET else name, "" if trace_id is UNSET else trace_id,
                    "" if span_id is UNSET else span_id,
                    "" if parent_id is UNSET else parent_id)

        def __getitem__(self, key: str) -> Any:
            value = self.get(key, UNSET)
            if value is UNSET:
                raise KeyError(key)
            return value

    _FIELDS = frozenset(TypedSpan.__struct_fields__)

    class _AnyValue(msgspec.Struct, gc=False):
        """An OTLP AnyValue of one scalar (an array, map or bytes is read by json)."""

        stringValue: str | UnsetType = UNSET  # noqa: N815
        intValue: int | str | UnsetType = UNSET  # noqa: N815
        doubleValue: float | str | UnsetType = UNSET  # noqa: N815
        boolValue: bool | UnsetType = UNSET  # noqa: N815
        arrayValue: Raw = _ABSENT  # noqa: N815
        kvlistValue: Raw = _ABSENT  # noqa: N815
        bytesValue: Raw = _ABSENT  # noqa: N815

    class _KeyValue(msgspec.Struct, gc=False):
        key: str
        value: _AnyValue | UnsetType = UNSET

    _ATTRIBUTES: Any = msgspec.json.Decoder(list[_KeyValue])

    class _ScopeSpans(msgspec.Struct, gc=False):
        spans: list[TypedSpan] | None | UnsetType = UNSET

    class _ResourceSpans(msgspec.Struct, gc=False):
        resource: dict[str, Any] | UnsetType = UNSET
        scopeSpans: list[_ScopeSpans] | UnsetType = UNSET  # noqa: N815

    class _TracesRequest(msgspec.Struct, gc=False):
        resourceSpans: list[_ResourceSpans] | UnsetType = UNSET  # noqa: N815

    _DECODER: Any = msgspec.json.Decoder(_TracesRequest)
else:  # pragma: no cover
    _DECODER = None

    class TypedSpan:  # type: ignore[no-redef]
        """Never made without msgspec: every span is json's dict."""

    UNSET = object()

    def decode_raw(raw: Any) -> Any:
        return json.loads(bytes(raw))


#: read every line with ``json`` (the tests' switch to compare the readers)
JSON_ONLY = False


def picked_values(raw: Any, keys: frozenset[str]) -> dict[str, Any] | None:
    """The decoded values of the attributes ``keys`` of a span's raw ``attributes`` (a
    :class:`msgspec.Raw`), as otlp.py's ``decode_value`` makes each, none of the others
    made into Python objects; None where this cannot read them all (an array, a map, a
    wrongly typed value: the caller reads them with json, which names what is wrong)."""
    if not raw:
        return {}
    try:
        pairs = _ATTRIBUTES.decode(raw)
    except Exception:  # noqa: BLE001 - the json reader decides
        return None
    out: dict[str, Any] = {}
    for pair in pairs:
        key = pair.key
        if key not in keys:
            continue
        value = pair.value
        if value is UNSET:
            out[key] = None
        elif value.stringValue is not UNSET:
            out[key] = value.stringValue
        elif value.intValue is not UNSET:
            out[key] = int(value.intValue)
        elif value.doubleValue is not UNSET:
            out[key] = float(value.doubleValue)
        elif value.boolValue is not UNSET:
            out[key] = value.boolValue
        elif value.arrayValue or value.kvlistValue:
            return None
        else:
            out[key] = None
    return out


def enabled() -> bool:
    """Whether lines are decoded here (msgspec installed, and not turned off)."""
    return _DECODER is not None and not JSON_ONLY


def span_batches(line: bytes, run_id: str | None,
                 resource_of: Callable[[Any], dict[str, Any] | None]) -> list[Batch] | None:
    """(decoded resource attributes, spans) of each scope of one traces line, run
    ``run_id``'s, the spans :class:`TypedSpan`; None where the line is to be read with json
    (it is not one whole request of these types, or msgspec is not there).
    ``resource_of(entry)``: the resource attributes of a resourceSpans entry (a dict, or
    its ``get``), None where it is not ``run_id``'s (otlp.py's rule for both readers)."""
    if _DECODER is None:
        return None
    try:
        if not line.isascii():
            line.decode("utf-8")  # json names a line that is not UTF-8 (msgspec's Raw may not)
        request = _DECODER.decode(line)
        batches: list[Batch] = []
        entries = request.resourceSpans
        for entry in () if entries is UNSET else entries:
            resource = resource_of({} if entry.resource is UNSET else entry.resource)
            if resource is None:
                continue
            scopes = entry.scopeSpans
            for scope in () if scopes is UNSET else scopes:
                spans = scope.spans
                batches.append((resource, spans if spans else []))
        return batches
    except Exception:  # noqa: BLE001 - json reads the line, and names what is wrong with it
        return None
