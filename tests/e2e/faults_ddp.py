"""A 2-process DDP fit on CPU with a fault injected at one call site in every rank (test_boundary.py).

    python tests/e2e/faults_ddp.py SITE raise|hang FOLDER

Prints, on rank zero, ``hits>0 steps=N`` when the fault was met and the fit ended, then the summary of
rank zero's file.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning.pytorch as pl  # noqa: E402

import telemetry_jit  # noqa: E402
from tests.faults import injected  # noqa: E402
from tests.models import TRAINER_DEFAULTS, Net, loader  # noqa: E402


def main() -> None:
    site, kind, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    warnings.simplefilter("ignore")
    session = telemetry_jit.configure("faults-ddp", file=folder / "telemetry.jsonl", global_batch_size=8)
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(
        pl.Trainer, session, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    )
    trainer = HookedTrainer(max_epochs=2, strategy="ddp", devices=2, **TRAINER_DEFAULTS)
    with injected(site, kind, seconds=20.0) as fault:
        trainer.fit(Net("print"), loader(84, 4))
    telemetry_jit.shutdown()
    if trainer.is_global_zero:
        print(f"hits>{0 if fault.hits else -1} steps={trainer.global_step}")
        print(telemetry_jit.format_summary(telemetry_jit.read_telemetry(folder / "telemetry.rank0.jsonl")[-1]))


if __name__ == "__main__":
    main()
