"""``terminal``: text from a file or an error made safe to print."""

from __future__ import annotations

import pytest

from telemetry_jit.terminal import clean, error_text

pytestmark = pytest.mark.any_torch


def test_terminal_escapes_never_reach_the_terminal() -> None:
    assert clean("run \x1b[31mred\x1b[0m\tok\n\u202eevil") == "run ?[31mred?[0m\tok\n?evil"


def test_an_error_without_a_message_is_named_by_its_type_alone() -> None:
    assert error_text(ValueError("bad batch")) == "ValueError: bad batch"
    assert error_text(KeyboardInterrupt()) == "KeyboardInterrupt"  # no dangling colon
