"""JAX binding: ``greta_core.jax.<name>`` runs the same Triton kernels through jax-triton.

Where jax-triton or a GPU is missing, a ``jax.numpy`` reference runs instead; which one
ran is recorded (``greta_core.observe.last_implementation``).
"""

from greta_core.jax._vec_add import vec_add

__all__ = ["vec_add"]
