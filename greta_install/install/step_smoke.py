"""Post-commit step: the smoke test. A required step: if it fails, the whole install is
undone (the environment is byte-identical to before), unless --keep-failed."""

from __future__ import annotations

import sys

from greta_install.install import smoke
from greta_install.install.pipeline import CommitContext, StepFailed
from greta_install.plan.install_plan import InstallPlan


class SmokeTest:
    name = "smoke-test"
    required = True

    def applies(self, plan: InstallPlan) -> bool:
        # It proves what a row promises (torch and what runs on it): a lock that installs
        # no torch (a partial lock of your own) promises none of it.
        return plan.smoke and any(p.name == "torch" for p in plan.packages)

    def describe(self, plan: InstallPlan) -> list[str]:
        mode = smoke.default_mode(plan.target)
        python = plan.python_executable or "python"
        what = (
            "torch on the GPU; the numeric gate: bf16/fp32 matmul, an elementwise/reduction "
            "chain, SGD training and an fp64 gradcheck against the CPU; a Triton kernel, SDPA "
            "fwd+bwd, GRETA raw/torch/jax ops against references, a jax op on the GPU"
            if mode == "gpu"
            else "the CPU equivalents: torch, the numeric checks on the CPU only (reported "
            "as skipped: no GPU to compare), a Triton kernel in the interpreter, SDPA "
            "fwd+bwd, GRETA raw/torch/jax ops, jax on CPU"
        )
        return [f"{python} -I {smoke.CHILD.name} {mode}   # {what}; undone on failure"]

    def run(self, ctx: CommitContext) -> None:
        mode = smoke.default_mode(ctx.plan.target)
        ctx.log(f"smoke test ({mode}): proving the environment runs before calling it done")
        report = smoke.run_smoke(ctx.executable, mode, env=ctx.env, log=ctx.log)
        ctx.results[self.name] = report.to_json()
        if report.ok:
            return
        message = report.failure_message()
        if ctx.plan.keep_failed:
            ctx.log(f"smoke test FAILED: {message}; the environment is kept (--keep-failed)")
            print(f"greta install: smoke test failed: {message}", file=sys.stderr)
            return
        raise StepFailed(self.name, message)
