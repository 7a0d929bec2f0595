"""``recording.progress``: a compile still running, said every so often, never after it ended."""

from __future__ import annotations

import threading
import time

from telemetry_jit.recording.progress import CompileProgress


def test_said_while_the_compile_runs_with_its_seconds_and_never_after_it_stopped() -> None:
    said: list[tuple[str, float, str]] = []
    twice = threading.Event()

    def say(what: str, elapsed_s: float, phase: str) -> None:
        said.append((what, elapsed_s, phase))
        if len(said) >= 2:
            twice.set()

    progress = CompileProgress(say, every_s=0.05)
    progress.start("forward (model.py:3) [0/0]")
    assert twice.wait(60)  # however loaded the machine: it only comes later
    progress.stop()
    count = len(said)
    time.sleep(0.3)  # six intervals: a timer left running would have said more
    assert len(said) == count
    assert [what for what, _, _ in said] == ["forward (model.py:3) [0/0]"] * count
    assert [s for _, s, _ in said] == sorted(s for _, s, _ in said) and said[0][1] >= 0.05
    assert all(phase == "" for _, _, phase in said)  # no torch compile ran on this thread: no phase to name


def test_a_new_compile_replaces_the_one_before() -> None:
    said: list[str] = []
    heard = threading.Event()
    progress = CompileProgress(lambda what, *_: (said.append(what), heard.set()), every_s=0.05)
    progress.start("first")
    progress.start("second")
    assert heard.wait(60)
    progress.stop()
    assert set(said) == {"second"}
