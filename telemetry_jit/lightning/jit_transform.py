"""JIT-compile selected submodules of a LightningModule (NeMo-compatible ``JitConfig``/``JitTransform``)."""

from __future__ import annotations

import fnmatch
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.notices import Notices
from telemetry_jit.probes.backends import compiler_backend
from telemetry_jit.recording.driver import TelemetryDriver
from telemetry_jit.records import CompileNotRun
from telemetry_jit.terminal import clean

_GLOB_CHARS = frozenset("*?[")
_TORCH_COMPILE_KWARGS = frozenset(inspect.signature(torch.compile).parameters) - {"model"}


class JitConfigError(ValueError, AssertionError):
    """A ``JitConfig`` that cannot work. Both a ``ValueError`` and, as NeMo raises, an ``AssertionError``."""


SELECTOR_STYLES = ("auto", "glob", "nemo")
_LOOPS = {"validate": "validation", "test": "testing", "predict": "prediction"}  # Trainer.state.fn -> its loop
THUNDER_BACKENDS = {"jit": "thunder", "dynamo": "thunder-dynamo"}  # JitConfig.thunder_backend -> the backend


@dataclass
class JitConfig:
    """What to compile and how; field-for-field compatible with NeMo's ``JitConfig``.

    Args:
        module_selector: A dotted path under the root module (:func:`resolve_root`); ``""`` or ``"*"`` is the
            root; every atom may be a glob (``"*.layer*"``: grandchildren whose name starts with ``layer``).
        use_torch: Compile with ``module.compile(**torch_kwargs)`` (torch's own layers: see ``compile_in_place``).
        torch_kwargs: Passed through to ``torch.compile``.
        use_thunder: Compile with Lightning Thunder, as ``thunder_backend`` says.
        thunder_backend: ``"jit"`` (default): ``thunder.jit`` of each module, in place. ``"dynamo"``: NeMo's
            path, ``module.compile(backend=thunder.dynamo.ThunderCompiler())``.
        profile_thunder: Apply thunder's NVTX profile transform (CUDA only; a warning on CPU).
        backend: A registered compiler backend (:func:`telemetry_jit.register_backend`) instead of
            ``use_torch``/``use_thunder``, NeMo's spelling of ``"torch"``, ``"thunder"``, ``"thunder-dynamo"``.
        selector_style: ``"glob"``: every atom a glob matched whole, at any depth. ``"nemo"``: NeMo's
            ``re.match(atom.replace("*", ".*"), name)``, stopping at the first wildcard atom. ``"auto"``
            (default): the two must agree, else ``setup`` fails naming both, so no NeMo config changes meaning.
    """

    module_selector: str | None = ""
    use_torch: bool = False
    torch_kwargs: dict[str, Any] = field(default_factory=dict)
    use_thunder: bool = False
    profile_thunder: bool = False
    selector_style: str = "auto"
    thunder_backend: str = "jit"
    backend: str = ""

    @property
    def compiler(self) -> str:
        """The name of the backend this config compiles with; ``""``: it compiles nothing."""
        if self.backend:
            return self.backend
        if self.use_thunder:
            return THUNDER_BACKENDS[self.thunder_backend]
        return "torch" if self.use_torch else ""

    def __post_init__(self) -> None:
        if self.backend and (self.use_torch or self.use_thunder):
            raise JitConfigError(
                f"JitConfig: backend={self.backend!r} and use_torch/use_thunder both say which compiler; give one."
            )
        if self.use_torch and self.use_thunder:
            raise JitConfigError(
                "JitConfig: use_torch and use_thunder cannot both be True; pick one compiler per config "
                "(pass a list of JitConfig to compile different modules with different compilers)."
            )
        if self.module_selector is None:
            self.module_selector = ""  # NeMo's "the whole model"
        if not isinstance(self.module_selector, str):
            raise TypeError(
                f"JitConfig.module_selector must be a str such as 'model.layers.*', "
                f"got {type(self.module_selector).__name__}."
            )
        for name, allowed in (("selector_style", SELECTOR_STYLES), ("thunder_backend", THUNDER_BACKENDS)):
            if getattr(self, name) not in allowed:
                raise JitConfigError(f"JitConfig.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}.")
        _split_selector(self.module_selector)  # raises on a malformed selector
        if not isinstance(self.torch_kwargs, dict):
            raise TypeError(f"JitConfig.torch_kwargs must be a dict, got {type(self.torch_kwargs).__name__}.")
        unknown = sorted(set(self.torch_kwargs) - _TORCH_COMPILE_KWARGS)
        if unknown:
            raise ValueError(
                f"JitConfig.torch_kwargs has argument(s) torch.compile does not take: {unknown}. "
                f"Valid: {sorted(_TORCH_COMPILE_KWARGS)}."
            )


def resolve_root(pl_module: torch.nn.Module) -> torch.nn.Module:
    """What selectors resolve against: ``pl_module.module``, else ``.model`` (as NeMo), else ``pl_module``."""
    name = _root_name(pl_module)
    return getattr(pl_module, name) if name else pl_module


def _root_name(pl_module: torch.nn.Module) -> str:
    for name in ("module", "model"):
        if isinstance(getattr(pl_module, name, None), torch.nn.Module):
            return name
    return ""


def selector_for(pl_module: torch.nn.Module, path: str) -> str:
    """The ``module_selector`` selecting the module at ``path`` of ``pl_module``; ``""`` outside the root."""
    root = _root_name(pl_module)
    if path == root:
        return "*"
    if not root:
        return path
    return path[len(root) + 1 :] if path.startswith(root + ".") else ""


def _split_selector(selector: str) -> list[str]:
    if selector in ("", "*"):
        return []
    atoms = selector.split(".")
    if any(atom == "" for atom in atoms):
        raise ValueError(
            f"JitConfig.module_selector {selector!r} is malformed: it has an empty name between dots. "
            "Write a dotted path such as 'model.layers.*'."
        )
    return atoms


def select_modules(root: torch.nn.Module, selector: str) -> list[tuple[str, torch.nn.Module]]:
    """``(qualified_name, module)`` of every module under ``root`` matching ``selector`` by glob; raises
    ``LookupError`` (listing the names where matching stopped) or ``TypeError`` (an atom names a non-module)."""
    level: list[tuple[str, torch.nn.Module]] = [("", root)]
    for depth, atom in enumerate(_split_selector(selector)):
        matched = [
            (f"{prefix}.{name}" if prefix else name, child)
            for prefix, module in level
            for name, child in _matching_children(module, atom)
        ]
        if not matched:
            path = ".".join(selector.split(".")[:depth]) or "<root>"
            existing = sorted({name for _, module in level for name, _ in module.named_children()})
            raise LookupError(
                f"JitConfig.module_selector {selector!r} matches nothing: no child of {path} "
                f"({type(root).__name__} root) matches {atom!r}. Modules at that level: "
                f"{existing or 'none (leaf module)'}."
            )
        level = matched
    return level


def select_modules_like_nemo(root: torch.nn.Module, selector: str) -> list[tuple[str, torch.nn.Module]]:
    """NeMo's ``get_modules_from_selector``: exact atoms walk down; the first atom with ``*`` selects the
    children whose name ``re.match``-es it and ends the walk. Raises ``AttributeError`` as NeMo does."""
    path: list[str] = []
    module = root
    for atom in _split_selector(selector):
        if "*" in atom:
            pattern = re.compile(atom.replace("*", ".*"))
            return [(".".join([*path, name]), child) for name, child in module.named_children() if pattern.match(name)]
        module = getattr(module, atom)
        if not isinstance(module, torch.nn.Module):
            raise AttributeError(f"`{atom}` is not an nn.Module")
        path.append(atom)
    return [(".".join(path), module)]


def select(root: torch.nn.Module, config: JitConfig) -> list[tuple[str, torch.nn.Module]]:
    """The modules ``config`` selects under ``root``, by its ``selector_style``."""
    selector = config.module_selector or ""
    if config.selector_style == "nemo":
        found = select_modules_like_nemo(root, selector)
        if not found:
            raise LookupError(
                f"JitConfig.module_selector {selector!r} matches nothing (NeMo's matching): no child matches its "
                f"wildcard atom. Modules under the root: {sorted(name for name, _ in root.named_modules() if name)}."
            )
        return found
    if config.selector_style == "glob" or not any(char in selector for char in _GLOB_CHARS):
        return select_modules(root, selector)
    try:
        nemo = select_modules_like_nemo(root, selector)
    except AttributeError:
        return select_modules(root, selector)  # NeMo fails on it too: there is no meaning to keep
    try:
        selected = select_modules(root, selector)
    except LookupError:
        if not nemo:
            raise  # a wildcard that matches nothing either way: glob's message names what exists
        selected = []
    if [module for _, module in nemo] != [module for _, module in selected]:
        glob_names = [name or "<root>" for name, _ in selected] or "nothing"
        nemo_names = [name or "<root>" for name, _ in nemo] or "nothing"
        raise JitConfigError(
            f"JitConfig.module_selector {selector!r} selects different modules than in NeMo: {glob_names} with "
            f"glob matching (each atom matched whole, at any depth), {nemo_names} with NeMo's (re.match, anchored "
            "at the start only, stopping at the first wildcard). Say which you mean with "
            "JitConfig(selector_style='glob') or JitConfig(selector_style='nemo'), or name the modules exactly."
        )
    return selected


def _matching_children(module: torch.nn.Module, atom: str) -> list[tuple[str, torch.nn.Module]]:
    if not _GLOB_CHARS.isdisjoint(atom):
        return [(name, child) for name, child in module.named_children() if fnmatch.fnmatchcase(name, atom)]
    child = getattr(module, atom, None)
    if child is not None and not isinstance(child, torch.nn.Module):
        raise TypeError(
            f"JitConfig.module_selector names {atom!r}, which is a {type(child).__name__}, "
            f"not an nn.Module, on {type(module).__name__}."
        )
    return [] if child is None else [(atom, child)]


def _as_list(config: JitConfig | Sequence[JitConfig]) -> list[JitConfig]:
    configs: list[Any] = list(config) if isinstance(config, (list, tuple)) else [config]
    for item in configs:
        if not isinstance(item, JitConfig):
            raise TypeError(
                f"JitTransform takes a JitConfig or a list of JitConfig, got {type(item).__name__}. "
                "Build one with telemetry_jit.JitConfig(use_torch=True, ...)."
            )
    return configs


def _driver_of(trainer: pl.Trainer | None) -> TelemetryDriver | None:
    """The telemetry driver recording ``trainer``'s run (a hooked trainer's callback holds it), if one does."""
    for callback in getattr(trainer, "callbacks", None) or []:
        for each in (callback, *getattr(callback, "callbacks", ())):
            if isinstance(driver := getattr(each, "driver", None), TelemetryDriver):
                return driver
    return None


class JitTransform(Callback):
    """Compile the modules that ``JitConfig`` selects, once, at the start of the first training epoch (as NeMo:
    adapters added earlier, e.g. by PEFT, are included), or of a validate/test/predict run. The compiler's
    arguments are checked at ``setup``, the selectors at ``on_fit_start`` (after ``configure_model``, which may
    build what they select): a typo fails before the first step."""

    def __init__(self, config: JitConfig | Sequence[JitConfig]) -> None:
        self.configs = _as_list(config)
        self.compiled: list[str] = []
        self._unchecked: list[tuple[str, torch.nn.Module, Callable[[], bool]]] = []  # compiled, not seen to run
        self._notices = Notices()

    @property
    def config(self) -> JitConfig | list[JitConfig]:
        """The config as given; assignable, as in NeMo."""
        return self.configs[0] if len(self.configs) == 1 else self.configs

    @config.setter
    def config(self, config: JitConfig | Sequence[JitConfig]) -> None:
        self.configs = _as_list(config)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for config in self.configs:
            if config.compiler:
                compiler_backend(config.compiler).check(config)  # a missing install or a bad argument fails here

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        root = resolve_root(pl_module)  # validate, test and predict select as they compile, at their loop's start
        for config in self.configs:
            if config.compiler:
                select(root, config)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a fit resumed from a checkpoint may start mid-epoch (or at an epoch's end): Lightning then calls no
        # on_train_epoch_start before the next step, and the rest of the job would run eagerly
        if getattr(trainer.fit_loop, "restarting", False):
            self._compile(pl_module)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._compile(pl_module)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn != "fit":  # validate, test, predict: in a fit, the training epoch compiles
            self._compile(pl_module)

    on_test_start = on_predict_start = on_validation_start

    # by the end of the first epoch (or of a validate/test/predict run) the compiled code has run
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_compiled_code_ran(pl_module, "the first training epoch")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loop = _LOOPS.get(trainer.state.fn or "")  # none in a fit: the first training epoch's end checks
        if loop is not None:
            self._check_compiled_code_ran(pl_module, loop)

    on_test_end = on_predict_end = on_validation_end

    def _check_compiled_code_ran(self, pl_module: pl.LightningModule, loop: str) -> None:
        """Say once per module that its compiled code never ran, and why."""
        unchecked, self._unchecked = self._unchecked, []
        for name, module, ran in unchecked:
            # a disabled forward: dynamo may still compile the call around it (Module._call_impl), never the forward
            disabled = torch_compat.forward_disabled(module)
            if not disabled and ran():
                continue
            forward = getattr(type(module).forward, "__code__", None)
            where = f" at {forward.co_filename}:{forward.co_firstlineno}" if forward is not None else ""
            children = [child for child, _ in module.named_children()]
            if disabled:
                why = "its forward is torch.compiler.disable-d, so dynamo compiles nothing of it and it runs eagerly"
                advice = "remove torch.compiler.disable from its forward, or compile a module that is not disabled"
            elif getattr(ran, "failed", False):
                why = (
                    "it was called, but compiling it failed and dynamo runs it eagerly (an error suppressed by "
                    "torch._dynamo.config.suppress_errors, or code dynamo gives up on for the whole frame)"
                )
                advice = "remove the cause torch's error names (said when it failed, and by telemetry-jit summary)"
            elif getattr(ran, "called", False):  # a backend that watches the first call knows it was called
                why = (
                    "it was called, but dynamo compiled none of its code: its forward is code dynamo does not trace "
                    "(torch.compiler.disable, a skipped package) or a compiler stance kept it eager"
                )
                advice = "compile a module whose forward dynamo traces, or remove what disables it"
            else:
                why = "nothing called it"
                if module is pl_module:
                    why = (
                        "Lightning calls training_step, validation_step, ... and not forward, and they did not call "
                        "self(...)"
                    )
                advice = (
                    f"select the module your step calls instead, e.g. JitConfig(module_selector={children[0]!r}) (its "
                    f"children: {', '.join(children[:8])})"
                    if children
                    else "check that the selector names the module your step calls"
                )
            self._notices.warn(
                id(module),
                f"telemetry-jit: JitTransform compiled {name or '<root>'} ({type(module).__name__}.forward{where}), "
                f"but its compiled code never ran in {loop}: {why}, so compiling it changed nothing. Fix: {advice}.",
            )
            # and a record of it, which check --no-eager-fallback fails, where a telemetry callback records the run
            driver = _driver_of(getattr(pl_module, "_trainer", None))
            if driver is not None:
                driver.compile_not_run(CompileNotRun("never_ran", name or type(module).__name__, f"in {loop}: {why}"))

    def _compile(self, pl_module: pl.LightningModule) -> None:
        if getattr(pl_module, "_compiled", False) is True:
            return  # NeMo's marker: compiled already (by us, or by the user who set it)
        root = resolve_root(pl_module)
        for config in self.configs:
            if not config.compiler:
                continue
            backend = compiler_backend(config.compiler)
            for name, module in select(root, config):
                if torch_compat.compiled_call(module) is not None and not torch_compat.compiles_nothing(module):
                    continue  # compiled already: by an earlier epoch, another config, or the user
                label = name or type(module).__name__
                ran = backend.compile(module, label, config)
                self.compiled.append(name or "<root>")
                self._unchecked.append((name, module, ran))
                rank_zero_info(clean(f"telemetry-jit: {backend.title}({label})"))  # a class name is code: any text
        setattr(pl_module, "_compiled", bool(self.compiled))  # noqa: B010 - NeMo's marker, not a declared attribute
