"""Post-commit steps of the hash policy: record first-use hashes; save a wheelhouse.

RecordHashes writes the sha256 of every file the lock could not hash (and that was
trusted on first use) into the environment's record (journalled: undone with the
install) and into the user's record (outside any environment, on purpose: a file seen
once stays pinned for every later install of this user, even one that failed).
SaveWheelhouse copies every staged file plus a record of all their hashes into a
folder: `greta install --from-record THAT_FOLDER` on N other nodes installs the very
same bytes, offline.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from greta_install.install import hashrecord
from greta_install.install.pipeline import CommitContext, StepFailed
from greta_install.plan.install_plan import InstallPlan


def _entries(ctx: CommitContext, names: list[str]) -> dict[str, hashrecord.Entry]:
    out = {}
    kw = ctx.plan.kernel_wheel
    if kw.requirement and not kw.pinned:  # an unpinned kernel wheel: trusted on first use
        name, _, version = kw.requirement.partition("==")
        path = ctx.staged.files.get(name)
        if path is not None:
            out[path.name] = hashrecord.Entry(
                name, version, ctx.staged.hashes[name], str(kw.location or "kernel wheels"),
                f"greta install into {ctx.site_packages}",
            )  # fmt: skip
    for pkg in ctx.plan.packages:
        if pkg.name not in names or pkg.name not in ctx.staged.files:
            continue
        path = ctx.staged.files[pkg.name]
        out[path.name] = hashrecord.Entry(
            pkg.name,
            pkg.version,
            ctx.staged.hashes[pkg.name],
            pkg.index or "default",
            f"greta install into {ctx.site_packages}",
        )
    return out


class RecordHashes:
    name = "record-hashes"
    required = True

    def applies(self, plan: InstallPlan) -> bool:
        return True

    def describe(self, plan: InstallPlan) -> list[str]:
        first = plan.first_use
        what = f" (first use: {', '.join(first)})" if first else ""
        return [
            f"record the sha256 of files without a lock hash in {hashrecord.RECORD_NAME} "
            f"and the user's record{what}"
        ]

    def run(self, ctx: CommitContext) -> None:
        names = [p.name for p in ctx.plan.packages if not p.verified]
        entries = _entries(ctx, names)
        env_path = hashrecord.env_record_path(ctx.site_packages)
        try:
            ctx.track_file(env_path)
            record = hashrecord.load_record(env_path)
            for filename, entry in entries.items():
                record.add(filename, entry)
            hashrecord.save_record(record, env_path)
            user_path = hashrecord.user_record_path()
            user = hashrecord.load_record(user_path)
            for filename, entry in entries.items():
                user.add(filename, entry)
            hashrecord.save_record(user, user_path)
        except (hashrecord.HashRecordError, OSError) as exc:
            raise StepFailed(self.name, str(exc)) from None
        ctx.results[self.name] = {fn: e.sha256 for fn, e in sorted(entries.items())}


class SaveWheelhouse:
    """`--save-wheelhouse DIR`: the staged files and a record of all their hashes."""

    name = "save-wheelhouse"
    required = False

    def applies(self, plan: InstallPlan) -> bool:
        return bool(plan.wheelhouse)

    def describe(self, plan: InstallPlan) -> list[str]:
        return [f"copy every installed file and {hashrecord.RECORD_NAME} into {plan.wheelhouse}"]

    def run(self, ctx: CommitContext) -> None:
        out = Path(ctx.plan.wheelhouse or "")
        entries = _entries(ctx, [p.name for p in ctx.plan.packages])
        try:
            out.mkdir(parents=True, exist_ok=True)
            record = hashrecord.load_record(out / hashrecord.RECORD_NAME)
            for path in ctx.staged.files.values():
                shutil.copy2(path, out / path.name)
            for filename, entry in entries.items():
                record.add(filename, entry)
            hashrecord.save_record(record, out / hashrecord.RECORD_NAME)
        except (hashrecord.HashRecordError, OSError) as exc:
            raise StepFailed(self.name, str(exc)) from None
        ctx.log(
            f"wheelhouse: {len(entries)} files in {out}; on other nodes: "
            f"greta install --from-record {out}"
        )
        ctx.results[self.name] = str(out)
