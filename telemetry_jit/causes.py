"""Why a frame recompiled: :data:`CAUSES` (docs/fixing.md) and :class:`RecompileClassifier`, which gives each
recompile one, from torch's reason and where training was; shared by the recording and the analysis of files."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

DOCS = "docs/fixing.md"


@dataclass(frozen=True)
class Cause:
    """One kind of recompile: what happened and its fix (``eval_fix`` where the training fix would do harm)."""

    title: str
    fix: str
    eval_fix: str = ""
    in_the_frame: bool = False  # the fix changes the compiled frame's own code
    id: str = ""

    @property
    def doc(self) -> str:
        return f"{DOCS}#{self.id.replace('_', '-')}"

    def fix_for(self, stage: str, owner: str = "user") -> str:
        """The fix in ``stage``, of a frame in ``owner``'s code (``breaks.recompile_owner``): no fix edits a
        package's code."""
        if self.in_the_frame and owner not in ("user", "unknown"):
            return (
                f"{owner}'s code cannot be edited, and it is compiled only because your compiled code calls it: keep "
                "that call out of the compiled code. A LightningModule compiled whole (torch.compile(model) given "
                "to the Trainer) compiles training_step and the calls of Lightning's in it (self.log, the "
                "optimizer's step): compile the network it holds instead, e.g. JitConfig(module_selector='net', "
                "use_torch=True) or self.net.compile() in configure_model"
            )
        # a training fix that drops data (drop_last) only where the stage is known to train: evaluation's fix, which
        # keeps every sample, holds in training too, for a loop named otherwise ("inference") or not named at all
        return self.fix if stage in TRAIN_STAGES or not self.eval_fix else self.eval_fix


# where a mark_dynamic fix goes: the compiled frame's own argument, which is not the batch when only a submodule
# is compiled (tried: a mark on the batch left the recompile; a mark on the compiled call's argument removed it)
_AT_THE_CALL = (
    "on the tensor the compiled call receives (torch's reason names it: args[0] is its first argument), right "
    "before that call (a tensor it is computed from does not pass the mark on)"
)


# what a guard on a dynamic size asks of the code, whatever the stage
_SPECIALIZED = (
    "compiling with dynamic=True does not help here, nor does torch._dynamo.mark_dynamic (torch refuses a mark on "
    "a dimension it specializes): torch compiled the dimension dynamic (the option, or its automatic dynamic shapes "
    "after the size changed) and the code it traced needs that size or range (the compile's compile.specialized "
    "names the size torch fixed and, where dynamo was tracing, the line; TORCH_LOGS=dynamic prints it as "
    "set_replacement ... range_refined_to_singleton, or a guard as [guard added]). Make that code independent of "
    "the size (a Python number read from the shape, a view or slice to a fixed size; under inductor, a kernel it "
    "lowers for one size)"
)

CAUSES: dict[str, Cause] = {
    name: replace(cause, id=name)  # each knows its id (its section of docs/fixing.md)
    for name, cause in {
        "stage_switch": Cause(
            "switching between calls with and without gradients (training and validation/test/predict, or a "
            "torch.no_grad() call)",
            "expected: a compiled frame compiles once more for each grad mode it runs in (with gradients for "
            "training, without for validation); nothing to fix",
        ),
        "inference_mode": Cause(
            "validate/test/predict ran outside fit under inference mode (Lightning's default), whose tensors the "
            "training graphs' guards refuse",
            "expected: once per frame; Trainer(inference_mode=False) evaluates under no_grad instead, which the graphs "
            "compiled for fit's validation accept, and avoids it",
        ),
        "tuner": Cause(
            "the Tuner's trials changed the batch size (or learning rate) on purpose",
            "expected: the trials run a few steps at each size; nothing to fix",
        ),
        "shared_code": Cause(
            "one function compiled again for another caller in the same batch (e.g. one layer class called on the "
            "batch, then on activations that need gradients; two networks of one class on their own inputs)",
            "expected: one compile per kind of call, paid once in the frame's first batch; nothing to fix",
        ),
        "last_batch": Cause(
            "the last batch of an epoch is smaller than the others",
            "drop the smaller last batch with DataLoader(..., drop_last=True), or compile for changing batch "
            "sizes with JitConfig(torch_kwargs={'dynamic': True}) (torch.compile(dynamic=True))",
            "compile for changing batch sizes with JitConfig(torch_kwargs={'dynamic': True}), or mark dimension 0 "
            f"dynamic with torch._dynamo.mark_dynamic(tensor, 0) {_AT_THE_CALL}; or pad the last batch to the full "
            "size (and leave the padding out of the metrics); drop_last=True would leave samples unevaluated",
        ),
        "eval_shape": Cause(
            "validation/test batches are shaped unlike training batches",
            "give validation and test batches the training shapes (same batch size and sequence length, e.g. pad "
            "to the training length), or, where the tensor whose size changes is an input of the compiled call (not "
            "a module's own tensor, which torch keeps static), compile for changing shapes with "
            "JitConfig(torch_kwargs={'dynamic': True}) (torch.compile(dynamic=True))",
        ),
        "changing_dim": Cause(
            "a dimension keeps changing between calls",
            f"mark that dimension dynamic with torch._dynamo.mark_dynamic(tensor, dim) {_AT_THE_CALL}; or compile "
            "with dynamic=True (JitConfig(torch_kwargs={'dynamic': True}), or torch.compile(..., dynamic=True)); "
            "or, where shapes must stay static, pad inputs to a few fixed sizes (one compile each)",
        ),
        "specialized": Cause(
            "torch compiled a dynamic dimension for one size or a range of sizes (the traced code depends on it: a "
            "guard on its size), and a call fell outside it",
            f"{_SPECIALIZED}, or keep the calls within the range: pad the batch, or drop an epoch's smaller last batch "
            "with DataLoader(..., drop_last=True)",
            f"{_SPECIALIZED}, or pad the batch to a size within it (and leave the padding out of the metrics); "
            "drop_last=True would leave samples unevaluated",
        ),
        "size_one": Cause(
            "a dimension compiled dynamic met a size of 0 or 1 (a batch of one): torch compiles those sizes apart from "
            "every other (its dynamic sizes are at least 2: the guard '2 <= x.size()[0]')",
            "a batch of one compiles a graph of its own, once per frame and stage, not again; to avoid it, keep "
            "batches of one out: pad such a batch to two (and leave the padding out of the metrics), or drop an "
            "epoch's last batch where it holds one sample, DataLoader(..., drop_last=True)",
            "a batch of one compiles a graph of its own, once per frame and stage, not again; to avoid it, pad such a "
            "batch to two and leave the padded row out of the outputs and metrics (or accept the one compile): every "
            "sample keeps its prediction",
        ),
        "python_value": Cause(
            "a Python number or attribute is burned into the graph",
            "keep what the compiled code reads the same from call to call: hold numbers that change in tensors (a "
            "buffer registered in __init__, updated in place) and give attributes it checks (x is None) their value "
            "before the first call",
            in_the_frame=True,
        ),
        "break_value": Cause(
            "a number a graph break left behind (read with .item() before the break) is burned into the code after it",
            "fix the graph break where the frame was split (the graph breaks name it, with its fix; for .item(), "
            "torch._dynamo.config.capture_scalar_outputs = True keeps the number in the graph): this recompile "
            "goes with it",
            in_the_frame=True,
        ),
        "module_mode": Cause(
            "a module switched between train() and eval() (its training flag, read by dropout or batch norm, is "
            "part of what was compiled)",
            "expected: a compiled frame compiles once more for each mode its modules run in (model.train(), "
            "model.eval()); nothing to fix",
        ),
        "trainable_params": Cause(
            "which parameters train changed (layers frozen or unfrozen, e.g. by Lightning's BackboneFinetuning): "
            "a parameter's requires_grad is part of what the compiled code was made for",
            "expected: a compiled frame compiles once more for each set of trainable parameters it runs with; nothing "
            "to fix (freeze and unfreeze between epochs, not at every step)",
        ),
        "tensor_property": Cause(
            "an input changed dtype, device or requires_grad",
            "give the compiled module the same kind of tensor at every call (cast once, e.g. x.float(); move it to "
            "one device; detach inputs that need no gradient)",
        ),
        "recompile_limit": Cause(
            "the frame hit torch's recompile limit (torch._dynamo.config.recompile_limit, or "
            "accumulated_recompile_limit) and now runs eagerly",
            "fix the cause of this frame's other recompiles; raising the limit only postpones it",
        ),
        "other": Cause(
            "another guard failed",
            "read torch's reason (TORCH_LOGS=recompiles_verbose prints every guard that failed); docs/fixing.md "
            "lists what each guard means",
        ),
    }.items()
}
# a stage that runs by itself when its Trainer method is called (not within fit): named by that call
BY_ITSELF = {"validate": "validate()"}
TRAIN_STAGES = frozenset(("train", "training", "tuner"))  # stages that fit the model (the tuner's trials do)
EVAL_STAGES = frozenset(
    ("validate", "validating", "sanity_check", "test", "testing", "predict", "predicting", *BY_ITSELF.values())
)
# prices, never things to fix
EXPECTED_CAUSES = frozenset(
    ("stage_switch", "module_mode", "shared_code", "inference_mode", "tuner", "trainable_params")
)

_COMPILE_ID = re.compile(r"^\s*\[?!?\d+(?:/\d+)+\]?:\s*")
_ENTRY_ID = re.compile(r"^\s*\[?!?(\d+(?:/\d+)+)\]?:")
_SOURCE_COMMENT = re.compile(r"\s+#.*$")
_SIZE = re.compile(
    r"tensor '(?P<name>.+?)' (?:size|stride) mismatch at index (?P<dim>\d+)\. "
    r"expected (?P<expected>\d+), actual (?P<actual>\d+)"
)
# a guard on a dynamic dimension's size: "16 <= x.size()[0]", "x.size()[2] <= 64", "Eq(x.size()[1], 47)"
_SIZE_GUARD = re.compile(
    r"(?:<|>|==|!=|\bEq\(|\bNe\().*\.(?:size|stride)\(\)\[\d+\]|\.(?:size|stride)\(\)\[\d+\].*(?:<|>|==|!=)"
)
# torch's 0/1 specialization: a dynamic size is assumed at least 2, so a call of size 0 or 1 fails this guard
# (the sized value may be a resume function's, normalized with spaces: "2 <= an intermediate value[2].size()[0]")
_SIZE_ONE = re.compile(r"(?:^|[\s(])2 <= [^<>=!]*\.size\(\)\[\d+\]|\.size\(\)\[\d+\] >= 2\b")


_TENSOR_PROPERTY = re.compile(r"tensor '(.+?)' (dtype|device|requires_grad|dispatch key set|rank) mismatch")
_MODULE_MODE = re.compile(r"\.training == (?:True|False)\b")  # a module's train()/eval() flag
_GRAD_MODE = re.compile(r"GLOBAL_STATE changed: .*?(?:grad_mode|inference_mode)|is_inference|torch\.is_grad_enabled")
_NUMBER = re.compile(r"(?:==|!=)\s*-?(?:\d+\.?\d*(?:e-?\d+)?|inf|nan)\b")
_STRING = re.compile(r"""(?:==|!=)\s*(?:'[^']*'|"[^"]*")""")
_ATTRIBUTE = re.compile(
    r"\bis None\b|\bis not None\b|___check_obj_id|___check_type_id|ID_MATCH|TYPE_MATCH|hasattr|len\("
)
_STACK_NAME = re.compile(r"___stack\d+")
# what normalize_reason calls a value on the stack where a graph break split the frame: only a resume
# function (the code after a break) receives one
_BREAK_VALUE = "an intermediate value"


def entry_of(reason: str) -> str:
    """The compile id of the cache entry a reason is about (``"0/2"`` of ``"0/2: tensor 'x' ..."``), or ``""``."""
    found = _ENTRY_ID.match(reason)
    return found[1] if found else ""


def _distance(reason: str) -> int:
    """How far a cache entry was from the call its failed guard refused (smaller: more of it matched). torch checks
    a tensor's dispatch keys, dtype, device and requires_grad before its sizes, so an entry that failed on a size
    matched everything before it; an entry made for another grad or module mode, or for inputs (or parameters)
    that need gradients, is another kind of call."""
    if _GRAD_MODE.search(reason) or _MODULE_MODE.search(reason) or "dispatch key set mismatch" in reason:
        return 5
    whose = _requires_grad_of(reason)
    if whose:
        return 4 if whose == "input" else 3
    if _SIZE.search(reason) or _SIZE_GUARD.search(reason):
        return 0
    return 1 if _TENSOR_PROPERTY.search(reason) else 2


def _module_of(caller: str) -> str:
    return caller.split("/", 1)[0]


def entries_for(reasons: Sequence[str], callers: Mapping[str, str], caller: str) -> tuple[list[str], list[str]]:
    """Of each cache entry's reason, those of entries made for ``caller``'s modules, and of those the entries made
    for its kind of call (``compat.torch.compile_caller``: which inputs and parameters need gradients); an entry
    whose caller is unknown counts as both."""
    module = _module_of(caller)
    own = [reason for reason in reasons if _module_of(callers.get(entry_of(reason), caller)) == module]
    return own, [reason for reason in own if callers.get(entry_of(reason), caller) == caller]


def _parameters_of(caller: str) -> str:
    return caller.rsplit("/", 1)[-1] if caller.count("/") == 2 else ""


def own_entries(reasons: Sequence[str], callers: Mapping[str, str], caller: str) -> list[str]:
    """The reasons of the entries made for ``caller``'s kind of call, else for its modules, else all of them."""
    own, same_kind = entries_for(reasons, callers, caller)
    return same_kind or own or list(reasons)


def telling_reason(reasons: Sequence[str]) -> str:
    """Of each cache entry's reason (most recent first), the one that says what changed: torch names the most
    recent entry's, which may be one made for another grad or module mode, or for inputs that need gradients; of
    the rest, a size that changed (everything before it matched), then a dtype or device, then another guard."""
    return min(reasons, key=_distance, default="")


def _requires_grad_of(reason: str) -> str:
    """Whose ``requires_grad`` guard failed: ``"parameter"``, ``"input"`` (any other tensor), or ``""``."""
    changed = _TENSOR_PROPERTY.search(reason)
    if changed is None or changed[2] != "requires_grad":
        return ""
    return "parameter" if "_parameters[" in changed[1] else "input"


def normalize_reason(reason: str) -> str:
    """torch's recompile reason as one readable line: its first failed guard, generated names said in words
    (``L['x']`` is ``x``, ``___stack0`` an intermediate value)."""
    first = reason.strip().split("\n", 1)[0]
    text = _SOURCE_COMMENT.sub("", _COMPILE_ID.sub("", first)).strip()
    text = re.sub(r"L\['([^']+)'\]", r"\1", text)
    text = re.sub(r"\._modules\['([^']+)'\]", r".\1", text)
    return _STACK_NAME.sub(_BREAK_VALUE, text)


@dataclass(frozen=True)
class Classified:
    """A recompile's cause; ``expected``: the one-time price; ``behind`` (``recompile_limit``): the frame's most
    common cause before it."""

    cause: str
    subject: str  # torch's reason, normalized
    expected: bool = False
    behind: str = ""
    reason: str = ""  # torch's reason as it gave it, of the cache entry that says what changed


_Batch = tuple[int, "int | None"]  # (global step, batch index): one batch, also where a step spans several


@dataclass
class _FrameHistory:
    stages: set[str] = field(default_factory=set)  # "train" / "eval": the modes it compiled for
    # (tensor, dim, "train"/"eval") -> the batch it first changed in, in that mode: each loop's own last batch
    changed_dims: dict[tuple[str, str, str], _Batch | None] = field(default_factory=dict)
    eval_sizes: set[tuple[str, str, str]] = field(default_factory=set)  # (tensor, dim, size) evaluation brought
    train_sizes: set[tuple[str, str, str]] = field(default_factory=set)  # ... that training's recompiles named
    first_batches: dict[str, _Batch] = field(default_factory=dict)  # mode -> the batch of its first compile
    changed_properties: set[tuple[str, str]] = field(default_factory=set)  # (tensor, dtype/device/...)
    causes: Counter[str] = field(default_factory=Counter)  # its recompiles' causes so far
    # compile id -> whose call it compiled (compat.torch.compile_caller: its modules' kinds and parameter shapes)
    callers: dict[str, str] = field(default_factory=dict)
    specialized: set[tuple[str, str]] = field(default_factory=set)  # (tensor, dim) torch fixed to one size here


@dataclass(frozen=True)
class _Sizes:
    history: _FrameHistory
    dynamic: str  # the option the frame compiled with: "true", "false", "auto", "" unknown
    mode: str  # "train" / "eval"
    batch: _Batch | None
    batch_index: int | None
    batches: int | None
    static: frozenset[tuple[str, str]] = frozenset()  # (input, dim) this compile's graph holds as a number

    def cause(self, subject: str) -> str:
        """The cause of a failed guard on a size (``""`` for none): a static size that changed, or a dynamic one's
        size or range the code needs (``specialized``; ``size_one`` for torch's 0/1 specialization)."""
        size = _SIZE.search(subject)
        if size is not None:
            static = self._static(size)  # noted in the frame's history whatever the option
            # torch made the dimension dynamic (the option, or its automatic dynamic shapes after a change) and the
            # code it traced fixed it to one size: neither dynamic=True nor mark_dynamic makes it dynamic
            torch_fixed = (size["name"], size["dim"]) in self.history.specialized
            # under torch's default (auto) a size that changed compiles dynamic at once; where the recompile's graph
            # holds it as a number of 2 or more (compile.input_shapes), torch fixed it again (said where no log line
            # was read: a file whose recording predates compile.specialized, a logger the user's setup closed)
            fixed_again = self.dynamic == "auto" and int(size["actual"]) >= 2
            torch_fixed = torch_fixed or fixed_again and (size["name"], size["dim"]) in self.static
            # evaluation shaped unlike training and a smaller last batch keep their own fixes (give evaluation the
            # training shapes; drop_last), which work whatever torch decided; a dimension that keeps changing is
            # told its fix is not dynamic=True
            torch_fixed = torch_fixed and static == "changing_dim"
            return "specialized" if self.dynamic == "true" or torch_fixed else static
        if _SIZE_GUARD.search(subject):
            return "size_one" if _SIZE_ONE.search(subject) else "specialized"
        return ""

    def _static(self, size: re.Match[str]) -> str:
        dim = (size["name"], size["dim"])
        seen = (*dim, self.mode) in self.history.changed_dims
        first = self.history.changed_dims.setdefault((*dim, self.mode), self.batch)
        # changed in an earlier batch of this mode (the same batch met again by another caller of the code is the
        # same change; the other mode's loop has a last batch of its own)
        changed_before = seen and (self.batch is None or first != self.batch)
        smaller = int(size["actual"]) < int(size["expected"])
        last = self.batches is not None and self.batches > 1 and self.batch_index == self.batches - 1
        if smaller and last and not changed_before:
            return "last_batch"
        actual = (*dim, size["actual"])
        if self.mode == "eval":
            if actual in self.history.train_sizes:  # a size training has had: the dimension changed for both
                return "changing_dim"
            if "train" in self.history.stages:
                self.history.eval_sizes.add(actual)
                return "eval_shape"
            return "changing_dim"
        if actual in self.history.eval_sizes:  # training meets a size evaluation left (a cached mask)
            return "eval_shape"
        self.history.train_sizes.update({(*dim, size["expected"]), actual})
        return "changing_dim"


FRAMES_REMEMBERED = 10_000  # frames whose history the classifier keeps: the least recently compiled forgotten
_MAX_ENTRIES = 1024  # cache entries' callers kept per frame (torch's recompile_limit is 8)
_SOURCE_DIM = re.compile(r"^(?P<tensor>.+)\.size\(\)\[(?P<dim>\d+)\]$")


_SHAPE = re.compile(r"^(?P<name>.+): \[(?P<dims>[^\]]*)\]$")


def _dims(input_shapes: Sequence[str]) -> Iterator[tuple[str, int, str]]:
    """``(input, index, size)`` of each dimension of a graph's inputs (``"x: [2, s3]"``: ``("x", 0, "2")``,
    ``("x", 1, "s3")``)."""
    for shape in input_shapes:
        if found := _SHAPE.match(shape):
            for index, size in enumerate(found["dims"].split(",")):
                if size := size.strip():
                    yield found["name"], index, size


def _static_dims(input_shapes: Sequence[str]) -> frozenset[tuple[str, str]]:
    """``(input, dim)`` of each dimension a graph holds as a number (``"x: [2, s3]"``: ``("x", "0")``)."""
    return frozenset((name, str(index)) for name, index, size in _dims(input_shapes) if size.isdigit())


_INDEXED = re.compile(r"^(\w+)\[(\w+)\]$")


def dynamic_dims(input_shapes: Sequence[str]) -> list[tuple[str, int]]:
    """``(input, dim)`` of each dimension a graph holds as a symbol (``"kwargs[x]: [4, s3]"``: ``("kwargs['x']",
    1)``, the input as torch's reasons name it): under automatic dynamic shapes, those whose size changed."""
    return [
        (f"{indexed[1]}['{indexed[2]}']" if (indexed := _INDEXED.match(name)) else name, index)
        for name, index, size in _dims(input_shapes)
        if not size.isdigit()
    ]


def specialized_dim(source: str) -> tuple[str, str] | None:
    """``("x", "2")`` of the source torch names a size by (``"L['x'].size()[2]"``), as its reasons name the tensor
    (``tensor 'x' size mismatch at index 2``); ``None`` for a source that is no tensor's size."""
    found = _SOURCE_DIM.match(normalize_reason(source))
    return (found["tensor"], found["dim"]) if found else None


class RecompileClassifier:
    """Assigns each recompile one cause; feed it every compile of a run in the order they started."""

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
        dynamic: str = "",
        reasons: Sequence[str] = (),
        trigger: str = "dynamo",
        compile_id: str = "",
        caller: str = "",
        specialized: Sequence[str] = (),
        input_shapes: Sequence[str] = (),
    ) -> Classified | None:
        """Note a frame compile (forward graphs only); for a recompile, return its cause. ``dynamic``: the option it
        compiled with (``""`` unknown); ``reasons``: every cache entry's; ``caller``: whose call it compiled
        (``""`` unknown), which tells the entries made for this caller from other callers'; ``specialized``: the
        sizes torch fixed while compiling it (``"L['x'].size()[2]"``); ``input_shapes``: its graph's inputs as torch
        decided them (``"x: [s77, 4]"``, ``compile.input_shapes``); a plug-in's naming no known cause has none."""
        # the latest compiled frames' histories, a bounded number (a run or file of countless frames)
        history = self._frames.pop(frame, None) or _FrameHistory()
        self._frames[frame] = history
        if len(self._frames) > FRAMES_REMEMBERED:
            del self._frames[next(iter(self._frames))]
        if compile_id and caller and len(history.callers) < _MAX_ENTRIES:
            history.callers[compile_id] = caller
        history.specialized.update(dim for source in specialized if (dim := specialized_dim(source)))
        mode = "eval" if stage in EVAL_STAGES else "train"
        first_in_mode = mode not in history.stages
        history.stages.add(mode)
        batch = (step, batch_index) if step is not None else None
        if batch is not None:
            history.first_batches.setdefault(mode, batch)
        if not is_recompile:
            return None
        in_first_batch = batch is not None and not first_in_mode and history.first_batches.get(mode) == batch
        sizes = _Sizes(history, dynamic, mode, batch, batch_index, batches, _static_dims(input_shapes))
        entries = list(reasons) or ([reason] if reason else [])
        # the entries made for this caller: another caller's entry (a network of another shape sharing the code)
        # fails on what tells the callers apart, which no change of this caller's removes; and of those, the
        # entries made for its kind of call (the same inputs and parameters needing gradients): torch checks a
        # tensor's dtype before its requires_grad, so another kind's entry may fail on a dtype that a cast alone
        # would not make match
        own, same_kind = entries_for(entries, history.callers, caller)
        new_kind = bool(caller) and bool(entries) and not limit_hit and stage != "tuner" and not same_kind
        trained = {_parameters_of(history.callers.get(entry_of(entry), caller)) for entry in own}
        if new_kind and not own:
            classified = Classified("shared_code", normalize_reason(entries[0]), expected=True, reason=entries[0])
        elif new_kind and _parameters_of(caller) not in trained:
            # the first call with these parameters trainable (toggle_optimizer, a frozen backbone)
            told = min(own, key=lambda entry: _requires_grad_of(normalize_reason(entry)) != "parameter")
            classified = Classified("trainable_params", normalize_reason(told), expected=True, reason=told)
        else:
            told = telling_reason(same_kind or own) if reasons else reason
            attributed = bool(caller) and bool(same_kind)
            classified = self._classify(sizes, told, stage, limit_hit, in_first_batch, attributed=attributed)
            if classified.cause == "other" and not caller:  # another entry's reason may name the size that changed
                for entry in entries:
                    if sized := sizes.cause(normalize_reason(entry)):
                        classified = Classified(sized, normalize_reason(entry), reason=entry)
                        break
        if classified.cause == "other" and trigger not in ("dynamo", "thunder"):
            return None
        history.causes[classified.cause] += 1
        return classified

    def _classify(
        self, sizes: _Sizes, reason: str, stage: str, limit_hit: bool, in_first_batch: bool, attributed: bool
    ) -> Classified:
        """``reason``'s cause; ``attributed``: it is of an entry made for the same caller (a size or dtype that
        changed there is the caller's to fix, never the price of another caller)."""
        return replace(self._cause_of(sizes, reason, stage, limit_hit, in_first_batch, attributed), reason=reason)

    def _cause_of(
        self, sizes: _Sizes, reason: str, stage: str, limit_hit: bool, in_first_batch: bool, attributed: bool
    ) -> Classified:
        subject = normalize_reason(reason)
        history = sizes.history
        if limit_hit:
            behind = [cause for cause, _ in history.causes.most_common() if cause not in EXPECTED_CAUSES]
            return Classified("recompile_limit", subject, behind=behind[0] if behind else "")
        if stage == "tuner":
            return Classified("tuner", subject, expected=True)
        if _GRAD_MODE.search(subject):
            # grad mode takes two values, so a frame's first recompile for it is its first compile in the other,
            # whatever the stage says (a plain loop's evaluation, a no_grad call inside training_step)
            return Classified("stage_switch", subject, expected=history.causes["stage_switch"] == 0)
        if _MODULE_MODE.search(subject):  # two values as well: train() and eval()
            return Classified("module_mode", subject, expected=history.causes["module_mode"] == 0)
        size, changed = _SIZE.search(subject), _TENSOR_PROPERTY.search(subject)
        if changed is not None and changed[2] == "dispatch key set" and sizes.mode == "eval":
            return Classified("inference_mode", subject, expected=True)
        if _requires_grad_of(subject) == "parameter":
            return Classified("trainable_params", subject, expected=True)
        # a size, dtype or device of this caller's own entry is never the price of another caller
        own_change = attributed and (size is not None or (changed is not None and changed[2] != "requires_grad"))
        if (size or changed) and in_first_batch and not own_change:
            # one code object called by another caller in the batch that first ran it: layers of one class on
            # the batch and on activations that need gradients, two networks of one class on their own inputs
            if changed is not None:
                history.changed_properties.add((changed[1], changed[2]))
            return Classified("shared_code", subject, expected=True)
        if sized := sizes.cause(subject):
            return Classified(sized, subject)
        if changed is not None:
            if (changed[1], changed[2]) in history.changed_properties and not own_change:
                # it alternates between callers: torch named the first guard of one cache entry, and
                # what changed this time is another guard of another entry
                return Classified("other", subject)
            history.changed_properties.add((changed[1], changed[2]))
            return Classified("tensor_property", subject)
        if subject.startswith(_BREAK_VALUE) and _NUMBER.search(subject):
            return Classified("break_value", subject)
        if _NUMBER.search(subject) or _STRING.search(subject) or _ATTRIBUTE.search(subject):
            return Classified("python_value", subject)
        return Classified("other", subject)
