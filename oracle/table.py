"""The oracle's table: model by fact, agree or not, and each disagreement in words; known disagreements (what
issue 54 lists and the product does not fix yet) are marked xfail with their reason, never hidden."""

from __future__ import annotations

import re
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from oracle.judge import Fact

# (fact, a pattern of the product's words or the detail) -> why it is known; only the full zoo's table uses these.
# Empty: every item of issue 54 the oracle judges is fixed. A disagreement found later and not fixed at once goes
# here with the issue that names it, never silently.
KNOWN: list[tuple[str, str, str]] = []


def known(fact: Fact) -> str:
    """Why this disagreement is known (issue 54's items), or '' for a new one."""
    if fact.agree is not False:
        return ""
    words = f"{fact.product} {fact.detail}"
    for name, pattern, reason in KNOWN:
        if name == fact.fact and re.search(pattern, words):
            return reason
    return ""


_PLACES = [(str(Path(__file__).resolve().parent.parent) + "/", ""), (sysconfig.get_paths()["purelib"] + "/", "")]


def _plain(text: str) -> str:
    """Paths of this machine said as a reader's: relative to the repository, or to site-packages."""
    for place, said in _PLACES:
        text = text.replace(place, said)
    return text.replace("\n", " ")


def mark(fact: Fact, use_known: bool) -> str:
    if fact.agree is None:
        return "–"
    if fact.agree:
        return "✓"
    return "xfail" if use_known and known(fact) else "✗"


def table(facts: Sequence[Fact], use_known: bool = True) -> str:
    """A Markdown table, one row per model, one column per fact, then every disagreement."""
    models = list(dict.fromkeys(fact.model for fact in facts))
    names = list(dict.fromkeys(fact.fact for fact in facts))
    cells = {(fact.model, fact.fact): mark(fact, use_known) for fact in facts}
    lines = ["| model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {model} | " + " | ".join(cells.get((model, name), "") for name in names) + " |" for model in models]
    new = [fact for fact in facts if fact.agree is False and not (use_known and known(fact))]
    if new:
        lines += ["", "Disagreements (telemetry-jit's statement, then torch's record):", ""]
        lines += [
            f"- **{fact.model}**, {fact.fact}: says `{fact.product}`; torch: `{fact.torch}`. {fact.detail}".rstrip()
            for fact in new
        ]
    by_reason: dict[str, list[Fact]] = {}
    for fact in facts:
        if use_known and fact.agree is False and known(fact):
            by_reason.setdefault(known(fact), []).append(fact)
    if by_reason:
        lines += [
            "",
            "Known disagreements (xfail), by the item of issue 54 that names them, with one example each:",
            "",
        ]
        for reason, found in by_reason.items():
            example = found[0]
            models = ", ".join(dict.fromkeys(f.model for f in found))
            lines.append(
                f"- {reason}: {len(found)} facts ({models}). E.g. **{example.model}**, {example.fact}: says "
                f"`{example.product}`; torch: `{example.torch}`. {example.detail}".rstrip()
            )
    return "\n".join(_plain(line) for line in lines)
