"""Nothing secret leaves the process: the deny list applied to what otel-train exports.

otel-train exports no environment values and no command lines. What it does export that
the application controls (log record fields and messages bridged into OpenTelemetry logs,
exception texts and tracebacks, span status descriptions and event attributes) passes
through this module:

- the *values* of the process's secret environment variables (``HF_TOKEN``,
  ``AWS_SECRET_ACCESS_KEY``, ``WANDB_API_KEY``, any ``*_SECRET*``, ``*_TOKEN``,
  ``*_PASSWORD``, ``*_API_KEY``, ``*_ACCESS_KEY*``, ...) are masked wherever they appear,
  as CI systems mask theirs: read once at start (:func:`load_env_secrets`), values shorter
  than six characters left alone (``true``, ``1``), replaced longest first;
- a value whose *key* names a credential is replaced by ``[REDACTED]``, at any depth of
  nested mappings and sequences. Keys are matched word by word (``db_password``,
  ``apiKey``, ``X-Auth-Token``, ``hf_token``), so ordinary training fields that merely
  contain such letters survive: ``tokens_per_s``, ``num_tokens``, ``tokenizer``,
  ``author``, ``num_passes``, and so do a tokenizer's special tokens (``pad_token``,
  ``eos_token``, ``mask_token``, ``pad_token_id``, ...), which are not secrets;
- in every string, credential-shaped parts are scrubbed and the rest kept: the value of a
  ``password=...``/``"token": "..."`` pair (not ``pad token: 50256``), a bearer token, a
  private key block, the password of a URL (``postgres://user:[REDACTED]@host``), cloud and
  hub access keys (``AKIA...``, ``ghp_...``, ``hf_...``, ``sk-...``), JWTs.

Site policy beyond this (hashing user ids, dropping attributes) belongs in the collector's
``redaction`` processor (README, Security).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"

# --- secret values, from the environment -------------------------------------------------

#: environment variable names that mark their value as a secret
_SECRET_ENV_NAME = re.compile(
    r"(?:^|_)SECRET|ACCESS_?KEY|"
    r"(?:^|_)(?:TOKEN|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|PRIVATE_?KEY|DSN)$", re.IGNORECASE)
#: shorter values are not masked: they would mask ``true``, ``1``, ``gpt2`` everywhere
MIN_SECRET_LEN = 6

#: the secret values (longest first) and one pattern for all of them; None until loaded
_secrets: tuple[tuple[str, ...], re.Pattern[str]] | None = None

#: a tokenizer's special tokens: ``pad_token``, ``eos_token``... name tokens, not credentials
_TOKENIZER_WORDS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask"})


def is_secret_env_name(name: str) -> bool:
    """Does the environment variable ``name`` hold a secret (``HF_TOKEN``, ``DB_PASSWORD``,
    ``AWS_SECRET_ACCESS_KEY``, ``OPENAI_API_KEY``...)? Not ``PAD_TOKEN``, not ``PWD``."""
    if not _SECRET_ENV_NAME.search(name):
        return False
    words = name.lower().split("_")
    return not (words[-1] == "token" and len(words) >= 2 and words[-2] in _TOKENIZER_WORDS)


def load_env_secrets(environ: Mapping[str, str] | None = None) -> int:
    """Read the values to mask from ``environ`` (``os.environ``); returns how many.

    Called once when a run starts (and when the exporter process starts: its environment is
    the training process's); :func:`mask_secrets` reads ``os.environ`` if it never was.
    """
    global _secrets
    _secrets = _read(os.environ if environ is None else environ)
    return len(_secrets[0])


def _read(environ: Mapping[str, str]) -> tuple[tuple[str, ...], re.Pattern[str]]:
    found = {value.strip() for name, value in environ.items() if is_secret_env_name(name)}
    values = tuple(sorted((v for v in found if len(v) >= MIN_SECRET_LEN), key=len,
                          reverse=True))
    # alternatives are tried in order: longest first, so a secret that extends another is
    # masked whole
    return values, re.compile("|".join(map(re.escape, values)) or "(?!)")


def mask_secrets(text: str) -> str:
    """``text`` with every secret environment value in it replaced by ``[REDACTED]``."""
    secrets = _secrets  # one read: a run's start may replace it meanwhile
    if secrets is None:
        load_env_secrets()
        secrets = _secrets
        assert secrets is not None
    values, pattern = secrets
    for value in values:  # str.__contains__ per value: the cheap test, ~70 ns a log line
        if value in text:
            return pattern.sub(REDACTED, text)
    return text


# --- credential keys ---------------------------------------------------------------------

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


def is_denied_key(key: str) -> bool:
    """Does ``key`` name a credential? Word by word (snake_case, camelCase, kebab-case);
    a tokenizer's ``pad_token``, ``eos_token``... do not."""
    words = [w.lower() for w in _WORDS.findall(str(key))]
    if any(w in _DENY_WORDS for w in words):
        return True
    if words and words[-1] in _DENY_LAST:
        return not (words[-1] == "token" and len(words) >= 2 and words[-2] in _TOKENIZER_WORDS)
    if "".join(words) in _DENY_WORDS:  # apikey written as one word, "APIKey"
        return True
    return any(pair in _DENY_PAIRS for pair in zip(words, words[1:]))


# --- credential shapes in free text ------------------------------------------------------

#: ``token`` not after a tokenizer's special-token word (``pad token: 50256``, ``eos_token=2``)
_TOKEN = r"(?<!(?:pad|eos|bos|unk|sep|cls)[ _-])(?<!mask[ _-])token"
#: an auth scheme's credential (8+ characters, a digit, a capital or a base64 sign among
#: them), not the word after "basic" or "token" in prose ("token embeddings")
_CREDENTIAL = r"(?=[A-Za-z0-9._~+/=-]*[0-9A-Z+/=])[A-Za-z0-9._~+/=-]{8,}"
#: the prefixed tokens of hubs and chat apps hold a digit: ``hf_raise_for_status`` does not
_PREFIXED = r"(?=[A-Za-z_-]*[0-9])"

#: credential-shaped parts of any string: (pattern, replacement)
_SCRUB = [
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)",
                re.DOTALL), REDACTED),
    (re.compile(r"\b(?i:(Bearer))(\s+)[A-Za-z0-9._~+/=-]{8,}"), rf"\1\2{REDACTED}"),
    (re.compile(rf"\b((?i:Basic|Digest|Token))(\s+){_CREDENTIAL}"), rf"\1\2{REDACTED}"),
    # scheme://user:password@host
    (re.compile(r"\b([a-z][a-z0-9+.-]*://[^/\s:@'\"]*):[^/\s@'\"]+@", re.IGNORECASE),
     rf"\1:{REDACTED}@"),
    # password=..., "api_key": "...", token: ..., secret ...=... in query strings, reprs, JSON
    # (after an auth scheme if any; a value already redacted is left as it is)
    (re.compile(rf"""((?<![A-Za-z0-9])(?:pass(?:word|wd|phrase)?|pwd|secret|{_TOKEN}|"""
                r"""api[-_]?key|access[-_]?key|private[-_]?key|client[-_]?secret|"""
                r"""auth(?:orization)?)(?:\\?['"])?\s*[:=]\s*+(?:\\?['"])?+"""
                r"""(?:(?:Bearer|Basic|Digest|Token)\s+)?+)"""
                r"""(?!\[REDACTED\])(?:[^\s'",;&}\])\\]|\\(?!['"]))+""", re.IGNORECASE), rf"\1{REDACTED}"),
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(rf"\b(?:gh[pousr]_|github_pat_|hf_|sk_|sk-|xox[abpr][_-]){_PREFIXED}"
                r"[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
]
#: the cheap test before the scrubbing regexes: each of them needs one of these words (in
#: lower case), and most strings hold none. Substring tests of the lowered text took ~2 us
#: on a 50-character log line, the case-insensitive regex of them they replace ~12 us
_MAYBE_WORDS = ("key", "token", "pass", "secret", "auth", "bearer", "basic", "digest", "pwd",
                "://", "akia", "asia", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat",
                "hf_", "sk_", "sk-", "xox", "eyj")


def _may_hold_credential(text: str) -> bool:
    lowered = text.lower()
    for word in _MAYBE_WORDS:  # a loop, not any(): no generator for the common miss
        if word in lowered:
            return True
    return False


def scrub(text: str) -> str:
    """``text`` with every secret environment value and every credential-shaped part
    replaced by ``[REDACTED]``."""
    text = mask_secrets(text)
    if not _may_hold_credential(text):
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
    if isinstance(value, list):
        return [redact_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact_value(v) for v in value)
    return value


def redact_mapping(fields: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of ``fields`` with denied keys redacted, every value walked and scrubbed, and
    secret values masked in string keys too."""
    return {mask_secrets(k) if isinstance(k, str) else k:
            REDACTED if is_denied_key(str(k)) else redact_value(v) for k, v in fields.items()}
