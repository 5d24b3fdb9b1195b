"""The Triton kernels, one module per op: ``@triton.jit`` code and ``aot_specs(arch)`` only.

A leaf: kernels import triton, ``greta_core.configs`` (tables and block rules, for the AOT
specs) and ``greta_core.arch``; never ops, the bindings or compute (tests/test_layers.py).
Kernels take the buffers they write last (jax-triton's convention).
"""
