"""Whose code a graph break is in, what torch says of it and what to do, and torch's errors in a line: shared by
the recording and the analysis of files."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from telemetry_jit.terminal import shown

# torch's note that it restarts a trace at a graph break it cannot resume from: not a break of its own (torch
# counts the break it wraps once in counters["graph_break"], never this note)
RESTART_NOTE = "Encountered graph break that we cannot resume from"


def is_restart_note(reason: str) -> bool:
    return reason.lstrip().startswith(RESTART_NOTE)


Owner = str  # "user", "torch", "lightning", "python", or another installed package's name

_PACKAGE_DIRS = re.compile(r"^(.*[/\\](?:site|dist)-packages)[/\\]([^/\\]+)")
_STDLIB = re.compile(r"[/\\]lib[/\\]python3\.\d+[/\\]")
_LIGHTNING = frozenset(("lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities"))
_TORCH = frozenset(("torch", "functorch", "torchgen"))


_OWN = re.compile(r"[/\\]telemetry_jit[/\\]")
# a torch run in place from its source tree: its packages and modules, each a whole path component (a user's
# mylib/backends/torch/utils.py is theirs)
_TORCH_SOURCE = re.compile(
    r"[/\\]torch[/\\](?:(?:_dynamo|_inductor|_functorch|nn|distributed|utils|autograd|fx)[/\\]|(?:_tensor|_ops)\.py$)"
)
# code with no file: exec'd or typed (<string>, <stdin>, a notebook's cell) is the user's; these are not
_NOT_USERS_CODE = (("<frozen", "python"), ("<eval_with_key", "torch"))  # the import system; torch.fx's generated code


def owner_of(location: str) -> Owner:
    """Whose code ``location`` (``file:line``) is: ``"user"`` unless in an installed package (``torch``,
    ``lightning``, or its name) or the standard library (``"python"``); code of no file is the user's."""
    path = location.rpartition(":")[0] if location.rpartition(":")[2].isdigit() else location
    if not path:
        return "unknown"
    if path.startswith("<"):
        return next((owner for prefix, owner in _NOT_USERS_CODE if path.startswith(prefix)), "user")
    package = _PACKAGE_DIRS.search(path)
    if package is not None:
        name = package.group(2).removesuffix(".py")
        if name in _TORCH or name in _LIGHTNING:
            return "torch" if name in _TORCH else "lightning"
        return "user" if installed_from_the_users_own(package.group(1), name) else name
    if _STDLIB.search(path):
        return "python"
    if _OWN.search(path):
        return "telemetry-jit"  # its in-place compile and first-call watch, where installed editable
    return "torch" if _TORCH_SOURCE.search(path) else "user"  # a torch built from source runs in place


@functools.lru_cache(maxsize=256)
def installed_from_the_users_own(site_packages: str, name: str) -> bool:
    """Whether the package ``name`` in ``site_packages`` was installed from the user's own source: its
    distribution's PEP 610 record (``direct_url.json``) names a local directory (``pip install .``), or a file
    under the project (the working directory: a wheel built there). One from an index has no such record."""
    found = _direct_url(Path(site_packages), name)
    if found is None or not found.get("url", "").startswith("file:"):
        return False
    if "dir_info" in found:
        return True
    where = Path(unquote(urlparse(found["url"]).path)).resolve()
    return where.is_relative_to(Path(os.getcwd()).resolve())


def _direct_url(site_packages: Path, name: str) -> dict[str, str] | None:
    """The ``direct_url.json`` of the distribution in ``site_packages`` that installed the top-level ``name``."""
    try:
        infos = sorted(entry for entry in os.listdir(site_packages) if entry.endswith(".dist-info"))
    except OSError:
        return None
    wanted = name.lower().replace("-", "_")
    # the distribution named as its package first (the usual case), then any whose files hold it
    infos.sort(key=lambda info: info.partition("-")[0].lower().replace(".", "_") != wanted)
    for info in infos:
        folder = site_packages / info
        if info.partition("-")[0].lower().replace(".", "_") != wanted and not _holds(folder, name):
            continue
        try:
            found = json.loads((folder / "direct_url.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # installed from an index (no record), or a record that says nothing
        return found if isinstance(found, dict) else None
    return None


def _holds(dist_info: Path, name: str) -> bool:
    """Whether the distribution of ``dist_info`` installed the top-level package or module ``name``."""
    try:
        with open(dist_info / "RECORD", encoding="utf-8") as record:
            return any(line.startswith((f"{name}/", f"{name}.py,")) for line in record)
    except OSError:
        return False


def recompile_owner(frame: str, location: str) -> Owner:
    """Whose code a recompile's fix would change: a library's ``forward`` the user compiled is changed from outside,
    as the user's code is; another library function (``self.log``) cannot be edited."""
    return "user" if frame == "forward" else owner_of(location)


def user_location(stack: tuple[str, ...] | list[str]) -> str:
    """The innermost frame of ``stack`` (outermost first) in the user's code: the line that led there."""
    return next((frame for frame in reversed(stack) if owner_of(frame) == "user"), "")


@dataclass(frozen=True)
class BreakText:
    """What torch says of a graph break, parsed from its reason (torch >= 2.7 writes it in this shape)."""

    type: str  # torch's graph-break type: the reason's first line
    explanation: str
    hints: tuple[str, ...]
    doc_url: str  # "" where this torch gives none


_URL = re.compile(r"https?://\S+?/gb/gb\d+\.html")


def parse_break(reason: str) -> BreakText:
    lines = [line.strip() for line in reason.strip().splitlines()]
    explanation = next(
        (line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation")), ""
    )
    hints = tuple(line.removeprefix("Hint:").strip() for line in lines if line.startswith("Hint:"))
    url = _URL.search(reason)
    return BreakText(lines[0] if lines else "", explanation, hints, url.group(0) if url else "")


_GENERIC_HINTS = ("Please report an issue to PyTorch.",)


def break_fix(owner: Owner, text: BreakText, user_lines: Sequence[str] = ()) -> str:
    """What to do about a graph break: torch's hint in the user's code; in a package's, the user's lines to change."""
    hint = next((hint for hint in text.hints if hint not in _GENERIC_HINTS), "")
    if owner == "user":
        return hint or "change this line so that torch.compile can trace it (see torch's explanation)"
    named = ", ".join(shown(line) for line in user_lines)
    line = (
        f"how your lines {named} call it"
        if len(user_lines) > 1
        else f"how your line {named} calls it"
        if user_lines
        else "how your code calls it"
    )
    advice = f"{owner}'s code cannot be edited: change {line}, or keep that call out of the compiled module"
    return advice + (f"; torch's hint: {hint}" if hint else "")


# -- torch's error text, said in a line ------------------------------------------------------------
_TRACED_FRAMES = re.compile(r"\nfrom user code:\n(?P<frames>(?:[ \t]+[^\n]*\n?)+)")
_TRACED_FRAME = re.compile(
    r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>[^\n]+)\n[ \t]*(?P<code>[^\n]*)'
)
_WHERE = re.compile(r" \((?P<where>at [^()\n]+)\)\s*$")  # what telemetry-jit adds: " (at train step 0)"


def gist(message: str, limit: int = 400) -> str:
    """An error's first paragraph on one line (at most ``limit`` characters) and where torch says it was raised
    (the innermost ``from user code:`` frame, and the user's line that reached it): ``Unsupported: ... (at
    model.py:15 in forward: `x.item()`)``."""
    found = _WHERE.search(message)
    body = message[: found.start()] if found else message
    head = " ".join(body.strip().split("\n\n", 1)[0].split())
    if len(head) > limit:
        head = head[: limit - 3] + "..."
    traced = _TRACED_FRAMES.search(body)
    frames = [_frame_words(frame) for frame in _TRACED_FRAME.finditer(traced["frames"])] if traced else []
    places = []
    if frames:
        (location, words), users = frames[-1], [words for where, words in frames if owner_of(where) == "user"]
        reached = f", reached from your line {users[-1]}" if owner_of(location) != "user" and users else ""
        places.append(f"at {words}{reached}")
    if found:
        places.append(found["where"])
    return f"{head} ({'; '.join(places)})" if places else head


def _frame_words(frame: re.Match[str]) -> tuple[str, str]:
    location = f"{frame['path']}:{frame['line']}"
    code = " ".join(frame["code"].split())
    words = f"{shown(location)} in {frame['function']}"
    return location, f"{words}: `{code}`" if code else words
