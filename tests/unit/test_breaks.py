"""``breaks``: a graph break's gist and whose code it is in."""

from __future__ import annotations

import pytest

from telemetry_jit.breaks import gist

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
