#!/usr/bin/env python3
"""The truth oracle: train every model of the zoo under HookedTrainer, each in a process of its own with
``TORCH_TRACE`` on, and check every statement telemetry-jit makes against torch's own record (in-process
``CompilationMetrics`` and counters, and tlparse's reading of the trace). Prints the table, model by fact, and
writes it to docs/oracle.md.

    python3 scripts/oracle.py                         # the whole zoo: aot_eager, and inductor for a few
    python3 scripts/oracle.py --models gpt2 lstm      # some of it
    python3 scripts/oracle.py --list

Needs transformers (``pip install transformers``) for its models and tlparse (``pip install tlparse``).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
        "--judge", type=Path, metavar="OUT", help="judge the runs an earlier --out holds again, no training"
    )
    args = parser.parse_args()
    if args.list:
        print("\n".join(f"{case.name}\t{case.family}" for case in ZOO.values()))
        return 0
    names = args.models or list(ZOO)
    out = args.out or Path(tempfile.mkdtemp(prefix="oracle-"))
    facts: list[Fact] = []
    started = time.time()
    if args.judge:
        for folder in sorted(path.parent for path in args.judge.glob("*/truth.json")):
            facts += judge(folder, ROOT)
    for backend in [] if args.judge else args.backends:
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
    text = table(facts)
    print(text)
    if args.doc:
        write_doc(Path(args.doc), text, facts, None if args.judge else time.time() - started)
    new = [fact for fact in facts if fact.agree is False and not known(fact)]
    return 1 if new else 0


def write_doc(path: Path, text: str, facts: list[Fact], seconds: float | None) -> None:
    models = len({fact.model for fact in facts})
    wrong = [fact for fact in facts if fact.agree is False]
    xfail = sum(bool(known(fact)) for fact in wrong)
    took = f", {seconds / 60:.0f} minutes on this 2-core CPU machine" if seconds is not None else ""
    header = (ROOT / "oracle" / "doc_header.md").read_text()
    path.write_text(
        f"{header}\n## Latest table\n\n{datetime.date.today().isoformat()}, {versions()}; {models} runs, "
        f"{len(facts)} facts, {len(wrong) - xfail} disagreements not yet known and {xfail} known (xfail){took} "
        f"(`python3 scripts/oracle.py`).\n\n✓ agrees with torch, ✗ disagrees, xfail: a disagreement issue 54 "
        "lists (the product does not fix it yet), – nothing stated to judge.\n\n" + text + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
