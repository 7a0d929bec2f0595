#!/usr/bin/env bash
# Installs telemetry-jit (editable) with its OTLP extra into the current Python.
# An existing torch (>= 2.8) is left alone; without one, torch 2.13.0 is installed, which on
# a CPU-only machine with the on-disk wheel is the CPU build (no CUDA packages are pulled).
#
#   --thunder      also Lightning Thunder (the thunder extra)
#   --test-tools   also thunder and the test extra (the suite drives thunder), and the outside tools some
#                  tests drive: Debian's chromium and prometheus (need root),
#                  speedscope (npm) and Arize Phoenix (in .venv-phoenix). A test whose tool could
#                  not be installed is skipped and says why.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
say() { echo "telemetry-jit setup: $*" >&2; }

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
    say "installing torch 2.13.0 (no torch here; the CPU wheel where one lies on disk, about 30 s)"
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
extras="otlp"
case "${1:-}" in
    --thunder) extras="otlp,thunder" ;;
    --test-tools) extras="otlp,thunder,test" ;;
    "") ;;
    *) echo "usage: bash scripts/install.sh [--thunder | --test-tools]" >&2; exit 2 ;;
esac
say "installing telemetry-jit (editable) with lightning, nv-one-logger and OpenTelemetry's OTLP exporters ($extras; about 1 minute)"
"$PY" -m pip install --quiet -e ".[$extras]"

if [ "${1:-}" = "--test-tools" ]; then
    if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        say "installing Debian's chromium for the report tests (apt, about 1 minute)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
            || echo "warning: could not install chromium; the browser tests will be skipped"
    fi
    if ! command -v prometheus >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        say "installing Debian's prometheus for the metrics test (apt, about 30 s)"
        # the package may start a service of its own; the test runs its own instance on a free loopback port
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus) >/dev/null 2>&1 \
            || echo "warning: could not install prometheus; the Prometheus metrics test will be skipped"
    fi
    if [ ! -d .node-speedscope/node_modules/speedscope ] && command -v npm >/dev/null 2>&1; then
        say "installing speedscope for the trace test (npm, about 20 s)"
        npm install --silent --prefix .node-speedscope speedscope@1.25.0 >/dev/null 2>&1 \
            || echo "warning: could not install speedscope; the trace consumer test will be skipped"
    fi
    if [ ! -x .venv-phoenix/bin/phoenix ]; then
        say "installing Arize Phoenix in .venv-phoenix for the viewer test (about 2 minutes)"
        # its own environment: Phoenix's dependencies never meet the project's
        ("$PY" -m venv .venv-phoenix && .venv-phoenix/bin/pip install --quiet arize-phoenix) >/dev/null 2>&1 \
            || echo "warning: could not install arize-phoenix; the viewer test will be skipped"
    fi
fi
say "done"
