#!/usr/bin/env bash
# Installs telemetry-jit (editable) with its test and thunder extras into the current Python.
# An existing torch (>= 2.8) is left alone; without one, torch 2.13.0 is installed, which on
# a CPU-only machine with the on-disk wheel is the CPU build (no CUDA packages are pulled).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if "$PY" -c "import torch" 2>/dev/null; then
    if ! "$PY" - <<'PYCODE'
import sys, torch
major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
if (major, minor) < (2, 8):
    sys.exit(f"telemetry-jit needs torch >= 2.8; found {torch.__version__}. "
             "Upgrade torch yourself (this script leaves an existing torch alone).")
PYCODE
    then exit 1; fi
else
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[thunder,test]"
