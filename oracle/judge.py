"""Every statement telemetry-jit makes about a run, read back from its own outputs (``summary --json``, the summary's
text, the run file, ``check``'s exit codes) and judged against torch's record (``oracle.truth``): one ``Fact`` per
kind of statement, agree or not, with both sides' words."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.truth import Truth, frame_attempt, read_truth

CLI = [sys.executable, "-m", "telemetry_jit"]


@dataclass
class Fact:
    model: str
    fact: str
    agree: bool | None  # None: nothing stated to judge
    product: str
    torch: str
    detail: str = ""


@dataclass
class Product:
    """What telemetry-jit says about one run."""

    summary: dict[str, Any]
    text: str
    spans: list[dict[str, Any]]  # the run file's compilation spans
    breaks: list[dict[str, Any]]  # the run file's graph_break events


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def read_product(out: Path, cwd: Path) -> Product:
    """The product's statements, its commands run where the training ran (``cwd``), as a user runs them."""
    summary = json.loads(cli("summary", str(out / "run.jsonl"), "--json", cwd=cwd).stdout)["runs"][-1]
    text = cli("summary", str(out / "run.jsonl"), cwd=cwd).stdout
    records = [json.loads(line) for line in (out / "run.jsonl").read_text().splitlines() if line.strip()]
    spans = [r for r in records if r["kind"] == "span" and r.get("name") == "compilation"]
    ids = {span["span_id"] for span in spans}
    breaks = [r for r in records if r["kind"] == "event" and r.get("name") == "graph_break" and r["span_id"] in ids]
    return Product(summary, text, spans, breaks)


def _span_key(span: dict[str, Any]) -> tuple[str, bool]:
    attributes = span["attributes"]
    return attributes.get("compile.id", ""), attributes.get("compile.trigger") != "lazy_backward"


def _metric_key(metric: dict[str, Any]) -> tuple[str, bool]:
    return metric["compile_id"], metric["is_forward"] is not False


def _pairs(product: Product, truth: Truth) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each compilation span with torch's metric of the same compile (id and direction), in torch's order."""
    spans: dict[tuple[str, bool], dict[str, Any]] = {}
    for span in product.spans:
        if span["attributes"].get("compile.source", "dynamo") == "dynamo":
            spans.setdefault(_span_key(span), span)
    return [(spans[_metric_key(m)], m) for m in truth.metrics if _metric_key(m) in spans]


def _count(model: str, fact: str, said: int, true: int, words: str) -> Fact:
    """A count the product states against torch's (``words`` follow torch's number)."""
    return Fact(model, fact, said == true, str(said), f"{true}{words}")


def counts(model: str, product: Product, truth: Truth) -> list[Fact]:
    said = product.summary
    tl_frames = len(truth.frames) if truth.tlparse.error else len(truth.tlparse.metrics)
    # null where the recording torch could not know them (2.8 has no input shapes): the summary then says it
    # did not count them, so what it does count may only fall short of torch's record, never exceed it
    uncounted = said.get("backward_graphs_within_frame_compiles", 0) is None
    within = (said.get("backward_graphs_within_frame_compiles") or 0) + said.get(
        "backward_graphs_loaded_within_frame_compiles", 0
    )
    all_backward = said["backward_graphs"] + within
    facts = [
        Fact(
            model,
            "frame compiles",
            said["frame_compiles"] == len(truth.frames) == tl_frames,
            str(said["frame_compiles"]),
            f"{len(truth.frames)} (tlparse {tl_frames})",
        ),
        _count(model, "recompiles", said["recompilations"], len(truth.recompiles), ""),
        _count(
            model,
            "lazy backward compiles",
            said["backward_graphs"],
            len(truth.backwards),
            f" (tlparse {len(truth.tlparse.backward_metrics)})",
        ),
        _count(model, "compilations", said["compilations"], len(truth.metrics), " CompilationMetrics"),
        Fact(
            model,
            "backward graphs",
            None
            if truth.tlparse.error
            else (
                all_backward <= len(truth.tlparse.backward_graphs)
                if uncounted
                else all_backward == len(truth.tlparse.backward_graphs)
            ),
            f"{all_backward} ({said['backward_graphs']} at a first backward, {within} within frame compiles)",
            f"{len(truth.tlparse.backward_graphs)} (aot_backward_graph in {_listed(truth.tlparse.backward_graphs)})",
            "the summary's backward graphs, those compiled within their frame compiles with them; torch built an "
            "aot_backward_graph in each compile listed",
        ),
    ]
    counted = sum(item["count"] for item in said["graph_breaks"] if item.get("counted_by_torch", True))
    facts.append(
        Fact(
            model,
            "graph breaks",
            counted == truth.graph_breaks and said["graph_break_count"] >= counted,
            f"{said['graph_break_count']} ({counted} counted by torch)",
            f"{truth.graph_breaks} in counters['graph_break'] ({truth.restarts} compiles restarted)",
        )
    )
    span_ids = sorted(
        _span_key(span) for span in product.spans if span["attributes"].get("compile.source", "dynamo") == "dynamo"
    )
    metric_ids = sorted(_metric_key(metric) for metric in truth.metrics)
    facts.append(Fact(model, "compile ids", span_ids == metric_ids, _ids(span_ids), _ids(metric_ids)))
    return facts


def _listed(items: list[str]) -> str:
    return ", ".join(items) or "none"


def _ids(keys: list[tuple[str, bool]]) -> str:
    return " ".join(f"{i}{'' if forward else '(bw)'}" for i, forward in keys)


def _verdict(model: str, fact: str, wrong: list[str], judged: bool, agreed: tuple[str, str]) -> Fact:
    """A fact judged item by item, each difference written "what the product said vs torch's record": ``agreed``'s
    words when none differs (``None``: nothing was judged), else the first difference and the rest as detail."""
    if not wrong:
        return Fact(model, fact, True if judged else None, *agreed)
    said, _, torch_said = wrong[0].partition(" vs ")
    return Fact(model, fact, False, said, torch_said, "; ".join(wrong[1:]))


def durations(model: str, product: Product, truth: Truth) -> list[Fact]:
    pairs = _pairs(product, truth)
    if not pairs:
        return [Fact(model, "compile span start", None, "no spans", f"{len(truth.metrics)} compiles")]
    starts = [span["start_unix_ns"] // 1000 - metric["start_time_us"] for span, metric in pairs]
    ends = [span["end_unix_ns"] // 1000 - metric["end_time_us"] for span, metric in pairs if metric.get("end_time_us")]
    # the span is torch's window around the compile (start_time_us..end_time_us); its length is that window's, and
    # torch's own duration_us (its outermost timed region, shorter by torch's bookkeeping) is compile.duration_ms
    windowed = [(span, metric) for span, metric in pairs if metric.get("end_time_us")]
    lengths = [
        span["end_unix_ns"] // 1000 - span["start_unix_ns"] // 1000 - metric["end_time_us"] + metric["start_time_us"]
        for span, metric in windowed
    ]
    torch_gap = [metric["end_time_us"] - metric["start_time_us"] - metric["duration_us"] for _, metric in windowed]
    said_ms = [
        span["attributes"].get("compile.duration_ms", 0.0) * 1000 - metric["duration_us"] for span, metric in pairs
    ]
    worst = max(range(len(said_ms)), key=lambda i: abs(said_ms[i]))
    span, metric = pairs[worst]
    total = sum(metric["duration_us"] for metric in truth.metrics) / 1e6
    gap = (
        f"; torch's own end_time_us - start_time_us - duration_us: {min(torch_gap)}..{max(torch_gap)} µs"
        if torch_gap
        else ""
    )
    return [
        Fact(
            model,
            "compile span start",
            all(diff == 0 for diff in starts),
            f"start - torch's start_time_us: {min(starts)}..{max(starts)} µs",
            "start_time_us",
        ),
        Fact(
            model,
            "compile span end",
            all(diff == 0 for diff in ends) if ends else None,
            f"end - torch's end_time_us: {min(ends)}..{max(ends)} µs" if ends else "",
            "end_time_us",
        ),
        Fact(
            model,
            "compile span length",
            all(diff == 0 for diff in lengths) if lengths else None,
            f"span minus torch's end_time_us - start_time_us: {min(lengths):+d}..{max(lengths):+d} µs"
            if lengths
            else "",
            "end_time_us - start_time_us",
        ),
        Fact(
            model,
            "compile.duration_ms",
            all(abs(diff) < 1 for diff in said_ms),
            f"{span['attributes'].get('compile.duration_ms')} ms ({metric['compile_id']}); minus duration_us over "
            f"{len(pairs)} compiles: {min(said_ms):+.0f}..{max(said_ms):+.0f} µs",
            f"duration_us {metric['duration_us']}",
            gap.lstrip("; "),
        ),
        Fact(
            model,
            "compile time in all",
            abs(product.summary["compile_s"] - total) <= 0.0015,
            f"{product.summary['compile_s']:.3f} s",
            f"{total:.6f} s (sum of duration_us)",
        ),
    ]


def _flat(text: str) -> str:
    return " ".join(text.split())


def reasons(model: str, product: Product, truth: Truth) -> list[Fact]:
    """Each recompile's reason is torch's text (whitespace aside): one of the failed guards torch names."""
    wrong, judged = [], 0
    for span, metric in _pairs(product, truth):
        if not (metric["is_forward"] is not False and frame_attempt(metric["compile_id"])[1] > 0):
            continue
        judged += 1
        torch_text = _flat(
            " ".join([metric["recompile_reason"] or "", *truth.tlparse.reasons.get(metric["compile_id"], [])])
        )
        attributes = span["attributes"]
        said = [attributes.get("compile.recompile_reason", ""), *attributes.get("compile.recompile_reasons", [])]
        if any(_flat(text) not in torch_text for text in said):
            wrong.append((metric["compile_id"], _flat(said[0])[:200], torch_text[:300]))
    if not wrong:
        return [Fact(model, "recompile reasons", True if judged else None, f"{judged} reasons", "the same text")]
    compile_id, said_text, torch_text = wrong[0]
    return [
        Fact(
            model,
            "recompile reasons",
            False,
            f"{compile_id}: {said_text!r}",
            torch_text,
            f"{len(wrong)} of {judged} differ",
        )
    ]


# the sized value is torch's guard source, which may hold spaces (t5 on torch 2.8, a resume function's stack:
# "2 <= dict.__getitem__(___stack0, list(dict.keys(___stack0))[0]).size()[0]"): anything up to a comparison or comment
SIZE_ONE = re.compile(r"(?:^|[\s(:])2 <= [^<>=!#]*\.size\(\)\[\d+\]")
SIZE = re.compile(r"size mismatch|stride mismatch|\.size\(\)\[\d+\]|\bNe\(|\bEq\(|size\(\)")


def acceptable_causes(lines: list[str], batch: dict[str, Any] | None, first_batch: bool = False) -> set[str] | None:
    """The causes torch's reason text allows, by the oracle's own reading (None: not judged). ``first_batch``:
    the recompile ran in the batch that first compiled its frame (in that kind of stage), where a size or
    tensor-property guard is another caller of shared code (bart's encoder and decoder share one positional
    embedding's ``forward``: float inputs, then long; docs/fixing.md)."""
    changed = [line for line in lines if "grad_mode" not in line]
    if not changed:
        return {"stage_switch"} if lines else None
    allowed = _guard_causes(changed, batch)
    if allowed is not None and first_batch and allowed & {"changing_dim", "tensor_property"}:
        allowed = allowed | {"shared_code"}
    return allowed


def _guard_causes(changed: list[str], batch: dict[str, Any] | None) -> set[str] | None:
    """The causes the failed guards other than grad mode's (``changed``) allow."""
    text = " ".join(changed)
    last = bool(
        batch and batch.get("batches") and batch["batch_idx"] == batch["batches"] - 1 and batch["batch_idx"] > 0
    )
    sizes = {"changing_dim", "eval_shape"} | ({"last_batch"} if last else set())
    first = changed[0]
    if SIZE_ONE.search(first):
        # torch's 0/1 specialization: its dynamic sizes are at least 2 (ShapeEnv's size-like range starts at 2), so
        # this guard fails only for a size of 0 or 1
        return {"size_one"}
    if SIZE.search(first) and "mismatch" not in first:
        # a guard on a symbol's range or value: torch compiled the dimension dynamic and then bounded or fixed it
        return sizes | {"specialized"}
    if SIZE.search(first):
        return sizes
    if "dispatch key set mismatch" in first or "inference" in first:
        return {"inference_mode", "stage_switch"}
    if "dtype mismatch" in first:
        return {"tensor_property"} | (sizes if SIZE.search(text) else set())
    if "requires_grad mismatch" in first:
        return {"tensor_property", "trainable_params", "stage_switch"}
    if re.search(r"\.training\b", first):
        return {"module_mode", "stage_switch"}
    return None


def _kind(stage: str | None) -> str:
    """Training or evaluation: the product's classifier keeps a frame's first batch per kind of stage."""
    return "train" if stage in ("train", None) else "eval"


def _in_first_batch(truth: Truth, metric: dict[str, Any], batch: dict[str, Any] | None) -> bool:
    """Whether ``metric``'s recompile ran in the batch of its frame's first compile in that kind of stage."""
    if batch is None:
        return False
    frame = frame_attempt(metric["compile_id"])[0]
    for other in truth.frames:  # in torch's order: the frame's first compile in this kind of stage
        if frame_attempt(other["compile_id"])[0] != frame:
            continue
        first = truth.batch_at(other["start_time_us"])
        if first is not None and _kind(first["stage"]) == _kind(batch["stage"]):
            return first is batch and other is not metric
    return False


def causes(model: str, product: Product, truth: Truth) -> list[Fact]:
    wrong, judged = [], 0
    for span, metric in _pairs(product, truth):
        attributes = span["attributes"]
        if attributes.get("compile.trigger") == "lazy_backward" or not attributes.get("compile.is_recompile"):
            continue
        cause = attributes.get("compile.recompile_cause", "")
        if cause == "recompile_limit":
            allowed: set[str] | None = {"recompile_limit"} if truth.fell_back else set()
        else:
            batch = truth.batch_at(metric["start_time_us"])
            allowed = acceptable_causes(truth.reason_lines(metric), batch, _in_first_batch(truth, metric, batch))
        if allowed is None:
            continue
        if truth.raw["torch_kwargs"].get("dynamic") is True and allowed & {"changing_dim", "last_batch"}:
            # a size mismatch under dynamic=True: torch compiled that dimension for one size (its logs say
            # set_replacement ... range_refined_to_singleton; the graph's input shape holds a number, not a symbol)
            allowed = allowed | {"specialized"}
        judged += 1
        if cause not in allowed:
            wrong.append((metric["compile_id"], cause, allowed, truth.reason_lines(metric)))
    if not wrong:
        return [Fact(model, "recompile causes", True if judged else None, f"{judged} judged", "reason text")]
    compile_id, cause, allowed, lines = wrong[0]
    return [
        Fact(
            model,
            "recompile causes",
            False,
            f"{compile_id}: {cause}",
            f"{' or '.join(sorted(allowed))}: {lines[0][:160]}",
            f"{len(wrong)} of {judged}: " + "; ".join(f"{w[0]} {w[1]}" for w in wrong),
        )
    ]


def stages(model: str, product: Product, truth: Truth) -> list[Fact]:
    wrong, steps = [], []
    for span, metric in _pairs(product, truth):
        attributes = span["attributes"]
        batch = truth.batch_at(metric["start_time_us"])
        stage = truth.stage_at(metric["start_time_us"])
        if attributes.get("train.stage") != stage:
            wrong.append(
                f"{metric['compile_id']}{'' if metric['is_forward'] is not False else '(bw)'}: "
                f"{attributes.get('train.stage')} vs {stage}"
            )
        if batch and (attributes.get("train.batch_index"), attributes.get("train.global_step")) != (
            batch["batch_idx"],
            batch["global_step"],
        ):
            steps.append(
                f"{metric['compile_id']}: batch {attributes.get('train.batch_index')} "
                f"step {attributes.get('train.global_step')} vs batch {batch['batch_idx']} step {batch['global_step']}"
            )
    facts = [
        _verdict(model, "stage of each compile", wrong, True, ("all", "the loop running")),
        _verdict(model, "batch and step of each compile", steps, True, ("all", "the batch running")),
    ]
    fell = product.summary.get("fell_back_to_eager") or []
    if fell or truth.fell_back:
        limit = [m for s, m in _pairs(product, truth) if s["attributes"].get("compile.fell_back_to_eager")]
        truth_stages = sorted({_fallback_stage(truth, m["start_time_us"]) for m in limit})
        said = sorted({str(item.get("stage")) for item in fell})
        facts.append(
            Fact(
                model,
                "stage of a fallback",
                said == truth_stages,
                ", ".join(said) or "none",
                ", ".join(truth_stages) or "a fallback torch logged",
            )
        )
    return facts


def _fallback_stage(truth: Truth, time_us: int) -> str:
    """The stage the summary names a fallback's: ``validate()`` where ``Trainer.validate`` ran it by itself."""
    batch = truth.batch_at(time_us)
    stage = truth.stage_at(time_us)
    return "validate()" if batch and batch["fn"] != "fit" and stage == "validate" else stage


def _cause_stage(batch: dict[str, Any] | None) -> set[str]:
    if batch is None:
        return set()
    stage = str(batch["stage"])
    if batch["fn"] == "fit" or stage == "sanity_check":
        return {stage}
    # test and predict always run by themselves: the summary's text says predict(), its JSON predict
    return {f"{stage}()", stage} if stage in ("test", "predict") else {f"{stage}()"}


def cause_stages(model: str, product: Product, truth: Truth) -> list[Fact]:
    """Each recompile cause's stages (the summary's 'in validation', 'predict()') and steps against the loops
    running when torch started those compiles."""
    by_cause: dict[str, set[str]] = {}
    steps: dict[str, set[int]] = {}
    for span, metric in _pairs(product, truth):
        cause = span["attributes"].get("compile.recompile_cause")
        batch = truth.batch_at(metric["start_time_us"])
        if cause and metric["is_forward"] is not False:
            by_cause.setdefault(cause, set()).update(_cause_stage(batch))
            if batch is not None:
                steps.setdefault(cause, set()).add(int(batch["global_step"]))
    wrong, wrong_steps = [], []
    for item in product.summary["recompile_causes"]:
        said = set(item["stages"])
        right = by_cause.get(item["cause"], set())
        if not said <= right or not right:
            wrong.append(f"{item['cause']}: {sorted(said)} vs {sorted(right)}")
        said_steps = set(item.get("steps", [])) | (
            {item["first_step"]} if item.get("first_step") is not None else set()
        )
        if item["cause"] in steps and not said_steps <= steps[item["cause"]]:
            wrong_steps.append(f"{item['cause']}: steps {sorted(said_steps)} vs {sorted(steps[item['cause']])}")
    count = len(product.summary["recompile_causes"])
    return [
        _verdict(model, "stage of each cause", wrong, True, (f"{count} causes", "loops running")),
        _verdict(
            model, "steps of each cause", wrong_steps, True, (f"{count} causes", "global steps of the batches running")
        ),
    ]


def _joined(text: str) -> list[str]:
    """The summary's statements, each on one line (continuations folded)."""
    lines: list[str] = []
    for line in text.splitlines():
        if lines and line.startswith("    ") and not line.strip().startswith(("frame", "-", "cause")):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line.strip())
    return lines


SHARE_OF_IT = re.compile(r"([\d.]+) s of the [^;]*?([\d.]+) s \(([\d.]+)% of it\)")
SHARE_OF = re.compile(r"^[^:]*: ([\d.]+) s [^;]*; ([\d.]+)% of the ([^']+)'s ([\d.]+) s")


def _half_unit(number: str) -> float:
    """Half the last printed digit: how far the printed figure may lie from the exact one."""
    return 0.5 * 10 ** -len(number.partition(".")[2])


def _share_fits(part: str, whole: str, share: str, scale: float = 100.0) -> bool:
    """``share`` is ``part`` over ``whole`` within the rounding of all three as printed."""
    p, w, s = float(part), float(whole), float(share)
    low = scale * max(p - _half_unit(part), 0) / (w + _half_unit(whole))
    high = scale * (p + _half_unit(part)) / max(w - _half_unit(whole), 1e-9)
    return low - _half_unit(share) <= s <= high + _half_unit(share)


def shares(model: str, product: Product, truth: Truth) -> list[Fact]:
    said = product.summary
    facts = []
    if said.get("wall_s"):
        part, whole, share = (repr(said[key]) for key in ("compile_in_loop_s", "wall_s", "compile_share_of_loop"))
        facts.append(
            Fact(model, "share of the loop (json)", _share_fits(part, whole, share, 1.0), share, f"{part} / {whole}")
        )
    wrong, found = [], 0
    for line in _joined(product.text):
        for part, whole, percent in SHARE_OF_IT.findall(line):
            found += 1
            if not _share_fits(part, whole, percent):
                wrong.append(f"{percent}% for {part} s of {whole} s")
        match = SHARE_OF.search(line)
        if match:
            found += 1
            part, percent, whole = match.group(1), match.group(2), match.group(4)
            if not _share_fits(part, whole, percent):
                wrong.append(
                    f"{percent}% for {part} s of the {match.group(3)}'s {whole} s "
                    f"({100 * float(part) / float(whole):.1f}%)"
                )
    facts.append(
        Fact(
            model,
            "shares in the text",
            not wrong if found else None,
            wrong[0] if wrong else f"{found} shares",
            "part over whole",
            "; ".join(wrong),
        )
    )
    in_loop = (
        sum(
            m["duration_us"]
            for m in truth.metrics
            if (b := truth.batch_at(m["start_time_us"])) and b["fn"] == "fit" and b["stage"] in ("train", "validate")
        )
        / 1e6
    )
    facts.append(
        Fact(
            model,
            "compiling in the loop",
            abs(said["compile_in_loop_s"] - in_loop) <= 0.0015,
            f"{said['compile_in_loop_s']} s",
            f"{in_loop:.6f} s (torch's compiles in fit's batches)",
        )
    )
    return facts


def _first_step_stage(batch: dict[str, Any]) -> str:
    """How the summary names a batch's stage: ``validate()`` for ``Trainer.validate`` run by itself."""
    return "validate()" if batch["stage"] == "validate" and batch["fn"] != "fit" else str(batch["stage"])


def first_steps(model: str, product: Product, truth: Truth) -> list[Fact]:
    """Each loop's first step: its compile time is torch's compiles started in that batch; its wall time holds the
    batch as Lightning's hooks timed it (the oracle's callback runs beside the product's: a few ms apart)."""
    wrong, walls, judged = [], [], 0
    seen: set[tuple[str, int]] = set()
    for item in product.summary.get("first_steps", []):
        stage = item["stage"].removesuffix("()")
        first = next(
            (
                b
                for b in truth.raw["batches"]
                if b["stage"] == stage
                and b["global_step"] == item["global_step"]
                and b["batch_idx"] == 0
                and (b["start_us"], b["stage"]) not in seen
                and _first_step_stage(b) in (item["stage"], stage)
            ),
            None,
        )
        if first is None:
            wrong.append(f"{item['stage']} at step {item['global_step']}: no such first batch")
            continue
        seen.add((first["start_us"], first["stage"]))
        judged += 1
        window = (first["end_us"] - first["start_us"]) / 1e6
        failed = truth.raw["status"] == "failed" and first is truth.raw["batches"][-1]  # ended by the raise, not a hook
        if not failed and not window - 0.0015 <= item["wall_s"] <= window + 0.05:
            walls.append(f"{item['stage']} at step {item['global_step']}: {item['wall_s']} s vs {window:.6f} s")
        inside = [m for m in truth.metrics if first["start_us"] <= m["start_time_us"] <= first["end_us"]]
        compiled = sum(m["duration_us"] for m in inside) / 1e6
        if abs(item["compile_s"] - compiled) > 0.0015:
            wrong.append(f"{item['stage']} at step {item['global_step']}: {item['compile_s']} s vs {compiled:.6f} s")
        phases = item.get("compile_phases_s", {})
        for phase, forward in (("forward", True), ("backward", False)):
            spent = sum(m["duration_us"] for m in inside if (m["is_forward"] is not False) == forward) / 1e6
            if abs(phases.get(phase, 0.0) - spent) > 0.0015:
                said_phase = phases.get(phase, 0.0)
                wrong.append(f"{item['stage']} at step {item['global_step']}, {phase}: {said_phase} s vs {spent:.6f} s")
    return [
        _verdict(
            model,
            "first steps' compile time",
            wrong,
            bool(judged),
            (f"{judged} first steps", "torch's compiles in that batch"),
        ),
        _verdict(
            model,
            "first steps' wall time",
            walls,
            bool(judged),
            (f"{judged} first steps", "the batch, start to end (at most 50 ms apart)"),
        ),
    ]


def _paths(raw: dict[str, Any]) -> dict[str, str]:
    """Where the run's interpreter keeps packages and the standard library (its truth records them; a run recorded
    before that: this interpreter's)."""
    return raw.get("paths") or {name: sysconfig.get_paths()[name] for name in ("purelib", "platlib", "stdlib")}


def true_owner(location: str, cwd: Path, paths: dict[str, str]) -> str:
    """Whose code a ``file:line`` is, by where the file lies in the run's interpreter (``paths``): an installed
    package's top-level name, ``python`` for the standard library, else ``user``."""
    file = Path(location.rsplit(":", 1)[0])
    path = (file if file.is_absolute() else cwd / file).resolve()
    for site in {Path(paths["purelib"]).resolve(), Path(paths["platlib"]).resolve()}:
        if path.is_relative_to(site):
            top = path.relative_to(site).parts[0]
            return top.removesuffix(".py")
    if path.is_relative_to(Path(paths["stdlib"]).resolve()):
        return "python"
    return "user"


def owners(model: str, product: Product, truth: Truth, cwd: Path) -> list[Fact]:
    wrong, judged = [], 0
    for event in product.breaks:
        attributes = event["attributes"]
        location = attributes.get("graph_break.location")
        if not location:
            continue
        judged += 1
        right = true_owner(location, cwd, _paths(truth.raw))
        if attributes.get("graph_break.owner") != right:
            wrong.append(f"{location}: {attributes.get('graph_break.owner')} vs {right}")
    wrong = list(dict.fromkeys(wrong))
    return [_verdict(model, "graph-break owners", wrong, bool(judged), (f"{judged} breaks", "where the file lies"))]


_IN_PARENS = re.compile(r"\(([^()]+:\d+)\)$")


def locations(model: str, product: Product, cwd: Path) -> list[Fact]:
    """Every ``file:line`` the summary names opens from the directory the command ran in (or is absolute), as
    compilers print locations."""
    said = product.summary
    found = [item["location"] for item in said["graph_breaks"]]
    found += [line for item in said["graph_breaks"] for line in item.get("user_locations", [])]
    found += [
        m.group(1) for item in said["recompile_causes"] for frame in item["frames"] if (m := _IN_PARENS.search(frame))
    ]
    missing = []
    for location in dict.fromkeys(found):
        file = Path(location.rsplit(":", 1)[0])
        if not location.startswith("<") and not (file if file.is_absolute() else cwd / file).is_file():
            missing.append(f"{location} vs no such file from {cwd}")
    return [
        _verdict(model, "locations open", missing, bool(found), (f"{len(set(found))} locations", "files that exist"))
    ]


def fixes(model: str, product: Product, truth: Truth) -> list[Fact]:
    """No fix names what is already on: dynamic=True where the run compiled with it, drop_last for predict's
    last batch (it would drop predictions)."""
    dynamic = truth.raw["torch_kwargs"].get("dynamic") is True
    wrong, judged = [], 0
    for item in product.summary["recompile_causes"]:
        fix = item.get("fix", "")
        if not fix or item.get("expected") == item.get("count"):
            continue
        judged += 1
        if dynamic and "dynamic': True" in fix:
            wrong.append(f"{item['cause']}: advises dynamic=True vs the run compiled with it")
        # a warning against drop_last ("drop_last=True would leave samples unevaluated") is not advice to set it
        if re.search(r"drop_last=True(?! would)", fix) and any(stage.startswith("predict") for stage in item["stages"]):
            wrong.append(f"{item['cause']} in {item['stages']}: advises drop_last=True vs it drops predictions")
    return [_verdict(model, "fixes", wrong, bool(judged), (f"{judged} fixes", ""))]


_FRAME = re.compile(r"^(\S+) \((.+):(\d+)\)$")


def _frame(name: str, file: str, line: int, cwd: Path) -> tuple[str, Path, int]:
    path = Path(file)
    return name, (path if path.is_absolute() else cwd / path).resolve(), line


def cause_figures(model: str, product: Product, truth: Truth, cwd: Path) -> list[Fact]:
    """Each recompile cause's count, compile time and frames against torch's compiles the run's spans give that
    cause: how many frame compiles, the sum of their ``duration_us`` and their backward graphs' (a recompile's cost),
    their ``co_name``, ``co_filename`` and ``co_firstlineno``."""
    given: dict[str, list[dict[str, Any]]] = {}
    for span, metric in _pairs(product, truth):
        cause = span["attributes"].get("compile.recompile_cause")
        if cause:
            given.setdefault(cause, []).append(metric)
    # the summary gives a cause one row per kind of stage (training, evaluation, the tuner: the fix differs), so
    # last_batch in training and in validation are two rows: their sums are the cause's
    rows: dict[str, list[dict[str, Any]]] = {}
    for item in product.summary["recompile_causes"]:
        rows.setdefault(item["cause"], []).append(item)
    wrong, frames = [], []
    for cause, items in rows.items():
        spent = sum(metric["duration_us"] for metric in given.get(cause, [])) / 1e6
        metrics = [metric for metric in given.get(cause, []) if metric["is_forward"] is not False]
        count, said_s = sum(item["count"] for item in items), sum(item["compile_s"] for item in items)
        # each row's compile_s is rounded to the ms
        if count != len(metrics) or abs(said_s - spent) > 0.001 + 0.0005 * len(items):
            wrong.append(f"{cause}: {count} in {said_s:.3f} s ({len(items)} rows) vs {len(metrics)} in {spent:.6f} s")
        # a frame past the recompile limit: torch's metric of it names no code (nothing was traced)
        known = {_frame(m["co_name"], m["co_filename"], m["co_firstlineno"], cwd) for m in metrics if m["co_filename"]}
        for frame in dict.fromkeys(frame for item in items for frame in item["frames"]) if known else []:
            found = _FRAME.match(frame)
            if found and _frame(found[1], found[2], int(found[3]), cwd) not in known:
                frames.append(f"{cause}: {frame} vs {_listed(sorted(f'{n} ({f}:{line})' for n, f, line in known))}")
    causes = len(product.summary["recompile_causes"])
    return [
        _verdict(model, "count and time of each cause", wrong, True, (f"{causes} causes", "torch's compiles of it")),
        _verdict(
            model,
            "frames of each cause",
            frames,
            bool(causes),
            (f"{causes} causes", "co_name (co_filename:co_firstlineno)"),
        ),
    ]


def failures(model: str, product: Product, truth: Truth) -> list[Fact]:
    """Failed compiles as torch counted them: a compile torch gave a ``fail_type`` is one the summary says failed,
    or a frame it says fell back to eager (torch skips the frame, ``Unsupported``: its compile failed, or, in some
    releases, the frame hit the recompile limit)."""
    said = product.summary
    failed = [metric for metric in truth.metrics if metric["fail_type"]]
    fell_back = sum(not item.get("recompile_limit") for item in said["fell_back_to_eager"])
    at_limit = len(said["fell_back_to_eager"]) - fell_back
    least = said["failed_compilations"] + fell_back
    return [
        Fact(
            model,
            "failed compiles",
            least <= len(failed) <= least + at_limit,
            f"{said['failed_compilations']} failed, {fell_back} fell back to eager as their compile failed, "
            f"{at_limit} at the recompile limit",
            f"{len(failed)} with a fail_type ({_listed(sorted({str(metric['fail_type']) for metric in failed}))})",
        ),
    ]


def outside_loop(model: str, product: Product, truth: Truth) -> list[Fact]:
    """The compile time the summary puts outside the training loop, by stage, against torch's compiles started in
    the batches of each loop other than fit's training and validation."""
    spent: dict[str, float] = {}
    for metric in truth.metrics:
        batch = truth.batch_at(metric["start_time_us"])
        if batch and not (batch["fn"] == "fit" and batch["stage"] in ("train", "validate")):
            stage = _first_step_stage(batch)
            spent[stage] = spent.get(stage, 0.0) + metric["duration_us"] / 1e6
    said = product.summary["compile_outside_loop_s"]
    wrong = [
        f"{stage} {said.get(stage, 0.0)} s vs {spent.get(stage, 0.0):.6f} s"
        for stage in sorted({*said, *spent})
        if abs(said.get(stage, 0.0) - spent.get(stage, 0.0)) > 0.0015
    ]
    return [
        _verdict(model, "compiling outside the loop", wrong, True, (f"{len(said)} stages", "torch's compiles there"))
    ]


def run_times(model: str, product: Product, truth: Truth) -> list[Fact]:
    """The loop's and the application's wall time against Lightning's own: the loop holds every batch fit trained
    and validated and lies within fit's calls; the application holds every Trainer call."""
    said = product.summary
    ended = [call for call in truth.raw["calls"] if "end_us" in call]
    fits = sum(call["end_us"] - call["start_us"] for call in ended if call["call"] == "fit") / 1e6
    batches = [
        batch for batch in truth.raw["batches"] if batch["fn"] == "fit" and batch["stage"] in ("train", "validate")
    ]
    inside = sum(batch["end_us"] - batch["start_us"] for batch in batches if "end_us" in batch) / 1e6
    calls = sum(call["end_us"] - call["start_us"] for call in ended) / 1e6
    facts = [
        Fact(
            model,
            "application time",
            said["application_s"] + 0.0015 >= calls,
            f"{said['application_s']} s",
            f"{calls:.6f} s in the Trainer's calls",
        )
    ]
    if said.get("wall_s") and truth.raw["status"] == "finished":
        facts.append(
            Fact(
                model,
                "loop time",
                inside - 0.0015 <= said["wall_s"] <= fits + 0.0015,
                f"{said['wall_s']} s",
                f"{inside:.6f} s in fit's batches, {fits:.6f} s in its calls",
            )
        )
    return facts


def compile_resources(model: str, product: Product, truth: Truth) -> list[Fact]:
    """Each compile's resources are torch's compiles (id, direction, duration); their CPU time and memory lie
    within what the kernel counted for the process (``getrusage``)."""
    said, process = product.summary.get("compile_resources"), truth.raw.get("process")
    if not said or not process:
        return [Fact(model, "compile resources", None, "none measured" if not said else str(said), "no getrusage")]
    measured = {(c["compile_id"], c["trigger"] != "lazy_backward"): c["duration_s"] for c in said["compiles"]}
    # a metric naming no code is a frame torch refused at the recompile limit: nothing compiled, nothing to measure
    traced = [m for m in truth.metrics if m["co_filename"] or m["is_forward"] is False]
    torch_ids = {_metric_key(m): m["duration_us"] / 1e6 for m in traced}
    slip = max((abs(measured[key] - torch_ids[key]) for key in measured.keys() & torch_ids.keys()), default=0.0)
    own_cpu = said["cpu_s"] - said["worker_cpu_s"]
    facts = [
        Fact(
            model,
            "compiles measured",
            measured.keys() == torch_ids.keys() and said["compiles_measured"] == len(torch_ids) and slip <= 6e-4,
            f"{said['compiles_measured']}: {_ids(sorted(measured))}",
            _ids(sorted(torch_ids)),
            f"duration_s minus duration_us: up to {slip * 1e6:.0f} µs",
        ),
        Fact(
            model,
            "compile CPU time",
            0 < own_cpu <= process["cpu_s"] + 0.01,
            f"{said['cpu_s']} s ({said['worker_cpu_s']} s in workers)",
            f"the process's own {process['cpu_s']:.2f} s, its reaped children's {process['children_cpu_s']:.2f} s",
        ),
    ]
    if not said["worker_cpu_s"]:  # the process alone: its resident memory never passed its own high-water mark
        bound, against = process["max_rss_mb"] + 0.05, f"ru_maxrss {process['max_rss_mb']:.1f} MB"
    else:  # compile workers ran beside it, whose memory ru_maxrss does not hold: the machine's memory bounds them all
        bound = process.get("machine_mb")
        against = f"the machine's {bound:.0f} MB (compile workers ran)" if bound else "no machine size recorded"
    facts.append(
        Fact(
            model,
            "compile memory",
            said["peak_host_mb"] <= said["peak_host_rss_mb"] <= bound if bound else None,
            f"grew {said['peak_host_mb']} MB, to {said['peak_host_rss_mb']} MB",
            against,
        )
    )
    return facts


def fallback_costs(model: str, product: Product, truth: Truth) -> list[Fact]:
    """Each fallback's cost counts the training batches from the one its compile failed in to the run's end, as
    Lightning ran them (the frame ran eagerly in each)."""
    failed = [metric for metric in truth.metrics if metric["fail_type"]]
    trained = [batch for batch in truth.raw["batches"] if batch["stage"] == "train"]
    wrong, judged = [], 0
    for item in product.summary["fell_back_to_eager"]:
        if not (item.get("cost") or {}).get("batches_since"):
            continue
        at = [
            m["start_time_us"]
            for m in failed
            if (batch := truth.batch_at(m["start_time_us"])) and batch["global_step"] == item["step"]
        ]
        if not at:
            continue
        judged += 1
        batch = truth.batch_at(at[0]) or {}
        since = sum(b["start_us"] >= batch.get("start_us", at[0]) for b in trained)
        if item["cost"]["batches_since"] != since:
            wrong.append(f"{item['frame']}: {item['cost']['batches_since']} batches since vs {since}")
    return [_verdict(model, "fallback cost", wrong, bool(judged), (f"{judged} fallbacks", "training batches since"))]


def options(model: str, product: Product, truth: Truth) -> list[Fact]:
    """The compile options each frame compile records (what the advice depends on) are those the run passed to
    ``torch.compile`` through ``JitConfig(torch_kwargs=...)``."""
    kwargs = truth.raw["torch_kwargs"]
    dynamic = {True: "true", False: "false"}.get(kwargs.get("dynamic"), "auto")
    given = (kwargs["backend"], dynamic, bool(kwargs.get("fullgraph")))
    said = {
        (a.get("compile.backend"), a.get("compile.dynamic"), bool(a.get("compile.fullgraph")))
        for span in product.spans
        if (a := span["attributes"]).get("compile.trigger") == "dynamo" and not a.get("compile.fell_back_to_eager")
    }  # a frame refused (the recompile limit) compiled with no options
    # no frame compiled (torch 2.8 refuses an LSTM's or GRU's frame, Unsupported, and runs it eagerly): no options
    # stated, nothing to judge
    return [
        Fact(
            model,
            "compile options",
            said == {given} if said else None,
            str(sorted(map(str, said))) if said else "no frame compiled",
            f"torch_kwargs {kwargs}",
        )
    ]


def cache(model: str, product: Product, truth: Truth) -> list[Fact]:
    """The compile cache's look-ups and the start's verdict against torch's cache counts of each compile: a warm
    start (``warm_start`` stated) only where every look-up hit."""
    counted = [(name, metric.get(name) or 0) for metric in truth.metrics for name in metric if "cache_" in name]
    hits = sum(value for name, value in counted if name.endswith("_hit_count"))
    misses = sum(value for name, value in counted if name.endswith("_miss_count"))
    saved = sum(value for name, value in counted if name == "remote_cache_time_saved_s")
    said = product.summary["compile_cache"]
    residual = product.summary.get("warm_start")
    warm = residual is not None
    facts = [
        Fact(
            model,
            "cache look-ups",
            (said["hits"], said["misses"]) == (hits, misses) and abs(said["saved_s"] - saved) <= 0.0015,
            f"{said['hits']} hits, {said['misses']} misses, {said['saved_s']} s saved",
            f"{hits} hits, {misses} misses, {saved:.6f} s saved (the metrics' cache counts)",
        ),
        Fact(
            model,
            "warm start",
            warm == (hits > 0 and misses == 0),
            "a warm start" if warm else "no warm start",
            f"{hits} hits, {misses} misses",
        ),
    ]
    if residual:  # a warm start's phases add up to its compile time, torch's; its recompiles are torch's
        phases, total = residual["phases"], sum(metric["duration_us"] for metric in truth.metrics) / 1e6
        again = sum(m["duration_us"] for m in truth.metrics if frame_attempt(m["compile_id"])[1] > 0) / 1e6
        facts.append(
            Fact(
                model,
                "warm start phases",
                abs(sum(phases.values()) - residual["compile_s"]) <= 0.0005 * (len(phases) + 1)
                and abs(residual["compile_s"] - total) <= 0.0015
                and abs(phases.get("recompiles", 0.0) - again) <= 0.0015,
                f"{' + '.join(f'{name} {value}' for name, value in phases.items())} of {residual['compile_s']} s",
                f"{total:.6f} s of duration_us, {again:.6f} s of it recompiling",
            )
        )
    return facts


def checks(model: str, truth: Truth, out: Path, cwd: Path) -> list[Fact]:
    recompiles, breaks = len(truth.recompiles), truth.graph_breaks
    finished = truth.raw["status"] == "finished"
    within = 0 if finished else 3  # docs/ci-gate.md: 3 for a run that did not finish, whatever its budgets
    cases: list[tuple[str, list[str], int]] = []
    cases.append(("check --max-recompiles R", ["--max-recompiles", str(recompiles)], within))
    if recompiles:
        cases.append(("check --max-recompiles R-1", ["--max-recompiles", str(recompiles - 1)], 1 if finished else 3))
    cases.append(("check --max-graph-breaks G", ["--max-graph-breaks", str(breaks)], within))
    if breaks:
        cases.append(("check --max-graph-breaks G-1", ["--max-graph-breaks", str(breaks - 1)], 1 if finished else 3))
    cases.append(("check --no-eager-fallback", ["--no-eager-fallback"], 3 if not finished else int(truth.fell_back)))
    cases.append(("check --max-recompiles -1", ["--max-recompiles", "-1"], 2))
    facts = []
    for name, args, expected in cases:
        done = cli("check", str(out / "run.jsonl"), *args, cwd=cwd)
        said = (done.stdout + done.stderr).replace(str(out / "run.jsonl"), "run.jsonl").strip().splitlines()
        facts.append(
            Fact(
                model,
                name,
                done.returncode == expected,
                f"exit {done.returncode}",
                f"exit {expected}",
                f"`check {' '.join(args)}` (torch: {recompiles} recompiles, {breaks} graph breaks, "
                f"{truth.restarts} compiles restarted): " + (said[-1][:200] if said else ""),
            )
        )
    return facts


def status(model: str, product: Product, truth: Truth) -> list[Fact]:
    said = product.summary["status"]["state"]
    error = [line for line in truth.raw["error"].splitlines() if line.strip()]
    return [Fact(model, "status", said == truth.raw["status"], said, truth.raw["status"], error[-1] if error else "")]


def judge(out: Path, cwd: Path) -> list[Fact]:
    """Every fact of the run in ``out`` (written by ``oracle.run`` with ``cwd`` as its working directory)."""
    truth = read_truth(out)
    model = f"{truth.raw['model']} ({truth.raw['backend']})"
    product = read_product(out, cwd)
    facts = [*status(model, product, truth), *counts(model, product, truth), *durations(model, product, truth)]
    facts += [*reasons(model, product, truth), *causes(model, product, truth), *stages(model, product, truth)]
    facts += [
        *cause_stages(model, product, truth),
        *first_steps(model, product, truth),
        *shares(model, product, truth),
        *owners(model, product, truth, cwd),
    ]
    facts += [*fixes(model, product, truth), *locations(model, product, cwd), *checks(model, truth, out, cwd)]
    facts += [*cause_figures(model, product, truth, cwd), *failures(model, product, truth)]
    facts += [*outside_loop(model, product, truth), *run_times(model, product, truth)]
    facts += [*compile_resources(model, product, truth), *cache(model, product, truth), *options(model, product, truth)]
    facts += fallback_costs(model, product, truth)
    if truth.tlparse.error:
        facts.append(Fact(model, "tlparse", None, "", truth.tlparse.error))
    return facts
