"""Reading the product's words as a user reads them: the terminal wraps long lines, the meaning does not
depend on where a line breaks."""

from __future__ import annotations


def flat(text: str) -> str:
    """``text`` with every run of whitespace (line breaks and the wrap's indentation) as one space."""
    return " ".join(text.split())
