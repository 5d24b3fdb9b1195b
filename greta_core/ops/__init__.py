"""Per op: input validation and the launch plan that every binding executes.

Each module exposes ``validate(...)`` (returns the arch to launch on, raises
``GretaInputError``), memoized ``plan_*(...) -> Plan`` builders (framework-free: shapes,
strides and dtype names in; kernel, grid, ordered arguments, constexprs, options and buffers
out, every config from the tables) and the raw functions, which validate, plan and run the
plan on torch tensors (``wrap=`` is ``torch.library.wrap_triton`` inside a triton_op).
``greta_core.raw`` re-exports the raw functions; ``greta_core.jax`` runs the same plans
through jax-triton. See ``_plan.py`` and docs/en/architecture.md.
"""
