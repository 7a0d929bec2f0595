"""Why a frame recompiled and whose code a graph break is in: the rules behind every answer telemetry-jit
gives, shared by the live recording and the analysis of files (no torch, no Lightning here).

Recompile causes form a small vocabulary (:data:`CAUSES`, explained with examples in docs/fixing.md).
:class:`RecompileClassifier` assigns each recompile exactly one cause, from torch's reason and where
training was (stage, batch position), seeing the compiles in the order they happened; the same
classifier runs while training (``compile.recompile_cause`` on the span, the console) and on a file
written before the cause was recorded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DOCS = "docs/fixing.md"


@dataclass(frozen=True)
class Cause:
    """One kind of recompile: what happened, in words, and what to do about it."""

    id: str
    title: str
    fix: str

    @property
    def doc(self) -> str:
        return f"{DOCS}#{self.id.replace('_', '-')}"


CAUSES: dict[str, Cause] = {
    cause.id: cause
    for cause in (
        Cause(
            "stage_switch",
            "switching between training and validation/test/predict (grad mode changed)",
            "expected: a compiled frame compiles once more for each mode it runs in (with gradients for "
            "training, without for validation); nothing to fix",
        ),
        Cause(
            "shared_code",
            "one function compiled again for another caller in the same step (e.g. one layer class called on the "
            "batch, then on activations that need gradients)",
            "expected: one compile per kind of call, paid once in the frame's first step; nothing to fix",
        ),
        Cause(
            "last_batch",
            "the last batch of an epoch is smaller than the others",
            "drop the smaller last batch with DataLoader(..., drop_last=True), or compile for changing batch "
            "sizes with JitConfig(torch_kwargs={'dynamic': True}) (torch.compile(dynamic=True))",
        ),
        Cause(
            "eval_shape",
            "validation/test batches are shaped unlike training batches",
            "give validation and test batches the training shapes (same batch size and sequence length, e.g. pad "
            "to the training length), or compile for changing shapes with JitConfig(torch_kwargs={'dynamic': True})",
        ),
        Cause(
            "changing_dim",
            "a dimension keeps changing between calls",
            "mark that dimension dynamic before the call with torch._dynamo.mark_dynamic(tensor, dim), or compile "
            "with JitConfig(torch_kwargs={'dynamic': True}); or pad inputs to a few fixed sizes",
        ),
        Cause(
            "python_value",
            "a Python number or attribute is burned into the graph",
            "keep what the compiled code reads the same from call to call: hold numbers that change in tensors (a "
            "buffer registered in __init__, updated in place) and give attributes it checks (x is None) their value "
            "before the first call",
        ),
        Cause(
            "tensor_property",
            "an input changed dtype, device or requires_grad",
            "give the compiled module the same kind of tensor at every call (cast once, e.g. x.float(); move it to "
            "one device; detach inputs that need no gradient)",
        ),
        Cause(
            "recompile_limit",
            "the frame hit torch._dynamo.config.recompile_limit and now runs eagerly",
            "fix the cause of this frame's other recompiles; raising the limit only postpones it",
        ),
        Cause(
            "other",
            "another guard failed",
            "read torch's reason (TORCH_LOGS=recompiles_verbose prints every guard that failed); docs/fixing.md "
            "lists what each guard means",
        ),
    )
}
EVAL_STAGES = frozenset(("validate", "validating", "sanity_check", "test", "testing", "predict", "predicting"))

_COMPILE_ID = re.compile(r"^\s*\[?!?\d+(?:/\d+)+\]?:\s*")
_SOURCE_COMMENT = re.compile(r"\s+#.*$")
_SIZE = re.compile(
    r"tensor '(?P<name>[^']+)' (?:size|stride) mismatch at index (?P<dim>\d+)\. "
    r"expected (?P<expected>\d+), actual (?P<actual>\d+)"
)
_TENSOR_PROPERTY = re.compile(r"tensor '([^']+)' (dtype|device|requires_grad|dispatch key set|rank) mismatch")
_GRAD_MODE = re.compile(r"GLOBAL_STATE changed: .*?(?:grad_mode|inference_mode)|is_inference|torch\.is_grad_enabled")
_NUMBER = re.compile(r"(?:==|!=)\s*-?(?:\d+\.?\d*(?:e-?\d+)?|inf|nan)\b")
_ATTRIBUTE = re.compile(
    r"\bis None\b|\bis not None\b|___check_obj_id|___check_type_id|ID_MATCH|TYPE_MATCH|hasattr|len\("
)
_STACK_NAME = re.compile(r"___stack\d+")


def normalize_reason(reason: str) -> str:
    """torch's recompile reason as one readable line: its first failed guard without the compile-id
    prefix, the source comment or the user stack, with generated names said in words
    (``L['x']`` is ``x``, ``___stack0`` an intermediate value)."""
    first = reason.strip().split("\n", 1)[0]
    text = _SOURCE_COMMENT.sub("", _COMPILE_ID.sub("", first)).strip()
    text = re.sub(r"L\['([^']+)'\]", r"\1", text)
    text = re.sub(r"\._modules\['([^']+)'\]", r".\1", text)
    return _STACK_NAME.sub("an intermediate value", text)


@dataclass(frozen=True)
class Classified:
    """A recompile's cause; ``expected`` marks the one-time price (a frame's first switch to a mode)."""

    cause: str
    subject: str  # torch's reason, normalized
    expected: bool = False


@dataclass
class _FrameHistory:
    stages: set[str] = field(default_factory=set)  # "train" / "eval": the modes it compiled for
    changed_dims: set[tuple[str, str]] = field(default_factory=set)
    first_steps: dict[str, int] = field(default_factory=dict)  # mode -> the step of its first compile
    changed_properties: set[tuple[str, str]] = field(default_factory=set)  # (tensor, dtype/device/...)


class RecompileClassifier:
    """Assigns each recompile one cause; feed it every compile of a run in the order they started.

    Example::

        classifier = RecompileClassifier()
        classifier.observe("0", "train", reason="", batch_index=0, batches=4)  # the first compile
        classifier.observe("0", "train", reason="0/0: tensor 'x' size mismatch at index 0. expected 8, "
                           "actual 6", batch_index=3, batches=4).cause  # "last_batch"
    """

    def __init__(self) -> None:
        self._frames: dict[str, _FrameHistory] = {}

    def observe(
        self,
        frame: str,
        stage: str,
        *,
        reason: str = "",
        is_recompile: bool = False,
        batch_index: int | None = None,
        batches: int | None = None,
        limit_hit: bool = False,
        step: int | None = None,
    ) -> Classified | None:
        """Note a frame compile (forward graphs only); for a recompile, return its cause."""
        history = self._frames.setdefault(frame, _FrameHistory())
        mode = "eval" if stage in EVAL_STAGES else "train"
        first_in_mode = mode not in history.stages
        history.stages.add(mode)
        if step is not None:
            history.first_steps.setdefault(mode, step)
        if not is_recompile:
            return None
        subject = normalize_reason(reason)
        if limit_hit:
            return Classified("recompile_limit", subject)
        if _GRAD_MODE.search(subject):
            return Classified("stage_switch", subject, expected=first_in_mode)
        size = _SIZE.search(subject)
        if size is not None:
            return Classified(self._size_cause(history, size, mode, batch_index, batches), subject)
        changed = _TENSOR_PROPERTY.search(subject)
        if changed is not None:
            if step is not None and not first_in_mode and history.first_steps.get(mode) == step:
                # one code object (layers of one class) called on the batch and on activations that
                # need gradients, in the step that first ran it
                history.changed_properties.add((changed[1], changed[2]))
                return Classified("shared_code", subject, expected=True)
            if (changed[1], changed[2]) in history.changed_properties:
                # it alternates between callers: torch named the first guard of one cache entry, and
                # what changed this time is another guard of another entry
                return Classified("other", subject)
            history.changed_properties.add((changed[1], changed[2]))
            return Classified("tensor_property", subject)
        if _NUMBER.search(subject) or _ATTRIBUTE.search(subject):
            return Classified("python_value", subject)
        return Classified("other", subject)

    @staticmethod
    def _size_cause(
        history: _FrameHistory, size: re.Match[str], mode: str, batch_index: int | None, batches: int | None
    ) -> str:
        dim = (size["name"], size["dim"])
        changed_before = dim in history.changed_dims
        history.changed_dims.add(dim)
        smaller = int(size["actual"]) < int(size["expected"])
        if smaller and batches is not None and batches > 1 and batch_index == batches - 1 and not changed_before:
            return "last_batch"
        if mode == "eval" and "train" in history.stages:
            return "eval_shape"
        return "changing_dim"


# -- graph breaks -----------------------------------------------------------------------------------
Owner = str  # "user", "torch", "lightning", "python", or another installed package's name

_PACKAGE_DIRS = re.compile(r"[/\\](?:site|dist)-packages[/\\]([^/\\]+)")
_STDLIB = re.compile(r"[/\\]lib[/\\]python3\.\d+[/\\]")
_LIGHTNING = frozenset(("lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities"))
_TORCH = frozenset(("torch", "functorch", "torchgen"))


_TORCH_SOURCE = re.compile(
    r"[/\\]torch[/\\](?:_dynamo|_inductor|_functorch|nn|distributed|utils|autograd|fx|_tensor|_ops)"
)


def owner_of(location: str) -> Owner:
    """Whose code ``location`` (``file:line``) is, by where the file lives: ``"user"`` unless it lies in
    an installed package (``torch``, ``lightning``, or that package's name) or Python's standard
    library (``"python"``)."""
    path = location.rpartition(":")[0] if location.rpartition(":")[2].isdigit() else location
    if not path:
        return "unknown"
    if path.startswith("<"):
        return "python"
    package = _PACKAGE_DIRS.search(path)
    if package is not None:
        name = package.group(1).removesuffix(".py")
        return "torch" if name in _TORCH else "lightning" if name in _LIGHTNING else name
    if _STDLIB.search(path):
        return "python"
    return "torch" if _TORCH_SOURCE.search(path) else "user"  # a torch built from source runs in place


def user_location(stack: tuple[str, ...] | list[str]) -> str:
    """The innermost frame of ``stack`` (outermost first) in the user's code: the line that led there."""
    for frame in reversed(stack):
        if owner_of(frame) == "user":
            return frame
    return ""


@dataclass(frozen=True)
class BreakText:
    """What torch says of a graph break, parsed from its reason (torch >= 2.7 writes it in this shape)."""

    type: str  # torch's graph-break type: the reason's first line
    explanation: str
    hints: tuple[str, ...]
    doc_url: str  # "" where this torch gives none


_URL = re.compile(r"https?://\S+?/gb/gb\d+\.html")


def parse_break(reason: str) -> BreakText:
    lines = [line.strip() for line in reason.strip().splitlines()]
    explanation = next(
        (line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation")), ""
    )
    hints = tuple(line.removeprefix("Hint:").strip() for line in lines if line.startswith("Hint:"))
    url = _URL.search(reason)
    return BreakText(lines[0] if lines else "", explanation, hints, url.group(0) if url else "")


_GENERIC_HINTS = ("Please report an issue to PyTorch.",)


def break_fix(owner: Owner, text: BreakText, user_line: str, innermost: str) -> str:
    """What to do about a graph break: torch's own hint where the break is in the user's code; where it
    is in another package's code, that it cannot be edited there, the user's line to change, and the hint."""
    hint = next((hint for hint in text.hints if hint not in _GENERIC_HINTS), "")
    if owner == "user":
        return hint or "change this line so that torch.compile can trace it (see torch's explanation)"
    line = f"how your line {short(user_line)} calls it" if user_line else "how your code calls it"
    advice = f"{owner}'s code cannot be edited: change {line}, or keep that call out of the compiled module"
    return advice + (f"; torch's hint: {hint}" if hint else "")


def short(location: str, keep: int = 2) -> str:
    """``file:line`` with the last ``keep`` parts of the path: what tables and messages show."""
    path, _, line = location.rpartition(":")
    parts = path.replace("\\", "/").split("/")
    return ("/".join(parts[-keep:]) + f":{line}") if path else location


def first_step_line(stage: str, global_step: int, wall_ms: float, compile_ms: float, phases_s: dict[str, float]) -> str:
    """``first train step (step 0): 41.2 s = 38.9 s compiling (forward 20.1 s, backward 18.8 s; inductor
    33.0 s of it) + 2.3 s running``: the live console's words and the summary's."""
    phases = ", ".join(f"{phase} {phases_s[phase]:.1f} s" for phase in ("forward", "backward") if phase in phases_s)
    if "inductor" in phases_s:
        phases += f"; inductor {phases_s['inductor']:.1f} s of it"
    compiling = f"{compile_ms / 1000:.1f} s compiling" + (f" ({phases})" if phases else "")
    running = max(wall_ms - compile_ms, 0.0) / 1000
    return f"first {stage} step (step {global_step}): {wall_ms / 1000:.1f} s = {compiling} + {running:.1f} s running"
