"""Nothing secret leaves, and nothing ordinary is hidden (issue 16, item 6; otel_train/redact.py).

- A property-based test plants secrets in random nested structures (under credential keys at
  any depth, and inside credential-shaped strings) and finds none in what redaction returns.
- Ordinary training field names (``tokens_per_s``, ``num_tokens``, ``tokenizer``, ``author``,
  ``num_passes``, ...) survive, keys and values.
- End to end, a real run whose log fields, exception texts and failing ``with`` block carry
  secrets: every exported byte is scanned.
"""

from __future__ import annotations

import json
import logging
import string

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import otlp_files, training

import otel_train
from otel_train import redact

CREDENTIAL_KEYS = ["password", "db_password", "apiKey", "X-Auth-Token", "hf_token",
                   "client_secret", "session_id", "Authorization", "aws_secret_access_key",
                   "privateKey", "cookie", "db_pass"]
ML_KEYS = ["tokens_per_s", "num_tokens", "tokenizer", "author", "num_passes", "token_count",
           "pass_at_k", "max_tokens", "learning_rate", "tokens", "passes", "key_count",
           "authors", "tokenized_len", "step_time_s", "world_size"]
SHAPES = ["password={s}", "Bearer {s}", "https://user:{s}@host:5432/db", "'api_key': '{s}'",
          'token: "{s}"', "postgres://admin:{s}@db/x", "pwd={s}&user=x", "Basic {s}",
          "-----BEGIN RSA PRIVATE KEY-----\n{s}\n-----END RSA PRIVATE KEY-----"]

secrets_ = st.text(string.ascii_letters + string.digits, min_size=12, max_size=24).map(
    lambda s: "Zq" + s)  # never a word of the surrounding text
plain = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(),
                  st.text(string.ascii_letters + " _-.,", max_size=20))


@st.composite
def planted(draw: st.DrawFn) -> tuple[object, list[str]]:
    """A random nested structure and the secrets planted in it."""
    planted_secrets: list[str] = []

    def secret_leaf() -> object:
        s = draw(secrets_)
        planted_secrets.append(s)
        return draw(st.sampled_from(SHAPES)).format(s=s)

    def node(depth: int) -> object:
        kind = draw(st.integers(0, 3 if depth < 3 else 1))
        if kind == 0:
            return draw(plain)
        if kind == 1:
            return (secret_leaf() if draw(st.booleans())
                    else f"{draw(plain)} {secret_leaf()} {draw(plain)}")
        if kind == 2:
            return [node(depth + 1) for _ in range(draw(st.integers(0, 3)))]
        out: dict[str, object] = {}
        for _ in range(draw(st.integers(0, 4))):
            if draw(st.booleans()):
                s = draw(secrets_)
                planted_secrets.append(s)
                out[draw(st.sampled_from(CREDENTIAL_KEYS))] = s
            else:
                out[draw(st.sampled_from(ML_KEYS))] = node(depth + 1)
        return out

    return node(0), planted_secrets


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(planted())
def test_no_planted_secret_survives_redaction(case: tuple[object, list[str]]) -> None:
    value, planted_secrets = case
    out = json.dumps(redact.redact_value(value), default=repr)
    for s in planted_secrets:
        assert s not in out


def test_ordinary_training_fields_survive() -> None:
    fields = {k: 1234 for k in ML_KEYS}
    assert redact.redact_mapping(fields) == fields
    for text in ("tokens_per_s=1234.5 num_tokens=8192", "tokenizer=gpt2 author=jane",
                 "num_passes=3 pass_at_k=0.42", "loss=0.5 lr=3e-4 https://host/v1/models"):
        assert redact.scrub(text) == text


@pytest.mark.parametrize("key", CREDENTIAL_KEYS)
def test_credential_keys_are_denied_at_any_depth(key: str) -> None:
    out = redact.redact_mapping({"outer": [{"inner": {key: "hunter2hunter2"}}]})
    assert out == {"outer": [{"inner": {key: redact.REDACTED}}]}


def test_nothing_secret_in_any_exported_byte(tmp_path) -> None:
    s = {name: f"Zq{name}SeCrEt{i}x7" for i, name in enumerate(
        ("nested", "message", "exception", "status", "structlog"))}
    model, opt, loader = training.setup(batches=2)
    with pytest.raises(RuntimeError):
        with otel_train.instrument(model, output_dir=tmp_path):
            training.train(model, opt, loader)
            structlog.get_logger("app").warning(
                "connecting", db={"host": "db", "password": s["nested"]},
                retries=[{"token": s["structlog"]}], tokens_per_s=1234.5, tokenizer="gpt2")
            logging.getLogger("app").warning("dsn postgres://admin:%s@db:5432/x", s["message"])
            try:
                raise ConnectionError(f"refused: https://u:{s['exception']}@host/")
            except ConnectionError:
                logging.getLogger("app").exception("could not connect")
            raise RuntimeError(f"giving up on password={s['status']}")
    run_dir = otlp_files.only_run_dir(tmp_path)
    exported = b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())
    for secret in s.values():
        assert secret.encode() not in exported, secret
    records = otlp_files.logs(run_dir)
    connecting = next(r for r in records if r["body"]["stringValue"] == "connecting")
    assert connecting["attrs"]["tokens_per_s"] == 1234.5  # ordinary fields intact
    assert connecting["attrs"]["tokenizer"] == "gpt2"
    run = next(sp for sp in otlp_files.spans(run_dir) if sp["name"] == "train.run")
    assert "giving up on password=[REDACTED]" in json.dumps(run)  # scrubbed, not dropped
