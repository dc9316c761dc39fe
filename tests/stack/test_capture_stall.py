"""A Kafka Connect that confirms nothing any more is restarted by the capture wait, on the real stack."""

from __future__ import annotations

import os
import signal
from typing import Any

import psycopg
import pytest

from ingest.verify.capture import wait_for_capture

pytestmark = pytest.mark.stack


def test_a_frozen_connect_is_restarted_and_the_capture_completes(stack: Any, pg_dsn: str) -> None:
    # SIGSTOP stands in for a task blocked for good: the replication connection stays open, so the
    # slots stay active, and nothing is confirmed any more.
    assert wait_for_capture(pg_dsn, timeout=120).ok  # Debezium holds its slots (a fresh stack may not yet)
    connect = stack.component("connect")
    frozen = connect.pid()
    assert frozen is not None
    os.kill(frozen, signal.SIGSTOP)
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_logical_emit_message(true, 'tests.stack', 'after the freeze')")
        lines: list[str] = []
        result = wait_for_capture(pg_dsn, timeout=150, say=lines.append, poll=0.25,
                                  on_stall=stack.unstick_capture, restart_after=20)
    finally:
        if connect.pid() == frozen:
            os.kill(frozen, signal.SIGCONT)
    assert result.ok, (result.problem, lines)
    assert result.restarts == 1 and result.markers >= 1
    assert any("restarting Kafka Connect" in line for line in lines)
    assert connect.pid() not in (None, frozen)
