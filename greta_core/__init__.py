"""GRETA kernels: LLM primitives written once in Triton, exposed to Triton, PyTorch and JAX.

Frameworks are imported lazily: importing `greta_core` costs nothing.
"""
