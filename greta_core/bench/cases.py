"""What `greta bench` times: op cases with their sizes, traffic, FLOPs and implementations.

Sizes and cost formulas are pure data; `build_case` turns one (op, params) pair into a
`Case` with input factories and the implementations to time:

- ``greta``: ``torch.ops.greta.<op>`` (skipped with a reason when not registered);
- ``vendor`` (or ``vendor:<backend>`` for attention, one per SDPA backend): the framework's
  own path (cuBLAS/hipBLASLt through ``torch.matmul``, ``F.scaled_dot_product_attention``,
  ``F.rms_norm``/``F.layer_norm``/``torch.softmax``; torch eager code where torch has no op);
- ``torch.compile``: the torch reference code compiled by inductor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from greta_core.errors import GretaInputError

OPS: tuple[str, ...] = (
    "vec_add",
    "rms_norm",
    "layer_norm",
    "softmax",
    "matmul",
    "attention",
    "rope",
    "kv_cache_append",
)
PRESETS: tuple[str, ...] = ("smoke", "standard", "perf")
SDPA_BACKENDS: tuple[str, ...] = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
EPS = 1e-6

Params = dict[str, int]

# (op, params) per preset. perf holds the sizes; smoke is tiny so it runs on CPU
# (and under the Triton interpreter) in seconds. Attention comes last: its torch.compile
# takes longest, so a --budget-s cut loses the least.
SIZES: dict[str, list[tuple[str, Params]]] = {
    "smoke": [
        ("vec_add", {"n": 4099}),
        ("rms_norm", {"rows": 8, "cols": 96}),
        ("layer_norm", {"rows": 8, "cols": 96}),
        ("softmax", {"rows": 8, "cols": 96}),
        ("matmul", {"m": 48, "n": 40, "k": 64}),
        ("attention", {"b": 1, "hq": 2, "hkv": 2, "s": 16, "d": 32}),
        ("attention", {"b": 1, "hq": 4, "hkv": 2, "s": 16, "d": 32}),
        ("rope", {"b": 1, "s": 16, "h": 2, "d": 32}),
        ("kv_cache_append", {"b": 1, "h": 2, "s_max": 32, "s_new": 4, "d": 32}),
    ],
    "standard": [
        ("vec_add", {"n": 1 << 24}),
        ("rms_norm", {"rows": 4096, "cols": 4096}),
        ("rms_norm", {"rows": 8192, "cols": 8192}),
        ("layer_norm", {"rows": 4096, "cols": 4096}),
        ("layer_norm", {"rows": 8192, "cols": 8192}),
        ("softmax", {"rows": 4096, "cols": 4096}),
        ("softmax", {"rows": 8192, "cols": 8192}),
        ("matmul", {"m": 2048, "n": 2048, "k": 2048}),
        ("matmul", {"m": 4096, "n": 4096, "k": 4096}),
        ("rope", {"b": 2, "s": 2048, "h": 16, "d": 128}),
        ("kv_cache_append", {"b": 2, "h": 8, "s_max": 4096, "s_new": 1024, "d": 128}),
        ("attention", {"b": 2, "hq": 16, "hkv": 16, "s": 2048, "d": 128}),
        ("attention", {"b": 2, "hq": 16, "hkv": 4, "s": 2048, "d": 128}),
    ],
    "perf": [
        ("vec_add", {"n": 1 << 27}),
        ("rms_norm", {"rows": 8192, "cols": 8192}),
        ("layer_norm", {"rows": 8192, "cols": 8192}),
        ("softmax", {"rows": 8192, "cols": 8192}),
        ("matmul", {"m": 4096, "n": 4096, "k": 4096}),
        ("matmul", {"m": 8192, "n": 8192, "k": 8192}),
        ("rope", {"b": 4, "s": 4096, "h": 32, "d": 128}),
        ("kv_cache_append", {"b": 4, "h": 8, "s_max": 8192, "s_new": 2048, "d": 128}),
        ("attention", {"b": 4, "hq": 32, "hkv": 32, "s": 4096, "d": 128}),
        ("attention", {"b": 4, "hq": 32, "hkv": 8, "s": 4096, "d": 128}),
    ],
}

# Ceiling sizes: copy bytes per tensor and the square matmul size, by preset and device.
CEILINGS: dict[str, dict[str, dict[str, int]]] = {
    "smoke": {
        "cpu": {"copy_bytes": 16 << 20, "matmul_n": 256},
        "gpu": {"copy_bytes": 256 << 20, "matmul_n": 4096},
    },
    "standard": {
        "cpu": {"copy_bytes": 64 << 20, "matmul_n": 512},
        "gpu": {"copy_bytes": 1 << 30, "matmul_n": 8192},
    },
    "perf": {
        "cpu": {"copy_bytes": 64 << 20, "matmul_n": 512},
        "gpu": {"copy_bytes": 1 << 30, "matmul_n": 8192},
    },
}


@dataclass(frozen=True)
class Cost:
    """Fewest bytes moved (inputs read once, outputs written once) and FLOPs of one call."""

    bytes_moved: int
    flops: int
    bound: str  # "memory" or "compute": which ceiling the op is judged against


def cost(op: str, p: Params, itemsize: int) -> Cost:
    """Traffic and arithmetic of one call of `op` at sizes `p`."""
    if op == "vec_add":
        return Cost(3 * p["n"] * itemsize, p["n"], "memory")
    if op in ("rms_norm", "layer_norm", "softmax"):
        rows, cols = p["rows"], p["cols"]
        params = {"rms_norm": cols, "layer_norm": 2 * cols, "softmax": 0}[op]
        flops = {"rms_norm": 4, "layer_norm": 7, "softmax": 5}[op] * rows * cols
        return Cost((2 * rows * cols + params) * itemsize, flops, "memory")
    if op == "matmul":
        m, n, k = p["m"], p["n"], p["k"]
        return Cost((m * k + k * n + m * n) * itemsize, 2 * m * n * k, "compute")
    if op == "attention":
        b, hq, hkv, s, d = p["b"], p["hq"], p["hkv"], p["s"], p["d"]
        elems = b * hq * s * d * 2 + b * hkv * s * d * 2  # q and out; k and v
        # QK^T and PV: 2 matmuls of 2*S*S*D FLOPs per head; causal does about half.
        flops = 4 * b * hq * s * s * d // 2
        return Cost(elems * itemsize, flops, "compute")
    if op == "rope":
        b, s, h, d = p["b"], p["s"], p["h"], p["d"]
        elems = 2 * b * s * h * d + 2 * s * (d // 2)  # x in, out, cos and sin
        return Cost(elems * itemsize, 3 * b * s * h * d, "memory")
    if op == "kv_cache_append":
        b, h, s_new, d = p["b"], p["h"], p["s_new"], p["d"]
        # k_new and v_new read, the same amount written into the caches, lengths read.
        return Cost(4 * b * h * s_new * d * itemsize + 4 * b, 0, "memory")
    raise GretaInputError(f"unknown op {op!r}")


def describe(op: str, p: Params) -> str:
    """Short shape label: 'rms_norm 8192x8192', 'attention B4 Hq32 Hkv8 S4096 D128 causal'."""
    if op == "vec_add":
        return f"n={p['n']}"
    if op in ("rms_norm", "layer_norm", "softmax"):
        return f"{p['rows']}x{p['cols']}"
    if op == "matmul":
        return f"{p['m']}x{p['n']}x{p['k']}"
    if op == "attention":
        return f"B{p['b']} Hq{p['hq']} Hkv{p['hkv']} S{p['s']} D{p['d']} causal"
    if op == "rope":
        return f"B{p['b']} S{p['s']} H{p['h']} D{p['d']}"
    if op == "kv_cache_append":
        return f"B{p['b']} H{p['h']} Smax{p['s_max']} Snew{p['s_new']} D{p['d']}"
    raise GretaInputError(f"unknown op {op!r}")


def select(preset: str, ops: list[str] | None) -> list[tuple[str, Params]]:
    """The preset's cases, restricted to `ops` (in the preset's order)."""
    if preset not in SIZES:
        raise GretaInputError(f"unknown preset {preset!r}; expected one of: {', '.join(PRESETS)}")
    unknown = sorted(set(ops or ()) - set(OPS))
    if unknown:
        raise GretaInputError(
            f"unknown op(s): {', '.join(unknown)}; expected some of: {', '.join(OPS)}"
        )
    return [(op, p) for op, p in SIZES[preset] if not ops or op in ops]


@dataclass
class Case:
    op: str
    params: Params
    shape: str
    dtype: str
    cost: Cost
    make_inputs: Callable[[], tuple[Any, ...]]
    impls: dict[str, Callable[..., Any]]
    skipped: dict[str, str] = field(default_factory=dict)
    # Impls that may legitimately be unavailable here (SDPA backends): a failure is "skipped".
    optional: frozenset[str] = frozenset()
    comparable: bool = True  # greta's output can be checked against the vendor's
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.op} {self.shape} {self.dtype}"


def greta_torch_op(name: str) -> tuple[Callable[..., Any] | None, str]:
    """torch.ops.greta.<name>, or None and why not."""
    import torch

    why = ""
    try:
        import greta_core.torch  # noqa: F401  (registers the ops present in this build)
    except Exception as exc:  # one broken op module must not hide the others
        why = f" (greta_core.torch import failed: {exc.__class__.__name__}: {exc})".splitlines()[0]
    try:
        return getattr(torch.ops.greta, name), ""
    except (AttributeError, RuntimeError):
        return None, f"torch.ops.greta.{name} is not registered in this build{why}"


def tensor_bytes(values: tuple[Any, ...]) -> int:
    """Bytes held by the tensors among `values` (one input set)."""
    return sum(t.numel() * t.element_size() for t in values if hasattr(t, "element_size"))


def build_case(op: str, p: Params, device: str, dtype: Any) -> Case:
    """A Case with input factories and implementations for `op` at sizes `p`."""
    import torch

    builder = _BUILDERS[op]
    itemsize = torch.empty((), dtype=dtype).element_size()
    case = builder(p, device, dtype)
    case.cost = cost(op, p, itemsize)
    greta, why = greta_torch_op(op)
    if greta is None:
        case.skipped["greta"] = why
    else:
        case.impls = {"greta": _greta_call(op, greta, p), **case.impls}
    return case


def _new_case(op: str, p: Params, dtype: Any, make: Callable[[], tuple[Any, ...]]) -> Case:
    return Case(
        op=op,
        params=p,
        shape=describe(op, p),
        dtype=str(dtype).replace("torch.", ""),
        cost=Cost(0, 0, "memory"),
        make_inputs=make,
        impls={},
    )


def _greta_call(op: str, fn: Callable[..., Any], p: Params) -> Callable[..., Any]:
    if op == "rms_norm":
        return lambda x, w: fn(x, w, EPS)
    if op == "layer_norm":
        return lambda x, w, b: fn(x, w, b, EPS)
    if op == "attention":
        return lambda q, k, v: fn(q, k, v, True)
    return fn


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    # Static shapes: each case compiles once for its own sizes, as a deployed model would.
    return torch.compile(fn, dynamic=False)


def _vec_add(p: Params, device: str, dtype: Any) -> Case:
    import torch

    def make() -> tuple[Any, ...]:
        return (
            torch.randn(p["n"], device=device, dtype=dtype),
            torch.randn(p["n"], device=device, dtype=dtype),
        )

    def ref(x: Any, y: Any) -> Any:
        return x + y

    case = _new_case("vec_add", p, dtype, make)
    case.impls = {"vendor": torch.add, "torch.compile": _compile(ref)}
    case.note = "copy-like: two reads, one write"
    return case


def _norm(op: str) -> Callable[[Params, str, Any], Case]:
    def build(p: Params, device: str, dtype: Any) -> Case:
        import torch
        import torch.nn.functional as F

        rows, cols = p["rows"], p["cols"]
        n_params = {"rms_norm": 1, "layer_norm": 2, "softmax": 0}[op]

        def make() -> tuple[Any, ...]:
            x = torch.randn(rows, cols, device=device, dtype=dtype)
            extra = [torch.randn(cols, device=device, dtype=dtype) for _ in range(n_params)]
            return (x, *extra)

        from greta_core import reference

        case = _new_case(op, p, dtype, make)
        if op == "rms_norm":
            vendor: Callable[..., Any] = lambda x, w: F.rms_norm(x, (cols,), w, EPS)  # noqa: E731
            ref: Callable[..., Any] = lambda x, w: reference.rms_norm(x, w, EPS)  # noqa: E731
        elif op == "layer_norm":
            vendor = lambda x, w, b: F.layer_norm(x, (cols,), w, b, EPS)  # noqa: E731
            ref = lambda x, w, b: reference.layer_norm(x, w, b, EPS)  # noqa: E731
        else:
            vendor = lambda x: torch.softmax(x, dim=-1)  # noqa: E731
            ref = reference.softmax
        case.impls = {"vendor": vendor, "torch.compile": _compile(ref)}
        return case

    return build


def _matmul(p: Params, device: str, dtype: Any) -> Case:
    import torch

    def make() -> tuple[Any, ...]:
        return (
            torch.randn(p["m"], p["k"], device=device, dtype=dtype),
            torch.randn(p["k"], p["n"], device=device, dtype=dtype),
        )

    def ref(a: Any, b: Any) -> Any:
        return a @ b

    case = _new_case("matmul", p, dtype, make)
    case.impls = {"vendor": torch.matmul, "torch.compile": _compile(ref)}
    case.note = "vendor = cuBLAS / hipBLASLt through torch.matmul"
    return case


def _attention(p: Params, device: str, dtype: Any) -> Case:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from greta_core import reference

    b, hq, hkv, s, d = p["b"], p["hq"], p["hkv"], p["s"], p["d"]

    def make() -> tuple[Any, ...]:
        return (
            torch.randn(b, hq, s, d, device=device, dtype=dtype),
            torch.randn(b, hkv, s, d, device=device, dtype=dtype),
            torch.randn(b, hkv, s, d, device=device, dtype=dtype),
        )

    gqa = {"enable_gqa": True} if hkv != hq else {}
    case = _new_case("attention", p, dtype, make)
    impls: dict[str, Callable[..., Any]] = {}
    for name in SDPA_BACKENDS:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            case.skipped[f"vendor:{name}"] = f"SDPBackend.{name} does not exist in this torch"
            continue

        def sdpa(q: Any, k: Any, v: Any, _backend: Any = backend) -> Any:
            with sdpa_kernel([_backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

        impls[f"vendor:{name}"] = sdpa
    # The reference maths (k/v heads repeated for GQA, fp32 softmax): what inductor compiles.
    impls["torch.compile"] = _compile(lambda q, k, v: reference.attention(q, k, v, True))
    case.impls = impls
    case.optional = frozenset(f"vendor:{n}" for n in SDPA_BACKENDS)
    case.note = "vendor = fastest F.scaled_dot_product_attention backend"
    return case


def _rope(p: Params, device: str, dtype: Any) -> Case:
    import torch

    from greta_core import reference

    b, s, h, d = p["b"], p["s"], p["h"], p["d"]

    def make() -> tuple[Any, ...]:
        angles = torch.rand(s, d // 2, device=device) * 6.2832
        return (
            torch.randn(b, s, h, d, device=device, dtype=dtype),
            angles.cos().to(dtype),
            angles.sin().to(dtype),
        )

    case = _new_case("rope", p, dtype, make)
    case.impls = {"vendor": reference.rope, "torch.compile": _compile(reference.rope)}
    # GRETA's pairing of the rotated halves may differ from this reference's: no check.
    case.comparable = False
    case.note = "torch has no rope op: vendor = torch eager reference"
    return case


def _kv_cache_append(p: Params, device: str, dtype: Any) -> Case:
    import torch

    from greta_core import reference

    b, h, s_max, s_new, d = p["b"], p["h"], p["s_max"], p["s_new"], p["d"]

    def make() -> tuple[Any, ...]:
        return (
            torch.randn(b, h, s_max, d, device=device, dtype=dtype),
            torch.randn(b, h, s_max, d, device=device, dtype=dtype),
            torch.randn(b, h, s_new, d, device=device, dtype=dtype),
            torch.randn(b, h, s_new, d, device=device, dtype=dtype),
            torch.randint(0, s_max - s_new + 1, (b,), device=device, dtype=torch.int32),
        )

    case = _new_case("kv_cache_append", p, dtype, make)
    case.impls = {
        "vendor": reference.kv_cache_append,
        "torch.compile": _compile(reference.kv_cache_append),
    }
    case.comparable = False
    case.note = "in place; vendor = torch eager scatter_"
    return case


_BUILDERS: dict[str, Callable[[Params, str, Any], Case]] = {
    "vec_add": _vec_add,
    "rms_norm": _norm("rms_norm"),
    "layer_norm": _norm("layer_norm"),
    "softmax": _norm("softmax"),
    "matmul": _matmul,
    "attention": _attention,
    "rope": _rope,
    "kv_cache_append": _kv_cache_append,
}
