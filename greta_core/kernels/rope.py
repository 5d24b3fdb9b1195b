"""Rotary position embedding, rotate-half convention, token-major layout.

x: [batch, seq, heads, head_dim] (any strides), out contiguous. With x1 = x[..., :d/2],
x2 = x[..., d/2:]: out1 = x1*cos - x2*sin, out2 = x2*cos + x1*sin. INVERSE rotates by the
negative angle (the backward). One program per (token, block of heads): cos/sin are read
once per token and reused across heads.

``rope_kernel`` reads cos/sin ([seq, d/2] or [batch, seq, d/2]: stride_cb = 0 broadcasts);
``rope_positions_kernel`` computes them from integer positions ([seq] or [batch, seq]) and
log2(theta): angle_i = pos * theta^(-2i/d), in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

DTYPES = ("fp32", "fp16", "bf16")


@triton.jit
def _rotate_store(
    x_ptr, out_ptr, b, s, h0, n_heads, half, cos, sin,
    stride_xb, stride_xs, stride_xh, stride_xd,
    stride_ob, stride_os, stride_oh,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INVERSE: tl.constexpr,
):  # fmt: skip
    heads = h0 + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < n_heads) & (dims[None, :] < half)
    x_base = x_ptr + b * stride_xb + s * stride_xs + heads[:, None] * stride_xh
    x1 = tl.load(x_base + dims[None, :] * stride_xd, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_base + (dims[None, :] + half) * stride_xd, mask=mask, other=0.0)
    x2 = x2.to(tl.float32)
    c = cos[None, :]
    sn = sin[None, :]
    if INVERSE:
        sn = -sn
    o_base = out_ptr + b * stride_ob + s * stride_os + heads[:, None] * stride_oh
    out_ty = out_ptr.dtype.element_ty
    tl.store(o_base + dims[None, :], (x1 * c - x2 * sn).to(out_ty), mask=mask)
    tl.store(o_base + half + dims[None, :], (x2 * c + x1 * sn).to(out_ty), mask=mask)


@triton.jit
def rope_kernel(
    x_ptr, cos_ptr, sin_ptr,
    seq_len, n_heads, half,
    stride_xb, stride_xs, stride_xh, stride_xd,
    stride_cb, stride_cs,
    stride_ob, stride_os, stride_oh,
    out_ptr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INVERSE: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    b = token // seq_len
    s = token % seq_len
    h0 = tl.program_id(1) * BLOCK_H
    dims = tl.arange(0, BLOCK_HALF)
    cs_off = b * stride_cb + s * stride_cs + dims
    cos = tl.load(cos_ptr + cs_off, mask=dims < half, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + cs_off, mask=dims < half, other=0.0).to(tl.float32)
    _rotate_store(
        x_ptr, out_ptr, b, s, h0, n_heads, half, cos, sin,
        stride_xb, stride_xs, stride_xh, stride_xd, stride_ob, stride_os, stride_oh,
        BLOCK_H, BLOCK_HALF, INVERSE,
    )  # fmt: skip


@triton.jit
def rope_positions_kernel(
    x_ptr, pos_ptr,
    seq_len, n_heads, half,
    stride_xb, stride_xs, stride_xh, stride_xd,
    stride_pb, stride_ps,
    log2_theta,
    stride_ob, stride_os, stride_oh,
    out_ptr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, INVERSE: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    b = token // seq_len
    s = token % seq_len
    h0 = tl.program_id(1) * BLOCK_H
    dims = tl.arange(0, BLOCK_HALF)
    pos = tl.load(pos_ptr + b * stride_pb + s * stride_ps).to(tl.float32)
    inv_freq = tl.exp2(-(dims.to(tl.float32) * 2.0 / (2 * half)) * log2_theta)
    angle = pos * inv_freq
    _rotate_store(
        x_ptr, out_ptr, b, s, h0, n_heads, half, tl.cos(angle), tl.sin(angle),
        stride_xb, stride_xs, stride_xh, stride_xd, stride_ob, stride_os, stride_oh,
        BLOCK_H, BLOCK_HALF, INVERSE,
    )  # fmt: skip


def aot_specs(arch: str) -> list:
    from greta_core import configs
    from greta_core.configs.blocks import rope_blocks
    from greta_core.kernels._aot import AotSpec

    specs = []
    strides_x = {f"stride_x{k}": "i32" for k in "bshd"}
    strides_o = {f"stride_o{k}": "i32" for k in "bsh"}
    sizes = {"seq_len": "i32", "n_heads": "i32", "half": "i32"}
    for head_dim, n_heads in ((64, 32), (128, 32), (128, 8)):
        config = configs.lookup("rope", arch, {"head_dim": head_dim})
        block_h, block_half = rope_blocks(config, n_heads, head_dim)
        options = configs.launch_options(config, arch)
        for dtype in DTYPES:
            for inverse in (False, True):
                const = {"BLOCK_H": block_h, "BLOCK_HALF": block_half, "INVERSE": inverse}
                tag = f"{dtype},d={head_dim},BLOCK_H={block_h},inverse={inverse}"
                for cdtype in sorted({dtype, "fp32"}):
                    specs.append(
                        AotSpec(
                            name=f"rope[{tag},cos={cdtype}]",
                            kernel=rope_kernel,
                            signature={
                                "x_ptr": f"*{dtype}",
                                "cos_ptr": f"*{cdtype}",
                                "sin_ptr": f"*{cdtype}",
                                **sizes,
                                **strides_x,
                                "stride_cb": "i32",
                                "stride_cs": "i32",
                                **strides_o,
                                "out_ptr": f"*{dtype}",
                            },
                            constexprs=const,
                            options=options,
                        )
                    )
                for pdtype in ("i32", "i64"):
                    specs.append(
                        AotSpec(
                            name=f"rope_positions[{tag},pos={pdtype}]",
                            kernel=rope_positions_kernel,
                            signature={
                                "x_ptr": f"*{dtype}",
                                "pos_ptr": f"*{pdtype}",
                                **sizes,
                                **strides_x,
                                "stride_pb": "i32",
                                "stride_ps": "i32",
                                "log2_theta": "fp32",
                                **strides_o,
                                "out_ptr": f"*{dtype}",
                            },
                            constexprs=const,
                            options=options,
                        )
                    )
    return specs
