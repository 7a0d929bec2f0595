"""The payoff's arithmetic and the meter's schedule, without a training run."""

from __future__ import annotations

import pytest

from telemetry_jit import Payoff, PayoffSettings
from telemetry_jit.recording.payoff import PayoffMeter


def test_break_even_and_net_follow_from_the_step_times() -> None:
    payoff = Payoff(eager_step_ms=30.0, compiled_step_ms=10.0, measured_at_step=12, blocks=4, block_steps=5)
    payoff.compile_s, payoff.steps = 8.0, 1000
    assert payoff.speedup == 3.0
    assert payoff.break_even_step == 400  # 8 s / 20 ms saved a step
    assert payoff.net_s == pytest.approx((1000 - 20) * 0.020 - 8.0)
    assert Payoff.from_attributes(payoff.attributes()) == payoff
    assert "3.00x faster than eager" in payoff.sentence() and "repaid at step 400" in payoff.sentence()


def test_a_recorded_payoff_reads_back_as_the_run_said_it() -> None:
    """The file's reader says what the run said: a speedup of 2.99496 was said 2.99x during the run and read
    3.00x from the file when the step times were written rounded."""
    said = Payoff(8.51, 8.51 / 2.994996, 4, 5, 5, 1024.12345, 900.98765, 1.23456789, 70)
    read = Payoff.from_attributes(said.attributes())
    assert read == said
    assert read.sentence() == said.sentence() and "2.99x" in said.sentence()


def test_a_compiled_step_that_is_slower_is_never_repaid_and_says_why() -> None:
    payoff = Payoff(eager_step_ms=1.0, compiled_step_ms=2.0, measured_at_step=5, blocks=2, block_steps=3)
    payoff.compile_s, payoff.steps = 3.0, 100
    assert payoff.break_even_step is None and payoff.attributes()["payoff.break_even_step"] == -1
    assert payoff.net_s < -3.0
    assert "2.00x slower than eager" in payoff.sentence("tiny ops") and "likely why: tiny ops" in payoff.sentence(
        "tiny ops"
    )


@pytest.mark.parametrize("field", ["settle_steps", "block_steps", "blocks"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_settings_name_what_is_wrong(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"PayoffSettings\({field}="):
        PayoffSettings(**{field: value})  # type: ignore[arg-type]


def test_the_schedule_waits_for_compiling_to_settle_alternates_and_starts_over_on_a_compile() -> None:
    compiles = [1]
    meter = PayoffMeter(PayoffSettings(settle_steps=2, block_steps=2, blocks=2), compilations=lambda: compiles[0])
    modes = []
    for step in range(20):
        if step == 5:
            compiles[0] += 1  # a recompile mid-measurement voids it
        meter.step_started(step)
        running = meter._running
        modes.append(None if running is None else ("eager" if running[0].eager else "compiled"))
        meter.step_ended()
    # settle 2 steps, measure from step 2; the compile seen at step 5 starts over: settle, then 4 blocks of 2
    assert modes[:5] == [None, None, "compiled", "compiled", "eager"]
    assert modes[5:7] == [None, None]
    assert modes[7:15] == ["compiled"] * 2 + ["eager"] * 4 + ["compiled"] * 2
    assert meter.result is not None and meter.result.measured_at_step == 7
    assert modes[15:] == [None] * 5  # measured once
