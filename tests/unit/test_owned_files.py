"""telemetry-jit writes only a file it creates or one of its own: each thing a path can hold is planted, and every
way of writing is refused at it, naming what lies there and leaving it as it was."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from telemetry_jit.owned_files import NotOurs, OwnKind, open_to_append, refusal, replace_whole, what_lies_at
from tests.planted import THINGS, as_it_was, planted

OURS = OwnKind("test file", lambda head: head.startswith(b"OURS\n"))


@pytest.mark.parametrize("thing", THINGS)
def test_what_lies_at_a_path_is_named_and_nothing_is_written_there(tmp_path: Path, thing: str) -> None:
    path = tmp_path / "out"
    with planted(path, thing) as words:
        before = as_it_was(path)
        refused = refusal(path, OURS)
        assert isinstance(refused, NotOurs) and words in str(refused) and repr(str(path)) in str(refused)
        with pytest.raises(NotOurs, match=re.escape(words)):
            open_to_append(path, OURS)
        with pytest.raises(NotOurs, match=re.escape(words)):
            replace_whole(path, b"OURS\nnew\n", OURS)
        assert as_it_was(path) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []  # no temporary left


def test_a_link_names_where_it_leads() -> None:
    assert what_lies_at(Path("/dev/stdout")) in ("a symbolic link to '/proc/self/fd/1'", "a device, not a regular file")
    assert what_lies_at(Path("/nonexistent/path")) is None


def test_its_own_file_and_an_empty_one_are_appended_to_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "out"
    fd, created = open_to_append(path, OURS)  # created exclusively
    os.write(fd, b"OURS\n")
    os.close(fd)
    assert created
    fd, created = open_to_append(path, OURS)  # its own: appended to
    os.write(fd, b"more\n")
    os.close(fd)
    assert not created and path.read_bytes() == b"OURS\nmore\n"
    replace_whole(path, b"OURS\nwhole\n", OURS)
    assert path.read_bytes() == b"OURS\nwhole\n"
    empty = tmp_path / "empty"
    empty.touch()
    assert refusal(empty, OURS) is None
    replace_whole(tmp_path / "new", b"OURS\n", OURS)
    assert (tmp_path / "new").read_bytes() == b"OURS\n"


def test_a_new_file_gets_the_permissions_the_umask_gives(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        replace_whole(tmp_path / "out", b"OURS\n", OURS)
        fd, _ = open_to_append(tmp_path / "log", OURS)
        os.close(fd)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "log").stat().st_mode) == 0o640
