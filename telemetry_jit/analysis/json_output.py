"""JSON the commands print and write: valid JSON whatever a file held (no ``NaN`` or ``Infinity``,
which JSON has no words for and ``json.dumps`` would write anyway)."""

from __future__ import annotations

import json
import math
from typing import Any


def to_json(value: Any, indent: int | None = None) -> str:
    """``value`` as strict JSON: a number that is not finite becomes ``null``."""
    return json.dumps(_finite(value), indent=indent, allow_nan=False, default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
