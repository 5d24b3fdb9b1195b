"""An in-memory SystemView for detection tests: files, tool outputs and env in dicts."""

from __future__ import annotations

from collections.abc import Mapping


class FakeView:
    def __init__(
        self,
        files: Mapping[str, str] | None = None,
        tools: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        is_live: bool = False,
    ) -> None:
        self.files = dict(files or {})
        self.tools = dict(tools or {})
        self._env = dict(env or {})
        self.is_live = is_live
        self.ran: list[str] = []

    def read_text(self, path: str) -> str | None:
        return self.files.get(path)

    def list_dir(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        names = {p[len(prefix) :].split("/", 1)[0] for p in self.files if p.startswith(prefix)}
        return sorted(names)

    def exists(self, path: str) -> bool:
        return path in self.files or bool(self.list_dir(path))

    def run(self, tool: str) -> str | None:
        self.ran.append(tool)
        return self.tools.get(tool)

    def env(self) -> Mapping[str, str]:
        return dict(self._env)
