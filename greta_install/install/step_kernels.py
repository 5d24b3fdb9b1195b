"""Post-commit step: build the GRETA kernel wheel here when no source serves it.

Runs after the offline install, so the environment's own Triton compiles the kernels;
the wheel is cached (greta_install.install.kernel_build) and installed through the transaction
(`ctx.install_wheels`), so a later failure undoes it with the rest. Optional: without a
kernel wheel the kernels still compile on first use, so a failed build is a warning.
"""

from __future__ import annotations

import os

from greta_install import commandline
from greta_install.install import installer, kernel_build
from greta_install.install.pipeline import CommitContext, StepFailed
from greta_install.plan.install_plan import InstallPlan


class KernelBuild:
    name = "kernel-build"
    required = False

    def applies(self, plan: InstallPlan) -> bool:
        return plan.kernel_wheel.status == "build" and bool(plan.kernel_wheel.arch)

    def describe(self, plan: InstallPlan) -> list[str]:
        python = plan.python_executable or "python"
        arch = plan.kernel_wheel.arch or "?"
        return [
            f"reuse the cached {arch} kernel wheel for the installed Triton, or: "
            + commandline.shell(kernel_build.build_argv(python, arch, "<cache>"))
            + f" (on all {os.cpu_count() or 1} cores)",
            f"install it offline with --require-hashes (cache: {kernel_build.cache_root()})",
        ]

    def run(self, ctx: CommitContext) -> None:
        arch = ctx.plan.kernel_wheel.arch
        assert arch is not None
        try:
            # Verified there for this Triton and the lock's (a cached wheel that fails is
            # rebuilt, not an install failure).
            built = kernel_build.build_or_reuse(
                ctx.executable, arch, log=ctx.log, locked_triton=installer.locked_triton(ctx.plan)
            )
        except kernel_build.KernelBuildError as exc:
            raise StepFailed(
                self.name, f"{exc}. Kernels compile on first use instead (JIT)"
            ) from None
        ctx.install_wheels([built.path], [f"sha256:{built.sha256}"])
        ctx.results[self.name] = {
            "wheel": built.path.name,
            "sha256": built.sha256,
            "cached": built.cached,
            "seconds": round(built.seconds, 1),
        }
