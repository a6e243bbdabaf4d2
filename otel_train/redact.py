"""Nothing secret leaves the process: the deny list applied to what otel-train exports.

otel-train exports no environment values and no command lines. What it does export that
the application controls (log record fields bridged into OpenTelemetry logs, extra
attributes) passes through :func:`redact_mapping`: a value whose key matches the deny list
is replaced by ``[REDACTED]``; so is any string value that looks like a credential (a bearer
token, a private key block, a URL with a password in it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"

#: keys (case-insensitive, matched anywhere in the key) whose values are never exported
DENY_KEYS = re.compile(
    r"(pass(word|wd)?|secret|token|api[-_]?key|access[-_]?key|private[-_]?key|credential|"
    r"auth(orization)?|cookie|session[-_]?id|signature|dsn)",
    re.IGNORECASE,
)

#: string values that are credentials whatever their key
_SECRET_VALUES = re.compile(
    r"(-----BEGIN [A-Z ]*PRIVATE KEY-----|\bBearer\s+[A-Za-z0-9._~+/-]{8,}|"
    r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@|\bAKIA[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{20,})"
)


def is_denied_key(key: str) -> bool:
    return bool(DENY_KEYS.search(key))


def redact_value(value: Any) -> Any:
    if isinstance(value, str) and _SECRET_VALUES.search(value):
        return REDACTED
    return value


def redact_mapping(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``fields`` with denied keys and credential-looking values redacted."""
    return {k: REDACTED if is_denied_key(str(k)) else redact_value(v) for k, v in fields.items()}
