"""Bounded categories for why dynamo compiled (guard failures) and why it broke a graph.

Metric attributes must come from a small fixed set; the verbatim text goes on spans only.
Guard failure text is what ``get_and_maybe_log_recompilation_reasons`` returns (the first
failing guard of the most recent cache entry, prefixed with its compile id), e.g.
``"0/0: tensor 'x' size mismatch at index 0. expected 2, actual 3"`` (C++ tensor guards) or
``"2/0: n == 0  # def f(x, n): ..."`` (Python guard code).
"""

from __future__ import annotations

import re

from otel_train import semconv

#: (pattern, category), first match wins: the C++ tensor guard messages, then guard code.
_GUARD_CATEGORIES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), category) for pattern, category in (
        (r"recompile.?limit|cache.?size.?limit", semconv.COMPILE_REASON_RECOMPILE_LIMIT),
        (r"size mismatch", semconv.COMPILE_REASON_TENSOR_SHAPE),
        (r"stride mismatch", semconv.COMPILE_REASON_TENSOR_STRIDE),
        (r"rank mismatch|ndim|dim\(\)", semconv.COMPILE_REASON_TENSOR_RANK),
        (r"dtype mismatch", semconv.COMPILE_REASON_TENSOR_DTYPE),
        (r"device (index )?mismatch|device index", semconv.COMPILE_REASON_TENSOR_DEVICE),
        (r"requires_grad mismatch", semconv.COMPILE_REASON_REQUIRES_GRAD),
        (r"dispatch key set mismatch", semconv.COMPILE_REASON_DISPATCH_KEY),
        (r"GLOBAL_STATE|grad_mode|autocast|DEFAULT_DEVICE|TORCH_FUNCTION_MODE",
         semconv.COMPILE_REASON_GLOBAL_STATE),
        (r"___check_obj_id|ID_MATCH|___check_current_backend|is not id",
         semconv.COMPILE_REASON_OBJECT_IDENTITY),
        (r"___check_type_id|TYPE_MATCH|expected type", semconv.COMPILE_REASON_TYPE),
        (r"\blen\(|length mismatch", semconv.COMPILE_REASON_LENGTH),
        (r"\.size\(\)|\.stride\(\)|\bs\d+\b|Ne\(|Eq\(", semconv.COMPILE_REASON_DYNAMIC_SHAPE),
        (r"Unable to find recompilation reasons", semconv.COMPILE_REASON_UNKNOWN),
        (r"==|!=|\bis None\b|\bis not None\b|EQUALS_MATCH|hasattr",
         semconv.COMPILE_REASON_VALUE),
    )
)


def recompile_category(guard_failure: str | None) -> str:
    """The bounded category of one guard failure (``other`` when nothing matches)."""
    if not guard_failure:
        return semconv.COMPILE_REASON_UNKNOWN
    text = _strip_compile_id(guard_failure.split("\n", 1)[0])
    text = re.sub(r"\s+#\s.*$", "", text)  # the guard's source line comment, not the guard
    for pattern, category in _GUARD_CATEGORIES:
        if pattern.search(text):
            return category
    return semconv.COMPILE_REASON_OTHER


def _strip_compile_id(text: str) -> str:
    return re.sub(r"^\s*\[?[!\d/_]+\]?:\s*", "", text)


class GraphBreakReasons:
    """Maps graph break messages to a bounded label: the message's first line (the
    ``gb_type`` of torch's graph-break registry since 2.7; free text before), capped in
    length and in number of distinct labels per run, the rest becoming ``other``."""

    def __init__(self, max_labels: int = 32, max_len: int = 120) -> None:
        self.max_labels = max_labels
        self.max_len = max_len
        self._labels: set[str] = set()

    def label(self, message: str) -> str:
        first = message.strip().split("\n", 1)[0].strip()[: self.max_len] or "unknown"
        if first in self._labels:
            return first
        if len(self._labels) >= self.max_labels:
            return semconv.COMPILE_REASON_OTHER
        self._labels.add(first)
        return first
