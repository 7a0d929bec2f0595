"""``python -m telemetry_jit``: the ``telemetry-jit`` command."""

from telemetry_jit.cli import main

raise SystemExit(main())
