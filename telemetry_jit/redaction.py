"""The secrets the user configured (OTLP header values, credentials in an endpoint), hidden from every text the
product says or writes: a collector echoes a token in its own words ("invalid credentials: sk-..."), without the
"Bearer " of the header, cut short, or inside a longer line, so any stretch of one long enough to be worth
guessing is replaced, not only the whole value.

Process-wide: the secrets are registered where settings resolve (``exporters.otlp_settings``) and never forgotten
(a warning said late, after the run, still hides them)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

# a stretch this long of a secret is hidden wherever it appears; a shorter one only as the whole value
STRETCH = 8
# texts shorter than this are no credential (a tenant id "1", a flag "on"); replaced everywhere they would make an
# error unreadable ("127.0.0.1" as "***27.0.0.***") and hide nothing
SHORTEST_SECRET = 3
MASK = "***"

_lock = threading.Lock()
# every STRETCH-character piece of the secrets registered. A shorter secret is hidden only in the texts of what
# it configures (``OTLPSettings.scrub``): replaced in every warning, "jit" would read "telemetry-***"
_grams: set[str] = set()


def register(secrets: Iterable[str]) -> None:
    """Hide every stretch of :data:`STRETCH` characters or more of ``secrets`` from now on, in every text."""
    with _lock:
        for secret in secrets:
            add_secret(secret, set(), _grams)


def add_secret(secret: str, whole: set[str], grams: set[str]) -> None:
    """Put ``secret`` into ``whole`` (short ones) or its pieces into ``grams``."""
    if len(secret) >= STRETCH:
        grams.update(secret[i : i + STRETCH] for i in range(len(secret) - STRETCH + 1))
    elif len(secret) >= SHORTEST_SECRET:
        whole.add(secret)


def scrub(text: str) -> str:
    """``text`` with every stretch of :data:`STRETCH` characters or more of a registered secret replaced by
    ``***``."""
    with _lock:
        grams = frozenset(_grams)
    return scrub_with(text, (), grams)


def scrub_with(text: str, whole: Iterable[str], grams: frozenset[str] | set[str]) -> str:
    if not text or not (whole or grams):
        return text
    if grams and len(text) >= STRETCH:
        # the characters some piece of a secret covers, each run of them replaced once: a stretch of any length
        # (a prefix, the middle, the whole token) is a chain of overlapping pieces
        covered_to = -1  # where the run being replaced ends
        parts: list[str] = []
        kept_from = 0
        for i in range(len(text) - STRETCH + 1):
            if text[i : i + STRETCH] in grams:
                if i > covered_to:  # a new run starts here (one that touches the last extends it)
                    parts.append(text[kept_from:i])
                    parts.append(MASK)
                covered_to = kept_from = i + STRETCH
        if parts:
            parts.append(text[kept_from:])
            text = "".join(parts)
    for secret in sorted(whole, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
