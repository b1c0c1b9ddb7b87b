"""The TCP service's token: random per start, in a file only the user can read, compared in constant time.

Anyone who can connect to the port and present the token can run code as the user, so the token is
the service's only lock: 256 random bits, a file created with mode 0600 inside a 0700 folder, and
`hmac.compare_digest` so the comparison's timing reveals nothing about it.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path
from typing import Any


def new_token() -> str:
    return secrets.token_urlsafe(32)


def default_token_path() -> Path:
    """Where `skyline serve --listen` writes its token unless told otherwise; `:SkylineConnect` looks
    there too (lua/skyline/constants.lua, kept equal by tests/test_parity.py)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "skyline" / "token"


def write_token_file(path: Path, token: str) -> None:
    """Write the token so that only the user can read it, replacing any older file atomically."""
    path = Path(path)
    folder = path.parent
    if not folder.exists():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = folder / f".{path.name}.{os.getpid()}.tmp"
    # O_EXCL with mode 0600: the file never exists with wider permissions, even for an instant.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have narrowed it; never widened
        os.write(fd, (token + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def remove_token_file(path: Path | None, token: str) -> None:
    """Remove the file at exit if it still holds our token (a newer service may have replaced it)."""
    if path is None:
        return
    try:
        if Path(path).read_text(encoding="ascii").strip() == token:
            os.unlink(path)
    except (OSError, UnicodeDecodeError):
        pass


def token_matches(expected: str, given: Any) -> bool:
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8", "surrogatepass"))
