"""The post-commit steps of `greta install`, in the order they run.

Each step follows greta_install.install.pipeline.PostCommitStep: `name`, `required`,
`applies(plan)`, `describe(plan)` (what --dry-run shows) and `run(ctx)`, which raises
`StepFailed(name, reason)` to fail. A required step's failure undoes the whole install
through the journal; an optional one's is a warning. Steps change the environment only
through `ctx.track_file(path)` (before writing a file) or `ctx.install_wheels(...)`.

To add a step: write a class with those members (in its own module) and put it into
POST_COMMIT_STEPS at the place it must run.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from greta_install import commandline
from greta_install.environment import envfix
from greta_install.install.pipeline import CommitContext, PostCommitStep, StepFailed
from greta_install.plan.install_plan import InstallPlan


class EnvFixes:
    """Persist the plan's environment fixes (or remove earlier ones) in site-packages."""

    name = "env-fixes"
    required = True

    def applies(self, plan: InstallPlan) -> bool:
        return True

    def describe(self, plan: InstallPlan) -> list[str]:
        if plan.env:
            return [f"write {', '.join(envfix.FILES)} into site-packages"]
        return [f"remove any earlier {', '.join(envfix.FILES)} from site-packages"]

    def run(self, ctx: CommitContext) -> None:
        for name in envfix.FILES:
            ctx.track_file(ctx.site_packages / name)
        try:
            if ctx.plan.env:
                envfix.write_env_fixes(
                    ctx.site_packages,
                    ctx.plan.env,
                    ctx.plan.env_why,
                    ctx.plan.target,
                    ctx.plan.arch,
                )
                ctx.log(f"environment fixes persisted in {ctx.site_packages / envfix.JSON_NAME}")
            else:
                envfix.clear_env_fixes(ctx.site_packages)
        except (envfix.EnvFixError, OSError) as exc:
            raise StepFailed(self.name, str(exc)) from None
        ctx.results[self.name] = dict(ctx.plan.env)


class WarmLaunchers:
    """Build the kernel wheel's host launchers (`greta warm` in the target environment).

    Optional by nature: when it cannot run (greta not installed there, no compiler, no
    GPU runtime) the kernels build their launchers at first use, so it only warns.
    """

    name = "warm"
    required = False
    timeout_s = 900.0

    def applies(self, plan: InstallPlan) -> bool:
        return plan.kernel_wheel.status in ("found", "build")

    def describe(self, plan: InstallPlan) -> list[str]:
        return [commandline.shell(self.argv(plan.python_executable or "python"))]

    @staticmethod
    def argv(python: str) -> list[str]:
        return [python, commandline.ISOLATED, "-m", "greta", "warm"]

    def run(self, ctx: CommitContext) -> None:
        ctx.log("building the kernel wheel's host launchers (greta warm)")
        ctx.results[self.name] = False
        kw = ctx.plan.kernel_wheel
        if kw.arch and (kw.status == "found" or ctx.results.get("kernel-build")):
            # Installed by this run after verify_wheel: vouch for its installed content, so
            # `greta warm` (which checks it again) holds it, and any later change, to it.
            from greta_install.install import kernel_build

            try:
                kernel_build.trust_installed(ctx.site_packages, kw.arch, vouch=True, log=ctx.log)
            except kernel_build.KernelWheelRefused as exc:
                raise StepFailed(self.name, f"the installed kernel wheel is {exc}") from None
        try:
            proc = ctx.python(self.argv("")[2:], self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StepFailed(
                self.name, f"greta warm did not finish ({exc}); the first kernel call builds them"
            ) from None
        for line in (proc.stdout + proc.stderr).strip().splitlines()[-20:]:
            ctx.log(f"    {line}")
        if proc.returncode != 0:
            raise StepFailed(
                self.name,
                "greta warm failed: the first call of each kernel builds its launcher "
                f"instead. Retry with: {ctx.executable} -m greta warm",
            )
        ctx.results[self.name] = True


# Run in this order after the offline install. Later steps see the earlier ones' work
# (a smoke test sees the environment fixes).
def _issue10_steps() -> list[Callable[[], PostCommitStep]]:
    from greta_install.install.step_hashes import RecordHashes, SaveWheelhouse
    from greta_install.install.step_kernels import KernelBuild
    from greta_install.install.step_smoke import SmokeTest

    # The launchers are warmed before the smoke test, so its first-call timing is what
    # a user's first call costs.
    return [EnvFixes, RecordHashes, KernelBuild, WarmLaunchers, SmokeTest, SaveWheelhouse]


POST_COMMIT_STEPS: list[Callable[[], PostCommitStep]] = _issue10_steps()


def steps_for(plan: InstallPlan) -> list[PostCommitStep]:
    """The post-commit steps this plan runs, in order."""
    return [step for step in (factory() for factory in POST_COMMIT_STEPS) if step.applies(plan)]
