"""Nothing secret leaves, and nothing ordinary is hidden (issue 16, item 6; otel_train/redact.py).

- A property-based test plants secrets in random nested structures (under credential keys at
  any depth, and inside credential-shaped strings) and finds none in what redaction returns.
- The values of secret environment variables are masked wherever they appear, as CI systems
  mask theirs; short values are not.
- Ordinary training field names (``tokens_per_s``, ``num_tokens``, ``tokenizer``, ``author``,
  ``num_passes``, ...) survive, keys and values, and so do a tokenizer's special tokens
  (``pad_token``, ``eos_token_id``, "pad token: 50256").
- End to end, a real run whose log fields, exception texts and failing ``with`` block carry
  secrets: every exported byte is scanned; and a property-based run of random log calls,
  nested fields and exceptions carrying planted secret values and credential shapes, every
  exported byte scanned again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import string
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
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


# --- secret values, from the environment -------------------------------------------------

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HF_SECRET = "ZqHubReadTokenValue4242"


@pytest.fixture
def env_secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A fake environment's secret variables, read as a run's start reads them; the real
    environment's read back afterwards."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("HF_TOKEN", HF_SECRET)
    redact.load_env_secrets()
    yield monkeypatch
    monkeypatch.undo()
    redact.load_env_secrets()


def test_a_secret_env_value_is_masked_in_a_message(env_secrets) -> None:
    assert redact.scrub(f"aws creds: {AWS_SECRET}") == "aws creds: [REDACTED]"


def test_a_secret_env_value_is_masked_in_fields_at_any_depth(env_secrets) -> None:
    out = redact.redact_mapping({"run": [{"note": f"hub {HF_SECRET} ok", "pad_token": HF_SECRET}]})
    assert out == {"run": [{"note": "hub [REDACTED] ok", "pad_token": redact.REDACTED}]}


def test_a_secret_env_value_is_masked_in_a_field_name(env_secrets) -> None:
    assert redact.redact_mapping({HF_SECRET: 1}) == {redact.REDACTED: 1}


def test_env_values_shorter_than_six_characters_are_not_masked(env_secrets) -> None:
    env_secrets.setenv("DEBUG_TOKEN", "12345")
    env_secrets.setenv("FEATURE_SECRET", "true")
    redact.load_env_secrets()
    assert redact.scrub("batch 12345 done: true") == "batch 12345 done: true"


def test_a_secret_that_extends_another_is_masked_whole(env_secrets) -> None:
    env_secrets.setenv("SHORT_TOKEN", HF_SECRET[:10])
    redact.load_env_secrets()
    assert redact.scrub(f"<{HF_SECRET}>") == "<[REDACTED]>"


def test_secret_values_are_read_when_loaded_not_at_each_call(env_secrets) -> None:
    env_secrets.setenv("LATE_API_KEY", "ZqSetAfterTheStart")
    assert redact.scrub("ZqSetAfterTheStart") == "ZqSetAfterTheStart"


def test_a_line_without_secrets_is_returned_as_is(env_secrets) -> None:
    line = "step 120 loss=0.513 lr=3e-4 tokens_per_s=51234.5"
    assert redact.mask_secrets(line) is line


@pytest.mark.parametrize("name", [
    "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY",
    "DB_PASSWORD", "MY_SERVICE_SECRET", "CLIENT_SECRET_VALUE", "SECRET_KEY", "SENTRY_DSN",
    "GPG_PASSPHRASE", "SIGNING_PRIVATE_KEY", "TOKEN"])
def test_secret_env_names_are_recognised(name: str) -> None:
    assert redact.is_secret_env_name(name)


@pytest.mark.parametrize("name", [
    "PWD", "OLDPWD", "PATH", "HOME", "HF_HOME", "WANDB_PROJECT", "AWS_REGION",
    "CUDA_VISIBLE_DEVICES", "TOKENIZERS_PARALLELISM", "PAD_TOKEN", "MAX_TOKENS",
    "SSH_AUTH_SOCK", "DB_PASSWORD_FILE"])
def test_ordinary_env_names_are_not_secret(name: str) -> None:
    assert not redact.is_secret_env_name(name)


# --- tokenizer fields ----------------------------------------------------------------------

TOKENIZER_KEYS = ["pad_token", "eos_token", "bos_token", "unk_token", "sep_token", "cls_token",
                  "mask_token", "pad_token_id", "eos_token_id", "decoder_start_token_id",
                  "padToken"]


@pytest.mark.parametrize("key", TOKENIZER_KEYS)
def test_tokenizer_special_token_fields_are_kept(key: str) -> None:
    assert redact.redact_mapping({key: "<|endoftext|>"}) == {key: "<|endoftext|>"}


@pytest.mark.parametrize("key", ["hf_token", "api_token", "auth_token", "access_token",
                                 "refresh_token", "GITHUB_TOKEN"])
def test_credential_token_fields_are_redacted(key: str) -> None:
    assert redact.redact_mapping({key: "abc123abc123"}) == {key: redact.REDACTED}


@pytest.mark.parametrize("text", ["pad token: 50256", "eos_token=50256 bos_token=1",
                                  "mask token: '[MASK]'", "PAD_TOKEN=0 pad_token_id=0"])
def test_tokenizer_text_is_not_scrubbed(text: str) -> None:
    assert redact.scrub(text) == text


@pytest.mark.parametrize("text", ["hf_token=abc123abc123", "api token: abc123abc123",
                                  "access_token='abc123abc123'"])
def test_credential_token_text_is_scrubbed(text: str) -> None:
    assert "abc123abc123" not in redact.scrub(text)


# --- credential shapes in free text --------------------------------------------------------


def test_a_redacted_nested_value_renders_once() -> None:
    nested = redact.redact_mapping({"db": {"host": "db", "password": "hunter2"}})
    assert redact.scrub(repr(nested["db"])) == "{'host': 'db', 'password': '[REDACTED]'}"


@pytest.mark.parametrize("key", ["sk-proj-4fT9xQ2bLmN8vR1cW7yZ0aKd", "sk-Zq81bE0yNc4TvXo2Lm9PqR7s",
                                 "sk_live_4fT9xQ2bLmN8vR1cW7yZ"])
def test_openai_and_stripe_style_keys_are_scrubbed(key: str) -> None:
    assert redact.scrub(f"client(api_base, {key})") == "client(api_base, [REDACTED])"


def test_an_authorization_header_keeps_its_scheme_and_loses_its_credential() -> None:
    assert (redact.scrub("Authorization: Basic dXNlcjpwYXNz")
            == "Authorization: Basic [REDACTED]")


@pytest.mark.parametrize("text", ["Basic functionality works", "Token embeddings are tied",
                                  "raised in hf_raise_for_status", "sk-learn-compatible-estimator"])
def test_prose_and_identifiers_that_look_like_credentials_are_kept(text: str) -> None:
    assert redact.scrub(text) == text


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(planted())
def test_scrubbing_twice_changes_nothing(case: tuple[object, list[str]]) -> None:
    once = json.dumps(redact.redact_value(case[0]), default=repr)
    assert redact.scrub(once) == once


# --- end to end ----------------------------------------------------------------------------


def test_nothing_secret_in_any_exported_byte(tmp_path) -> None:
    s = {name: f"Zq{name}SeCrEt{i}x7" for i, name in enumerate(
        ("nested", "message", "exception", "status", "structlog"))}
    model, opt, loader = training.setup(batches=2)
    with pytest.raises(RuntimeError):
        with otel_train.instrument(model, output_dir=tmp_path):
            training.train(model, opt, loader)
            structlog.get_logger("app").warning(
                "connecting", db={"host": "db", "password": s["nested"]},
                retries=[{"token": s["structlog"]}], tokens_per_s=1234.5, tokenizer="gpt2",
                pad_token="<|endoftext|>", eos_token_id=50256)
            logging.getLogger("app").warning("pad token: %d", 50256)
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
    assert connecting["attrs"]["pad_token"] == "<|endoftext|>"  # tokenizer fields too
    assert connecting["attrs"]["eos_token_id"] == 50256
    assert connecting["attrs"]["db"] == "{'host': 'db', 'password': '[REDACTED]'}"
    assert any(r["body"]["stringValue"] == "pad token: 50256" for r in records)
    run = next(sp for sp in otlp_files.spans(run_dir) if sp["name"] == "training.run")
    assert "giving up on password=[REDACTED]" in json.dumps(run)  # scrubbed, not dropped


# --- end to end, fuzzed ------------------------------------------------------------------

SECRET_ENV_NAMES = ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY", "GITHUB_TOKEN",
                    "OPENAI_API_KEY", "DB_PASSWORD", "MY_SERVICE_SECRET", "CI_JOB_TOKEN"]
FIELD_KEYS = ML_KEYS + TOKENIZER_KEYS
_ALNUM = string.ascii_letters + string.digits
#: credential shapes in free text and the strategy of the secret part each one holds
_SHAPE_SECRETS = {
    "Bearer {s}": st.text(_ALNUM, min_size=8, max_size=30),
    "password={s}": st.text(_ALNUM + "!#%", min_size=6, max_size=30),
    "https://user:{s}@host:5432/db": st.text(_ALNUM, min_size=6, max_size=30),
    "'api_key': '{s}'": st.text(_ALNUM, min_size=6, max_size=30),
    "ghp_{s}": st.text(_ALNUM, min_size=35, max_size=35).map(lambda s: s + "7"),
    "hf_{s}": st.text(_ALNUM, min_size=33, max_size=33).map(lambda s: s + "4"),
    "sk-proj-{s}": st.text(_ALNUM + "_-", min_size=40, max_size=60).map(lambda s: s + "2"),
    "sk-{s}": st.text(_ALNUM, min_size=47, max_size=47).map(lambda s: s + "9"),
    "AKIA{s}": st.text(string.ascii_uppercase + string.digits, min_size=14, max_size=14),
    "eyJhbGciOiJIUzI1NiJ9.eyJ{s}.c2lnbmF0dXJlc2ln": st.text(_ALNUM, min_size=8, max_size=40),
    "-----BEGIN PRIVATE KEY-----\n{s}\n-----END PRIVATE KEY-----": st.text(
        _ALNUM + "+/", min_size=16, max_size=64),
}
words = st.text(string.ascii_letters + " .,:", max_size=16)


@st.composite
def fuzzed_run(draw: st.DrawFn) -> tuple[dict[str, str], list[tuple[str, Any]], str | None,
                                         list[str]]:
    """Secret environment values, the log calls of a run and the text its ``with`` block
    raises (or None), and every secret planted in them."""
    env = {name: "Zq" + draw(st.text(_ALNUM + "/+", min_size=4, max_size=40))
           for name in draw(st.lists(st.sampled_from(SECRET_ENV_NAMES), min_size=1,
                                     max_size=4, unique=True))}
    planted_secrets = list(env.values())

    def secret_text() -> str:
        """Free text holding a secret value, glued to its words, or a shape, spaced."""
        if draw(st.booleans()):
            return f"{draw(words)}{draw(st.sampled_from(sorted(env.values())))}{draw(words)}"
        shape = draw(st.sampled_from(sorted(_SHAPE_SECRETS)))
        s = "Zq" + draw(_SHAPE_SECRETS[shape]) if not shape.startswith("AKIA") else \
            "ZQ" + draw(_SHAPE_SECRETS[shape])
        planted_secrets.append(s)
        return f"{draw(words)} {shape.format(s=s)} {draw(words)}"

    def node(depth: int) -> Any:
        kind = draw(st.integers(0, 4 if depth < 3 else 2))
        if kind == 0:
            return draw(st.one_of(st.integers(), st.floats(allow_nan=False), words))
        if kind == 1:
            return secret_text()
        if kind == 2:  # a secret under a credential key
            s = "Zq" + draw(st.text(_ALNUM, min_size=6, max_size=20))
            planted_secrets.append(s)
            return {draw(st.sampled_from(CREDENTIAL_KEYS)): s}
        if kind == 3:
            return [node(depth + 1) for _ in range(draw(st.integers(0, 3)))]
        return {draw(st.sampled_from(FIELD_KEYS)): node(depth + 1)
                for _ in range(draw(st.integers(0, 3)))}

    calls = [(draw(st.sampled_from(["stdlib", "stdlib_fields", "structlog", "stdlib_exception",
                                    "structlog_exception", "structlog_exc_info"])),
              (secret_text(), node(0), secret_text() if draw(st.booleans()) else None))
             for _ in range(draw(st.integers(1, 6)))]
    raised = secret_text() if draw(st.booleans()) else None
    return env, calls, raised, planted_secrets


def _log(i: int, kind: str, text: str, fields: Any, cause: str | None) -> None:
    app, slog = logging.getLogger("app"), structlog.get_logger("app")
    if kind == "stdlib":
        app.warning("case %d: %s", i, text, extra={"case": i})
    elif kind == "stdlib_fields":
        app.warning("case %d", i, extra={"case": i, "ctx": fields})
    elif kind == "structlog":
        slog.warning(f"case {i}: {text}", case=i, ctx=fields)
    else:
        try:
            try:
                raise ValueError(cause or "no cause")
            except ValueError as err:
                if cause is None:
                    raise ConnectionError(text) from None
                raise ConnectionError(text) from err
        except ConnectionError as err:
            if kind == "stdlib_exception":
                app.exception("case %d", i, extra={"case": i})
            elif kind == "structlog_exception":
                slog.exception(f"case {i}", case=i, ctx=fields)
            else:
                slog.error(f"case {i}", case=i, exc_info=err)


@pytest.mark.slow  # a run a case, with its exporter process
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fuzzed_run())
def test_no_planted_secret_in_any_exported_byte_of_fuzzed_runs(
        case: tuple[dict[str, str], list[tuple[str, Any]], str | None, list[str]]) -> None:
    env, calls, raised, planted_secrets = case
    model = torch.nn.Linear(2, 2)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        try:
            with contextlib.suppress(RuntimeError):
                with otel_train.instrument(model, output_dir=tmp):
                    for i, (kind, (text, fields, cause)) in enumerate(calls):
                        _log(i, kind, text, fields, cause)
                    if raised is not None:
                        raise RuntimeError(raised)
        finally:
            mp.undo()
            redact.load_env_secrets()  # this process's own environment again
        exported = b"".join(p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file())
        for secret in planted_secrets:
            assert secret.encode() not in exported, secret
        cases = {r["attrs"].get("case") for r in otlp_files.logs(otlp_files.only_run_dir(
            Path(tmp)))}
        assert set(range(len(calls))) <= cases  # every call was exported, scanned
