"""Text that reaches a terminal: what torch, a file or user code hands over may hold escape sequences."""

from __future__ import annotations

import os
import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def clean(text: str) -> str:
    """``text`` with control characters (also those that reorder text) shown as ``?``; line breaks and tabs kept."""
    return _CONTROL.sub("?", text)


def short(location: str, keep: int = 2) -> str:
    """``file:line`` with the last ``keep`` parts of the path: what tables and messages show."""
    path, _, line = location.rpartition(":")
    parts = path.replace("\\", "/").split("/")
    return ("/".join(parts[-keep:]) + f":{line}") if path else location


def shown(location: str) -> str:
    """``file:line`` as compilers print it: relative to the working directory where under it, else as recorded."""
    path, _, line = location.rpartition(":")
    if not path or not line.isdigit() or not os.path.isabs(path):
        return location
    try:
        relative = os.path.relpath(path, os.getcwd())
    except (ValueError, OSError):  # another drive (Windows), or no working directory any more
        return location
    return location if relative.startswith(os.pardir) else f"{relative}:{line}"


def frame_label(frame: object, location: object) -> str:
    """``frame (file:line)`` as tables and comparisons name it (:func:`short`: another checkout's paths differ)."""
    return f"{frame or '?'} ({short(str(location or ''))})"


def frame_shown(frame: object, location: object) -> str:
    """``frame (file:line)`` as the user reads it: the location opens where the command runs (:func:`shown`)."""
    return f"{frame or '?'} ({shown(str(location or ''))})"


def error_text(error: BaseException) -> str:
    """``Type: message``, or the type alone for an exception that says nothing (Ctrl-C, a bare ``assert``)."""
    said = str(error)
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


def counted(count: int, noun: str) -> str:
    """``1 graph break``, ``3 graph breaks``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def possessive(words: str) -> str:
    """``the training loop's``, ``the 3 training loops'``."""
    return f"{words}'" if words.endswith("s") else f"{words}'s"


def rank_list(ranks: list[int] | tuple[int, ...], shown: int = 8) -> str:
    """``rank 3``, or ``ranks 1, 2, 5`` and, past ``shown`` of them, ``and N more``."""
    listed = ", ".join(map(str, ranks[:shown]))
    more = f" and {len(ranks) - shown} more" if len(ranks) > shown else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}{more}"
