"""The user's own package, installed with ``pip install .`` (not editable) into site-packages, is the user's code:
a graph break in it counts for ``check --user-code-only``. Whose a package is goes by where it came from (PEP 610's
``direct_url.json``), not by where it sits (tests/unit/test_breaks.py has the other origins)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]

PACKAGE = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "advmodels"
        version = "0.1"
    """,
    "advmodels/__init__.py": """
        import torch


        class Breaking(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(4, 4)

            def forward(self, x):
                x = self.linear(x)
                torch._dynamo.graph_break()
                return x.relu()
    """,
}

LOOP = textwrap.dedent(
    """
    import sys
    import torch
    import telemetry_jit
    from advmodels import Breaking

    telemetry_jit.configure("own-package", file=sys.argv[1])
    compiled = torch.compile(Breaking(), backend="eager")
    with telemetry_jit.CompileTelemetry() as telemetry:
        for step in range(2):
            telemetry.step(step)
            compiled(torch.randn(2, 4)).sum().backward()
    telemetry_jit.shutdown()
    print(Breaking.__module__, sys.modules["advmodels"].__file__)
    """
)


def pip_install(source: Path, prefix: Path) -> Path:
    """``pip install --prefix`` (not editable, offline): the site-packages folder it installed into."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--prefix", str(prefix), str(source)],
        check=True,
        capture_output=True,
    )
    relative = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    return prefix / relative


def test_a_break_in_the_users_package_installed_with_pip_counts_as_theirs(tmp_path: Path) -> None:
    source = tmp_path / "advmodels-src"
    for name, text in PACKAGE.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(textwrap.dedent(text))
    site_packages = pip_install(source, tmp_path / "prefix")
    installed = site_packages / "advmodels" / "__init__.py"
    (info,) = site_packages.glob("advmodels-0.1.dist-info")
    assert installed.exists() and json.loads((info / "direct_url.json").read_text())["dir_info"] == {}
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site_packages), str(ROOT)])}
    environment.pop("TELEMETRY_JIT_RUN_ID", None)
    out = tmp_path / "t.jsonl"
    ran = subprocess.run(
        [sys.executable, "-c", LOOP, str(out)], capture_output=True, text=True, env=environment, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert str(installed) in ran.stdout  # the installed copy ran, not the source
    check = [sys.executable, "-m", "telemetry_jit", "check", str(out), "--max-graph-breaks", "0"]
    gate = subprocess.run([*check, "--user-code-only"], capture_output=True, text=True, env=environment)
    assert gate.returncode != 0, gate.stdout + gate.stderr
    owners = [
        record["attributes"].get("graph_break.owner")
        for line in out.read_text().splitlines()
        if (record := json.loads(line)).get("attributes", {}).get("graph_break.owner")
    ]
    assert owners and set(owners) == {"user"}, owners
