"""What the package declares matches what it is: every subpackage is shipped, every outside import is
a declared dependency, and every declared dependency is imported."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from importlib.metadata import distributions, packages_distributions
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extras install tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SOURCES = {"telemetry_jit": ROOT / "telemetry_jit", "telemetry_jit.exporters": ROOT / "exporters"}
# import name -> distribution, for optional extras a test environment may not have installed
ABSENT_EXTRAS = {"thunder": "lightning-thunder"}


def _normalized(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _outside_imports() -> set[str]:
    """Every non-standard-library module the package imports, by its full name."""
    names = set()
    for source in SOURCES.values():
        for path in source.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    # "from opentelemetry import trace": the name may be a module of a namespace package
                    names.update(f"{node.module}.{alias.name}" for alias in node.names)
    top = {name: name.split(".")[0] for name in names}
    return {name for name in names if top[name] not in sys.stdlib_module_names and top[name] != "telemetry_jit"}


def _top_level_owners(wanted: set[str]) -> dict[str, list[str]]:
    """``packages_distributions()``, completed from the file lists for what it misses: Python 3.10's reads only
    ``top_level.txt``, which distributions built by hatchling (``opentelemetry-*``, ``nv-one-logger-*``) lack."""
    tops = dict(packages_distributions())
    missing = wanted - tops.keys()
    if missing:
        for distribution in distributions():
            for top in {file.parts[0] for file in distribution.files or () if file.parts} & missing:
                tops.setdefault(top, []).append(distribution.metadata["Name"])
    return tops


def _distributions_of(module: str, owners: dict[str, str], tops: Mapping[str, list[str]]) -> set[str]:
    """The installed distribution whose files hold ``module``, found from the top down without importing
    it (namespace packages such as ``opentelemetry`` are shared by several); where no installed file
    matches, every distribution that installs its top-level package."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        spec = importlib.util.find_spec(".".join(parts[:depth]))
        if spec is None:
            break
        if spec.origin and os.path.normpath(spec.origin) in owners:
            return {owners[os.path.normpath(spec.origin)]}
        if spec.submodule_search_locations is None:  # a module, not a package: "module.name" is an attribute
            break
    if importlib.util.find_spec(parts[0]) is None:  # an extra this environment lacks: named, not guessed
        return {ABSENT_EXTRAS.get(parts[0], parts[0])}
    return set(tops.get(parts[0], [parts[0]]))


def test_every_subpackage_is_shipped() -> None:
    shipped = set(PROJECT["tool"]["setuptools"]["packages"])
    found = {
        ".".join([package, *init.parent.relative_to(source).parts])
        for package, source in SOURCES.items()
        for init in source.rglob("__init__.py")
    }
    assert found == shipped, "list each package under [tool.setuptools] packages in pyproject.toml"


def test_dependencies_match_imports() -> None:
    declared = {_normalized(requirement) for requirement in PROJECT["project"]["dependencies"]}
    optional = {
        _normalized(requirement)
        for requirements in PROJECT["project"]["optional-dependencies"].values()
        for requirement in requirements
    }
    modules = _outside_imports()
    # only the distributions that install the imported top-level packages: reading every installed
    # distribution's file list took most of this test's time
    tops = _top_level_owners({module.split(".")[0] for module in modules})
    candidates = {name for module in modules for name in tops.get(module.split(".")[0], ())}
    owners = {
        os.path.normpath(distribution.locate_file(file)): name
        for distribution in distributions()
        if (name := distribution.metadata["Name"]) in candidates
        for file in distribution.files or ()
        if file.suffix == ".py"
    }
    imported = {_normalized(name) for module in modules for name in _distributions_of(module, owners, tops)}
    assert imported - declared - optional == set(), "imported but not declared in pyproject.toml"
    assert declared - imported == set(), "declared in pyproject.toml but never imported"


def test_the_schema_names_nv_one_loggers_spans_as_it_does() -> None:
    from nv_one_logger.core.span import StandardSpanName
    from nv_one_logger.training_telemetry.api.spans import StandardTrainingJobSpanName

    from telemetry_jit.schema import TrainingSpanName

    theirs = {span.value for span in StandardTrainingJobSpanName} | {StandardSpanName.APPLICATION.value}
    ours = {value for name, value in vars(TrainingSpanName).items() if name.isupper()}
    assert ours <= theirs


def test_a_python_too_old_is_told_which_versions_work() -> None:
    import shutil
    import subprocess

    found = [*sorted(Path.home().glob(".pyenv/versions/3.9*/bin/python3.9")), shutil.which("python3.9")]
    old = next((str(path) for path in found if path and "/shims/" not in str(path)), None)  # a shim needs pyenv's say
    if old is None:
        pytest.skip("no Python 3.9 on this machine")
    result = subprocess.run(
        [str(old), "-c", "import telemetry_jit"], capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)}
    )
    assert result.returncode != 0
    assert "telemetry-jit needs Python 3.10 or newer (tested on 3.10 to 3.13)" in result.stderr


@pytest.mark.any_torch
def test_unit_tests_mirror_the_source_tree() -> None:
    """``tests/unit/<part>/test_<module>.py`` tests ``<part>/<module>.py``: a change finds its tests by name."""
    unit = ROOT / "tests" / "unit"
    roots = {"exporters": ROOT, "oracle": ROOT}  # shipped as telemetry_jit.exporters; the oracle beside the package
    strays = []
    for test in sorted(unit.rglob("test_*.py")):
        relative = test.relative_to(unit)
        if relative.name in ("test_layers.py", "test_packaging.py"):  # the package as a whole
            continue
        module = relative.with_name(relative.name.removeprefix("test_"))
        if not (roots.get(module.parts[0], ROOT / "telemetry_jit") / module).is_file():
            strays.append(str(relative))
    assert not strays, f"unit tests named for no module (move them beside their module's name): {strays}"


def test_the_public_names_are_a_literal_all_that_type_checkers_read() -> None:
    # mypy and pyright read only a literal __all__: a computed one leaves users' `from telemetry_jit import X`
    # "not explicitly exported" under --strict
    import telemetry_jit

    tree = ast.parse(Path(telemetry_jit.__file__).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__")
    assert isinstance(node.value, ast.List)
    assert sorted(element.value for element in node.value.elts) == sorted(telemetry_jit._WHERE)
