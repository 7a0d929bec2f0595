"""Reading the product's words as a user reads them: the terminal wraps long lines, the meaning does not
depend on where a line breaks."""

from __future__ import annotations

import re


def flat(text: str) -> str:
    """``text`` with every run of whitespace (line breaks and the wrap's indentation) as one space."""
    return " ".join(text.split())


def short_paths(text: str) -> str:
    """``text`` with each whole path in a location cut to its last two parts, as ``diff`` and ``check`` compare
    frames (``forward (/tmp/x/e2e/test_truth.py:556)`` reads ``forward (e2e/test_truth.py:556)``): for tests that
    name a frame by the key the product compares it by, wherever the command ran."""
    return re.sub(r"(?<=[(\s])/\S*/([^/\s()]+/[^/\s()]+:\d+)", r"\1", text)
