"""What the product concludes from the counts, on a user's own kind of run: the loop a compile belongs to, the
advice against the options already on, the cause a guard names, the whole a share is part of, the owner of a
line, the gate's budgets (issue 54)."""

from __future__ import annotations

import warnings

import torch

from telemetry_jit.analysis.summary import summarize, summary_json
from tests.e2e.conftest import Telemetry
from tests.e2e.test_truth import Regressor, data, hooked, said
from tests.models import TRAINER_DEFAULTS


# -- the stage of a compile is the loop that ran when torch began it ----------------------------------
@torch._dynamo.config.patch(recompile_limit=1)
def test_a_fallback_at_the_training_epochs_last_batch_is_in_training_not_the_validation_that_follows(
    telemetry: Telemetry,
) -> None:
    """The frame hits the limit at the smaller last training batch (torch gives up before its compile callbacks,
    so the compile is seen only when validation's first batch starts): its stage is training's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = hooked(telemetry)(max_epochs=1, num_sanity_val_steps=0, **TRAINER_DEFAULTS)
        trainer.fit(Regressor(), data(44, 8), data(16, 8))  # 5 batches of 8, then 4; validation after
    run = telemetry.end()
    (fallback,) = summarize(run).digest.fallbacks
    assert (fallback.step, fallback.stage) == (5, "train")
    assert summary_json(run)["fell_back_to_eager"][0]["stage"] == "train"
    status, out = said("check", str(telemetry.path), "--no-eager-fallback")
    assert status == 1 and "it hit the recompile limit, in training)" in out, out
