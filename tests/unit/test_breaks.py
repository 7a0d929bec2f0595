"""``breaks``: a graph break's gist and whose code it is in."""

from __future__ import annotations

import json

import pytest

from telemetry_jit.breaks import gist, owner_of

pytestmark = pytest.mark.any_torch


def test_an_errors_gist_is_its_first_paragraph_and_the_users_line() -> None:
    torch_error = (
        "Unsupported: Tensor.item\n  Explanation: the op needs the value\n\n  Hint: set capture_scalar_outputs\n\n"
        'from user code:\n   File "/home/me/train.py", line 40, in training_step\n    loss = self.net(x)\n'
        '  File "/home/me/net.py", line 15, in forward\n    if h.sum().item() > 1:\n\nSet TORCHDYNAMO_VERBOSE=1\n'
    )
    assert gist(torch_error) == (
        "Unsupported: Tensor.item Explanation: the op needs the value "
        "(at /home/me/net.py:15 in forward: `if h.sum().item() > 1:`)"
    )
    assert gist(torch_error + " (at train step 3)").endswith("`if h.sum().item() > 1:`; at train step 3)")
    assert gist("ValueError: a bug (at train step 5)") == "ValueError: a bug (at train step 5)"
    assert gist("x" * 1000, limit=50) == "x" * 47 + "..."
    in_torch = torch_error.replace("/home/me/net.py", "/venv/lib/python3.11/site-packages/torch/nn/modules/x.py")
    assert gist(in_torch).endswith(
        "(at /venv/lib/python3.11/site-packages/torch/nn/modules/x.py:15 in forward: `if h.sum().item() > 1:`, "
        "reached from your line /home/me/train.py:40 in "
        "training_step: `loss = self.net(x)`)"
    )


def _installed(site_packages, name: str, direct_url: dict | None) -> str:
    """A package ``name`` laid out as pip installs it, with its PEP 610 record; a location in it."""
    (site_packages / name).mkdir(parents=True)
    info = site_packages / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    return f"{site_packages / name / '__init__.py'}:7"


def test_a_package_is_the_users_by_where_it_was_installed_from(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, site_packages = tmp_path / "project", tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (project / "dist").mkdir(parents=True)
    monkeypatch.chdir(project)
    local_directory = {"url": (tmp_path / "elsewhere").as_uri(), "dir_info": {}}  # pip install /path/to/src
    assert owner_of(_installed(site_packages, "mine", local_directory)) == "user"
    built_here = {"url": (project / "dist" / "ours-1.0-py3-none-any.whl").as_uri(), "archive_info": {}}
    assert owner_of(_installed(site_packages, "ours", built_here)) == "user"
    downloaded = {"url": (tmp_path / "downloads" / "theirs-1.0.whl").as_uri(), "archive_info": {}}
    assert owner_of(_installed(site_packages, "theirs", downloaded)) == "theirs"
    assert owner_of(_installed(site_packages, "indexed", None)) == "indexed"  # from an index: no record
    from_git = {"url": "https://github.com/x/y.git", "vcs_info": {"vcs": "git", "commit_id": "ab"}}
    assert owner_of(_installed(site_packages, "cloned", from_git)) == "cloned"
