"""The counterfactual oracle: the product's first fix, applied to the same model in a second run, checked against
torch's record of both runs.

The first fix is read as a user reads it: the first item of the summary's "what to fix first" (``summary --json``:
an unexpected recompile cause, else a graph break), mapped mechanically to a change of the run (``oracle.run``'s
``fix``: a ``mark_dynamic`` on the input torch's reason names, ``drop_last`` on the loader of the cause's stage,
``dynamic=True``, a cast, a ``torch._dynamo.config`` flag a hint names, ``inference_mode=False``). torch's
recompiles of that cause are counted in both runs by their failed guard, frame and stage; ``telemetry-jit diff``'s
figures for the cause must equal that change, and every recompile the second run has anew must be one diff reports.
"""

from __future__ import annotations

import datetime
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.judge import _cause_stage, cli
from oracle.truth import Truth, frame_attempt, read_truth

TRAIN_STAGES = {"train", "training"}
LOOPS = {"train": "train", "validate": "val", "validate()": "val", "sanity_check": "val", "test": "test"}
LOOPS |= {"test()": "test", "predict": "predict", "predict()": "predict"}
_SIZE_MISMATCH = re.compile(r"tensor '(.+?)' size mismatch at index (\d+)")
_SIZE_GUARD = re.compile(r"([\w\[\]']+)\.size\(\)\[(\d+)\]")
_KWARG = re.compile(r"^(?:L\[')?(?:kwargs\[')?(\w+)(?:'\])*$")  # kwargs['input_ids'] is the call's input_ids
_DTYPE = re.compile(r"tensor '([^']+)' dtype mismatch\. expected (\w+), actual (\w+)")
_REFUSED = re.compile(r"You marked \S+ as dynamic but your code specialized it to be a constant \(\d+\)")
_CONFIG = re.compile(r"torch\._dynamo\.config\.(\w+)\s*=\s*(True|False)")


@dataclass
class Fix:
    """What the oracle changes in the second run (``oracle.run``'s ``fix``), or why it cannot."""

    words: str  # the change, as the table says it
    change: dict[str, Any] = field(default_factory=dict)
    not_mechanical: str = ""  # why no change of the run stands for the fix


@dataclass
class FirstFix:
    """The first item of "what to fix first"."""

    kind: str  # "recompile", "graph break", or the summary's key of a module compiled to no effect
    item: dict[str, Any]  # the summary's JSON of it
    fix: Fix

    @property
    def label(self) -> str:
        if "words" in self.item:
            return f"{self.kind}: {self.item['words'][:100]}..."
        if self.kind == "graph break":
            return f"graph break: {self.item['type']} ({Path(self.item['location']).name})"
        return f"{self.item['cause']} in {', '.join(self.item['stages'])}"


def summary_json(out: Path, cwd: Path) -> dict[str, Any]:
    return json.loads(cli("summary", str(out / "run.jsonl"), "--json", cwd=cwd).stdout)["runs"][-1]


def first_fix(summary: dict[str, Any], inputs: set[str]) -> FirstFix | None:
    """The summary's first fix, in the order its text lists them (``analysis.text.fix_first``): modules compiled to
    no effect, compiled code that never ran, unexpected recompile causes by cost, then graph breaks."""
    for key in ("not_compiled", "compiled_code_not_run"):
        if summary.get(key):
            said = summary[key][0]
            words = said if isinstance(said, str) else said.get("module", json.dumps(said))
            return FirstFix(key, {"words": words}, Fix("", not_mechanical="a change of what is compiled or how"))
    causes = summary.get("recompile_causes") or []
    for item in causes:
        if item["count"] > item["expected"]:
            return FirstFix("recompile", item, cause_fix(item, causes, inputs))
    breaks = summary.get("graph_breaks") or []
    return FirstFix("graph break", breaks[0], break_fix(breaks[0])) if breaks else None


def _loops(stages: list[str]) -> list[str]:
    return sorted({LOOPS[stage] for stage in stages if stage in LOOPS})


def _dynamic() -> Fix:
    return Fix("JitConfig(torch_kwargs={'dynamic': True})", {"torch_kwargs": {"dynamic": True}})


def _named_dims(reasons: list[str], dim: int | None = None) -> list[tuple[str, int]]:
    """``(tensor, dim)`` of each size torch's failed guards name (``dim``: the one the fix names instead)."""
    found = [_SIZE_MISMATCH.search(reason) or _SIZE_GUARD.search(reason) for reason in reasons]
    return [(size.group(1), int(size.group(2)) if dim is None else dim) for size in found if size]


def _mark(named: list[tuple[str, int]], inputs: set[str]) -> Fix:
    """``mark_dynamic`` on each of the ``named`` tensors that is an input of the compiled call (``inputs``), in every
    frame of the cause: a user marks each tensor the fix names."""
    marks, others = [], []
    for tensor, at in named:
        plain = _KWARG.match(tensor)
        name = plain.group(1) if plain else tensor
        (marks if name in inputs else others).append([name, at])
    marks = [mark for i, mark in enumerate(marks) if mark not in marks[:i]]
    if not marks:
        return Fix("", not_mechanical=f"the fix names no input of the compiled call: {named[:1]}")
    words = ", ".join(f"mark_dynamic({name}, {at})" for name, at in marks)
    if others:  # tensors computed inside the compiled code: a mark there is no change a user can make
        words += f" ({', '.join(sorted({name for name, _ in others}))}: no input of the compiled call, not marked)"
    return Fix(words, {"mark_dynamic": marks})


def cause_fix(item: dict[str, Any], causes: list[dict[str, Any]], inputs: set[str]) -> Fix:
    """The first option the cause's fix text names, as a change of the run (``inputs``: the compiled call's)."""
    cause, text, reasons = item["cause"], item["fix"], item["reasons"]
    if cause == "recompile_limit":
        # "its recompiles were mostly: TITLE. Fix that: ...": the fix of the cause behind it, in the same frames
        behind = [c for c in causes if c is not item and text.startswith(f"its recompiles were mostly: {c['title']}")]
        same = [c for c in behind if set(c["frames"]) & set(item["frames"])] or behind
        if not same:
            return Fix("", not_mechanical="no cause behind the recompile limit is listed")
        return cause_fix(same[0], causes, inputs)
    patterns = {
        "drop_last": r"drop_last=True(?! would)",  # "drop_last=True would leave samples unevaluated" warns against it
        "mark_dynamic": r"mark_dynamic\(",
        "dynamic": r"'dynamic': True",
        "cast": r"cast once",
        "inference_mode": r"inference_mode=False",
        "config": r"torch\._dynamo\.config\.\w+\s*=",
    }
    options = {name: found.start() if (found := re.search(pattern, text)) else -1 for name, pattern in patterns.items()}
    if cause in ("specialized", "python_value", "eval_shape", "size_one", "other", "stage_switch"):
        # their first option changes the user's code or data (pad a batch, make code independent of a size)
        return Fix("", not_mechanical=f"{cause}'s fix changes the code or data: {text[:90]}...")
    named = sorted((at, name) for name, at in options.items() if at >= 0)
    if not named:
        return Fix("", not_mechanical=f"its fix names no setting: {text[:90]}...")
    first = named[0][1]
    if first == "drop_last":
        loops = _loops(item["stages"])
        return Fix(f"drop_last=True on the {', '.join(loops)} loader", {"drop_last": loops})
    if first == "mark_dynamic":
        if item.get("marks"):  # the inputs the fix names, every one torch made dynamic in its recompile
            return _mark([(name, dim) for name, dim in item["marks"]], inputs)
        zero = re.search(r"mark_dynamic\(tensor, 0\)", text)
        return _mark(_named_dims(reasons, 0 if zero else None), inputs)
    if first == "dynamic":
        return _dynamic()
    if first == "inference_mode":
        return Fix("Trainer(inference_mode=False)", {"trainer_flags": {"inference_mode": False}})
    if first == "cast":
        for reason in reasons:
            found = _DTYPE.search(reason)
            if found:  # the dtype the first compile saw: the frame keeps its graph for it
                name, dtype = found.group(1), found.group(2).lower()
                return Fix(f"{name}.to(torch.{dtype})", {"cast": {name: dtype}})
        return Fix("", not_mechanical=f"not a dtype change: {reasons[:1]}")
    found = _CONFIG.search(text)
    if found:
        return Fix(f"torch._dynamo.config.{found.group(1)} = {found.group(2)}", _config(found))
    return Fix("", not_mechanical=f"its fix names no setting: {text[:90]}...")


def _config(found: re.Match[str]) -> dict[str, Any]:
    return {"dynamo_config": {found.group(1): found.group(2) == "True"}}


def break_fix(item: dict[str, Any]) -> Fix:
    """A graph break's fix: a ``torch._dynamo.config`` flag its fix or torch's hints name, else not mechanical."""
    for text in (item.get("fix", ""), *item.get("hints", [])):
        found = _CONFIG.search(text)
        if found:
            return Fix(f"torch._dynamo.config.{found.group(1)} = {found.group(2)}", _config(found))
    return Fix("", not_mechanical=f"its fix changes the code: {item.get('fix', '')[:90]}")


def guard(line: str) -> str:
    """A failed guard without what differs from run to run: the compile id, the sizes or numbers compared."""
    text = re.sub(r"^\s*\[?!?\d+(?:/\d+)+\]?:\s*", "", line)
    text = re.sub(r"L\['([^']+)'\]", r"\1", text)
    text = re.sub(r"___stack\d+", "an intermediate value", text)  # as the product says torch's generated names
    text = re.sub(r"\.\s*expected .*$", "", re.sub(r"\s+#.*$", "", text))
    return re.sub(r"(?<!index )(?<![\[\w.])-?\d+(?:\.\d+)?(?![\]\w])", "N", text).strip()


def _frame(metric: dict[str, Any]) -> str:
    return f"{metric['co_name']}:{Path(metric['co_filename'] or '').name}:{metric['co_firstlineno']}"


def _item_frames(item: dict[str, Any]) -> set[str]:
    """``forward (oracle/zoo.py:184)`` as ``forward:zoo.py:184``."""
    found = set()
    for frame in item.get("frames", []):
        match = re.match(r"(.+?) \((.+):(\d+)\)$", frame)
        if match:
            found.add(f"{match.group(1)}:{Path(match.group(2)).name}:{match.group(3)}")
    return found


@dataclass(frozen=True)
class Recompile:
    """One recompile torch started, as the counterfactual compares them."""

    frame: str
    stages: frozenset[str]  # the stages the summary would name
    guard: str  # its newest cache entry's failed guard
    batch: tuple[object, ...]  # (stage, global step, batch index): where it ran

    @property
    def kind(self) -> bool:
        return bool(self.stages & TRAIN_STAGES)


def recompiles(truth: Truth) -> list[Recompile]:
    """Each recompile torch started. Its guard is its newest cache entry's (the first torch lists): the older
    entries' differ with how many entries the frame holds, which a fix changes, and are no reason it had."""
    # an attempt refused at the recompile limit has no code object in its metric: its frame's other compiles name it
    names = {frame_attempt(m["compile_id"])[0]: _frame(m) for m in truth.frames if m["co_name"]}
    found = []
    for metric in truth.recompiles:
        batch = truth.batch_at(metric["start_time_us"]) or {}
        frame = names.get(frame_attempt(metric["compile_id"])[0], _frame(metric))
        lines = truth.reason_lines(metric)
        where = (batch.get("fn"), batch.get("stage"), batch.get("global_step"), batch.get("batch_idx"))
        found.append(Recompile(frame, frozenset(_cause_stage(batch or None)), guard(lines[0]) if lines else "", where))
    return found


def held(before: Truth, item: dict[str, Any], after: Truth | None = None) -> int:
    """torch's recompiles of the cause in ``before``: in its frames and stages, failing a guard its reasons name.
    With ``after``: those of ``after`` that do, or that ran in a frame and batch where one of ``before``'s did (the
    same recompile, its guard now on another tensor: an intermediate value where the input was marked)."""
    guards, frames, stages = {guard(r) for r in item["reasons"]}, _item_frames(item), set(item["stages"])
    cause = [r for r in recompiles(before) if r.frame in frames and r.stages & stages and r.guard in guards]
    if after is None:
        return len(cause)
    where = {(r.frame, r.batch) for r in cause}
    return sum(
        r.frame in frames and bool(r.stages & stages) and (r.guard in guards or (r.frame, r.batch) in where)
        for r in recompiles(after)
    )


def appeared(before: Truth, after: Truth) -> int:
    """Recompiles of the second run the first lacks: none of the first's has its frame, kind of stage and guard, or
    its frame and batch."""
    old = recompiles(before)
    by_guard = Counter((r.frame, r.kind, r.guard) for r in old)
    by_batch = Counter((r.frame, r.batch) for r in old)
    new = 0
    for r in recompiles(after):
        if by_guard[(r.frame, r.kind, r.guard)] > 0:
            by_guard[(r.frame, r.kind, r.guard)] -= 1
        elif by_batch[(r.frame, r.batch)] > 0:
            by_batch[(r.frame, r.batch)] -= 1
        else:
            new += 1
    return new


def breaks_held(truth: Truth, item: dict[str, Any]) -> int:
    """torch's graph breaks of the group: its counter's entries whose reason holds the group's type and
    explanation."""
    said = [item["type"][:60], item.get("explanation", "")[:60]]
    return sum(n for reason, n in truth.raw["counters"]["graph_break"].items() if all(s in reason for s in said))


@dataclass
class Verdict:
    model: str
    cause: str
    fix: str
    before: int | None = None  # torch's recompiles (or breaks) of the cause in the first run
    after: int | None = None  # ... in the second
    new: int = 0  # torch's recompiles (or breaks) the second run has and the first lacks
    diff: str = ""  # diff's figures for the cause, and what it reports anew
    verdict: str = ""
    detail: str = ""

    def row(self) -> str:
        counts = f"{self.before} -> {self.after}" if self.before is not None else "–"
        counts += f" ({self.new} new)" if self.new else ""
        verdict = f"{self.verdict}: {self.detail}" if self.detail else self.verdict
        cells = [self.model, self.cause, self.fix or "–", counts, self.diff or "–", verdict]
        return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def _failure(truth: Truth) -> str:
    """The run's exception, its first line (a model that fails by design fails the same way in both runs)."""
    if truth.raw["status"] == "finished":
        return ""
    lines = [line.strip() for line in truth.raw["error"].splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Violation)\b.*:", line)]
    return (raised or lines or [""])[-1]


def _fails_by_design(truth: Truth) -> bool:
    """A zoo model whose ``predict_step`` raises after a fit that went well: its run fails in ``predict``."""
    from oracle.zoo import ZOO  # the zoo imports torch: imported where a verdict needs it

    case = ZOO.get(truth.raw["model"])
    return bool(case and case.predict_bug and truth.raw["calls"] and truth.raw["calls"][-1]["call"] == "predict")


def diff_json(first: Path, second: Path, cwd: Path) -> dict[str, Any]:
    return json.loads(cli("diff", str(first / "run.jsonl"), str(second / "run.jsonl"), "--json", cwd=cwd).stdout)


def _diff_key(names: dict[str, int], item: dict[str, Any]) -> str | None:
    """The cause's key in diff's figures: ``last_batch``, ``last_batch in eval``, ``x (expected)``."""
    evaluation = not set(item["stages"]) <= TRAIN_STAGES
    for name in names:
        bare = name.removesuffix(" (expected)")
        if bare.split(" in ")[0] == item["cause"] and (" in " in bare) == evaluation:
            return name
    return next((name for name in names if name.split(" ")[0] == item["cause"]), None)


def diff_counts(diff: dict[str, Any], item: dict[str, Any]) -> tuple[int, int, int]:
    """Diff's recompiles of the cause before and after (its renamed ones count as left), and the recompiles it
    reports anew (new causes, more of a cause, renamed ones)."""
    base, new = diff["base"]["recompile_causes"], diff["new"]["recompile_causes"]
    key = _diff_key(base, item) or item["cause"]
    renamed = sum(r["count"] for r in diff["renamed_recompile_causes"])
    left = new.get(key, 0) + sum(r["count"] for r in diff["renamed_recompile_causes"] if r["base"] == key)
    more = sum(max(0, c["new"] - c["base"]) for c in diff["changed_recompile_causes"].values())
    return base.get(key, 0), left, sum(diff["new_recompile_causes"].values()) + renamed + more


def inputs_of(name: str) -> set[str]:
    """The compiled call's inputs for the zoo's ``name``: its batch's keys (less the labels a user's loss takes)."""
    import torch  # the zoo's data, made where a verdict needs it: judging alone needs no torch

    from oracle.data import KINDS
    from oracle.zoo import ZOO

    case = ZOO[name]
    make, collate = KINDS[case.data]
    keys = set(collate(make(2, torch.Generator().manual_seed(0))))
    return keys if case.hf else keys - {"labels"}


def judge_pair(model: str, first: Path, second: Path | None, found: FirstFix, cwd: Path) -> Verdict:
    """The verdict on one model: ``second`` is the run with ``found``'s fix (None where it is not mechanical)."""
    verdict = Verdict(model, found.label, found.fix.words)
    if second is None:
        verdict.verdict, verdict.detail = "not mechanical", found.fix.not_mechanical
        return verdict
    before, after = read_truth(first), read_truth(second)
    if _failure(before) and not _fails_by_design(before):  # a run cut short: what it left is no count to compare
        verdict.verdict, verdict.detail = "first run failed", _failure(before)[:160]
        return verdict
    if _failure(after) != _failure(before):  # e.g. torch's own failure (oneDNN's LSTM under bf16): nothing to judge
        refused = _REFUSED.search(after.raw["error"])
        if refused:  # the fix cannot work: torch specializes the dimension the product said to mark dynamic
            verdict.verdict, verdict.detail = "not removed", f"torch refused the mark: {refused.group(0)}"
        else:
            verdict.verdict, verdict.detail = "second run failed", _failure(after)[:160]
        return verdict
    diff = diff_json(first, second, cwd)
    if found.kind == "graph break":
        verdict.before, verdict.after = breaks_held(before, found.item), breaks_held(after, found.item)
        fixed = any(b["location"] == found.item["location"] for b in diff["fixed_graph_breaks"])
        verdict.diff = "fixed" if fixed else "not fixed"
        agree = fixed == (verdict.after == 0)
        problems = [] if agree else [f"diff says {verdict.diff}, torch {verdict.before} -> {verdict.after}"]
    else:
        verdict.before, verdict.after = held(before, found.item), held(before, found.item, after)
        was, left, reported = diff_counts(diff, found.item)
        verdict.new = new = appeared(before, after)
        named = ", ".join(f"{cause} {n}" for cause, n in diff["new_recompile_causes"].items())
        verdict.diff = (
            f"{was} -> {left}"
            + (f"; new: {named}" if named else "")
            + (f"; {reported} new in all" if reported and not named else "")
        )
        problems = []
        if (was, left) != (verdict.before, verdict.after):
            problems.append(f"diff counts {was} -> {left}, torch {verdict.before} -> {verdict.after}")
        if new > reported:
            problems.append(f"torch has {new} recompiles the first run lacks, diff reports {reported}")
    if verdict.before == 0:
        problems.insert(0, "torch has none of this cause in the first run")
    if verdict.after:
        problems.insert(0, f"{verdict.after} of torch's {verdict.before} remain")
    removed = bool(verdict.before) and not verdict.after
    # torch removed them but diff said otherwise: the product's verdict on the fix is the disagreement
    verdict.verdict = "not removed" if not removed else "diff disagrees" if problems else "removed"
    verdict.detail = "; ".join(problems)
    return verdict


def counterfactual(name: str, backend: str, folder: Path, timeout: float, first: Path | None = None) -> Verdict:
    """Train ``name`` (or take ``first``, an earlier run of it), read its first fix, train it again with that fix
    (``folder/fixed``) and judge."""
    from oracle.runner import ROOT, train_one  # the runner judges with oracle.judge too: imported where used

    model = f"{name} ({backend})"
    if first is None:
        first = folder / "first"
        # a first run an earlier call left is taken as it is
        failed = "" if (first / "truth.json").exists() else train_one(name, backend, first, timeout)
        if failed:
            return Verdict(model, "–", "", verdict="no run", detail=failed)
    found = first_fix(summary_json(first, ROOT), inputs_of(name))
    if found is None:
        return Verdict(model, "nothing to fix", "", verdict="nothing to fix")
    if found.fix.not_mechanical:
        return judge_pair(model, first, None, found, ROOT)
    fixed = folder / "fixed"
    done = fixed / "truth.json"
    # a second run an earlier call made with this very fix is judged again, not trained again (--judge)
    failed = (
        ""
        if done.exists() and _fix_of(done) == found.fix.change
        else train_one(name, backend, fixed, timeout, found.fix.change)
    )
    if failed and not (folder / "fixed" / "truth.json").exists():
        return Verdict(model, found.label, found.fix.words, verdict="not removed", detail=f"second run: {failed}")
    return judge_pair(model, first, folder / "fixed", found, ROOT)


def _fix_of(truth: Path) -> dict[str, Any]:
    return json.loads(truth.read_text()).get("fix", {})


SECTION = "## The counterfactual oracle: the first fix, applied"
INTRO = """
`python3 scripts/oracle.py --counterfactual [--models ...]` trains each model, reads the first fix of the summary's
"what to fix first" (`summary --json`: the first unexpected recompile cause, else the first graph break) and applies
it mechanically in a second run of the same model (`oracle/counterfactual.py`): the first option its fix names,
`drop_last=True` on the loader of the cause's stage, `torch._dynamo.mark_dynamic(input, dim)` on the input and
dimension torch's reason names (right before the compiled call), `dynamic=True`, a cast to the dtype the first
compile saw, a `torch._dynamo.config` flag a hint names, `Trainer(inference_mode=False)`. A fix whose first option
changes the user's code or data (pad a batch, make code independent of a size, avoid a call) is "not mechanical".

torch's recompiles of the cause are counted in both runs' `CompilationMetrics` (and tlparse's reasons): in the
cause's frames and stages, its newest cache entry failing a guard the cause's reasons name (sizes and numbers
aside); in the second run also one that ran in the frame and batch of one of them (the same recompile, its guard now
on another tensor, e.g. an intermediate value after a graph break where the input was marked). **removed**: torch
had them and the second run has none, `telemetry-jit diff --json` counts the cause's recompiles the same before and
after (a recompile it calls renamed counts as left), and every recompile the second run has anew (by frame, kind of
stage and guard, nor by frame and batch) is one diff reports as new, more or renamed; **not removed**: some remain,
or torch refused the fix (a `mark_dynamic` on a dimension the code specializes raises `ConstraintViolationError`): a
disagreement, the product's fix did not do what it said; **diff disagrees**: torch's record changed as the fix said,
diff's figures did not; **second run failed**: the run with the fix raised, unlike the first, for a reason of
torch's own (its words given); **first run failed**: the model's own run raised (torch's words given), so there is
no whole run to compare; **not mechanical**: the fix's first option is a change of code or data. "new" counts
torch's recompiles the fix brought (the cost moved elsewhere, e.g. a validation's last batch compiles once
training's last batch stopped making the batch dimension dynamic), each reported by diff.

"""


HEADER = [
    "| model | cause | fix applied | torch's recompiles (breaks) of that cause before -> after | diff's verdict "
    "| verdict |",
    "|---|---|---|---|---|---|",
]


def write_section(path: Path, versions: str, verdicts: list[Verdict]) -> None:
    """This oracle's section of the page: in the table for ``versions``, these models' rows replaced (models run
    before, in another batch, kept); the other torches' tables kept."""
    old = path.read_text() if path.exists() else ""
    head, _, section = old.partition(SECTION)
    section, _, rest = section.partition("\n## ")  # a section after this one stays where it is
    tables: dict[str, dict[str, str]] = {}  # versions -> model -> row
    dates = {versions: datetime.date.today().isoformat()}  # when each table last changed
    for part in section.split("\n### ")[1:]:
        title, _, body = part.partition("\n")
        dates.setdefault(title.strip(), body.strip().split(":")[0])
        rows = [line for line in body.splitlines() if line.startswith("| ") and line not in HEADER]
        tables[title.strip()] = {row.split(" | ")[0].removeprefix("| "): row for row in rows}
    tables.setdefault(versions, {}).update({verdict.model: verdict.row() for verdict in verdicts})
    body = ""
    for title, rows in tables.items():
        words = Counter(row.rstrip(" |").rsplit(" | ", 1)[-1].split(":")[0] for row in rows.values())
        said = ", ".join(f"{n} {word}" for word, n in words.most_common())
        body += f"\n### {title}\n\n{dates[title]}: {len(rows)} models, {said}.\n\n" + "\n".join(
            [*HEADER, *rows.values()]
        )
        body += "\n"
    path.write_text(
        head.rstrip("\n") + "\n\n" + SECTION + "\n" + INTRO + body.lstrip("\n") + (f"\n## {rest}" if rest else "")
    )
