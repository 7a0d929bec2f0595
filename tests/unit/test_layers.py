"""The layout tells the truth: every module imports only the layers the README draws below it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"


NEW, OLD = DATA / "answers.jsonl", DATA / "answers-recorded-by-0.1.jsonl"


ROOT = Path(__file__).resolve().parents[2]


BOTTOM = {
    "schema",
    "records",
    "identity",
    "notices",
    "causes",
    "breaks",
    "terminal",
    "boundary",
    "redaction",
    "owned_files",
}


# layer -> the layers (and outside packages) it may import; a module's layer is its first name part
MAY_IMPORT: dict[str, set[str]] = {
    "bottom": set(),
    "compat": set(),
    "exporters": {"bottom", "exporters"},
    "probes": {"bottom", "compat", "probes"},
    "compilers": {"bottom", "compat", "probes"},  # the built-in compiler plug-ins, found by entry points
    "session": {"bottom", "compat", "exporters"},
    "recording": {"bottom", "compat", "exporters", "session", "probes", "recording"},
    "loop": {"bottom", "compat", "exporters", "probes", "recording", "session"},
    "lightning": {"bottom", "compat", "exporters", "probes", "recording", "session", "loop", "lightning"},
    "analysis": {"bottom", "analysis"},
    "cli": {"bottom", "analysis"},
    "__main__": {"cli"},
}


NEVER_ON_THE_ANALYSIS_SIDE = ("torch", "lightning", "nv_one_logger", "opentelemetry", "thunder")


def layer(module: str) -> str:
    """``telemetry_jit.recording.compile_spans`` -> ``recording``; the bottom modules share one layer."""
    part = module.removeprefix("telemetry_jit.").split(".")[0]
    return "bottom" if part in BOTTOM else part


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in (("telemetry_jit", ROOT / "telemetry_jit"), ("telemetry_jit.exporters", ROOT / "exporters")):
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join([package, *parts]).removesuffix(".__init__")
            found[name] = path
    return found


def imports_of(name: str, path: Path) -> set[str]:
    """The modules ``path`` imports at run time (``if TYPE_CHECKING:`` blocks aside)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).rstrip(".")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.any_torch
def test_summarising_a_file_imports_no_training_package() -> None:
    code = (
        "import sys; from telemetry_jit import cli; cli.main(['summary', '--json', sys.argv[1]]);"
        "heavy = [m for m in ('torch', 'lightning', 'nv_one_logger', 'opentelemetry') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code, str(NEW)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1500:]


def test_no_import_runs_back_up_the_layers() -> None:
    wrong = []
    for name, path in modules().items():
        if name == "telemetry_jit":
            continue  # the package's face imports its public names lazily
        own = layer(name)
        for imported in imports_of(name, path):
            if not imported.startswith("telemetry_jit.") or imported in modules() and imported == name:
                continue
            target = layer(imported)
            if imported in modules() and target != own and target not in MAY_IMPORT[own]:
                wrong.append(f"{name} ({own}) imports {imported} ({target})")
            if own == "compat" and imported in modules():
                wrong.append(f"{name} (compat) imports {imported}: adapters import nothing of the project")
    assert wrong == []


def test_the_analysis_side_imports_no_training_package() -> None:
    wrong = [
        f"{name} imports {imported}"
        for name, path in modules().items()
        if layer(name) in ("analysis", "cli") or (layer(name) == "bottom")
        for imported in imports_of(name, path)
        if imported.split(".")[0] in NEVER_ON_THE_ANALYSIS_SIDE
    ]
    assert wrong == []
