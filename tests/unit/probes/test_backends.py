"""Compiler plug-ins found through the ``telemetry_jit.compilers`` entry points: the built-ins are declared there,
an installed package's is found without being imported by hand, and a broken one costs a warning, not the rest."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from telemetry_jit.probes.backends import backends, compiler_backend


class Toy:
    name, title = "toy-found", "toy.found"

    def check(self, config: Any) -> None:
        pass

    def compile(self, module: Any, label: str, config: Any) -> Any:
        return lambda: True

    def observer(self) -> None:
        return None


@pytest.mark.any_torch
def test_an_installed_plug_in_is_found_and_a_broken_one_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert {"torch", "thunder", "thunder-dynamo"} <= {backend.name for backend in backends()}
    package = tmp_path / "toy_found-0.1.dist-info"
    package.mkdir()
    (package / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-found\nVersion: 0.1\n")
    (package / "entry_points.txt").write_text(
        f"[telemetry_jit.compilers]\ntoy-found = {__name__}:Toy\nbroken = no_such_package_anywhere:Backend\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(RuntimeWarning, match="no_such_package_anywhere:Backend failed to load"):
        assert isinstance(compiler_backend("toy-found"), Toy)
    monkeypatch.undo()
    with pytest.raises(LookupError, match="no compiler backend 'toy-found'"):
        compiler_backend("toy-found")  # uninstalled: gone


@pytest.mark.any_torch
def test_the_built_ins_are_the_ones_pyproject_declares_and_are_found_where_no_metadata_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from telemetry_jit.probes import backends as module

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the test extras install tomli there
        import tomli as tomllib
    project = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["telemetry_jit.compilers"] == module._BUILT_INS
    monkeypatch.setattr(module.metadata, "entry_points", lambda **_: [])  # a source checkout: no dist-info
    module._discover.cache_clear()
    try:
        assert set(module._BUILT_INS) <= set(module._discover(("no metadata",)))
    finally:
        module._discover.cache_clear()
