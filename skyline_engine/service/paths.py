"""Mapping paths between the engine's machine and the client's.

A remote project is often the same folder seen at two places: `/srv/me/proj` where the engine
runs, `/Users/me/mnt/proj` on the laptop (NFS, sshfs). Documents name files relative to
`project_root`, so replacing `project_root` (and the root inside any absolute path or message) by
the client's root is all the editor needs to open the right buffers.
"""

from __future__ import annotations

import re
from typing import Any


class PathMapper:
    def __init__(self, server_root: str, client_root: str | None) -> None:
        self.server_root = server_root.rstrip("/") or "/"
        self.client_root = (client_root.rstrip("/") or "/") if client_root else None
        # The root as a whole path component: `/srv/proj` in `/srv/proj/a.py`, and before the
        # full stop that ends a sentence ("… under /srv/proj."), not in `/srv/project` or `/srv/proj.old`.
        self._pattern = re.compile(re.escape(self.server_root) + r"(?=$|[/\s'\"`),;:\]]|\.(?:$|\s))")

    def to_client(self, value: Any) -> Any:
        """A copy of `value` (a document, an error) with server paths rewritten for the client."""
        client_root = self.client_root
        if client_root is None or client_root == self.server_root:
            return value
        if isinstance(value, str):
            return self._pattern.sub(lambda _: client_root, value)
        if isinstance(value, dict):
            return {key: self.to_client(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.to_client(item) for item in value]
        return value

    def entry_to_server(self, entry_point: str) -> str:
        """The entry point as the engine's machine names it: a path under the client's root (an
        editor may send the buffer's absolute name) becomes relative to the project root."""
        if self.client_root is not None and entry_point.startswith(self.client_root + "/"):
            return entry_point[len(self.client_root) + 1 :]
        return entry_point
