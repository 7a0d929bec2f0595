"""``oracle.judge``: the rules the truth oracle judges the product's statements by."""

from __future__ import annotations

import pytest

from oracle.judge import acceptable_causes

pytestmark = pytest.mark.any_torch


def test_a_size_one_guard_on_a_spaced_source_is_size_one() -> None:
    """torch 2.8's guard on a resume function's stack holds spaces (t5's 9/6); still 0/1 specialization."""
    line = (
        "9/5: 2 <= dict.__getitem__(___stack0, list(dict.keys(___stack0))[0]).size()[0]  # inner_dict = "
        "dict(self.items())  # transformers/utils/generic.py:527 in __getitem__"
    )
    assert acceptable_causes([line], None) == {"size_one"}
    assert acceptable_causes(["0/5: 2 <= kwargs['input_ids'].size()[0]  # output = f()"], None) == {"size_one"}
    assert "size_one" not in (acceptable_causes(["0/1: 16 <= x.size()[0]"], None) or set())
