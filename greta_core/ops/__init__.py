"""Launchers, one module per op: input validation, config lookup and the kernel launch.

Each module exposes ``validate(...)`` (returns the arch to launch on), ``launch(...,
wrap=...)`` (the bindings pass ``torch.library.wrap_triton``) and a plain function that
allocates outputs. The public raw API re-exports those functions in ``greta_core.raw``.
"""
