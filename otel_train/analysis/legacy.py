"""Runs recorded under the names before one scheme (0.3.0), read as if written under the new.

``semconv.LEGACY_NAMES`` and ``semconv.LEGACY_PREFIXES`` give every name that changed. An
export request is one JSON line; an old name there is a JSON string equal to it: a span's
``"name"``, an attribute's ``"key"``, a metric's ``"name"`` or a log record's body. A line
whose ``otel_train`` instrumentation scope has a version before 0.3 is upgraded before it is
parsed, so every reader above (``report``, ``check``, ``compare``) sees one set of names. A
new line costs one search that stops at its scope, near the line's start. The names
``signal`` and ``component`` are changed only as attribute keys (as values they are words).
"""

from __future__ import annotations

import re

from otel_train import semconv

_PLAIN = {old: new for old, new in semconv.LEGACY_NAMES.items()
          if old not in ("signal", "component")}
_KEYS = {old: new for old, new in semconv.LEGACY_NAMES.items() if old in ("signal", "component")}


def _alternation(names: list[str]) -> bytes:
    # longest first, so "train.step.end" is not read as "train.step" + ".end"
    return b"|".join(re.escape(n.encode()) for n in sorted(names, key=len, reverse=True))


_OLD = re.compile(
    rb'"(' + _alternation(list(_PLAIN)) + rb')"'
    + rb'|"(' + _alternation(list(semconv.LEGACY_PREFIXES)) + rb')'
    + rb'|("key":\s*)"(' + _alternation(list(_KEYS)) + rb')"')
_NEW = {old.encode(): new.encode() for old, new in
        {**_PLAIN, **semconv.LEGACY_PREFIXES, **_KEYS}.items()}
#: otel-train's scope on a line, as OTLP JSON writes it (the SDK's file exporter and the
#: collector's alike); its version says which names the line's records carry
_SCOPE = b'"scope":{"name":"' + semconv.SCOPE_NAME.encode() + b'","version":"'
_VERSION = re.compile(rb"(\d+)\.(\d+)")
#: the first version that writes the names of one scheme
FIRST_VERSION = (0, 3)


def _replace(match: re.Match[bytes]) -> bytes:
    whole, prefix, key_head, key = match.groups()
    if whole is not None:
        return b'"' + _NEW[whole] + b'"'
    if prefix is not None:
        return b'"' + _NEW[prefix]
    return key_head + b'"' + _NEW[key] + b'"'


def upgrade(line: bytes) -> bytes:
    """``line`` (one export request, JSON) with every old name made its new one, if an
    otel-train before 0.3 wrote it."""
    at = line.find(_SCOPE)
    if at < 0:
        return line  # no record of otel-train's own: a user's log records keep their words
    version = _VERSION.match(line, at + len(_SCOPE))
    if version is None or (int(version[1]), int(version[2])) >= FIRST_VERSION:
        return line
    return _OLD.sub(_replace, line)


def upgrade_name(name: str) -> str:
    """One name as the new scheme has it (a live store's span or attribute name)."""
    new = semconv.LEGACY_NAMES.get(name)
    if new is not None:
        return new
    for old, prefix in semconv.LEGACY_PREFIXES.items():
        if name.startswith(old):
            return prefix + name[len(old):]
    return name
