"""A database server of the stack that must not run as root (PostgreSQL, MariaDB)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from harness.stack.component import Component
from harness.stack.errors import StackError


class SystemUserServer(Component):
    """As root, the server runs as the system user its Debian package creates, and owns its files."""

    #: the system user (``postgres``, ``mysql``)
    system_user: str = ""
    #: the Debian package that creates it
    package: str = ""
    #: the server's name in messages
    title: str = ""

    def _os_user(self) -> str | None:
        return self.system_user if os.geteuid() == 0 else None

    def _chown(self, path: Path) -> None:
        user = self._os_user()
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def check_system_user(self) -> None:
        """Raises StackError when the stack runs as root and the system user is missing."""
        user = self._os_user()
        if user is None:
            return
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise StackError(f"{self.title} must not run as root and there is no '{user}' system user "
                             f"(apt-get install {self.package} creates it)") from None
