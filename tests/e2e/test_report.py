"""`telemetry-jit report`: one self-contained HTML file, checked as a browser renders it."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import lightning.pytorch as pl
import pytest

from telemetry_jit import JitConfig, cli, hook_trainer_cls
from tests.e2e.browser import CHROMIUM, chromium
from tests.e2e.conftest import Telemetry
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


class Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def having(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())]


@pytest.fixture
def report(telemetry: Telemetry, tmp_path: Path) -> tuple[Path, Telemetry]:
    HookedTrainer, callback = hook_trainer_cls(
        pl.Trainer, telemetry.provider, jit_config=JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    )
    HookedTrainer(max_epochs=2, **TRAINER_DEFAULTS).fit(Net("print"), loader(18, 4), loader(8, 4))
    callback.on_app_end()
    output = tmp_path / "report.html"
    assert cli.main(["report", str(telemetry.path), "-o", str(output)]) == 0
    return output, telemetry


def test_report_holds_timeline_tables_and_every_graph_break_offline(report: tuple[Path, Telemetry]) -> None:
    output, telemetry = report
    html = output.read_text()
    run = telemetry.run()
    compiles = run.find("compilation")
    recompiles = [
        s for s in compiles if s.attributes["compile.is_recompile"] and s.attributes["compile.trigger"] == "dynamo"
    ]
    breaks = [e for s in compiles for e in s.events if e.name == "graph_break"]
    page = Elements()
    page.feed(html)
    assert page.having("svg", id="timeline")
    assert len(page.having("rect", **{"class": "compilation"})) == len(compiles)
    assert len(page.having("line", **{"class": "recompile"})) == len(recompiles) > 0
    assert len(page.having("rect", **{"class": "training_loop"})) == 1
    # the axis is the run's wall time from its first loop (README), each recompile marked with its global step
    timeline = html.split('<svg id="timeline"')[1].split("</svg>")[0]
    marks = re.findall(r'<line class="recompile".*?</line><text [^>]*>([^<]*)</text>', timeline, re.S)
    assert sorted(marks) == sorted(str(s.attributes["train.global_step"]) for s in recompiles)
    loops = [s for s in run.spans.values() if s.name in ("training_loop", "validation_loop", "testing_loop")]
    first = min([s.start_unix_ns for s in loops] + [s.start_unix_ns for s in compiles])
    last = max([s.end_unix_ns for s in loops] + [s.end_unix_ns for s in compiles])
    assert f">{(last - first) / 1e9:.2f} s</text>" in timeline and ">0 s (wall time)</text>" in timeline
    for table in ("frames", "causes", "breaks"):
        assert page.having("table", id=table)
    every_break = html.split('<ul id="graph-breaks">')[1].split("</ul>")[0]
    assert every_break.count("<li>") == len(breaks) > 0
    assert "tests/models.py" in html
    assert html.index('id="diagnosis"') < html.index('id="timeline"')  # the answers on the first screen
    # self-contained: nothing is fetched from anywhere (links to torch's documentation fetch nothing)
    assert not page.having("script") and not page.having("link") and not page.having("img")
    assert not [a for tag, attrs in page.tags if tag != "a" for a in attrs.values() if a and "//" in a]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_report_renders_in_headless_chromium_without_errors(report: tuple[Path, Telemetry], tmp_path: Path) -> None:
    output, _ = report
    profile = tmp_path / "profile"
    dom = subprocess.run(chromium(profile, "--dump-dom", output.as_uri()), capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert '<svg id="timeline"' in dom.stdout and '<table id="frames">' in dom.stdout
    assert "Uncaught" not in dom.stderr and "SyntaxError" not in dom.stderr
    screenshot = tmp_path / "report.png"
    shot = subprocess.run(
        chromium(profile, f"--screenshot={screenshot}", "--window-size=1280,1600", output.as_uri()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(screenshot, ARTIFACTS / "report.png")  # kept for a person to look at
