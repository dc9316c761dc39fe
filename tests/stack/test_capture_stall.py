"""The capture wait on the real stack: a Kafka Connect that confirms nothing any more is restarted, and a
wait for some slots does not wait for the others."""

from __future__ import annotations

import os
import signal
import time
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


def test_a_wait_for_some_slots_does_not_wait_for_a_paused_connectors_slot(stack: Any, pg_dsn: str) -> None:
    # bench_latency measures one connector while the stack's other one is paused: it waits for its slot alone.
    # Both must stream first: on a fresh stack pgjson's slot may not be active yet, and the slot of a
    # connector paused before it streamed stays inactive. A slot named is waited for until it is active.
    assert wait_for_capture(pg_dsn, timeout=120, slots=["pgavro_slot", "pgjson_slot"]).ok
    missing = wait_for_capture(pg_dsn, timeout=2, slots=["pgavro_slot", "no_such_slot"])
    assert not missing.ok and "no_such_slot" in (missing.problem or ""), missing.problem
    with stack.connectors_paused(["pgjson"]):
        for _ in range(60):  # the pause reaches the task asynchronously
            if all(t["state"] == "PAUSED" for t in stack.connector_status("pgjson")["tasks"]):
                break
            time.sleep(0.5)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_logical_emit_message(true, 'tests.stack', 'while pgjson is paused')")
        measured = wait_for_capture(pg_dsn, timeout=60, slots=["pgavro_slot"])
        assert measured.ok, measured.problem
        assert [s.name for s in measured.slots] == ["pgavro_slot"]
        everything = wait_for_capture(pg_dsn, timeout=5)
        assert not everything.ok and "pgjson_slot" in (everything.problem or ""), everything.problem
    assert wait_for_capture(pg_dsn, timeout=120).ok  # resumed, it catches up


def test_bringing_the_stack_up_resumes_a_connector_a_killed_process_left_paused(stack: Any) -> None:
    # A benchmark killed inside connectors_paused never resumes its other connector; the next `stack up`
    # found it PAUSED and waited three minutes for it to run, then failed.
    connect = stack._connect()
    connect.pause("pgjson")
    try:
        for _ in range(60):  # the pause reaches the connector asynchronously
            if stack.connector_status("pgjson")["connector"]["state"] == "PAUSED":
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"pgjson did not pause: {stack.connector_status('pgjson')}")
        stack.up(["connect"])
        assert stack.connector_status("pgjson")["connector"]["state"] == "RUNNING"
    finally:
        connect.resume("pgjson")  # for the tests after this one, whatever happened
