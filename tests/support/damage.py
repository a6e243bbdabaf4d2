"""Damaging a run directory's files on purpose, as a disk, a killed writer or a careless edit
would: the readers must name what they could not read (file and line) and read the rest.

Each helper changes one file in place and returns the number of the line it damaged.
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def append_random_bytes(path: Path, size: int = 300, seed: int = 5) -> int:
    """Bytes that are not UTF-8 after the last line (no newline in them): one damaged line."""
    rng = random.Random(seed)
    noise = bytes(rng.choice([*range(0x80, 0x100)]) for _ in range(size))
    count = len(lines_of(path))
    with open(path, "ab") as out:
        out.write(noise)
    return count + 1


def tear_line(path: Path, number: int) -> int:
    """Line ``number`` cut in the middle, its newline kept: the lines after it are whole."""
    lines = lines_of(path)
    lines[number - 1] = lines[number - 1][:len(lines[number - 1]) // 2] + b"\n"
    path.write_bytes(b"".join(lines))
    return number


def truncate_in_last_line(path: Path) -> int:
    """The file cut in the middle of its last line, as a writer killed mid-write leaves it."""
    lines = lines_of(path)
    lines[-1] = lines[-1][:len(lines[-1]) // 2]
    path.write_bytes(b"".join(lines))
    return len(lines)


def retype_first(path: Path, key: str, value: object) -> int:
    """The first ``"key": ...`` of the file set to ``value`` (e.g. a string where OTLP JSON has
    a number), the line still valid JSON; the number of the line changed."""
    lines = lines_of(path)
    for number, line in enumerate(lines, 1):
        request = json.loads(line)
        if _retype(request, key, value):
            lines[number - 1] = json.dumps(request, separators=(",", ":")).encode() + b"\n"
            path.write_bytes(b"".join(lines))
            return number
    raise AssertionError(f"no {key!r} in {path}")


def retype_attribute(path: Path, attribute: str, value: object) -> int:
    """The ``AnyValue`` of the first attribute ``attribute`` of the file (a span's, a
    record's or a point's) replaced by ``{"intValue": value}``."""
    lines = lines_of(path)
    for number, line in enumerate(lines, 1):
        request = json.loads(line)
        if _retype_attribute(request, attribute, value):
            lines[number - 1] = json.dumps(request, separators=(",", ":")).encode() + b"\n"
            path.write_bytes(b"".join(lines))
            return number
    raise AssertionError(f"no attribute {attribute!r} in {path}")


def _retype(node: object, key: str, value: object) -> bool:
    if isinstance(node, dict):
        if key in node:
            node[key] = value
            return True
        return any(_retype(v, key, value) for v in node.values())
    if isinstance(node, list):
        return any(_retype(v, key, value) for v in node)
    return False


def _retype_attribute(node: object, attribute: str, value: object) -> bool:
    if isinstance(node, dict):
        if node.get("key") == attribute and "value" in node:
            node["value"] = {"intValue": value}
            return True
        return any(_retype_attribute(v, attribute, value) for v in node.values())
    if isinstance(node, list):
        return any(_retype_attribute(v, attribute, value) for v in node)
    return False
