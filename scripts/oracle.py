#!/usr/bin/env python3
"""The truth oracle: train every model of the zoo under HookedTrainer, each in a process of its own with
``TORCH_TRACE`` on, and check every statement telemetry-jit makes against torch's own record (in-process
``CompilationMetrics`` and counters, and tlparse's reading of the trace). Prints the table, model by fact, and
writes it to docs/oracle.md.

    python3 scripts/oracle.py                         # the whole zoo: aot_eager, and inductor for a few
    python3 scripts/oracle.py --models gpt2 lstm      # some of it
    python3 scripts/oracle.py --list
    python3 scripts/oracle.py --counterfactual --models conv1d_bn   # the first fix applied in a second run

Needs transformers (``pip install transformers``) for its models and tlparse (``pip install tlparse``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oracle.counterfactual import SECTION, Verdict, counterfactual, write_section  # noqa: E402
from oracle.judge import Fact, judge  # noqa: E402
from oracle.runner import ROOT, run_one  # noqa: E402
from oracle.table import known, table  # noqa: E402
from oracle.zoo import ZOO  # noqa: E402

# inductor compiles for tens of seconds a graph on a CPU: the user's models of the issue and one transformer
INDUCTOR = ["conv1d_bn", "conv1d_bn_dynamic", "gpt2"]


def versions() -> str:
    import lightning
    import torch
    import transformers

    return (
        f"torch {torch.__version__}, lightning {lightning.__version__}, transformers {transformers.__version__}, "
        f"Python {sys.version.split()[0]}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=None, help="zoo names (default: all)")
    parser.add_argument("--backends", nargs="*", default=["aot_eager", "inductor"])
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--doc", default=str(ROOT / "docs" / "oracle.md"), help="'' to write none")
    parser.add_argument("--list", action="store_true")
    parser.add_argument(
        "--counterfactual",
        action="store_true",
        help="apply each model's first fix in a second run and judge it (its own section of the page; aot_eager "
        "unless --backends names others)",
    )
    parser.add_argument(
        "--judge",
        type=Path,
        nargs="+",
        metavar="OUT",
        help="judge the runs earlier --out folders hold again, no training: one table each (a torch each)",
    )
    args = parser.parse_args()
    if args.list:
        print("\n".join(f"{case.name}\t{case.family}" for case in ZOO.values()))
        return 0
    names = args.models or list(ZOO)
    out = args.out or Path(tempfile.mkdtemp(prefix="oracle-"))
    started = time.time()
    if args.counterfactual:
        return counterfactuals(names, args, out)
    if args.judge:
        sections = [judged(out) for out in args.judge]
        for facts in sections:
            print(table(facts))
        if args.doc:
            write_doc(
                Path(args.doc),
                [(run_versions(out), facts, None) for out, facts in zip(args.judge, sections, strict=True)],
            )
        return 1 if any(fact.agree is False and not known(fact) for facts in sections for fact in facts) else 0
    facts: list[Fact] = []
    for backend in args.backends:
        for name in names:
            if backend == "inductor" and args.models is None and name not in INDUCTOR:
                continue
            begun = time.time()
            found = run_one(name, backend, out / f"{name}-{backend}", args.timeout)
            facts += found
            wrong = [fact.fact for fact in found if fact.agree is False]
            print(
                f"{name} ({backend}): {len(found)} facts, {len(wrong)} disagree {wrong} [{time.time() - begun:.0f} s]",
                flush=True,
            )
    print(table(facts))
    if args.doc:
        write_doc(Path(args.doc), [(versions(), facts, time.time() - started)])
    return 1 if any(fact.agree is False and not known(fact) for fact in facts) else 0


def counterfactuals(names: list[str], args: argparse.Namespace, out: Path) -> int:
    """The counterfactual oracle over ``names`` (or, with --judge, the runs earlier calls left, judged again): one
    row each, written into the page's section for the torch they ran on."""
    backends = args.backends if "--backends" in sys.argv else ["aot_eager"]
    runs = [(out / f"{name}-{backend}", name, backend, None) for backend in backends for name in names]
    if args.judge:  # FOLDER/NAME-BACKEND/first: the runs kept, the fixed ones judged again where their fix is the same
        firsts = sorted(first for folder in args.judge for first in folder.glob("*/first"))
        runs = [(first.parent, *first.parent.name.rsplit("-", 1), first) for first in firsts]
    verdicts: list[Verdict] = []
    for folder, name, backend, first in runs:
        begun = time.time()
        verdicts.append(counterfactual(name, backend, folder, args.timeout, first))
        print(f"{verdicts[-1].row()} [{time.time() - begun:.0f} s]", flush=True)
    print("\n".join(verdict.row() for verdict in verdicts))
    if args.doc:
        # titled as the zoo's tables are, from what the runs recorded (the same title trained or judged again)
        folders = {folder.parent for folder, *_ in runs}
        said = "; ".join(sorted({run_versions(folder, "*/first/truth.json") for folder in folders}))
        write_section(Path(args.doc), said, verdicts)
    return (
        1 if any(v.verdict in ("not removed", "diff disagrees", "no run", "second run failed") for v in verdicts) else 0
    )


def judged(out: Path) -> list[Fact]:
    facts: list[Fact] = []
    for folder in sorted(path.parent for path in out.glob("*/truth.json")):
        facts += judge(folder, ROOT)
    return facts


def run_versions(out: Path, pattern: str = "*/truth.json") -> str:
    """The versions the runs of ``out`` trained with, as their truth records them."""
    found = {json.dumps(json.loads(path.read_text())["versions"], sort_keys=True) for path in out.glob(pattern)}
    return "; ".join(", ".join(f"{k} {v}" for k, v in json.loads(one).items()) for one in sorted(found))


def write_doc(path: Path, sections: list[tuple[str, list[Fact], float | None]]) -> None:
    """The page: its header, then one table per torch the zoo ran on."""
    parts = [(ROOT / "oracle" / "doc_header.md").read_text(), "\n## Latest tables\n"]
    for versions_run, facts, seconds in sections:
        models = len({fact.model for fact in facts})
        wrong = [fact for fact in facts if fact.agree is False]
        xfail = sum(bool(known(fact)) for fact in wrong)
        took = f", {seconds / 60:.0f} minutes on this 2-core CPU machine" if seconds is not None else ""
        parts.append(
            f"\n### {versions_run}\n\n{datetime.date.today().isoformat()}: {models} runs, {len(facts)} facts, "
            f"{len(wrong) - xfail} disagreements not yet known and {xfail} known (xfail){took}.\n\n"
            "✓ agrees with torch, ✗ disagrees, xfail: a disagreement issue 54 lists (the product does not fix it "
            "yet), – nothing stated to judge.\n\n" + table(facts) + "\n"
        )
    # the counterfactual oracle's section is its own writer's (oracle.counterfactual.write_section): kept as it was
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(SECTION) :] if SECTION in old else ""
    path.write_text("".join(parts) + (f"\n{kept}" if kept else ""))


if __name__ == "__main__":
    sys.exit(main())
