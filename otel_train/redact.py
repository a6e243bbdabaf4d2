"""Nothing secret leaves the process: the deny list applied to what otel-train exports.

otel-train exports no environment values and no command lines. What it does export that
the application controls (log record fields and messages bridged into OpenTelemetry logs,
exception texts, span status descriptions and event attributes) passes through this module:

- a value whose *key* names a credential is replaced by ``[REDACTED]``, at any depth of
  nested mappings and sequences. Keys are matched word by word (``db_password``,
  ``apiKey``, ``X-Auth-Token``, ``hf_token``), so ordinary training fields that merely
  contain such letters survive: ``tokens_per_s``, ``num_tokens``, ``tokenizer``,
  ``author``, ``num_passes``;
- in every string, credential-shaped parts are scrubbed and the rest kept: the value of a
  ``password=...``/``"token": "..."`` pair, a bearer token, a private key block, the password
  of a URL (``postgres://user:[REDACTED]@host``), cloud and hub access keys, JWTs.

Site policy beyond this (hashing user ids, dropping attributes) belongs in the collector's
``redaction`` processor (README, Security).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"

#: key words that name a credential on their own
_DENY_WORDS = frozenset({
    "password", "passwd", "pwd", "passphrase", "secret", "secrets", "credential",
    "credentials", "auth", "authorization", "cookie", "cookies", "signature", "dsn", "apikey",
    "bearer", "sessionid", "privatekey", "accesskey", "secretkey", "accesstoken",
})
#: words that name one as the last word of a key (``hf_token``, ``db_pass``), not before
#: another (``token_count``, ``pass_at_k`` are training figures)
_DENY_LAST = frozenset({"token", "pass"})
#: adjacent key words that name one: api key, access key, session id, ...
_DENY_PAIRS = frozenset({
    ("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"),
    ("session", "id"), ("client", "secret"), ("signing", "key"), ("encryption", "key"),
})
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

#: credential-shaped parts of any string: (pattern, replacement)
_SCRUB = [
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)",
                re.DOTALL), REDACTED),
    (re.compile(r"\b(Bearer|Basic|Token)(\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
     rf"\1\2{REDACTED}"),
    # scheme://user:password@host
    (re.compile(r"\b([a-z][a-z0-9+.-]*://[^/\s:@'\"]*):[^/\s@'\"]+@", re.IGNORECASE),
     rf"\1:{REDACTED}@"),
    # password=..., "api_key": "...", token: ..., secret ...=... in query strings, reprs, JSON
    (re.compile(r"""((?<![A-Za-z0-9])(?:pass(?:word|wd|phrase)?|pwd|secret|token|api[-_]?key|access[-_]?key|"""
                r"""private[-_]?key|client[-_]?secret|auth(?:orization)?)['"]?\s*[:=]\s*['"]?)"""
                r"""[^\s'",;&}\])]+""", re.IGNORECASE), rf"\1{REDACTED}"),
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\b(gh[pousr]|github_pat|hf|sk|xox[abpr])_[A-Za-z0-9_]{16,}"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
]
#: a cheap test before the scrubbing regexes (most strings hold none of these)
_MAYBE = re.compile(r"PRIVATE KEY|bearer|basic|token|://|pass|pwd|secret|key|auth|AKIA|ASIA|"
                    r"gh[pousr]_|github_pat|hf_|sk_|xox|eyJ", re.IGNORECASE)


def is_denied_key(key: str) -> bool:
    """Does ``key`` name a credential? Word by word (snake_case, camelCase, kebab-case)."""
    words = [w.lower() for w in _WORDS.findall(str(key))]
    if any(w in _DENY_WORDS for w in words) or (words and words[-1] in _DENY_LAST):
        return True
    if "".join(words) in _DENY_WORDS:  # apikey written as one word, "APIKey"
        return True
    return any(pair in _DENY_PAIRS for pair in zip(words, words[1:]))


def scrub(text: str) -> str:
    """``text`` with every credential-shaped part replaced by ``[REDACTED]``."""
    if not _MAYBE.search(text):
        return text
    for pattern, replacement in _SCRUB:
        text = pattern.sub(replacement, text)
    return text


def redact_value(value: Any) -> Any:
    """A copy of ``value`` with secrets removed: strings scrubbed, mappings and sequences
    walked (their denied keys redacted)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return redact_mapping(value)
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value) if isinstance(value, list) \
            else tuple(redact_value(v) for v in value)
    return value


def redact_mapping(fields: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of ``fields`` with denied keys redacted and every value walked and scrubbed."""
    return {k: REDACTED if is_denied_key(str(k)) else redact_value(v) for k, v in fields.items()}
