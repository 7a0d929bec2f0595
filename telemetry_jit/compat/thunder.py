"""The lightning-thunder adapter: importing it on the torch versions users have, and its compilers. thunder 0.2.6
lists torch's named-tensor methods in its op table at import; torch 2.13 removed them: :func:`import_thunder` adds
stand-ins that raise only for the import. A thunder that still cannot import fails with one clear error each time."""

from __future__ import annotations

import logging
import re
import sys
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

NAMED_TENSOR_METHODS = ("align_as", "align_to", "refine_names", "rename", "rename_", "has_names")
SUPPORTED = "lightning-thunder 0.2.x (0.2.6 tested) with torch 2.8 - 2.13"

_log = logging.getLogger(__name__)
_import_error: ImportError | None = None


def _removed(name: str):  # noqa: ANN202 - a stand-in with the name thunder's table expects
    def method(self: torch.Tensor, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"Tensor.{name}: named tensors were removed from torch {torch.__version__}")

    method.__name__ = name
    method.__qualname__ = f"Tensor.{name}"
    return method


def import_thunder() -> ModuleType:
    """Import and return ``thunder``, bridging torch's removed named-tensor methods; ``ImportError`` if it can't."""
    global _import_error
    if _import_error is not None:
        raise _import_error
    if sys.modules.get("thunder") is not None:
        return sys.modules["thunder"]
    missing = [name for name in NAMED_TENSOR_METHODS if not hasattr(torch.Tensor, name)]
    if missing:
        _log.debug(
            "telemetry-jit: torch %s has no named tensors; importing lightning-thunder with temporary "
            "stand-ins for Tensor.%s (removed again right after the import).",
            torch.__version__,
            ", Tensor.".join(missing),
        )
        for name in missing:
            setattr(torch.Tensor, name, _removed(name))
    try:
        with warnings.catch_warnings():
            # thunder says this at import on every machine without NVIDIA's Transformer Engine (all CPUs):
            # nothing a user can act on, and thunder works without it
            warnings.filterwarnings("ignore", message="transformer_engine module not found")
            import thunder
    except ModuleNotFoundError as error:
        if error.name != "thunder":
            raise
        raise ImportError(
            "JitConfig(use_thunder=True) needs lightning-thunder: pip install 'telemetry-jit[thunder]' "
            f"(supported: {SUPPORTED})."
        ) from error
    except Exception as error:  # noqa: BLE001 - any import failure gets the versions that work
        _import_error = ImportError(
            f"lightning-thunder does not import with torch {torch.__version__}: {error!r}. "
            f"Supported: {SUPPORTED}. Use JitConfig(use_torch=True) on this torch, or a torch that thunder supports."
        )
        # a half-imported thunder would fail differently next time ("... is already registered")
        for name in [name for name in sys.modules if name == "thunder" or name.startswith("thunder.")]:
            del sys.modules[name]
        raise _import_error from error
    finally:
        for name in missing:
            delattr(torch.Tensor, name)
    return thunder


def _transforms(nvtx_ranges: bool) -> list[Any]:
    if not nvtx_ranges:
        return []
    from thunder.dev_utils.nvtx_profile_transform import NvtxProfileTransform

    return [NvtxProfileTransform()]


def jit(module: torch.nn.Module, nvtx_ranges: bool = False) -> torch.nn.Module:
    """``thunder.jit(module)``, with thunder's NVTX profile transform when asked for."""
    return import_thunder().jit(module, transforms=_transforms(nvtx_ranges))


def dynamo_compiler(nvtx_ranges: bool = False) -> Any:
    """A ``thunder.dynamo.ThunderCompiler``: the ``torch.compile`` backend NeMo compiles with."""
    import_thunder()
    try:
        from thunder.dynamo import ThunderCompiler
    except ImportError as error:
        raise ImportError(
            f"JitConfig(thunder_backend='dynamo') needs thunder.dynamo.ThunderCompiler, which this "
            f"lightning-thunder lacks ({error}). Supported: {SUPPORTED}; or use thunder_backend='jit'."
        ) from error
    return ThunderCompiler(transforms=_transforms(nvtx_ranges))


@dataclass(frozen=True)
class ThunderGraph:
    """What ``ThunderCompiler`` made of one dynamo graph."""

    index: int  # the how-many-th graph this compiler got
    thunder_modules: list[tuple[str, torch.nn.Module]]  # pieces thunder runs, by name in the split graph
    splits: list[tuple[str, str]]  # why thunder left an op to torch: (reason, "file:line" of the op)


def split_graph(compiler: Any, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> tuple[Any, ThunderGraph]:
    """Run ``compiler`` on a dynamo graph; return its split graph and what thunder made of it. Call it under
    ``torch_compat.eager_graph_modules``: generating a piece's code lazily in thunder's interpreter fails."""
    split = compiler(graph, example_inputs)
    info = compiler.subgraph_infos[-1]
    thunder_fns = {id(fn) for fn in info.thunder_compiled_fns}
    modules = [(name, child) for name, child in split.named_children() if id(child) in thunder_fns]
    nodes = {node.name: node for node in info.original_graph_module.graph.nodes}
    splits = []
    for reason in info.split_reasons:
        text = f"thunder split ({reason.reason_type.name}): {reason.info}"
        if reason.exception:
            text += f"\n{reason.exception}"
        named = re.search(r"name: (\S+)", reason.info or "")  # thunder's reasons read "node with name: <name> and ..."
        node = nodes.get(named.group(1)) if named else None
        trace = (node.meta.get("stack_trace") or "") if node is not None else ""
        frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
        splits.append((text, f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""))
    return split, ThunderGraph(len(compiler.subgraph_infos) - 1, modules, splits)
