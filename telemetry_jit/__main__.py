"""``python -m telemetry_jit``: the ``telemetry-jit`` command."""

import sys

from telemetry_jit.cli import main

sys.exit(main())
