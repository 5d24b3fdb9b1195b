"""torch.ops.greta.<name> for a declared op (``greta_core.ops.declare``).

``greta::<name>_fwd`` is a triton_op (``torch.compile`` sees the Triton kernel; fake tensors
come from tracing it) with a CPU kernel (the reference; the Triton kernel under the
interpreter, see ``_common.use_interpreter_on_cpu``) and the declared backward as its
autograd. ``greta::<name>`` is a CompositeImplicitAutograd front over it with two eager
shortcuts, plain GPU tensors only:

- no gradient wanted: the ready launch (``ops/_calls.py``), no dispatcher hop;
- a gradient wanted: a plain ``torch.autograd.Function`` over the same cached launches and
  the same backward, without torch.library's per-call autograd wrapper (as attention's).

torch.compile, dispatch modes, functorch transforms and tensor subclasses take the triton_op.
"""

from __future__ import annotations

import inspect
import operator
import types
from collections.abc import Callable
from typing import Any, Optional

import torch
from torch.autograd.function import once_differentiable
from torch.library import triton_op, wrap_triton

from greta_core.observe import record, recorded
from greta_core.ops import _calls
from greta_core.ops._calls import ForwardCall
from greta_core.ops._plan import _identity
from greta_core.ops.declare import Caller, OpDecl
from greta_core.torch._common import consuming, record_reference
from greta_core.torch._norms_common import run_triton_on_cpu, takes_reference

_lib = torch.library.Library("greta", "FRAGMENT")


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous()


def _torch_run(op: OpDecl, *args: Any) -> Any:
    if op.mutates and not torch.compiler.is_compiling() and _plain_device(args):
        # Eager: the launch itself (a consuming backward writing over its inputs). Through
        # the triton_op, torch 2.15's functional wrap_triton copies the arguments it mutates
        # (GPU suite, locked stack: the consuming backward's peak equalled the copying
        # one's). Compiling: the registered mutating op, which the graph must see.
        out = op.unpack(op.call.run(_identity, *args))
        # What the registered op's in-place schema does: a second backward through a
        # retained graph then fails autograd's version check instead of reading the
        # overwritten tensors.
        torch.autograd.graph.increment_version(
            [a for a, spec in zip(args, op.args, strict=False) if spec.mutable]
        )
        return out
    # The public front: an eager backward (no create_graph) takes its hot path too.
    return getattr(torch.ops.greta, op.name)(*args)


def _plain_device(args: tuple[Any, ...]) -> bool:
    """Plain tensors on a GPU (no fake, functional or subclass tensors, none on CPU)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return all(type(t) is torch.Tensor and t.device.type not in ("cpu", "meta") for t in tensors)


_torch_call = Caller(_torch_run, _contiguous, torch.zeros_like)


def _raw_run(op: OpDecl, *args: Any) -> Any:
    call = op.call
    # ForwardCall.launch's body, inline (one frame fewer): the ready launch, else launch,
    # which finds the same None and takes the ordinary path (a body op's runs the body).
    outs = call.launch_args(_identity, False, args) if type(call) is ForwardCall else None
    if outs is None:
        outs = call.launch(args)
    # OpDecl.unpack, inline for a backward's kernel op of several outputs (its plan's
    # results are the outputs: nothing to drop or unwrap).
    return outs if op.n_outputs > 1 and not op.mutates else op.unpack(outs)


class _RawCaller(Caller):
    """The eager Function's backward calls: the ready launches, in one frame (no
    ``Caller.__call__`` in front of the runner)."""

    __slots__ = ()
    __call__ = staticmethod(_raw_run)  # type: ignore[assignment]


# torch.Tensor.contiguous: no Python frame per call.
_raw_call = _RawCaller(_raw_run, torch.Tensor.contiguous, torch.zeros_like)


_TYPES = {"Tensor": torch.Tensor, "bool": bool, "float": float, "int": int, "str": str}


def _signature(op: OpDecl) -> inspect.Signature:
    """The Python signature torch.library infers the triton_op's schema from: the declared
    arguments (defaults as `fwd_defaults` says), every output of the forward."""
    params = []
    for a in op.args:
        annotation = _TYPES[a.type.rstrip("?")]
        if a.type.endswith("?"):
            annotation = Optional[annotation]  # noqa: UP045  (infer_schema reads typing forms)
        keep = a.has_default and (op.fwd_defaults or not op.front)
        default = a.default if keep else inspect.Parameter.empty
        params.append(inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=default, annotation=annotation))  # fmt: skip
    n_out = op.n_fwd_outputs
    out = torch.Tensor if n_out == 1 else tuple[(torch.Tensor,) * n_out]
    if n_out == 0:
        out = None
    return inspect.Signature(params, return_annotation=out)


_REGISTERED: dict[str, Any] = {}


def register_declared() -> None:
    """Register every declared op not registered yet (``greta_core.torch``'s import)."""
    from greta_core.ops.declare import DECLARED

    for op in list(DECLARED.values()):
        if op.name not in _REGISTERED:
            register(op)


def register(op: OpDecl) -> Any:
    """Define greta::<name>_fwd and greta::<name> for `op` (with ``front=False``: the
    triton_op greta::<name> alone); returns the triton_op."""
    if op.name in _REGISTERED:
        return _REGISTERED[op.name]
    n = op.n_tensors
    kernel_dtypes = tuple(getattr(torch, d) for d in op.kernel_dtypes)
    out_schema = op.schema.partition("->")[2].strip()
    n_out = op.n_outputs

    def reference(*args: Any) -> Any:
        op.validate(*args, reference=True)
        record_reference(op.name)
        return op.reference(*args)

    n_args = len(op.args)
    defaults = tuple(a.default for a in op.args)
    # The dispatcher drops trailing arguments equal to their defaults (and torch.library
    # passes one left at its default by keyword): those are filled here, typed by the
    # schema already, without binding every call afresh.
    first_default = n_args
    while first_default and op.args[first_default - 1].has_default:
        first_default -= 1

    def full(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if not kwargs:
            given = len(args)
            if given == n_args:
                return args
            if first_default <= given < n_args:
                return args + defaults[given:]
        return op.bind(args, kwargs, public=False)

    public = full
    if op._from_public is not None:  # the front takes the schema's order (see OpDecl.args)
        public_defaults = tuple(a.default for a in op.public_args)
        first_public_default = n_args
        while first_public_default and op.public_args[first_public_default - 1].has_default:
            first_public_default -= 1

        def public(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
            if not kwargs and first_public_default <= len(args) <= n_args:
                return op.from_public(args + public_defaults[len(args) :])
            return op.bind(args, kwargs)

    def fwd(*args: Any, **kwargs: Any) -> Any:
        args = full(args, kwargs)
        x = args[0]
        if (
            x.device.type in ("cpu", "meta") or x.dtype not in kernel_dtypes
        ):  # meta: no data to launch on
            return reference(*args)
        return op.unpack_fwd(op.call_stats.run(wrap_triton, *args))

    def fwd_cpu(*args: Any, **kwargs: Any) -> Any:
        args = full(args, kwargs)
        if op.check_values is not None:  # the values are on the host here: free
            op.validate(*args, reference=True)
            op.check_values(*args)
        if run_triton_on_cpu(*args[:n]) and args[0].dtype in kernel_dtypes:
            return op.unpack_fwd(op.call_stats.run(_identity, *args))
        return reference(*args)

    fwd.__signature__ = _signature(op)  # type: ignore[attr-defined]
    name = f"greta::{op.name}_fwd" if op.front else f"greta::{op.name}"
    fwd_op = triton_op(name, fwd, mutates_args=op.mutates)
    fwd_op.register_kernel("cpu")(fwd_cpu)
    _REGISTERED[op.name] = fwd_op

    backward = op.backward
    if backward is not None:

        def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
            _save(ctx, op, inputs, output if op.n_fwd_outputs > 1 else (output,))

        def grads(ctx: Any, *grad_outputs: Any) -> tuple:
            return tuple(backward.grads(_torch_call, grad_outputs[:n_out], _saved(ctx)))

        fwd_op.register_autograd(grads, setup_context=setup_context)
    if not op.front:
        if op.public is not None:
            _register_public(op, fwd_op)
        return fwd_op
    if backward is not None:  # the eager training path is the front's (a body op has none)
        train, optional = _eager_training(op)
        unwrap = torch._C._functorch.unwrap_if_dead
        by_torch = _training_route(op)

    _lib.define(f"{op.name}({op.schema.partition('->')[0].strip()}) -> {out_schema}")

    def eager(args: tuple[Any, ...]) -> Any:
        """The eager paths' decision, in one place for the front and the Python entry: the
        call's outputs, or _DECLINED (the torch op runs it)."""
        if args[0].dtype in kernel_dtypes:
            # A training call is told apart first: the no-grad hot path's checks would
            # only find a tensor that wants a gradient, and cost it a pass.
            training = _calls.eager_training(args[:n]) if backward is not None else None
            if training is None:
                done = op.call.if_eager(*args)
                if done is not None:
                    return op.unpack(done)
            elif training:
                if by_torch is not None:  # the table may hand a small call to torch's op
                    done = by_torch(args)
                    if done is not None:
                        return done
                # autograd's C apply after Function.apply's unwrapping of dead functorch
                # wrappers (see _eager_training), inline: one frame fewer per call.
                if optional:
                    return train(*[t if t is None else unwrap(t) for t in args[:n]], *args[n:])
                return train(*map(unwrap, args[:n]), *args[n:])
        return _DECLINED

    def front(*args: Any, **kwargs: Any) -> Any:
        args = public(args, kwargs)
        done = eager(args)
        if done is not _DECLINED:
            return done
        if op.stats:  # the statistics stay behind, for the backward
            return op.unpack(fwd_op(*args)[:n_out])
        return fwd_op(*args)

    # CompositeImplicitAutograd: decomposes into the triton_op (autograd, compile, fake).
    _lib.impl(op.name, front, "CompositeImplicitAutograd")
    setattr(ops, op.name, _entry(op, public, eager, getattr(torch.ops.greta, op.name)))
    return fwd_op


# Sentinel of a call the eager paths decline.
_DECLINED = object()

# The Python entries of the declared ops with a front: ``ops.<name>(*args)`` is
# ``torch.ops.greta.<name>(*args)``, less the dispatcher's hop where an eager path takes
# the call (see _entry). greta_core.transformers' forwards call these.
ops = types.SimpleNamespace()


def _entry(
    op: OpDecl,
    public: Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]],
    eager: Callable[[tuple[Any, ...]], Any],
    packet: Any,
) -> Callable[..., Any]:
    """``torch.ops.greta.<name>`` for Python callers, without the dispatcher's hop (its
    boxing of the arguments into the CompositeImplicitAutograd front costs about as much as
    the eager no-grad path itself) where the front's eager decision (`eager`) takes the
    call. Anything else calls `packet`, the torch op, as the caller wrote it:

    - ``torch.compile`` tracing (dynamo reads ``is_compiling()`` as True, so the graph
      gets the torch op, as from a direct call);
    - keyword arguments, or positional ones the dispatcher would convert or reject (an int
      where the schema has a float, a missing tensor): what the front gets is typed by the
      dispatcher, and the entry passes only calls already typed so;
    - whatever the front's eager decision declines (modes, functorch, subclasses, CPU)."""
    compiling = torch.compiler.is_compiling
    lowest = sum(not a.has_default for a in op.public_args)
    highest = len(op.public_args)
    # Positions in the op's order: (tensor, None allowed), (scalar, the types it may be).
    tensors = tuple((i, a.type.endswith("?")) for i, a in enumerate(op.args) if a.is_tensor)
    scalars = tuple(
        (i, (_TYPES[a.type.rstrip("?")], *((type(None),) if a.type.endswith("?") else ())))
        for i, a in enumerate(op.args) if not a.is_tensor
    )  # fmt: skip
    no_kwargs: dict[str, Any] = {}
    # A call giving every argument, in an op whose schema's order is its own, is complete
    # as given: no call to `public` (one frame fewer).
    as_given = op._from_public is None

    def entry(*args: Any, **kwargs: Any) -> Any:
        if not kwargs and lowest <= len(args) <= highest and not compiling():
            full = args if as_given and len(args) == highest else public(args, no_kwargs)
            # Typed as the dispatcher would pass them (inline: one frame fewer per call).
            for i, optional in tensors:
                t = full[i]
                if not isinstance(t, torch.Tensor) and (t is not None or not optional):
                    return packet(*args)
            for i, accepted in scalars:
                if type(full[i]) not in accepted:
                    return packet(*args)
            done = eager(full)
            if done is not _DECLINED:
                return done
        return packet(*args, **kwargs)

    entry.__name__ = entry.__qualname__ = op.name
    entry.__doc__ = f"torch.ops.greta.{op.name}, without the dispatcher where eager ({op.schema})"
    return entry


class _Context:
    """``NoContext``'s questions (ops/declare.py) answered for torch tensors: what a
    public ``Front`` decides its kernel op's flags from."""

    __slots__ = ("_kernel_dtypes",)

    def __init__(self, kernel_dtypes: tuple[torch.dtype, ...]) -> None:
        self._kernel_dtypes = kernel_dtypes

    @staticmethod
    def backward_follows(*tensors: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)

    @staticmethod
    def owned(t: torch.Tensor) -> bool:
        """Inside consume_inputs(); a plain tensor with data, outside any tracing (a traced
        graph would bake the decision in as a constant, and functionalization trusts the
        schema); not a leaf that requires grad (a parameter's data, never an
        intermediate)."""
        return (
            consuming()
            and type(t) is torch.Tensor
            and not torch.compiler.is_compiling()
            and not torch._C._len_torch_dispatch_stack()
            and not (t.is_leaf and t.requires_grad)
        )

    def kernel_runs(self, *tensors: torch.Tensor) -> bool:
        """The kernels, not the reference: a GPU in a kernel dtype, or the CPU interpreter
        when asked for."""
        if tensors[0].device.type == "cpu":
            return run_triton_on_cpu(*tensors)
        return not takes_reference(tensors[0], self._kernel_dtypes)


def _register_public(op: OpDecl, fwd_op: Any) -> None:
    """greta::<public name>, a CompositeImplicitAutograd front over `op`'s triton_op (see
    ``declare.Front``), and its Python entry ``ops.<public name>``."""
    spec = op.public
    assert spec is not None
    inputs, _, outputs = spec.schema.partition("->")
    _lib.define(f"{spec.name}({inputs.strip()}) -> {outputs.strip()}")
    args, n_out = spec.args, spec.n_outputs
    n_args = len(args)
    defaults = tuple(a.default for a in args)
    lowest = sum(not a.has_default for a in args)
    context = _Context(tuple(getattr(torch, d) for d in op.kernel_dtypes))
    route = spec.route
    public_call = op.public_call
    whole = op.n_fwd_outputs == n_out  # the kernel op returns the public outputs as they are

    def run(full: tuple[Any, ...]) -> Any:
        """A complete call, typed as the schema says."""
        if route is not None:
            done = route(context, *full)
            if done is not None:
                return done
        outs = fwd_op(*public_call(context, full))
        if whole:
            return outs
        return outs[0] if n_out == 1 else tuple(outs[:n_out])

    def front(*given: Any, **kwargs: Any) -> Any:
        # The dispatcher passes an argument left at its default by keyword, or drops it.
        if not kwargs and lowest <= len(given) <= n_args:
            return run(given + defaults[len(given) :])
        return run(spec.bind(given, kwargs))

    # CompositeImplicitAutograd: decomposes into the triton_op (autograd, compile, fake).
    _lib.impl(spec.name, front, "CompositeImplicitAutograd")

    packet = getattr(torch.ops.greta, spec.name)
    compiling = torch.compiler.is_compiling
    function_modes = torch._C._len_torch_function_stack
    plain = (torch.Tensor, torch.nn.Parameter)
    kinds = tuple(plain if a.is_tensor else (_TYPES[a.type],) for a in args)

    def typed(full: tuple[Any, ...]) -> bool:
        for v, kind in zip(full, kinds, strict=True):  # noqa: SIM110  (no generator per call)
            if type(v) not in kind:
                return False
        return True

    def entry(*given: Any, **kwargs: Any) -> Any:
        # The front itself where the dispatcher would only have called it: positional
        # arguments of the schema's exact types, plain tensors (a subclass may override
        # the op through __torch_function__), no function mode, not compiling (dynamo
        # records the torch op).
        if not kwargs and lowest <= len(given) <= n_args and not compiling():
            full = given + defaults[len(given) :]
            if not function_modes() and typed(full):
                return run(full)
        return packet(*given, **kwargs)

    entry.__name__ = entry.__qualname__ = spec.name
    entry.__doc__ = (
        f"torch.ops.greta.{spec.name}, without the dispatcher where eager ({spec.schema})"
    )
    setattr(ops, spec.name, entry)


def _save(ctx: Any, op: OpDecl, args: tuple, outs: tuple) -> None:
    """Keep what the declared backward reads: tensors through save_for_backward (version
    checks), the rest on ctx. The statistics, outputs of the triton_op, and the declared
    non-differentiable outputs are marked so."""
    saved = vars(op.saved(args, outs))
    tensors = {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}
    ctx.save_for_backward(*tensors.values())
    ctx.names = tuple(tensors)
    ctx.rest = {k: v for k, v in saved.items() if k not in tensors}
    if op.backward.may_consume:  # type: ignore[union-attr]
        ctx.rest["consume"] = consuming()
    nondiff = {*op.backward.nondiff_outputs, *range(op.n_outputs, len(outs))}  # type: ignore[union-attr]
    if nondiff:  # one call: each call replaces the set the last one marked
        ctx.mark_non_differentiable(*[outs[i] for i in sorted(nondiff)])
    if not op.backward.materialize_grads:  # type: ignore[union-attr]
        ctx.set_materialize_grads(False)


def _saved(ctx: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        **dict(zip(ctx.names, ctx.saved_tensors, strict=True)), **ctx.rest,
        needs_grad=ctx.needs_input_grad,
    )  # fmt: skip


# What observe records for an eager training call torch's own op ran (OpDecl.training_route).
TORCH_EAGER = "torch-eager"


def _training_route(op: OpDecl) -> Callable[[tuple[Any, ...]], Any] | None:
    """The eager training path's hand-off to PyTorch's own op (``op.training_route``) for
    the calls the arch's ``<name>_training`` table entry gives backend "torch" (by their
    ``ELEMENTS``), decided once per (table, shape, device): (args) -> outputs, or None
    (GRETA's path runs the call). None where the op declares no route."""
    torch_op = op.training_route
    if torch_op is None:
        return None
    from greta_core import configs
    from greta_core.arch import arch_of

    entry, name = op.training_entry, op.name
    decided: dict[tuple[Any, ...], str | None] = {}

    def route(args: tuple[Any, ...]) -> Any:
        x = args[0]
        key = (configs.lookup, x.shape, x.get_device())
        try:
            arch = decided[key]
        except KeyError:
            arch = arch_of(x)
            config = configs.lookup(entry, arch, {"ELEMENTS": x.numel()})
            if config.get("backend", "greta") != "torch":
                arch = None
            if len(decided) >= 4096:
                decided.clear()
            decided[key] = arch
        if arch is None:
            return None
        out = torch_op(*args)
        if out is not None and recorded.get(name) != TORCH_EAGER:
            record(name, TORCH_EAGER, arch)
        return out

    return route


def _eager_training(op: OpDecl) -> tuple[Callable[..., Any], bool]:
    """The eager training path of `op`: (the C ``apply`` of a plain ``torch.autograd.Function``
    over the ready launches, called with the op's arguments in its order; whether the op
    has an optional tensor, which the caller's unwrapping must pass over).

    Everything a call would otherwise recompute is decided here once, as it is the same for
    every call: which arguments and outputs the backward reads (picked by position into
    ``save_for_backward``), and what it gets as ``saved`` (a tuple whose fields are named
    as ``Backward`` says, built from ``ctx.saved_tensors`` without a dict or namespace).

    The Function is entered through autograd's C ``apply`` (what ``Function.apply`` calls
    once it has found no functorch transform, which ``eager_training`` has made sure of),
    after the same unwrapping of dead functorch wrappers. Its backward runs the op's
    declared backward without ``once_differentiable``'s ``no_grad`` block, which is a no-op
    there: autograd runs a backward with grad mode off unless ``create_graph`` is set, and
    then ``once_differentiable`` itself runs (a second differentiation must fail)."""
    backward = op.backward
    assert backward is not None
    n, n_args, n_out = op.n_tensors, len(op.args), op.n_outputs
    at = {a.name: i for i, a in enumerate(op.args)}
    at.update({s: n_args + n_out + i for i, s in enumerate(op.stats)})
    tensor_names = (*backward.saves, *(f"out{i}" for i in backward.saves_outputs))
    tensor_at = (*(at[s] for s in backward.saves), *(n_args + i for i in backward.saves_outputs))
    # One pick for the saved tensors, always a tuple (a slice for a single one).
    pick: Callable[[tuple[Any, ...]], Any] = (
        operator.itemgetter(*tensor_at) if len(tensor_at) > 1
        else operator.itemgetter(slice(tensor_at[0], tensor_at[0] + 1)) if tensor_at
        else (lambda src: ())
    )  # fmt: skip
    # The op's scalars come after its tensors (OpDecl.args): ctx keeps them as one slice.
    names = (*tensor_names, *(a.name for a in op.args[n:]), "consume", "needs_grad")
    saved_type = type(f"{op.name}_saved", (tuple,), {
        "__slots__": (), **{name: property(operator.itemgetter(i)) for i, name in enumerate(names)},
    })  # fmt: skip
    new_saved = tuple.__new__
    nondiff = tuple(i for i in backward.nondiff_outputs if i < n_out)
    # Its methods looked up per call (one attribute), not bound here: the forward then runs
    # whatever the op's call cache has now, as the backward's _raw_call does (tests count
    # launches).
    call = op.call_stats
    # ForwardCall.launch's body, inline (one frame fewer): the ready launch, else the call's
    # ordinary path through launch (which finds the same None first). A body op has no
    # ready launch: its launch runs the body.
    ready = isinstance(call, ForwardCall)
    may_consume = backward.may_consume
    grads_of = backward.grads
    grad_enabled = torch.is_grad_enabled

    def forward(ctx: Any, *args: Any) -> Any:
        outs = call.launch_args(_identity, False, args) if ready else None
        if outs is None:
            outs = call.launch(args)
        # FunctionCtx.save_for_backward's body (it sets to_save; autograd's C apply saves
        # them, version checks and all), without its frame. None: an absent optional.
        ctx.to_save = pick(args + outs)
        # Whether the backward may overwrite what it saved: decided while the forward runs
        # (``consuming()`` is a context the caller's forward pass sets), read by the backward.
        ctx.rest = (*args[n:], consuming() if may_consume else False)
        if nondiff:  # mark_non_differentiable's body: one set, every output in it
            ctx.non_differentiable = tuple([outs[i] for i in nondiff])
        return outs[0] if n_out == 1 else outs[:n_out]

    def saved(ctx: Any) -> Any:
        return new_saved(saved_type, ctx.saved_tensors + ctx.rest + (ctx.needs_input_grad,))

    @once_differentiable
    def differentiable_once(ctx: Any, *grad_outputs: Any) -> tuple:
        return tuple(grads_of(_raw_call, grad_outputs, saved(ctx)))

    def grads(ctx: Any, *grad_outputs: Any) -> tuple:
        if grad_enabled():  # create_graph=True
            return differentiable_once(ctx, *grad_outputs)
        # saved(ctx), inline (one frame fewer).
        rest = ctx.saved_tensors + ctx.rest + (ctx.needs_input_grad,)
        return tuple(grads_of(_raw_call, grad_outputs, new_saved(saved_type, rest)))

    # Named after the triton_op it stands in for (its grad_fn reads "<name>_eagerBackward").
    function = type(
        f"greta_{op.name}_fwd_eager",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(grads)},
    )
    # autograd's C apply: Function.apply's own call, once no functorch transform is active
    # (the caller unwraps dead functorch wrappers first, as Function.apply does).
    apply = super(torch.autograd.Function, function).apply
    return apply, any(a.type == "Tensor?" for a in op.args)
