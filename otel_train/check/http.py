"""The JSON envelope Prometheus and Loki share: ``{"status": "success", "data": ...}``."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any


def api_data(base: str, path: str, params: dict[str, str], timeout_s: float,
             backend: str) -> Any:
    """GET ``base + path`` with ``params``; its ``data``, or OSError naming ``backend``."""
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise OSError(f"{backend} {path}: {body.get('error', body)}")
    return body["data"]
