"""What one run's compilations amount to, folded as they are read (:meth:`RunDigest.add`, in file order) into
bounded aggregates that every answer reads. A recompile recorded without its cause (an older file) is classified
here by the :class:`~telemetry_jit.causes.RecompileClassifier` that runs while training."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from telemetry_jit.analysis.cold_start import CacheLedger, Residual, without_line
from telemetry_jit.analysis.resources import RunResources
from telemetry_jit.analysis.runs import EventRecord, SpanRecord, add_new, number
from telemetry_jit.breaks import (
    BreakText,
    break_fix,
    gist,
    is_restart_note,
    owner_of,
    parse_break,
    recompile_owner,
    user_location,
)
from telemetry_jit.causes import (
    BY_ITSELF,
    CAUSES,
    EVAL_STAGES,
    Classified,
    RecompileClassifier,
    dynamic_dims,
    normalize_reason,
)
from telemetry_jit.records import FallbackCost, is_frame_recompile
from telemetry_jit.schema import (
    LOOP_SPAN_NAMES,
    CompileAttr,
    DdpAttr,
    GraphBreakAttr,
    JitEventName,
    TrainAttr,
    TrainingSpanName,
)
from telemetry_jit.terminal import frame_label, frame_shown, short

MAX_KEPT = 5000  # compile windows for timelines, entries of each rank's compile sequence
MAX_DETAILS = 200  # graph breaks shown one by one, DDP splits, fallbacks
MAX_NAMES = 50  # frames that missed the caches, reasons kept per row
# frames and graph-break places with a row of their own (RunDigest.max_rows): past them, one row counts the rest
MAX_ROWS = 1000
AWAITED = 10_000  # compile ids awaiting their backward graph: it follows its forward within a step or two
Loops = Mapping[str, SpanRecord]  # the run's spans other than compilations, by id
Frame = tuple[str, str]  # a compiled frame's name and location ("file:line")


def _cache_count(attributes: Mapping[str, Any], kind: str, *outcomes: str) -> float:
    """A frame compile's cache counts of ``kind`` (``fx_graph``, ``aot_autograd``), local and remote."""
    total = 0.0
    for name in _CACHE_NAMES[(kind, outcomes)]:  # names made once: this runs for every training compile
        value = attributes.get(name)
        if value:
            total += number(value)
    return total


_CACHE_NAMES: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {
    (kind, outcomes): tuple(
        f"{CompileAttr.PREFIX}cache.{kind}_{where}_{outcome}" for where in ("local", "remote") for outcome in outcomes
    )
    for kind, outcomes in (("aot_autograd", ("hits",)), ("fx_graph", ("hits",)), ("fx_graph", ("hits", "misses")))
}


@dataclass
class FrameRow:
    """One compiled frame (or thunder module): how often and how long it compiled."""

    frame: str
    location: str
    compiles: int = 0  # the frame compiled (dynamo's frames, thunder's modules); its backward graphs apart
    recompiles: int = 0
    backward_graphs: int = 0
    breaks: int = 0
    compile_ms: float = 0.0  # all of it, backward graphs included
    reasons: Counter[str] = field(default_factory=Counter)  # its recompiles' reasons, normalized (MAX_NAMES of them)
    other_reasons: int = 0  # its recompiles whose reason is none of those kept

    @property
    def label(self) -> str:
        return frame_label(self.frame, self.location) if self.location else self.frame or "?"


EXPECTED = " (expected)"  # how a cause's expected price is keyed apart: "stage_switch (expected)"
_DYNAMIC_DIM = re.compile(r"\bs\d+\b")  # a symbol in an input's shape (compile.input_shapes): a dynamic dimension
Occasion = tuple[str, str, int, "int | None"]  # a recompile's frame (without its line), stage, global step, batch


@dataclass
class CauseRow:
    """The recompiles of one cause, in one kind of stage (training, evaluation, the tuner), in one run."""

    cause: str  # an id of telemetry_jit.causes.CAUSES
    kind: str  # train, eval or tuner: the fix differs
    count: int = 0
    expected: int = 0  # of which the expected one-time price
    compile_ms: float = 0.0  # the recompiles and their backward graphs
    frames: list[str] = field(default_factory=list)  # "frame (file:line)", in order seen
    steps: list[int] = field(default_factory=list)  # global steps they happened at (the first MAX_NAMES)
    step_count: int = 0  # distinct steps they happened at, all of them (steps only grow within a loop)
    _last_step: int | None = field(default=None, repr=False)
    stages: list[str] = field(default_factory=list)  # Lightning's stages they happened in
    loaders: list[int] = field(default_factory=list)  # the dataloaders, where a loop had several
    loops: list[str] = field(default_factory=list)  # span ids of the outermost loops they happened under (a fit's)
    reasons: list[str] = field(default_factory=list)  # torch's reasons, normalized, distinct
    behind: Counter[str] = field(default_factory=Counter)  # recompile_limit: the causes that led there
    # (frame, stage, global step, batch) of each recompile, bounded: the same recompile met in another run
    occasions: set[Occasion] = field(default_factory=set)
    owner: str = ""  # whose code its fix would change (breaks.recompile_owner); "user" unless all one package's
    # changing_dim: the inputs torch made dynamic in its first such recompile (automatic dynamic shapes), each to mark
    marks: list[tuple[str, int]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return CAUSES[self.cause].title

    @property
    def unexpected(self) -> int:
        return self.count - self.expected

    @property
    def name(self) -> str:
        """How diff and check key it: ``last_batch in eval``, ``stage_switch (expected)``."""
        name = self.cause + ("" if self.kind == "train" or self.cause in ONE_KIND else f" in {self.kind}")
        return name + (EXPECTED if self.expected and not self.unexpected else "")

    @property
    def fix(self) -> str:
        if self.cause == "stage_switch" and self.unexpected:
            return (
                "a frame recompiled on returning to a grad mode it had compiled for before, so something else "
                "changed as well: torch names only the first guard that failed (see this frame's other recompiles)"
            )
        stage = self.stages[0] if self.stages else ""
        if self.cause == "recompile_limit" and self.behind:
            behind = CAUSES[self.behind.most_common(1)[0][0]]
            return f"its recompiles were mostly: {behind.title}. Fix that: {behind.fix_for(stage, self.owner)}"
        fix = CAUSES[self.cause].fix_for(stage, self.owner)
        if self.marks:  # a mark on one input alone is refused where the code ties its size to another's
            marks = ", ".join(f"mark_dynamic({name}, {dim})" for name, dim in self.marks)
            here = f" (here: {marks}: every input torch made dynamic when it recompiled, marked together)"
            at = fix.find("; or ")
            fix = fix[:at] + here + fix[at:] if at >= 0 else fix + here
        return fix

    def as_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "title": self.title,
            "stages": self.stages,
            "count": self.count,
            "expected": self.expected,
            "compile_s": round(self.compile_ms / 1000, 3),
            "frames": self.frames,
            "first_step": self.steps[0] if self.steps else None,
            "steps": self.steps,
            "dataloaders": self.loaders,
            "reasons": self.reasons,
            "marks": [list(mark) for mark in self.marks],
            "fix": self.fix,
            "doc": CAUSES[self.cause].doc,
        }


@dataclass(kw_only=True)
class BreakGroup:
    """The graph breaks at one place, of one type: every line of the user's code that led there."""

    # in the order ``--json`` says them
    location: str  # the innermost line that broke, "file:line"
    user_locations: list[str] = field(default_factory=list)  # the user's lines that led there, in order seen
    owner: str  # whose code it is
    type: str
    count: int = 0
    counted_by_torch: int = 0
    explanation: str
    hints: list[str]
    doc_url: str
    loops: list[str] = field(default_factory=list)  # span ids of the outermost loops compiles found them in

    @property
    def fix(self) -> str:
        """What to do, naming every line of the user's that led here."""
        text = BreakText(self.type, self.explanation, tuple(self.hints), self.doc_url)
        return break_fix(self.owner, text, self.user_locations)

    def as_json(self) -> dict[str, Any]:
        return {**{name: value for name, value in asdict(self).items() if name != "loops"}, "fix": self.fix}


@dataclass(frozen=True)
class BreakDetail:
    """One graph break as the report lists it."""

    location: str
    owner: str
    user_location: str
    frame: str
    compile_id: str
    reason: str
    reason_full: str
    stack: tuple[str, ...]


@dataclass(frozen=True)
class Fallback:
    """A frame that runs eagerly from a step on: it hit the recompile limit, or compiling it failed."""

    frame: str
    step: int
    stage: str
    limit_hit: bool
    reason: str  # torch's failure text, or the recompile that hit the limit
    cost: FallbackCost | None = None  # what running eagerly cost, where the run measured it (summarize)
    shown: str = ""  # the frame as the user reads it (``frame_shown``); ``frame`` is the key runs compare by

    def as_json(self) -> dict[str, Any]:
        said = {"frame": self.frame, "step": self.step, "stage": self.stage, "recompile_limit": self.limit_hit}
        return {**said, "reason": self.reason, "cost": self.cost.as_json() if self.cost is not None else None}


@dataclass
class WarmStart:
    """What the FX graph and AOTAutograd caches did over a run: cache look-ups, torch's counts on each span."""

    hits: int = 0
    misses: int = 0
    saved_s: float = 0.0  # torch's remote_cache_time_saved_s, summed
    missed_frames: list[str] = field(default_factory=list)  # frames that compiled a graph the caches did not have
    unavailable: list[str] = field(default_factory=list)  # cache counts this torch does not record
    bypasses: list[str] = field(default_factory=list)  # why torch could not use a cache, distinct

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.lookups if self.lookups else None

    @property
    def line(self) -> str:
        kind = "warm start" if self.hits and not self.misses else "cold start" if not self.hits else "partly warm"
        text = f"{self.hits} of {self.lookups} cache look-ups hit ({kind}), {self.saved_s:.1f} s saved"
        if self.missed_frames:
            text += f"; missed in: {', '.join(self.missed_frames[:5])}"
        return text


@dataclass(frozen=True)
class Window:
    """One compilation on the clock: for timelines and the ranks' view."""

    start_ns: int
    end_ns: int
    recompile: bool
    title: str
    step: str


OTHER_PLACES = ("(other places)", "")  # the break key counting breaks past max_rows places (diff, check)


@dataclass
class RunDigest:
    """The aggregates of one run's compilations (see the module's doc)."""

    max_rows: int = MAX_ROWS  # frames, graph-break places and break keys kept, each; the rest counted

    compilations: int = 0  # every compilation span: frame compiles, backward graphs, thunder's
    frame_compiles: int = 0  # frames dynamo compiled (first compiles and recompiles)
    backward_graphs: int = 0  # backward graphs compiled at their first backward
    thunder_compiles: int = 0
    recompiles: int = 0  # frames compiled again (a recompile's backward graph is part of it)
    compile_ms: float = 0.0
    # compile ms by stage and the kinds of loop span around it (at any depth): inside a loop, or outside it
    ms_by_stage_loops: dict[tuple[str, frozenset[str]], float] = field(default_factory=dict)
    frames: dict[Frame, FrameRow] = field(default_factory=dict)
    other_frames: FrameRow | None = None  # the compiles of frames past the first max_rows, as one row
    causes: dict[tuple[str, str, bool], CauseRow] = field(default_factory=dict)
    breaks: dict[tuple[str, str], BreakGroup] = field(default_factory=dict)
    break_count: int = 0
    breaks_not_grouped: int = 0  # graph breaks at places past the first max_rows: counted, in no group
    breaks_not_grouped_by_torch: int = 0  # of which torch counted (BreakGroup.counted_by_torch)
    # graph breaks by identity, as diff and check compare them: (location, reason's first line) -> count
    break_keys: Counter[tuple[str, str]] = field(default_factory=Counter)
    user_break_keys: Counter[tuple[str, str]] = field(default_factory=Counter)
    break_details: list[BreakDetail] = field(default_factory=list)
    warm_start: WarmStart = field(default_factory=WarmStart)
    cache_ledger: CacheLedger = field(default_factory=CacheLedger)  # each look-up, for explaining a cold start
    resources: RunResources = field(default_factory=RunResources)  # what each compile cost the host
    residual: Residual = field(default_factory=Residual)  # compile time by phase, for a warm start's residual
    ddp: list[tuple[str, str, int, float]] = field(default_factory=list)  # frame, compile id, splits, cap MB
    ddp_splits: int = 0
    fallbacks: list[Fallback] = field(default_factory=list)
    fallback_count: int = 0
    limit_hits: int = 0
    failed: int = 0
    first_failure: str = ""
    first_failure_graph: str = ""  # the graph that failed first: "the backward graph of forward (model.py:5) [0/0]"
    windows: list[Window] = field(default_factory=list)
    # the compile sequence, for comparing ranks: (compile id, frame, cause), and when each compile ended
    sequence: list[tuple[str, str, str]] = field(default_factory=list)
    ends: dict[tuple[str, str, int], tuple[int, str]] = field(default_factory=dict)  # key -> (end ns, frame)
    backends: set[str] = field(default_factory=set)
    plain_backends: set[str] = field(default_factory=set)  # of those, the ones that said they do not optimise
    # the torch.compile options compiles were made with (compile.dynamic, .mode, .fullgraph): attribute -> values
    compile_options: dict[str, set[str]] = field(default_factory=dict)
    lacks_positions: bool = True  # no span says where in its epoch it was (written before they were recorded)
    lacks_stacks: bool = True  # no break says whose code it is in
    train_breaks: int = 0  # graph breaks of frames compiled while training: what runs inside a timed step
    train_recompiles: int = 0  # recompiles while training beyond the expected price
    _classifier: RecompileClassifier = field(default_factory=RecompileClassifier, repr=False)
    _rows_by_id: dict[str, CauseRow] = field(default_factory=dict, repr=False)  # a recompile's row, for its backward
    _seen: Counter[tuple[str, str]] = field(default_factory=Counter, repr=False)
    # training frame compiles that may yet get a lazy_backward compile of their id, with how their backward came:
    # "loaded" with them from the cache, "built" with them by inductor, "dynamic" (a dynamic dimension: built within,
    # see _counts), "unknown" (torch 2.8 records no input shapes); the latest AWAITED, older ones settled (counted)
    _awaiting: dict[str, set[str]] = field(default_factory=dict, repr=False)
    _settled: Counter[str] = field(default_factory=Counter, repr=False)
    # frames compiled static in training; frames that compiled or loaded a backward graph (the first MAX_KEPT)
    _static_train_frames: set[str] = field(default_factory=set, repr=False)
    _frames_with_backward: set[str] = field(default_factory=set, repr=False)
    _frame_labels: dict[Frame, str] = field(default_factory=dict, repr=False)  # see _label
    _frames_shown: dict[Frame, str] = field(default_factory=dict, repr=False)

    def add(self, span: SpanRecord, others: Loops) -> None:
        """One compilation span with its events; ``others``: the run's other spans, for its enclosing loop."""
        attributes = span.attributes
        ms = span.compile_ms or 0.0
        trigger = str(attributes.get(CompileAttr.TRIGGER) or "")
        compile_id = str(attributes.get(CompileAttr.ID) or "")
        around = loops_around(span, others)
        stage = stage_named(str(attributes.get(TrainAttr.STAGE) or ""), around)
        frame = (str(attributes.get(CompileAttr.FRAME) or "?"), str(attributes.get(CompileAttr.LOCATION) or ""))
        label = self._label(frame)
        recompile = is_frame_recompile(bool(attributes.get(CompileAttr.IS_RECOMPILE)), trigger)
        self.compilations += 1
        self.frame_compiles += trigger not in ("lazy_backward", "thunder")  # dynamo's, or a plug-in backend's
        built = not attributes.get(CompileAttr.FAILED)  # a backward compile that raised built no backward graph
        self.backward_graphs += trigger == "lazy_backward" and built
        if trigger == "lazy_backward":
            self._awaiting.pop(compile_id, None)
            _bounded_add(self._frames_with_backward, compile_id.rsplit("/", 1)[0])
        elif trigger == "dynamo" and stage == "train":
            self._training_frame_compile(compile_id, attributes)
        self.thunder_compiles += trigger == "thunder"
        self.recompiles += recompile
        self.compile_ms += ms
        key, loop = (stage or "unknown", frozenset(loop.name for loop in around)), outermost_loop(around)
        self.ms_by_stage_loops[key] = self.ms_by_stage_loops.get(key, 0.0) + ms
        for option in (CompileAttr.DYNAMIC, CompileAttr.MODE, CompileAttr.FULLGRAPH):
            if option in attributes:
                self.compile_options.setdefault(option, set()).add(str(attributes[option]).lower())
        if attributes.get(CompileAttr.BACKEND):
            self.backends.add(str(attributes[CompileAttr.BACKEND]))
            if attributes.get(CompileAttr.BACKEND_OPTIMIZES) is False:
                self.plain_backends.add(str(attributes[CompileAttr.BACKEND]))
        if TrainAttr.BATCH_INDEX in attributes or CompileAttr.RECOMPILE_CAUSE in attributes:
            self.lacks_positions = False
        breaks = [event for event in span.events if event.name == JitEventName.GRAPH_BREAK]
        row = self.frames.get(frame) or self._new_frame_row(frame)
        row.compiles += trigger != "lazy_backward"
        row.backward_graphs += trigger == "lazy_backward" and built
        row.recompiles += recompile
        row.breaks += len(breaks)
        row.compile_ms += ms
        if recompile:
            reason = _normalized(str(attributes.get(CompileAttr.RECOMPILE_REASON) or "unknown"))
            if reason in row.reasons or len(row.reasons) < MAX_NAMES:
                row.reasons[reason] += 1
            else:
                row.other_reasons += 1
        cause = self._cause(span, trigger, compile_id, stage, frame, recompile, loop)
        if stage == "train":
            self.train_breaks += len(breaks)
            self.train_recompiles += recompile and not (cause is not None and cause.expected)
        for event in breaks:
            self._break(event, label, compile_id, loop)
        self._warm_start(attributes, label)
        self.cache_ledger.add(span, label, trigger, compile_id, str(attributes.get(TrainAttr.GLOBAL_STEP, "")))
        self._failure(span, frame, stage, trigger)
        for event in span.events:
            if event.name == JitEventName.DDP_GRAPH_SPLIT:
                splits = int(number(event.attributes.get(DdpAttr.SPLITS)))
                self.ddp_splits += splits
                if len(self.ddp) < MAX_DETAILS:
                    cap = round(number(event.attributes.get(DdpAttr.BUCKET_CAP_BYTES)) / 2**20, 2)
                    self.ddp.append((label, compile_id, splits, cap))
        if len(self.sequence) < MAX_KEPT:  # the ids seen are counted as long as ends are kept: bounded
            nth = self._seen[(compile_id, trigger)]  # ids repeat after torch._dynamo.reset()
            self._seen[(compile_id, trigger)] += 1
            said_id = compile_id + ("b" if trigger == "lazy_backward" else "")
            self.sequence.append((said_id, label, cause.cause if cause is not None else ""))
            end = span.end_unix_ns or span.start_unix_ns
            self.ends[(compile_id, trigger, nth)] = (end, label)
            step = str(attributes.get(TrainAttr.GLOBAL_STEP, ""))
            title = f"{attributes.get(CompileAttr.FRAME, '')} {compile_id} ({trigger}) {ms:.1f} ms at step {step} "
            title += str(attributes.get(CompileAttr.RECOMPILE_REASON, ""))
            self.windows.append(Window(span.start_unix_ns, end, recompile, title, step))
        self.resources.add(span)
        self.residual.add(span)

    def _label(self, frame: Frame) -> str:
        """``frame_label``, made once a frame (of the latest MAX_KEPT): path arithmetic on every compile cost a tenth
        of reading a file."""
        return _named(self._frame_labels, frame_label, frame)

    def _shown(self, frame: Frame) -> str:
        """``frame_shown`` (a path relative to the working directory: slower still), made once a frame."""
        return _named(self._frames_shown, frame_shown, frame)

    def _new_frame_row(self, frame: Frame) -> FrameRow:
        if len(self.frames) < self.max_rows:
            row = self.frames[frame] = FrameRow(*frame)
            return row
        if self.other_frames is None:
            self.other_frames = FrameRow(f"(frames past the first {self.max_rows})", "")
        return self.other_frames

    def _training_frame_compile(self, compile_id: str, attributes: Mapping[str, Any]) -> None:
        """How a training frame compile's backward graph came (see ``_awaiting``), or that it comes at its backward."""
        shapes = attributes.get(CompileAttr.INPUT_SHAPES)
        # a frame whose graph holds no op (it broke at its first line) compiled nothing, no backward either; nor did
        # one whose inputs and parameters need no gradients (a generator frozen by toggle_optimizer): AOTAutograd
        # built an inference graph only
        has_ops = attributes.get(CompileAttr.PREFIX + "graph_op_count") != 0
        has_ops = has_ops and attributes.get(CompileAttr.NEEDS_BACKWARD) is not False
        has_ops = has_ops and not attributes.get(CompileAttr.FELL_BACK_TO_EAGER)  # refused or failed: built nothing
        frame = compile_id.rsplit("/", 1)[0]
        kinds = set()
        # AOTAutograd's entry and two FX graphs (forward and backward) loaded from the compile cache
        if _cache_count(attributes, "aot_autograd", "hits") > 0 and _cache_count(attributes, "fx_graph", "hits") >= 2:
            kinds.add("loaded")
        # inductor looked up two FX graphs: it built the backward with the forward (torch 2.15, a static recompile)
        elif _cache_count(attributes, "fx_graph", "hits", "misses") >= 2 and has_ops:
            kinds.add("built")
        elif _DYNAMIC_DIM.search(str(shapes)) and has_ops:
            kinds.add("dynamic")
        elif shapes:
            _bounded_add(self._static_train_frames, frame)
        if kinds & {"loaded", "built"}:
            _bounded_add(self._frames_with_backward, frame)
        if has_ops and "input_shapes" in (attributes.get(CompileAttr.UNAVAILABLE) or ()):  # torch 2.8 records none
            kinds.add("unknown")
        if kinds:
            self._awaiting.setdefault(compile_id, set()).update(kinds)
        if len(self._awaiting) > AWAITED:
            oldest = next(iter(self._awaiting))
            self._settled.update(kind for kind in self._awaiting.pop(oldest) if self._counts(kind, oldest))

    def _counts(self, kind: str, compile_id: str) -> bool:
        """Whether a compile that got no backward graph of its own counts: a dynamic one compiled its backward
        within it, but not where its frame's static compile needed no backward (no input needs gradients: an LSTM's
        lengths)."""
        frame = compile_id.rsplit("/", 1)[0]
        return kind != "dynamic" or frame not in self._static_train_frames or frame in self._frames_with_backward

    def _without_backward(self, kind: str) -> int:
        """Training frame compiles of ``kind`` (see ``_awaiting``) that got no backward graph of their own."""
        awaiting = (compile_id for compile_id, kinds in self._awaiting.items() if kind in kinds)
        return self._settled[kind] + sum(self._counts(kind, compile_id) for compile_id in awaiting)

    def _cause(
        self, span: SpanRecord, trigger: str, compile_id: str, stage: str, frame: Frame, recompile: bool, loop: str
    ) -> Classified | None:
        """The recompile's cause (recorded, else classified now); a backward graph's ms go to its recompile's row."""
        attributes = span.attributes
        ms = span.compile_ms or 0.0
        if trigger == "lazy_backward":
            row = self._rows_by_id.get(compile_id)
            if row is not None and attributes.get(CompileAttr.IS_RECOMPILE):
                row.compile_ms += ms
            return None
        cause = _recorded_cause(attributes, recompile) or self._classifier.observe(
            compile_id.rsplit("/", 1)[0],
            stage,
            reason=str(attributes.get(CompileAttr.RECOMPILE_REASON) or ""),
            is_recompile=recompile,
            batch_index=_whole(attributes.get(TrainAttr.BATCH_INDEX)),
            batches=_whole(attributes.get(TrainAttr.BATCHES)),
            limit_hit=_limit_hit(span),
            step=_whole(attributes.get(TrainAttr.GLOBAL_STEP)),
            dynamic=str(attributes.get(CompileAttr.DYNAMIC) or ""),
            reasons=[str(reason) for reason in attributes.get(CompileAttr.RECOMPILE_REASONS) or ()],
            trigger=trigger,
            compile_id=compile_id,
            specialized=[str(fixed).split(" = ", 1)[0] for fixed in attributes.get(CompileAttr.SPECIALIZED) or ()],
            input_shapes=[str(shape) for shape in attributes.get(CompileAttr.INPUT_SHAPES) or ()],
        )
        if cause is None:
            return None
        # evaluation's shapes met again in training (a mask it cached) are evaluation's item, with its fix
        eval_kind = cause.cause == "eval_shape" or stage in EVAL_STAGES
        kind = "eval" if eval_kind else "tuner" if stage == "tuner" else "train"  # where a cause's fix differs
        key = (cause.cause, kind, cause.expected)
        row = self.causes.get(key) or self.causes.setdefault(key, CauseRow(cause.cause, kind))
        row.count += 1
        row.expected += cause.expected
        row.compile_ms += ms
        owner = recompile_owner(*frame)
        row.owner = owner if row.owner in ("", owner) else "user"
        step = int(number(attributes.get(TrainAttr.GLOBAL_STEP)))
        if step != row._last_step and step not in row.steps:  # counted in bounded memory: steps only grow
            row.step_count += 1
        row._last_step = step
        shown = self._shown(frame)
        kept = (row.frames, shown), (row.steps, step), (row.stages, stage or "unknown"), (row.loops, loop)
        for values, value in (*kept, (row.loaders, _whole(attributes.get(TrainAttr.LOADER)))):
            add_new(values, value, MAX_NAMES)
        add_new(row.reasons, cause.subject, 5)
        if cause.cause == "changing_dim" and not row.marks and str(attributes.get(CompileAttr.DYNAMIC)) == "auto":
            row.marks = dynamic_dims([str(shape) for shape in attributes.get(CompileAttr.INPUT_SHAPES) or ()])[:8]
        if cause.behind:
            row.behind[cause.behind] += 1
        if len(row.occasions) < 1000:
            batch = _whole(attributes.get(TrainAttr.BATCH_INDEX))
            row.occasions.add((without_line(self._label(frame)), stage, step, batch))
        if len(self._rows_by_id) > 10_000:  # a backward graph follows its forward within a step or two
            self._rows_by_id.clear()
        self._rows_by_id[compile_id] = row
        return cause

    def _break(self, event: EventRecord, frame: str, compile_id: str, loop: str) -> None:
        attributes = event.attributes
        location = str(attributes.get(GraphBreakAttr.LOCATION) or "")
        reason = str(attributes.get(GraphBreakAttr.REASON_FULL) or attributes.get(GraphBreakAttr.REASON) or "")
        if is_restart_note(reason):  # a file from before recorded torch's restart note as a break: it is none
            return
        owner = str(attributes.get(GraphBreakAttr.OWNER) or owner_of(location))
        if GraphBreakAttr.OWNER in attributes:
            self.lacks_stacks = False
        stack = attributes.get(GraphBreakAttr.STACK)
        stack = tuple(str(frame) for frame in stack) if isinstance(stack, list) else ()
        user_line = str(attributes.get(GraphBreakAttr.USER_LOCATION) or "") or user_location([*stack, location])
        text = _parse_break(reason)
        kind = str(attributes.get(GraphBreakAttr.TYPE) or text.type)
        group = self.breaks.get((location, kind))
        if group is None and len(self.breaks) < self.max_rows:  # the first break of its group says its text
            group = self.breaks[(location, kind)] = BreakGroup(
                location=location,
                owner=owner,
                type=kind,
                explanation=str(attributes.get(GraphBreakAttr.EXPLANATION) or text.explanation),
                hints=[str(hint) for hint in attributes.get(GraphBreakAttr.HINTS) or text.hints],
                doc_url=str(attributes.get(GraphBreakAttr.DOC_URL) or text.doc_url),
            )
        if group is None:
            self.breaks_not_grouped += 1
            self.breaks_not_grouped_by_torch += bool(attributes.get(GraphBreakAttr.COUNTED_BY_TORCH, True))
        else:
            add_new(group.user_locations, user_line, MAX_NAMES)
            add_new(group.loops, loop, MAX_NAMES)
            group.count += 1
            group.counted_by_torch += bool(attributes.get(GraphBreakAttr.COUNTED_BY_TORCH, True))
        self.break_count += 1
        key = (short(location or "unknown location"), reason.strip().split("\n", 1)[0])
        self._count_break(self.break_keys, key)
        if owner == "user":
            self._count_break(self.user_break_keys, key)
        if len(self.break_details) < MAX_DETAILS:
            self.break_details.append(BreakDetail(location, owner, user_line, frame, compile_id, key[1], reason, stack))

    def _count_break(self, keys: Counter[tuple[str, str]], key: tuple[str, str]) -> None:
        keys[key if key in keys or len(keys) < self.max_rows else OTHER_PLACES] += 1

    def _warm_start(self, attributes: Mapping[str, Any], label: str) -> None:
        warm = self.warm_start
        for reason in attributes.get(CompileAttr.CACHE_BYPASSES) or ():
            add_new(warm.bypasses, str(reason), MAX_NAMES)
        prefix = CompileAttr.cache("")
        for name, value in attributes.items():
            if not name.startswith(prefix):
                continue
            if name.endswith("_hits"):
                warm.hits += int(number(value))
            elif name.endswith("_misses") and value:
                warm.misses += int(number(value))
                add_new(warm.missed_frames, label, MAX_NAMES)
            elif name == CompileAttr.cache("time_saved_s"):
                warm.saved_s += number(value)
        for fact in map(str, attributes.get(CompileAttr.UNAVAILABLE) or ()):
            if fact.startswith("cache."):
                add_new(warm.unavailable, fact, MAX_NAMES)

    def _failure(self, span: SpanRecord, frame: Frame, stage: str, trigger: str) -> None:
        attributes = span.attributes
        if attributes.get(CompileAttr.FELL_BACK_TO_EAGER):
            limit = _limit_hit(span)
            self.fallback_count += 1
            self.limit_hits += limit
            if len(self.fallbacks) < MAX_DETAILS:
                reason = str(attributes.get(CompileAttr.RECOMPILE_REASON if limit else CompileAttr.FAILURE) or "")
                step = int(number(attributes.get(TrainAttr.GLOBAL_STEP)))
                said = _normalized(reason) if limit else gist(reason, 300)  # torch's failure: paragraphs
                where = self._shown(frame)
                self.fallbacks.append(Fallback(self._label(frame), step, stage, limit, said, shown=where))
        elif attributes.get(CompileAttr.FAILED):
            self.failed += 1
            if not self.first_failure_graph:
                self.first_failure = str(attributes.get(CompileAttr.FAILURE) or "")
                graph = f"{frame_shown(*frame)} [{attributes.get(CompileAttr.ID) or '?'}]"
                self.first_failure_graph = f"the backward graph of {graph}" if trigger == "lazy_backward" else graph

    # -- what the answers read ----------------------------------------------------------------------
    def frame_rows(self) -> list[FrameRow]:
        """The frames, costliest first; the compiles of frames past the first :attr:`max_rows` last, as one row."""
        rows = sorted(self.frames.values(), key=lambda row: -row.compile_ms)
        return rows if self.other_frames is None else [*rows, self.other_frames]

    @property
    def unexpected_recompiles(self) -> int:
        return sum(row.unexpected for row in self.causes.values())

    @property
    def backward_within_unknown(self) -> int:
        """Training frame compiles without a backward graph whose input shapes torch 2.8 did not record."""
        return self._without_backward("unknown")

    @property
    def backward_within(self) -> int:
        """Training frame compiles that compiled their backward within them: dynamic ones (torch needs a size
        there), unless opless or of a frame whose static compile needed no backward; and those in which inductor
        looked up two FX graphs, whatever their shapes."""
        return self._without_backward("dynamic") + self._without_backward("built")

    @property
    def backward_loaded(self) -> int:
        """Training frame compiles that loaded their backward graph from the compile cache with the forward."""
        return self._without_backward("loaded")

    def causes_by_name(self) -> Counter[str]:
        """Recompiles by :attr:`CauseRow.name`, as diff and check compare them."""
        counts: Counter[str] = Counter()
        for row in self.causes.values():
            counts[row.name] += row.count
        return +counts

    def occasions_by_name(self) -> dict[str, set[Occasion]]:
        """Where the recompiles of each cause happened, keyed as :meth:`causes_by_name` keys them."""
        occasions: dict[str, set[Occasion]] = {}
        for row in self.causes.values():
            occasions.setdefault(row.name, set()).update(row.occasions)
        return occasions


# torch's texts repeat (a break's reason at every compile that meets it): parsed once each, the latest kept
_parse_break = lru_cache(maxsize=256)(parse_break)
_normalized = lru_cache(maxsize=1024)(normalize_reason)


def _named(names: dict[Frame, str], name: Callable[[str, str], str], frame: Frame) -> str:
    said = names.get(frame)
    if said is None:
        if len(names) >= MAX_KEPT:
            names.clear()
        said = names[frame] = name(*frame)
    return said


def _bounded_add(kept: set[str], item: str) -> None:
    if len(kept) < MAX_KEPT:
        kept.add(item)


# causes met in one kind of stage only (or named for it): their name says where
ONE_KIND = frozenset(("eval_shape", "stage_switch", "inference_mode", "tuner", "shared_code"))


def _recorded_cause(attributes: Mapping[str, Any], recompile: bool) -> Classified | None:
    cause = attributes.get(CompileAttr.RECOMPILE_CAUSE)
    if not recompile or cause not in CAUSES:
        return None
    subject = _normalized(str(attributes.get(CompileAttr.RECOMPILE_REASON) or ""))
    behind = str(attributes.get(CompileAttr.RECOMPILE_BEHIND) or "")
    return Classified(str(cause), subject, bool(attributes.get(CompileAttr.RECOMPILE_EXPECTED)), behind)


def loops_around(span: SpanRecord, others: Loops) -> list[SpanRecord]:
    """The loop spans a compilation happened under, innermost first (the application last, where it was)."""
    loops = []
    parent = others.get(span.parent_id or "")
    for _ in range(64):  # a cycle in a damaged file must not hang the reader
        if parent is None:
            break
        if parent.name in LOOP_SPAN_NAMES:
            loops.append(parent)
        parent = others.get(parent.parent_id or "")
    return loops


def stage_named(stage: str, loops: list[SpanRecord]) -> str:
    """Lightning's stage, or ``validate()`` and the like for a stage its own Trainer call ran (no fit's training
    loop among ``loops``), as the live console says it."""
    names = {loop.name for loop in loops}
    if stage in BY_ITSELF and TrainingSpanName.VALIDATION_LOOP in names and TrainingSpanName.TRAINING_LOOP not in names:
        return BY_ITSELF[stage]
    return stage


def outermost_loop(loops: list[SpanRecord]) -> str:
    """The id of the outermost loop below the application, ``""`` for none."""
    inside = [loop for loop in loops if loop.name != TrainingSpanName.APPLICATION]
    return inside[-1].span_id if inside else ""


def _limit_hit(span: SpanRecord) -> bool:
    return any(event.is_error and "recompile limit" in str(event.attributes) for event in span.events)


def _whole(value: object) -> int | None:
    figure = number(value, default=float("nan"))
    return None if figure != figure else int(figure)
