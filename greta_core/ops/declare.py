"""One declaration per op: everything GRETA needs to know about an op, written once.

An op is its Triton kernel(s) plus one :class:`OpDecl`: the name and schema, the input
checks, the launch plan (framework-free: :class:`Meta` of each tensor and the scalars in,
a :class:`~greta_core.ops._plan.Plan` out, blocks from the config table), the reference
maths, the backward (written once against a ``call`` that runs other declared ops in
whichever binding is differentiating) and the cases the AOT build must cover. From it:

- the raw launch (:meth:`OpDecl.raw`): validation and planning cached per call signature
  (``ops/_calls.py``), ready launches on the hot path;
- ``torch.ops.greta.<name>`` (``greta_core.torch._declared``): a triton_op forward with a
  CPU kernel, autograd, ``torch.compile`` support, and an eager front whose no-grad and
  training calls run the ready launches;
- ``greta_core.jax`` (``greta_core.jax._declared``): a ``custom_vjp`` over jax-triton, the
  reference elsewhere;
- the GretaCompute entry (``greta_core.compute._declared``);
- the AOT specs (:func:`aot_specs`), derived from the plans of the declared cases, so a
  kernel module writes no ``aot_specs(arch)`` by hand.

See docs/en/architecture.md ("How to add an op").
"""

from __future__ import annotations

import ast
import functools
import importlib
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from greta_core.errors import GretaConfigError, GretaInputError
from greta_core.ops._calls import ForwardCall
from greta_core.ops._plan import In, Out, Plan, Wrap, _identity, dtype_name, memo


@dataclass(frozen=True, slots=True)
class Meta:
    """What a plan reads of a tensor: shape, strides (in elements) and dtype name."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, t: Any) -> Meta:
        """A torch tensor's."""
        return cls(tuple(t.shape), tuple(t.stride()), dtype_name(t.dtype))

    @classmethod
    def contiguous(cls, shape: Iterable[int], dtype: Any) -> Meta:
        """A row-major array's (JAX arrays, AOT cases)."""
        shape = tuple(shape)
        strides, step = [], 1
        for n in reversed(shape):
            strides.append(step)
            step *= max(n, 1)
        return cls(shape, tuple(reversed(strides)), dtype_name(dtype))

    @property
    def is_contiguous(self) -> bool:
        """Row-major, as torch's ``is_contiguous`` (dims of size 1 have any stride)."""
        if 0 in self.shape:
            return True
        step = 1
        for n, stride in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if n != 1 and stride != step:
                return False
            step *= n
        return True


@dataclass(frozen=True, slots=True)
class Arg:
    name: str
    type: str  # the torch schema type: "Tensor", "bool", "float", "int", "float?" ...
    default: Any = None
    has_default: bool = False
    mutable: bool = False  # "Tensor(a!)": the op writes into it (see OpDecl.mutates)

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")


_LITERALS = {"True": True, "False": False, "None": None}


def parse_schema(schema: str) -> tuple[tuple[Arg, ...], int]:
    """``"Tensor x, Tensor cos, bool inverse=False -> Tensor"`` -> (args, output count).

    ``Tensor(a!) cache`` marks an argument the op writes into; ``-> ()`` returns nothing."""
    inputs, _, outputs = schema.partition("->")
    args = []
    for part in filter(None, (p.strip() for p in inputs.split(","))):
        decl, eq, default = part.partition("=")
        type_, name = decl.split()
        value = _LITERALS.get(default.strip()) if eq else None
        if eq and default.strip() not in _LITERALS:
            value = ast.literal_eval(default.strip())
        mutable = type_.startswith("Tensor(") and type_.endswith("!)")
        args.append(Arg(name, "Tensor" if mutable else type_, value, bool(eq), mutable))
    outputs = outputs.strip().strip("()").strip()
    return tuple(args), len(outputs.split(",")) if outputs else 0


_CONVERT: dict[str, Callable[[Any], Any]] = {"bool": bool, "float": float, "int": int, "str": str}


def _bind(
    name: str, spec: tuple[Arg, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """`args` then `kwargs` as one positional list after `spec`: defaults filled, scalars
    converted. Raises GretaInputError for a missing or unexpected argument."""
    if len(args) > len(spec):
        raise GretaInputError(f"{name}: takes {len(spec)} arguments")
    out = list(args)
    for a in spec[len(args) :]:
        if a.name in kwargs:
            out.append(kwargs.pop(a.name))
        elif a.has_default:
            out.append(a.default)
        else:
            raise GretaInputError(f"{name}: missing argument '{a.name}'")
    if kwargs:
        raise GretaInputError(f"{name}: unexpected argument(s) {sorted(kwargs)}")
    for i, a in enumerate(spec):
        convert = _CONVERT.get(a.type)
        if convert is not None and out[i] is not None:
            out[i] = convert(out[i])
    return out


class Caller:
    """What a declared backward gets as `call`: ``call(op, *args)`` runs a declared op in
    the binding that differentiates; ``call.contiguous(t)`` is a dense copy of a strided
    gradient where a kernel needs one (torch's ``.contiguous()``; JAX arrays already are);
    ``call.dense(t, like)`` is that, or zeros like `like` for an output that got no
    gradient (torch passes None; JAX always passes zeros)."""

    __slots__ = ("_run", "_zeros_like", "contiguous")

    def __init__(
        self,
        run: Callable[..., Any],
        contiguous: Callable[[Any], Any],
        zeros_like: Callable[[Any], Any] | None = None,
    ) -> None:
        self._run = run
        self.contiguous = contiguous
        self._zeros_like = zeros_like

    def __call__(self, op: OpDecl, *args: Any) -> Any:
        return self._run(op, *args)

    def dense(self, t: Any, like: Any) -> Any:
        if t is None:
            if self._zeros_like is None:
                raise GretaConfigError("this binding passes no None gradient")
            return self._zeros_like(like)
        return self.contiguous(t)


@dataclass(frozen=True)
class Backward:
    """How the op differentiates.

    `grads(call, grad_outputs, saved)` returns one gradient (or None) per forward argument;
    `grad_outputs` has one gradient per output of the schema (statistics get none).
    `call` (a :class:`Caller`) runs declared ops in the binding that is differentiating (the
    torch op, the raw launch, the JAX implementation), so the backward is written once. `saved`
    has the arguments and statistics (:attr:`OpDecl.stats`) named in `saves`, every
    non-tensor argument, the forward's outputs listed in `saves_outputs` as ``out0``,
    ``out1``..., ``needs_grad`` (one bool per forward argument: torch's
    ``ctx.needs_input_grad``, all True under JAX) and, with `may_consume`, ``consume``.
    """

    grads: Callable[[Caller, tuple[Any, ...], Any], tuple[Any, ...]]
    saves: tuple[str, ...] = ()
    saves_outputs: tuple[int, ...] = ()
    nondiff_outputs: tuple[int, ...] = ()  # e.g. saved statistics returned beside y
    # ``saved.consume``: the torch forward ran inside ``greta_core.torch.consume_inputs()``,
    # so the backward may write its gradients over the saved inputs (never under JAX).
    may_consume: bool = False
    # (*args) -> the names among `saves` and ``out<i>`` this call keeps (the others read
    # None): a backward whose needs depend on the call's flags keeps nothing else alive
    # (linear_cross_entropy_fwd: its precomputed gradients, or the inputs to redo them).
    # None: every one.
    saves_for: Callable[..., tuple[str, ...]] | None = None
    # False: an output nobody sent a gradient for reaches `grads` as None (torch), not as
    # zeros autograd would allocate (a [vocab, hidden] dweight output's, say).
    materialize_grads: bool = True


@dataclass(frozen=True)
class Front:
    """The public op of a kernel op (``front=False``) whose trailing arguments are not its
    callers' to give but each call's context (linear_cross_entropy_fwd's ``with_grad``: a
    backward follows; ``dh_into_hidden``: the caller lets it write over `hidden`), and
    which may hand a call to another implementation (the config table's choice of torch's
    own code). Each binding derives the public op from it: ``torch.ops.greta.<name>`` with
    its Python entry, ``greta_core.jax.<name>``.

    `schema`: the public op's; its arguments are the kernel op's leading ones (the schema's
    order), its outputs the kernel op's first ones. `flags(context, *args)`: the kernel
    op's remaining arguments for one call, from what the binding's `context` tells of it
    (:class:`NoContext`'s questions). `route(context, *args)`: the result of another
    implementation where one takes the call (torch tensors; torch's autograd
    differentiates it), else None."""

    name: str
    schema: str
    flags: Callable[..., tuple[Any, ...]]
    route: Callable[..., Any] | None = None
    args: tuple[Arg, ...] = field(init=False)
    n_outputs: int = field(init=False)

    def __post_init__(self) -> None:
        args, n_outputs = parse_schema(self.schema)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "n_outputs", n_outputs)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The complete public call (the schema's order): defaults filled, scalars
        converted. Raises GretaInputError for a missing or unexpected argument."""
        return tuple(_bind(self.name, self.args, args, kwargs))


class NoContext:
    """What a binding tells :attr:`Front.flags` of a call; this one (JAX's) tells nothing:
    no backward is known to follow, no input may be overwritten."""

    @staticmethod
    def backward_follows(*tensors: Any) -> bool:
        """Autograd records the call: the forward may compute what the backward needs."""
        return False

    @staticmethod
    def owned(t: Any) -> bool:
        """The caller lets the op write over `t` (nothing reads its values afterwards)."""
        return False

    @staticmethod
    def kernel_runs(*tensors: Any) -> bool:
        """The op's kernels (not its reference) take these tensors."""
        return False


@dataclass(eq=False)
class OpDecl:
    """One op. See the module docstring; docs/en/architecture.md has a worked example."""

    name: str
    schema: str  # torch schema of the public op, "Tensor x, ..., float eps=1e-06 -> Tensor"
    # (*args, reference=False) -> arch; raises GretaInputError. `reference`: only the
    # reference will run (CPU tensors, float64), so the kernels' dtype/layout limits relax.
    validate: Callable[..., str]
    # (arch, *tensor Metas, *scalars) -> Plan: In(i) is the i-th tensor argument as given.
    # None for an op with a `body` instead.
    plan: Callable[..., Plan] | None
    reference: Callable[..., Any]  # (*args) -> output(s), torch tensors or JAX arrays
    backward: Backward | None = None
    # JAX arrays' checks (torch tensors go through `validate`); None: no extra checks.
    check_arrays: Callable[..., None] | None = None
    # arch -> the (Metas..., scalars...) cases a kernel wheel precompiles (None for an absent
    # optional tensor; with `stats`, each case ends with the plan's `stats` flag).
    aot_cases: Callable[[str], Iterable[tuple[Any, ...]]] | None = None
    kernel_dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    # Its kernels reach the matrix units (the AOT report checks): all, or those named.
    uses_matrix_units: bool | tuple[str, ...] = False
    describe: str = ""  # one line for GretaCompute and reports
    # Saved statistics (a norm's rstd): outputs of greta::<name>_fwd after the schema's,
    # which the public op drops and the backward reads. With stats, `plan` takes a trailing
    # flag `stats`: False plans neither their buffers nor their stores (a call no backward
    # follows: the raw API, the no-grad front, the JAX primal).
    stats: tuple[str, ...] = ()  # (a kernel that always stores them: the same plan)
    # (*tensor Metas) -> the indices of the tensor arguments the kernels cannot take as
    # given (rows that do not flatten to one stride, say): the call passes a contiguous
    # copy of each and the plan sees the copy's layout; such a signature gets no ready
    # launch. None: the plan takes every tensor as given (validation rejects the rest).
    copies: Callable[..., Iterable[int]] | None = None
    # (*args) -> None, raises GretaInputError: checks that read values, not the signature
    # (a capacity, lengths). They cost a device sync on a GPU, so they run where values are
    # on the host: the torch CPU kernel, JAX's concrete arrays, the raw op when asked.
    check_values: Callable[..., None] | None = None
    # False: ``torch.ops.greta.<name>`` is the triton_op itself, with no eager front and no
    # ``<name>_fwd`` (a backward's kernel op such as greta::rms_norm_bwd, an op that writes
    # into its arguments).
    front: bool = True
    # Whether greta::<name>_fwd's schema keeps the declared defaults.
    fwd_defaults: bool = True
    # AOT: an int argument equal to 1 is the constexpr 1, as Triton's JIT specialises it
    # at run time (the cases name the unit strides the launches have).
    aot_unit_ints: bool = False
    # AOT: compile each case at its own ints' specialisation (each 16-divisible or not, a
    # unit int the constexpr 1), not at the build's all-aligned/all-ragged variants: for
    # calls that mix the two (attention: strides divisible, lengths and head counts not).
    aot_case_ints: bool = False
    # (*tensor Metas) -> False where the kernels do not take a call the op accepts (a head
    # dim they were not built for): the JAX binding then runs the reference. None: they
    # take every call in `kernel_dtypes`.
    kernel_takes: Callable[..., bool] | None = None
    # The arguments in the op's own order: tensors first, then the scalars, each group as
    # the schema has it. `validate`, `plan`, `reference`, the backward's gradients and the
    # cases take this order; the public functions (torch.ops.greta.<name>, the raw launch,
    # the JAX function) take the schema's, which may put a scalar before an optional tensor
    # (attention's ``causal`` before ``q_lens``).
    # An op whose kernels interleave with the binding's own tensor ops (linear
    # cross-entropy: a GEMM per chunk of tokens, then the kernel on its logits) has no one
    # plan. `body(arch, *args, wrap=, stats=)` runs its whole forward on torch tensors
    # (after `validate`) and returns every result as a tuple (with `stats`, the statistics
    # too); `jax_body(*args, stats=)` does the same on JAX arrays (the kernels through
    # jax-triton where they run, its own fallback elsewhere). Such an op gets no ready
    # launch (its calls run the body) and no AOT specs from plans: its kernel module keeps
    # ``aot_specs(arch)``.
    body: Callable[..., tuple[Any, ...]] | None = None
    jax_body: Callable[..., tuple[Any, ...]] | None = None
    # The public op over this kernel op (front=False), where its callers do not give every
    # argument: see :class:`Front`.
    public: Front | None = None
    # (*args) -> the outputs of PyTorch's own eager op for this call, or None where it does
    # not take it (``ops/_torch_eager.py``). Eager training calls (torch tensors that want
    # a gradient, on a GPU) run it where the arch's ``<name>_training`` table entry picks
    # backend "torch" for the call's ``ELEMENTS`` (its first tensor's numel): small,
    # host-bound calls. None: GRETA's own path always.
    training_route: Callable[..., Any] | None = None
    args: tuple[Arg, ...] = field(init=False)
    public_args: tuple[Arg, ...] = field(init=False)  # the schema's order
    # For each of `args`, its position in the schema; None where the two orders agree.
    _from_public: tuple[int, ...] | None = field(init=False, repr=False)
    n_outputs: int = field(init=False)
    n_tensors: int = field(init=False)
    # The arguments the op writes into ("Tensor(a!)"). Its plan's results are these, in
    # order, then the schema's outputs; torch and raw return the outputs (the writes are
    # in place), JAX returns all (its arrays are immutable: the updated ones come first).
    mutates: tuple[str, ...] = field(init=False)
    call: ForwardCall = field(init=False)  # the schema's outputs (no statistics)
    call_stats: ForwardCall = field(init=False)  # with the statistics (a backward follows)
    _converts: bool = field(init=False, repr=False)

    @property
    def training_entry(self) -> str:
        """The config table entry that picks ``training_route``'s calls."""
        return f"{self.name}_training"

    def __post_init__(self) -> None:
        self.public_args, self.n_outputs = parse_schema(self.schema)
        order = sorted(
            range(len(self.public_args)), key=lambda i: not self.public_args[i].is_tensor
        )
        self.args = tuple(self.public_args[i] for i in order)
        self._from_public = tuple(order) if order != sorted(order) else None
        self.n_tensors = sum(a.is_tensor for a in self.args)
        self.mutates = tuple(a.name for a in self.args if a.mutable)
        # Scalars to convert (bind): a call of tensors alone skips binding (the hot path).
        self._converts = any(a.type in _CONVERT for a in self.args) or bool(self._from_public)
        if self.mutates and (self.front or self.backward is not None):
            raise GretaConfigError(
                f"{self.name}: an op that writes into its arguments has no eager front and "
                "no autograd (front=False, backward=None)"
            )
        if self.public is not None and self.front:
            raise GretaConfigError(f"{self.name}: a public Front is for a kernel op (front=False)")
        per_call = self.backward is not None and (
            self.backward.saves_for is not None or not self.backward.materialize_grads
        )
        if per_call and self.front:
            raise GretaConfigError(
                f"{self.name}: saves_for and materialize_grads=False are for a kernel op "
                "(front=False): the eager front's training path saves every name"
            )
        if self.body is not None:
            self.call, self.call_stats = _BodyCall(self, False), _BodyCall(self, True)
            return
        self.plan = memo(self.plan)
        # Validation and planning once per call signature (ops/_calls.py): the plan takes
        # the call's tensors as given (unless `copies` says otherwise for one signature),
        # so every such signature may get a ready launch.
        positions = tuple(range(self.n_tensors))

        def plan_inputs(resolved: tuple[Plan, tuple[int, ...]]) -> Any:
            plan, copied = resolved
            return None if copied else (plan, positions)

        def inputs(resolved: tuple[Plan, tuple[int, ...]], args: tuple[Any, ...]) -> Any:
            plan, copied = resolved
            tensors = list(args[: self.n_tensors])
            for i in copied:
                tensors[i] = tensors[i].contiguous()
            return plan, tuple(tensors)

        calls = [
            ForwardCall(
                functools.partial(self._resolve, stats=stats), self.n_tensors, plan_inputs, inputs
            )
            for stats in ((False, True) if self.stats else (None,))
        ]
        self.call, self.call_stats = calls[0], calls[-1]

    @property
    def n_fwd_outputs(self) -> int:
        """Outputs of greta::<name>_fwd: the schema's, then the statistics."""
        return self.n_outputs + len(self.stats)

    def plan_for(
        self, arch: str, metas: Iterable[Meta | None], scalars: Iterable[Any], stats: bool = False
    ) -> Plan:
        """The plan of one call: `stats` plans the statistics too (ops that have them)."""
        return self.plan(arch, *metas, *scalars, *((stats,) if self.stats else ()))

    # --- the raw launch ---------------------------------------------------------------

    def _resolve(self, *args: Any, stats: bool | None = None) -> tuple[Plan, tuple[int, ...]]:
        """(the plan, the positions of the tensors passed as contiguous copies)."""
        arch = self.validate(*args)
        n = self.n_tensors
        metas = [None if t is None else Meta.of(t) for t in args[:n]]
        copied = tuple(self.copies(*metas)) if self.copies is not None else ()
        for i in copied:
            metas[i] = Meta.contiguous(metas[i].shape, metas[i].dtype)  # type: ignore[union-attr]
        return self.plan_for(arch, metas, args[n:], bool(stats)), copied

    def bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], public: bool = True
    ) -> tuple[Any, ...]:
        """The full positional argument tuple in the op's order (tensors first): defaults
        filled, scalars converted. `public`: `args` come in the schema's order."""
        out = _bind(self.name, self.public_args if public else self.args, args, kwargs)
        if public and self._from_public is not None:
            out = [out[i] for i in self._from_public]
        return tuple(out)

    def from_public(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A complete call in the schema's order (the dispatcher's: typed already) in the
        op's order; the tuple itself where the two agree."""
        order = self._from_public
        return args if order is None else tuple([args[i] for i in order])

    def public_call(self, context: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A complete call of the public op (:attr:`public`, the schema's order) as this
        op's full argument tuple (its order), the flags decided from `context`."""
        flags = self.public.flags(context, *args)  # type: ignore[union-attr]
        return self.from_public((*args, *flags))

    def raw(self, *args: Any, wrap: Wrap = _identity, **kwargs: Any) -> Any:
        """Launch the kernels on torch tensors (GPU, or CPU under TRITON_INTERPRET=1); no
        autograd. Raises GretaInputError for a wrong shape, dtype, device or layout."""
        if kwargs or len(args) != len(self.args) or self._converts:
            args = self.bind(args, kwargs)
        return self.unpack(self.call.run(wrap, *args))

    def if_eager(self, *args: Any) -> Any | None:
        """:meth:`raw` (positional, complete arguments) for a call
        :func:`~greta_core.ops._calls.eager_raw` allows (a torch.ops front's hot path), else
        None: the caller then takes its torch op."""
        done = self.call.if_eager(*args)
        return None if done is None else self.unpack(done)

    def raw_fwd(self, *args: Any, wrap: Wrap = _identity, **kwargs: Any) -> tuple[Any, ...]:
        """:meth:`raw` with the statistics: every output of greta::<name>_fwd, as a tuple."""
        return self.call_stats.run(wrap, *self.bind(args, kwargs))

    def unpack(self, outs: tuple[Any, ...]) -> Any:
        """The schema's outputs of a plan's results (a mutating op's updated arguments
        dropped): one tensor, a tuple, or None for ``-> ()``."""
        if self.mutates:
            outs = outs[len(self.mutates) :]
        if self.n_outputs == 1:
            return outs[0]
        return outs if self.n_outputs else None

    def unpack_fwd(self, outs: tuple[Any, ...]) -> Any:
        """:meth:`unpack` keeping the statistics (greta::<name>_fwd's outputs)."""
        if self.mutates:
            outs = outs[len(self.mutates) :]
        if self.n_fwd_outputs == 1:
            return outs[0]
        return tuple(outs) if self.n_fwd_outputs else None

    def saved(self, args: tuple[Any, ...], outputs: tuple[Any, ...]) -> types.SimpleNamespace:
        """What the backward reads (see :class:`Backward`), by name. `outputs`: every
        output of the forward, statistics included."""
        assert self.backward is not None
        values = {a.name: v for a, v in zip(self.args, args, strict=True) if not a.is_tensor}
        names = {a.name: i for i, a in enumerate(self.args)}
        stats = {s: self.n_outputs + i for i, s in enumerate(self.stats)}
        for n in self.backward.saves:
            values[n] = outputs[stats[n]] if n in stats else args[names[n]]
        values.update({f"out{i}": outputs[i] for i in self.backward.saves_outputs})
        if self.backward.saves_for is not None:
            kept = set(self.backward.saves_for(*args))
            tensors = (*self.backward.saves, *(f"out{i}" for i in self.backward.saves_outputs))
            values.update({n: None for n in tensors if n not in kept})
        return types.SimpleNamespace(**values)


class _BodyCall:
    """:class:`ForwardCall`'s interface for an op with a `body`: every call validates and
    runs the body (no plan to cache, no ready launch)."""

    __slots__ = ("_op", "_stats")

    def __init__(self, op: OpDecl, stats: bool) -> None:
        self._op, self._stats = op, stats

    def run(self, wrap: Wrap, *args: Any) -> tuple[Any, ...]:
        arch = self._op.validate(*args)
        return self._op.body(arch, *args, wrap=wrap, stats=self._stats)  # type: ignore[misc]

    def launch(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return self.run(_identity, *args)

    def if_eager(self, *args: Any) -> tuple[Any, ...] | None:
        from greta_core.ops._calls import eager_raw

        return self.run(_identity, *args) if eager_raw(*args[: self._op.n_tensors]) else None


DECLARED: dict[str, OpDecl] = {}


def declare(op: OpDecl) -> OpDecl:
    """Register `op` (by name; declaring a name again replaces it: a reloaded module)."""
    DECLARED[op.name] = op
    return op


# --- AOT specs, derived from the plans ----------------------------------------------------

_SHORT = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "i1",
}  # fmt: skip


def _scalar_type(value: Any) -> str:
    # What Triton's JIT specializes a Python scalar as.
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    return "fp32"


def launch_signature(plan: Plan, launch: Any, metas: tuple[Any, ...]) -> dict[str, str]:
    """The Triton signature of one planned launch: pointer dtypes and scalar types by name."""
    # A launch passes the kernel's leading parameters positionally, constexprs by keyword
    # (arg_names: a JITFunction's and the interpreter's alike).
    signature = {}
    for name, arg in zip(launch.kernel.arg_names, launch.args, strict=False):
        if type(arg) is In:
            signature[name] = "*" + _SHORT[metas[arg.index].dtype]
        elif type(arg) is Out:
            signature[name] = "*" + _SHORT[plan.buffers[arg.index].dtype]
        else:
            signature[name] = _scalar_type(arg)
    return signature


def aot_specs(op: OpDecl, arch: str) -> list[Any]:
    """Every distinct launch of the plans of `op`'s AOT cases for `arch`, as AotSpecs."""
    from greta_core.kernels._aot import AotSpec

    specs: dict[tuple[Any, ...], Any] = {}
    for case in op.aot_cases(arch) if op.aot_cases else ():
        metas = tuple(case[: op.n_tensors])  # None for an absent optional tensor
        plan = op.plan(arch, *case)
        for launch in plan.launches:
            signature = launch_signature(plan, launch, metas)
            constexprs, options = dict(launch.constexprs), dict(launch.options)
            divisible: dict[str, bool] | None = {} if op.aot_case_ints else None
            if op.aot_unit_ints or op.aot_case_ints:
                names = launch.kernel.arg_names
                unaligned, unspecialised = not_specialised(launch.kernel)
                for name, arg in zip(names, launch.args, strict=False):
                    if type(arg) is not int or name in unspecialised:
                        continue
                    if arg == 1:
                        del signature[name]
                        constexprs[name] = 1
                    elif divisible is not None and name not in unaligned:
                        divisible[name] = arg % 16 == 0
            key = (
                launch.kernel,
                *(tuple(sorted(d.items())) for d in (signature, constexprs, options)),
                None if divisible is None else tuple(sorted(divisible.items())),
            )
            if key in specs:
                continue
            pointers = ",".join(t[1:] for t in signature.values() if t.startswith("*"))
            consts = ",".join(f"{k}={v}" for k, v in constexprs.items())
            if divisible is not None:  # the ints not 16-divisible, Triton's "no attribute"
                consts += ";ragged=" + ",".join(n for n, d in divisible.items() if not d)
            name = f"{launch.kernel.__name__}[{pointers};{consts}]"
            taken = sum(s.name.startswith(name) for s in specs.values())
            specs[key] = AotSpec(
                name=f"{name}#{taken}" if taken else name, kernel=launch.kernel,
                signature=signature, constexprs=constexprs, options=options,
                uses_matrix_units=_matrix(op.uses_matrix_units, launch.kernel),
                int_divisible=divisible,
            )  # fmt: skip
    return list(specs.values())


def not_specialised(kernel: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(ints the JIT does not specialise on 16-divisibility, ints it does not specialise at
    all): the kernel's ``do_not_specialize_on_alignment`` / ``do_not_specialize``, so two
    cases whose ints differ only there are one key, one spec. The interpreter keeps them in
    its keyword arguments."""
    names = list(kernel.arg_names)
    given = getattr(kernel, "kwargs", None) or getattr(kernel, "__dict__", {})

    def named(key: str) -> frozenset[str]:
        return frozenset(names[a] if isinstance(a, int) else a for a in given.get(key) or ())

    return named("do_not_specialize_on_alignment"), named("do_not_specialize")


def _matrix(uses: bool | tuple[str, ...], kernel: Any) -> bool:
    return uses if isinstance(uses, bool) else kernel.__name__ in uses


def _kernel_module(kernel: Any) -> str:
    return getattr(getattr(kernel, "fn", kernel), "__module__", "")


def aot_maker(kernel_module: str) -> Callable[[str], list[Any]] | None:
    """``aot_specs(arch)`` for the declared ops of ``greta_core.kernels.<kernel_module>``
    (their declarations live in ``greta_core.ops.<kernel_module>``), or None."""
    try:
        importlib.import_module(f"greta_core.ops.{kernel_module}")
    except ModuleNotFoundError:
        return None
    full = f"greta_core.kernels.{kernel_module}"

    def make(arch: str) -> list[Any]:
        specs = []
        for op in DECLARED.values():
            specs += [s for s in aot_specs(op, arch) if _kernel_module(s.kernel) == full]
        return specs

    return make if any(op.aot_cases for op in DECLARED.values()) else None
