"""GET and JSON for the live backends, each failure an OSError that names the backend and the
URL it was given; and the JSON envelope Prometheus and Loki share
(``{"status": "success", "data": ...}``)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def get_json(base: str, path: str, query: str, timeout_s: float, backend: str) -> Any:
    """The JSON ``base + path`` (``?query`` where not empty) answers; OSError naming
    ``backend`` and ``base`` where it is unreachable, slow, refuses, or answers no JSON."""
    url = f"{base}{path}" + (f"?{query}" if query else "")
    where = f"{backend} at {base}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as err:
        raise OSError(f"{where} answered HTTP {err.code} to {path}{_error_of(err)}") from err
    except urllib.error.URLError as err:
        raise OSError(f"{where} is unreachable: {err.reason}") from err
    except TimeoutError as err:
        raise OSError(f"{where} did not answer {path} within {timeout_s:g} s") from err
    except (OSError, http.client.HTTPException) as err:
        raise OSError(f"{where} failed on {path}: {err!r}") from err
    except ValueError as err:  # urllib's "unknown url type" and the like
        raise OSError(f"{where}: {err} (give its base URL, http://host:port)") from err
    try:
        return json.loads(body)
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise OSError(f"{where} answered {path} with something that is not JSON (is it "
                      f"{backend}'s HTTP API?)") from err


def _error_of(err: urllib.error.HTTPError) -> str:
    """``: <the error>`` of an HTTP error's body: the ``error`` of Prometheus's or Jaeger's
    JSON, else its first line of text (Loki answers text)."""
    try:
        text = err.read(4096).decode("utf-8", errors="replace")
    except (OSError, http.client.HTTPException):
        return ""
    try:
        body = json.loads(text)
    except ValueError:
        error: Any = text.strip().split("\n")[0][:200]
    else:
        error = (body.get("error") or body.get("errors")) if isinstance(body, dict) else None
    return f": {error}" if error else ""


def api_data(base: str, path: str, params: dict[str, str], timeout_s: float,
             backend: str) -> Any:
    """GET ``base + path`` with ``params``; its ``data``, or OSError naming ``backend``."""
    body = get_json(base, path, urllib.parse.urlencode(params), timeout_s, backend)
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error", body) if isinstance(body, dict) else body
        raise OSError(f"{backend} at {base}: {path}: {error}")
    return body["data"]
