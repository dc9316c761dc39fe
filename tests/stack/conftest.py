"""The real stack for tests/stack: started once per test run, never skipped.

``Stack.from_env().up()`` is idempotent (a running stack costs ~1 s to check). When the stack
cannot start, every test here FAILS with one line naming what is missing, whether ``CI`` is
``true`` or not. A skip would let a run go green without the only tests that prove the engine
against what Debezium really emits, and the project's machines can provide everything the stack
needs (Debian packages, Maven Central), so a stack that does not start is a problem to fix, not to
hide. Deselect these tests explicitly with ``-m "not stack"``.

A stack this run started is stopped at its end, as on CI's clean machine -- also when it fails to
start, so that no component it did start is left behind; a stack that was already running
(``make stack``: a developer's, shared with other runs) is left running.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def stack() -> Iterator[Any]:
    """The running local stack, with the engine's credentials in ``os.environ`` for the session."""
    from harness.stack import CDC_COMPONENTS, Stack

    from ingest.errors import first_line

    running, already = None, None
    try:
        running = Stack.from_env()
        already = [c.name for c in running.status() if c.pid is not None]
        running.up(CDC_COMPONENTS)
        running.wait_connectors()
    except Exception as exc:  # StackError, a missing package, a port in use ...
        if running is not None and already == []:
            # What this run started before the failure (PostgreSQL, say) must not outlive it.
            with contextlib.suppress(Exception):
                running.down()
        ci = " (CI)" if os.environ.get("CI") == "true" else ""
        pytest.fail(f"the local stack could not start{ci}: {first_line(exc)} -- see docs/stack.md; "
                    "deselect with -m 'not stack'", pytrace=False)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in running.engine_env().items():
            patch.setenv(key, value)
        yield running
    if not already:
        running.down()


@pytest.fixture(scope="session")
def pg_dsn(stack: Any) -> str:
    """The workload role's libpq URL."""
    return str(stack.pg_dsn())
