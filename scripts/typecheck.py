#!/usr/bin/env python3
"""Type-check the package as it is installed: ``exporters/`` is ``telemetry_jit.exporters``.

mypy knows no ``package-dir`` mapping, so this lays the package out as installed, in a throwaway
folder of links to the real files, and runs mypy there (paths in its report read
``telemetry_jit/exporters/...`` for ``exporters/...``).

    python3 scripts/typecheck.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        package = Path(folder) / "telemetry_jit"
        package.mkdir()
        for entry in (ROOT / "telemetry_jit").iterdir():
            if entry.name != "__pycache__":
                (package / entry.name).symlink_to(entry)
        (package / "exporters").symlink_to(ROOT / "exporters")
        command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "telemetry_jit"]
        return subprocess.run(command, cwd=folder).returncode


if __name__ == "__main__":
    sys.exit(main())
