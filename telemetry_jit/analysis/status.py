"""Whether a run finished, and if not, how it ended: what every surface says first, and what ``check``
refuses to judge (docs/ci-gate.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from telemetry_jit.analysis.runs import TelemetryRun
from telemetry_jit.breaks import gist
from telemetry_jit.schema import LOOP_SPAN_NAMES, JitEventName, JitSpanName, TrainingSpanName

State = Literal["finished", "failed", "interrupted", "killed", "incomplete", "empty"]
_INTERRUPTIONS = ("KeyboardInterrupt", "SIGTERM", "SignalException", "SystemExit")
_WORK = frozenset(LOOP_SPAN_NAMES) - {TrainingSpanName.APPLICATION}  # the loops that train or evaluate


@dataclass(frozen=True)
class RunStatus:
    """How a run ended: ``finished``, ``failed`` (it raised), ``interrupted`` (Ctrl-C, SIGTERM), ``killed`` (loops
    never ended, file never closed), ``incomplete`` (records missing) or ``empty`` (it trained nothing)."""

    state: State
    detail: str  # what happened, in words

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def headline(self) -> str:
        """The first line every surface shows for a run that did not finish (``""`` for one that did)."""
        if self.finished:
            return ""
        if self.state == "empty":
            return f"this run TRAINED NOTHING: {self.detail}; there are no figures to judge"
        return f"this run {self.state.upper()}: {self.detail}; the figures below cover what was recorded before"

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "detail": self.detail}


def run_status(run: TelemetryRun) -> RunStatus:
    """How ``run`` ended, from what its file holds."""
    loops = sorted((span for span in run.spans.values() if span.name in LOOP_SPAN_NAMES), key=lambda s: s.start_unix_ns)
    for span in loops:
        errors = [event for event in span.events if event.is_error]
        if errors:
            message = str(errors[0].attributes.get("error_message") or errors[0].name)
            state: State = "interrupted" if message.startswith(_INTERRUPTIONS) else "failed"
            return RunStatus(state, f"{gist(message)} (in its {span.name})")
    if run.fragment:
        return RunStatus("incomplete", f"this file holds part of the run: {run.fragment}")
    unended = sorted({span.name for span in loops if span.end_unix_ns is None})
    if unended and run.health is None and run.file_format != "nv-one-logger":
        return RunStatus(
            "killed",
            f"its {', '.join(unended)} never ended and its file has no closing record (the process was killed, its "
            "disk filled, or it still runs)",
        )
    if unended:
        return RunStatus("incomplete", f"telemetry closed without ending its {', '.join(unended)}")
    if run.damage:
        return RunStatus("incomplete", run.damage.words())
    if run.lost_records:
        return RunStatus("incomplete", f"{run.lost_records} record(s) could not be written to its file")
    # empty where the run ran no loop: a fit said it trained nothing (and no training loop followed), or no loop and
    # no compilation is in the file at all (no fit ran)
    names = {span.name for span in run.spans.values()}
    said = list(run.events(JitEventName.TRAINED_NOTHING, run.find(TrainingSpanName.APPLICATION)))
    if said and TrainingSpanName.TRAINING_LOOP not in names:
        return RunStatus("empty", f"fit ran no training step ({said[-1].attributes.get('reason', 'no reason given')})")
    compiled = bool(run.digest and run.digest.compilations) or JitSpanName.COMPILATION in names
    if names.isdisjoint(_WORK) and not compiled:
        return RunStatus(
            "empty",
            "it recorded no training, validation or test loop and no compilation (no fit ran, or it stopped before "
            "its first step: an empty dataset, max_steps=0, limit_train_batches=0, max_epochs=0)",
        )
    return RunStatus("finished", "")
