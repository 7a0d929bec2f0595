"""What a fallback to eager costs: which batches are timed and kept on which side, without a training run."""

from __future__ import annotations

import pytest

from telemetry_jit.recording.fallback_cost import FallbackCostMeter
from telemetry_jit.records import CompileContext, CompileRecord, FallbackCost


def record(
    frame_id: str, step: int, fell_back: bool = False, limit: bool = False, stage: str = "train"
) -> CompileRecord:
    return CompileRecord(
        source="dynamo",
        compile_id=f"{frame_id}/0",
        trigger="dynamo",
        start_ns=0,
        end_ns=1,
        frame=f"forward_{frame_id}",
        location="model.py:3",
        fell_back_to_eager=fell_back or limit,
        recompile_limit_hit=limit,
        context=CompileContext(global_step=step, stage=stage),
    )


class Clock:
    """Drives the meter one training batch at a time, each ``ms`` long."""

    def __init__(self, meter: FallbackCostMeter) -> None:
        self.meter, self.ns, self.step = meter, 0, 0

    def batch(
        self, ms: float, stage: str = "train", compiled: CompileRecord | None = None, eager: bool = False
    ) -> None:
        self.meter.batch_started(stage, self.step, self.ns)
        if eager:  # as the payoff callback says it: once the batch has started
            self.meter.running_eagerly(self.step)
        if compiled is not None:  # what compiled in this batch is recorded as the next one starts
            self.meter.recorded(compiled)
        self.ns += int(ms * 1e6)
        self.step += stage == "train"


def test_the_median_batch_before_a_fallback_against_after_it_and_what_it_added_up_to() -> None:
    meter = FallbackCostMeter()
    clock = Clock(meter)
    clock.batch(900.0, compiled=record("0", 0))  # the first compile: not a timed batch
    for ms in (10.0, 11.0, 10.5, 500.0, 10.2):  # one batch stalled by the machine: the median ignores it
        clock.batch(ms)
    clock.batch(800.0, compiled=record("0", 6, limit=True))  # the batch it went eager in: not timed
    for ms in (20.0, 21.0, 20.5, 20.5):
        clock.batch(ms)
    clock.batch(0.0)  # the last batch ends as the next starts
    (cost,) = meter.costs()
    assert (cost.frame, cost.location, cost.step) == ("forward_0", "model.py:3", 6)
    assert (cost.compiled_batch_ms, cost.eager_batch_ms) == (10.5, 20.5)
    assert (cost.compiled_batches, cost.eager_batches, cost.batches_since) == (5, 4, 6)
    assert cost.cost_s == pytest.approx(10.0 * 6 / 1000)
    # 4 and 5 batches, one of them stalled: a difference of medians this few batches cannot tell from noise
    assert cost.words() == (
        "not enough batches to tell what it costs: 20.5 ms against 10.5 ms while compiled, medians of 4 and 5 "
        "batches; the 95% interval, -479.5 to 10.8 ms a batch, holds zero"
    )
    assert not cost.told
    assert FallbackCost.from_attributes(cost.attributes()) == cost


def test_a_cost_is_said_with_its_interval_where_the_batches_tell_it_and_a_saving_likewise() -> None:
    for compiled_ms, eager_ms, said in (
        (10.0, 20.0, "costs 10.0 ms a training batch (95% interval 9.8 to 10.2 ms a batch; 20.0 ms against 10.0"),
        (20.0, 10.0, "saves 10.0 ms a training batch (95% interval 9.8 to 10.2 ms; 10.0 ms against 20.0"),
    ):
        meter = FallbackCostMeter()
        clock = Clock(meter)
        for i in range(10):
            clock.batch(compiled_ms + (i % 5 - 2) / 10)  # a tenth of a millisecond of jitter either way
        clock.batch(800.0, compiled=record("0", 10, limit=True))
        for i in range(10):
            clock.batch(eager_ms + (i % 5 - 2) / 10)
        clock.batch(0.0)
        (cost,) = meter.costs()
        assert cost.told and cost.words().startswith(said), cost.words()
        assert FallbackCost.from_attributes(cost.attributes()) == cost
        assert cost.as_json()["extra_ms_interval"] == [round(cost.extra_low_ms, 3), round(cost.extra_high_ms, 3)]


def test_a_noisy_run_is_not_enough_to_tell_whichever_way_its_medians_lean() -> None:
    # issue 63: the same frame falling back in two runs, "saves 1007 ms" and "costs 2538 ms" a batch, from medians
    # of 6 to 18 batches ranging 589-3725 ms
    before = [589, 3725, 1200, 2900, 800, 3100, 1500, 2400, 650, 3600, 1900, 1000, 3300, 700, 2200, 1750, 2800, 900]
    after = [3500, 620, 2950, 1100, 3650, 2050]
    for compiled, eager in ((before, after), (after, before)):
        meter = FallbackCostMeter()
        clock = Clock(meter)
        for ms in compiled:
            clock.batch(ms)
        clock.batch(800.0, compiled=record("0", len(compiled), limit=True))
        for ms in eager:
            clock.batch(ms)
        clock.batch(0.0)
        (cost,) = meter.costs()
        assert abs(cost.extra_ms) > 300 and not cost.told
        assert cost.words().startswith("not enough batches to tell what it costs: ") and "holds zero" in cost.words()


def test_three_batches_a_side_are_too_few_for_an_interval() -> None:
    meter = FallbackCostMeter()
    clock = Clock(meter)
    for ms in (10.0, 10.0, 10.0, 800.0):
        clock.batch(ms, compiled=record("0", 3, limit=True) if ms == 800.0 else None)
    for ms in (30.0, 30.0, 30.0, 0.0):
        clock.batch(ms)
    (cost,) = meter.costs()
    assert (cost.compiled_batches, cost.eager_batches, cost.extra_low_ms) == (3, 3, None)
    assert cost.words() == (
        "not enough batches to tell what it costs: 30.0 ms against 10.0 ms while compiled, medians of 3 and 3 "
        "batches, too few for a 95% interval"
    )


def test_batches_that_compiled_met_another_stage_or_ran_eagerly_for_the_payoff_are_not_timed() -> None:
    meter = FallbackCostMeter()
    clock = Clock(meter)
    for _ in range(3):
        clock.batch(10.0)
    clock.batch(999.0, compiled=record("1", 3))  # a recompile of another frame
    clock.batch(999.0)  # validation follows this one: its time holds validation's start
    clock.batch(50.0, stage="validate")
    meter.running_eagerly(clock.step)
    clock.batch(999.0)  # a payoff block's eager step, said before its batch starts
    clock.batch(999.0, eager=True)  # and one said after
    clock.batch(10.0, compiled=record("0", 6, fell_back=True))
    for _ in range(3):
        clock.batch(30.0)
    clock.batch(0.0)
    (cost,) = meter.costs()
    assert (cost.compiled_batch_ms, cost.compiled_batches) == (10.0, 3)
    assert (cost.eager_batch_ms, cost.eager_batches) == (30.0, 3)


def test_too_few_batches_on_either_side_say_so_and_each_fallback_is_judged_against_the_one_before() -> None:
    meter = FallbackCostMeter()
    clock = Clock(meter)
    clock.batch(100.0, compiled=record("0", 0, fell_back=True))  # failed at its first compile: nothing before
    for _ in range(4):
        clock.batch(30.0)
    clock.batch(30.0, compiled=record("1", 5, limit=True))  # a second frame, judged against the first's eager batches
    for _ in range(4):
        clock.batch(45.0)
    clock.batch(0.0)
    clock.batch(45.0, compiled=record("1", 11, limit=True))  # the same frame again: no second account
    first, second = meter.costs()
    assert first.not_measured == (
        "0 training batch(es) ran with it compiled, and nothing compiling, before it fell back; a measurement needs 3"
    )
    assert first.cost_s == 0.0 and first.words().startswith("its cost not measured: 0 training batch(es)")
    assert (second.compiled_batch_ms, second.eager_batch_ms, second.step) == (30.0, 45.0, 5)
    # a frame that fell back runs eagerly to the loop's end, past the second frame's fallback: all 12 batches
    assert (first.batches_since, second.batches_since) == (12, 7)


@pytest.mark.parametrize("stage", ["validate", "validate()"])
def test_a_fallback_outside_a_training_batch_counts_only_the_training_batches_after_it(stage: str) -> None:
    # bart, opt on torch 2.8: a frame hit the recompile limit in fit's validation (6 training batches followed,
    # not 7) and in a Trainer.validate() after fit (none followed, not 1)
    meter = FallbackCostMeter()
    clock = Clock(meter)
    for _ in range(6):
        clock.batch(10.0)
    clock.batch(5.0, stage=stage, compiled=record("0", clock.step, limit=True, stage=stage))
    for _ in range(6 if stage == "validate" else 0):
        clock.batch(10.0)
    (cost,) = meter.costs()
    assert cost.batches_since == (6 if stage == "validate" else 0)


def test_a_loop_without_a_fallback_has_no_cost_to_say() -> None:
    meter = FallbackCostMeter()
    clock = Clock(meter)
    for _ in range(5):
        clock.batch(10.0)
    assert meter.costs() == []
