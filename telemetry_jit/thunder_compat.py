"""Importing lightning-thunder on the torch versions users have.

lightning-thunder 0.2.6 (the newest release) lists ``Tensor.align_as``, ``align_to``,
``refine_names``, ``rename``, ``rename_`` and ``has_names`` in its op table at import time; torch
2.13 removed named tensors, so ``import thunder`` fails with an AttributeError. When (and only
when) those methods are missing, :func:`import_thunder` adds stand-ins that raise, imports thunder,
and removes them again: ``torch.Tensor`` is exactly as before for everyone else. It says so once.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType

import torch

NAMED_TENSOR_METHODS = ("align_as", "align_to", "refine_names", "rename", "rename_", "has_names")
SUPPORTED = "lightning-thunder 0.2.x (0.2.6 tested) with torch 2.8 - 2.13"

_log = logging.getLogger(__name__)


def _removed(name: str):  # noqa: ANN202 - a stand-in with the name thunder's table expects
    def method(self: torch.Tensor, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"Tensor.{name}: named tensors were removed from torch {torch.__version__}")

    method.__name__ = name
    method.__qualname__ = f"Tensor.{name}"
    return method


def import_thunder() -> ModuleType:
    """Import and return ``thunder``, bridging torch's removed named-tensor methods if needed.

    Raises:
        ImportError: lightning-thunder is not installed, or does not import with this torch.
    """
    if sys.modules.get("thunder") is not None:
        return sys.modules["thunder"]
    missing = [name for name in NAMED_TENSOR_METHODS if not hasattr(torch.Tensor, name)]
    if missing:
        _log.warning(
            "telemetry-jit: torch %s has no named tensors; importing lightning-thunder with temporary "
            "stand-ins for Tensor.%s (removed again right after the import).",
            torch.__version__,
            ", Tensor.".join(missing),
        )
        for name in missing:
            setattr(torch.Tensor, name, _removed(name))
    try:
        import thunder
    except ModuleNotFoundError as error:
        if error.name != "thunder":
            raise
        raise ImportError(
            "JitConfig(use_thunder=True) needs lightning-thunder: pip install 'telemetry-jit[thunder]' "
            f"(supported: {SUPPORTED})."
        ) from error
    except Exception as error:  # noqa: BLE001 - any import failure gets the versions that work
        raise ImportError(
            f"lightning-thunder does not import with torch {torch.__version__}: {error!r}. Supported: {SUPPORTED}."
        ) from error
    finally:
        for name in missing:
            delattr(torch.Tensor, name)
    return thunder
