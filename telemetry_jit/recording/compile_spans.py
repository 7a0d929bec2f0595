"""What a compilation becomes: a ``compilation`` span with its ``graph_break``, ``ddp_graph_split``
and error events (names and attributes in :mod:`telemetry_jit.schema`, documented in docs/telemetry.md)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from telemetry_jit.exporters.finished import FinishedEvent, FinishedSpan
from telemetry_jit.records import AttributeValue, CacheLookup, CompileContext, CompileRecord, GraphBreak
from telemetry_jit.schema import CacheAttr, CompileAttr, DdpAttr, GraphBreakAttr, JitEventName, JitSpanName, TrainAttr

if TYPE_CHECKING:
    from nv_one_logger.core.span import Span

_MAX_FAILURE_TEXT = 2000
_MAX_REASONS = 16  # torch's recompile_limit is 8
_DDP_REASON = (
    "DDPOptimizer split the graph at DDP gradient-bucket boundaries so all-reduce overlaps backward; "
    "not a graph break in user code"
)


def compilation_span(record: CompileRecord, context: CompileContext) -> FinishedSpan:
    """The span of one finished compilation, under ``context.parent``."""
    events = [
        FinishedEvent(JitEventName.GRAPH_BREAK.value, record.start_ns, graph_break_attributes(graph_break))
        for graph_break in record.graph_breaks
    ]
    if record.ddp_graph_splits:
        ddp = {
            DdpAttr.SPLITS: record.ddp_graph_splits,
            DdpAttr.SUBGRAPHS: sum(record.ddp_buckets),
            DdpAttr.BUCKET_CAP_BYTES: record.ddp_bucket_cap_bytes,
            DdpAttr.REASON: _DDP_REASON,
        }
        events.append(FinishedEvent(JitEventName.DDP_GRAPH_SPLIT.value, record.start_ns, ddp))
    events += [_cache_lookup_event(lookup, record.start_ns) for lookup in record.cache_lookups]
    if record.recompile_limit_hit:
        message = f"{record.frame or 'frame'} hit the recompile limit; it now runs eagerly"
        events.append(FinishedEvent.error_event(message, record.end_ns))
    elif record.fell_back_to_eager and record.failure:
        message = f"compiling {record.frame or 'frame'} failed; it now runs eagerly: {record.failure}"
        events.append(FinishedEvent.error_event(message, record.end_ns))
    elif record.failure:
        events.append(FinishedEvent.error_event(f"compilation failed: {record.failure}", record.end_ns))
    return FinishedSpan(
        name=JitSpanName.COMPILATION.value,
        parent=context.parent,
        start_unix_ns=record.start_ns,
        end_unix_ns=record.end_ns,
        attributes=record_attributes(record, context),
        events=tuple(events),
    )


def out_of_step_span(attributes: dict[str, AttributeValue], seconds: float, parent: Span | None) -> FinishedSpan:
    """What the rank watcher said, as a span ending now (a stall's spans its length) holding its event, exported
    at once: an OTLP backend has it while the job runs (an event on the application span would come at its end)."""
    now = time.time_ns()
    return FinishedSpan(
        name=JitSpanName.RANKS_OUT_OF_STEP.value,
        parent=parent,
        start_unix_ns=now - int(max(0.0, seconds) * 1e9),
        end_unix_ns=now,
        attributes=attributes,
        events=(FinishedEvent(JitEventName.RANKS_OUT_OF_STEP.value, now, attributes),),
    )


def record_attributes(record: CompileRecord, context: CompileContext) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        CompileAttr.SOURCE: record.source,
        CompileAttr.ID: record.compile_id,
        CompileAttr.TRIGGER: record.trigger,
        CompileAttr.BACKEND: record.backend,
        CompileAttr.FRAME: record.frame,
        CompileAttr.LOCATION: record.location,
        CompileAttr.IS_RECOMPILE: record.is_recompile,
        CompileAttr.RECOMPILE_REASON: record.recompile_reason,
        CompileAttr.GRAPH_BREAKS: len(record.graph_breaks),
        CompileAttr.DURATION_MS: round(record.duration_ms, 3),
        CompileAttr.FAILED: bool(record.failure),
        CompileAttr.FELL_BACK_TO_EAGER: record.fell_back_to_eager,
        CompileAttr.FAILURE: record.failure.strip()[:_MAX_FAILURE_TEXT],
        TrainAttr.GLOBAL_STEP: context.global_step,
        TrainAttr.STAGE: context.stage,
    }
    where = {TrainAttr.BATCH_INDEX: context.batch_index, TrainAttr.BATCHES: context.batches}
    where[TrainAttr.LOADER] = context.loader
    attributes.update((name, value) for name, value in where.items() if value is not None)  # where known
    options = {"dynamic": CompileAttr.DYNAMIC, "fullgraph": CompileAttr.FULLGRAPH, "mode": CompileAttr.MODE}
    attributes.update({options[name]: value for name, value in record.options.items() if name in options})
    if record.input_shapes:
        attributes[CompileAttr.INPUT_SHAPES] = list(record.input_shapes)
    if record.specializations:
        attributes[CompileAttr.SPECIALIZED] = list(record.specializations)
    if record.needs_backward is not None:
        attributes[CompileAttr.NEEDS_BACKWARD] = record.needs_backward
    if len(record.recompile_reasons) > 1:  # their first lines (a reason may go on with the user's stack)
        reasons = record.recompile_reasons[:_MAX_REASONS]
        attributes[CompileAttr.RECOMPILE_REASONS] = [reason.strip().split("\n", 1)[0] for reason in reasons]
    if record.cause is not None:
        attributes[CompileAttr.RECOMPILE_CAUSE] = record.cause.cause
        attributes[CompileAttr.RECOMPILE_EXPECTED] = record.cause.expected
        if record.cause.behind:
            attributes[CompileAttr.RECOMPILE_BEHIND] = record.cause.behind
    if record.ddp_buckets:
        attributes[CompileAttr.DDP_GRAPH_SPLITS] = record.ddp_graph_splits
        attributes[CompileAttr.DDP_BUCKET_CAP_BYTES] = record.ddp_bucket_cap_bytes
    attributes.update({CompileAttr.phase_time(phase): value for phase, value in record.phase_times_s.items()})
    attributes.update({CompileAttr.cache(outcome): value for outcome, value in record.cache.items()})
    if record.cache_bypasses:
        attributes[CompileAttr.CACHE_BYPASSES] = record.cache_bypasses
    attributes.update({CompileAttr.PREFIX + name: value for name, value in record.extra.items()})
    if record.resources is not None:
        attributes.update(record.resources.attributes())
    if not record.optimizes:
        attributes[CompileAttr.BACKEND_OPTIMIZES] = False
    if record.unavailable:
        attributes[CompileAttr.UNAVAILABLE] = list(record.unavailable)
    return attributes


def graph_break_attributes(graph_break: GraphBreak) -> dict[str, AttributeValue]:
    text = graph_break.text
    attributes: dict[str, AttributeValue] = {
        GraphBreakAttr.REASON: graph_break.summary,
        GraphBreakAttr.REASON_FULL: graph_break.reason,
        GraphBreakAttr.LOCATION: graph_break.location,
        GraphBreakAttr.COUNTED_BY_TORCH: graph_break.counted_by_torch,
        GraphBreakAttr.COMPILER: graph_break.compiler,
        GraphBreakAttr.OWNER: graph_break.owner,
        GraphBreakAttr.USER_LOCATION: graph_break.user_location,
        GraphBreakAttr.TYPE: text.type,
        GraphBreakAttr.EXPLANATION: text.explanation,
        GraphBreakAttr.HINTS: list(text.hints),
        GraphBreakAttr.FIX: graph_break.fix,
    }
    if graph_break.stack:
        attributes[GraphBreakAttr.STACK] = list(graph_break.stack)
    if text.doc_url:
        attributes[GraphBreakAttr.DOC_URL] = text.doc_url
    return attributes


def _cache_lookup_event(lookup: CacheLookup, time_unix_ns: int) -> FinishedEvent:
    attributes: dict[str, AttributeValue] = {
        CacheAttr.LAYER: lookup.layer,
        CacheAttr.STATE: lookup.state,
        CacheAttr.KEY: lookup.key,
        CacheAttr.PARTS: ["\t".join(part) for part in lookup.parts],
        CacheAttr.SETTINGS: lookup.settings,
    }
    if lookup.settings_parts:
        attributes[CacheAttr.SETTINGS_PARTS] = ["\t".join(part) for part in lookup.settings_parts]
    if lookup.bypass_reason:
        attributes[CacheAttr.BYPASS_REASON] = lookup.bypass_reason
    if lookup.saved_s:
        attributes[CacheAttr.TIME_SAVED_S] = round(lookup.saved_s, 3)
    if lookup.loaded:
        attributes[CacheAttr.LOADED] = True
    return FinishedEvent(JitEventName.CACHE_LOOKUP.value, time_unix_ns, attributes)
