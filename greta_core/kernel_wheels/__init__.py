"""Kernel-wheel machinery: compile GRETA's kernels ahead of time, package, serve and check them.

Modules, lowest first; each imports only modules above it in this list (and
``greta_core.arch``/``configs``/``kernels``/``errors``, ``greta_install.kernel_names``):

- ``cache``: GRETA's per-user cache directory.
- ``wheelbuild``: writes a kernel wheel (names from ``greta_install.kernel_names``).
- ``triton_key_memo``: remembers Triton's cache key per Triton install.
- ``host_launchers``: builds/loads Triton's host launcher modules (``greta warm``).
- ``installed``: what ``greta doctor`` reports about the installed wheel (no triton import).
- ``aot``: compiles each kernel's ``AotSpec`` for any arch, without a GPU.
- ``buildpool``: runs ``aot`` compiles in spawned worker processes, results in spec order
  (``greta build-kernels`` on all cores).
- ``precompiled``: serves an installed wheel's binaries to Triton's JIT (ops call ``activate``).
- ``tune``: times config candidates through the raw ops and writes tuned tables (above ``ops``).
"""
