"""One run of one model, in a process of its own: trained under ``HookedTrainer`` with the Trainer flags users
set, while torch's own record of it is kept beside telemetry-jit's file (``truth.json``): every
``CompilationMetrics``, dynamo's counters, torch's recompile-limit warnings, the process's CPU time and memory as
the kernel counted them, and the Lightning batch that was running at each moment (a callback of the oracle's own,
timed on the clock torch stamps compiles with).

    python -m oracle.run MODEL BACKEND OUT_DIR [FIX]   (with TORCH_TRACE=OUT_DIR/trace set before Python starts)

FIX (the counterfactual oracle's second run, ``oracle.counterfactual``) is JSON of the change a fix makes:
``{"mark_dynamic": [[input, dim]], "cast": {input: dtype}, "drop_last": [loop], "torch_kwargs": {...},
"dynamo_config": {...}, "trainer_flags": {...}}``; without it the run is the case as the zoo has it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import sys
import sysconfig
import time
import traceback
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

import telemetry_jit
from oracle.data import SIZES, loaders
from oracle.zoo import ZOO, Case

# the Trainer flags users set (issue 54): mixed precision, accumulation, clipping, validation every epoch
FLAGS: dict[str, Any] = {
    "accelerator": "cpu",
    "precision": "bf16-mixed",
    "accumulate_grad_batches": 2,
    "gradient_clip_val": 1.0,
    "check_val_every_n_epoch": 1,
    "max_epochs": 2,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}

METRIC_FIELDS = (
    "compile_id",
    "co_name",
    "co_filename",
    "co_firstlineno",
    "start_time_us",
    "end_time_us",
    "duration_us",
    "recompile_reason",
    "is_forward",
    "num_graph_breaks",
    "fail_type",
    "fail_reason",
    "restart_reasons",
    "entire_frame_compile_time_s",
    "backend_compile_time_s",
    "inductor_compile_time_s",
    # the compile caches: inductor's FX graph cache and AOTAutograd's, local and remote, and the time they saved
    "inductor_fx_local_cache_hit_count",
    "inductor_fx_local_cache_miss_count",
    "inductor_fx_remote_cache_hit_count",
    "inductor_fx_remote_cache_miss_count",
    "aotautograd_local_cache_hit_count",
    "aotautograd_local_cache_miss_count",
    "aotautograd_remote_cache_hit_count",
    "aotautograd_remote_cache_miss_count",
    "remote_cache_time_saved_s",
)


class ZooModule(pl.LightningModule):
    """What a user writes around a library model: the loss from the model's output, AdamW, StepLR."""

    def __init__(self, case: Case, fix: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.case = case
        self.fix = fix or {}
        self.model = case.build()

    def _inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The compiled call's arguments, with a fix's cast and marks applied right before the call (a mark on a
        tensor the argument is computed from would not pass on)."""
        inputs = batch if self.case.hf else {key: value for key, value in batch.items() if key != "labels"}
        if not self.fix:
            return inputs
        inputs = dict(inputs)
        for name, dtype in self.fix.get("cast", {}).items():
            inputs[name] = inputs[name].to(getattr(torch, dtype))
        for name, dim in self.fix.get("mark_dynamic", []):
            torch._dynamo.mark_dynamic(inputs[name], dim)
        return inputs

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.case.hf:
            return self.model(**self._inputs(batch)).loss
        return torch.nn.functional.cross_entropy(self.model(**self._inputs(batch)), batch["labels"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, batch_size=len(batch["labels"]))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), batch_size=len(batch["labels"]))

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch), batch_size=len(batch["labels"]))

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.case.predict_bug:
            raise ValueError("a bug in predict_step")
        if self.case.hf:  # labels too: an encoder-decoder builds its decoder's inputs from them
            return self.model(**self._inputs(batch)).logits
        return self.model(**self._inputs(batch))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)}


class BatchClock(Callback):
    """Each batch Lightning ran: its stage, index, loader, global step, the loop's batch count, and when it ran on
    torch's clock (``time.time_ns``, as ``CompilationMetrics.start_time_us``)."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None

    def _start(self, trainer: pl.Trainer, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._open = {
            "fn": trainer.state.fn.value if trainer.state.fn else None,
            "stage": trainer.state.stage.value if trainer.state.stage else None,
            "batch_idx": batch_idx,
            "dataloader_idx": dataloader_idx,
            "global_step": trainer.global_step,
            "batches": _loop_batches(trainer, dataloader_idx),
            "start_us": time.time_ns() // 1000,
        }

    def _end(self, *args: Any) -> None:
        if self._open is not None:
            self._open["end_us"] = time.time_ns() // 1000
            self.batches.append(self._open)
            self._open = None

    def close(self) -> None:
        self._end()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._start(trainer, batch_idx)

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._start(trainer, batch_idx, dataloader_idx)

    # every loop's batch is timed alike; the loop's batch count comes from the stage running (_loop_batches)
    on_test_batch_start = on_predict_batch_start = on_validation_batch_start
    on_train_batch_end = on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _end


def _loop_batches(trainer: pl.Trainer, dataloader_idx: int) -> int | None:
    """How many batches the running loop has (of its ``dataloader_idx``-th loader), as Lightning counts them."""
    if trainer.training:
        batches: Any = trainer.num_training_batches
    elif trainer.sanity_checking:
        batches = trainer.num_sanity_val_batches
    else:
        batches = {
            "validate": trainer.num_val_batches,
            "test": trainer.num_test_batches,
            "predict": trainer.num_predict_batches,
        }.get(trainer.state.stage.value if trainer.state.stage else "")
    count = batches[dataloader_idx] if isinstance(batches, list) else batches
    return count if isinstance(count, int) else None


class LimitWarnings(logging.Handler):
    """torch's own words when a frame hits the recompile limit (a log warning of ``torch._dynamo``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "recompile_limit" in text or "cache_size_limit" in text:
            self.said.append({"time_us": int(record.created * 1e6), "text": text[:2000]})


def _plain(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if value is None or isinstance(value, (bool, int, float, str, list)):
        return value
    return str(value)


def compilation_metrics() -> list[dict[str, Any]]:
    found = []
    for metric in torch._dynamo.utils.get_compilation_metrics():
        fields = dataclasses.asdict(metric) if dataclasses.is_dataclass(metric) else vars(metric)
        found.append({name: _plain(fields.get(name)) for name in METRIC_FIELDS})
    return found


def process_resources() -> dict[str, float]:
    """What the kernel counted for this process so far: CPU seconds of its own threads and of the children it
    reaped, the largest resident memory of each (``getrusage``; kB on Linux), and the machine's memory."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cpu_s": own.ru_utime + own.ru_stime,
        "children_cpu_s": children.ru_utime + children.ru_stime,
        "max_rss_mb": own.ru_maxrss / 1024,
        "children_max_rss_mb": children.ru_maxrss / 1024,
        "machine_mb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20,
    }


def train(case: Case, backend: str, out: Path, truth: dict[str, Any], clock: BatchClock, fix: dict[str, Any]) -> None:
    session = telemetry_jit.configure("oracle", file=out / "run.jsonl", global_batch_size=SIZES["train"][1])
    config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs=truth["torch_kwargs"])
    trainer_cls, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=config, live=False)
    calls = truth["calls"]

    def call(name: str, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> Any:
        calls.append({"call": name, "start_us": time.time_ns() // 1000})
        result = getattr(trainer, name)(*args, **kwargs)
        calls[-1]["end_us"] = time.time_ns() // 1000
        return result

    def make_trainer(epochs: int) -> pl.Trainer:
        checkpoint = ModelCheckpoint(dirpath=out / "checkpoints", save_last=True)
        return trainer_cls(
            **{**FLAGS, **case.trainer_flags, **fix.get("trainer_flags", {}), "max_epochs": epochs},
            default_root_dir=out,
            logger=CSVLogger(out, name="logs"),
            callbacks=[clock, checkpoint],
        )

    pl.seed_everything(0, verbose=False)
    loops = loaders(case.data, drop_last=fix.get("drop_last", ()))
    callback.on_model_init_start()
    model = ZooModule(case, fix)
    callback.on_model_init_end()
    trainer = make_trainer(FLAGS["max_epochs"])
    call("fit", trainer, model, loops["train"], loops["val"])
    call("validate", trainer, model, loops["val"])
    call("test", trainer, model, loops["test"])
    call("predict", trainer, model, loops["predict"])
    if case.resume:  # a fresh model and trainer, one epoch more, from the checkpoint the fit left
        resumed = make_trainer(FLAGS["max_epochs"] + 1)
        call(
            "fit",
            resumed,
            ZooModule(case, fix),
            loops["train"],
            loops["val"],
            ckpt_path=str(out / "checkpoints" / "last.ckpt"),
        )
    callback.on_app_end()


def main(name: str, backend: str, out: Path, fix: dict[str, Any] | None = None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    case, fix = ZOO[name], fix or {}
    dynamo_config = {**case.dynamo_config, **fix.get("dynamo_config", {})}
    torch.set_num_threads(1)
    # torch keeps only its newest 64 CompilationMetrics (DEFAULT_COMPILATION_METRICS_LIMIT, 2.8 to 2.15): a run
    # that compiles more would lose its first compiles from the truth (bart on torch 2.8: 70 compiles, 64 kept)
    torch._dynamo.utils.set_compilation_metrics_limit(1_000_000)
    limits = LimitWarnings()
    clock = BatchClock()
    logging.getLogger("torch._dynamo").addHandler(limits)
    truth: dict[str, Any] = {
        "model": name,
        "family": case.family,
        "backend": backend,
        "torch_kwargs": {"backend": backend, **case.torch_kwargs, **fix.get("torch_kwargs", {})},
        "dynamo_config": dynamo_config,
        "drop_last": bool(fix.get("drop_last")),
        **({"fix": fix} if fix else {}),
        "versions": {"torch": torch.__version__, "lightning": pl.__version__, "python": sys.version.split()[0]},
        # whose code a file is, judged where the run's interpreter keeps packages (not the judging one's)
        "paths": {name: sysconfig.get_paths()[name] for name in ("purelib", "platlib", "stdlib")},
        "calls": [],
        "status": "finished",
        "error": "",
    }
    try:
        with torch._dynamo.config.patch(**dynamo_config):
            train(case, backend, out, truth, clock, fix)
    except Exception as error:  # the run's failure is a fact the product must state; it is kept, not raised
        truth["status"] = "failed"
        truth["error"] = "".join(traceback.format_exception(error))[-4000:]
        clock.close()  # the batch the failure ended
    truth["batches"] = clock.batches
    truth["metrics"] = compilation_metrics()
    counters = torch._dynamo.utils.counters
    truth["counters"] = {
        key: {str(k): v for k, v in counters[key].items()}
        for key in ("graph_break", "unimplemented", "frames", "stats")
    }
    truth["recompile_limit_warnings"] = limits.said
    truth["process"] = process_resources()
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4]) if sys.argv[4:] else None))
