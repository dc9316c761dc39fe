"""Has Debezium captured everything MariaDB has committed? Asked of Kafka Connect, on the project's stack.

MariaDB keeps no record of how far a binlog reader has come, and the connector's heartbeats do not
move its offset while the binlog is quiet. So :func:`wait_for_capture` commits one marker
transaction (a row of ``cdc.capture_marker``, whose topic no configuration reads), notes the binlog
position before it, and waits until Kafka Connect reports the connector's committed source offset
(``GET /connectors/<name>/offsets``) at or past that position. Connect commits an offset only once
Kafka has acknowledged every record before it, so every change committed before the marker is then
in Kafka. This needs the stack: an engine user's ``ingest verify`` compares until equal instead
(:mod:`ingest.verify.mysql_source`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from ingest.verify.captured import CaptureResult

Say = Callable[[str], None]
MARKER_TABLE = "capture_marker"
#: The stack's MariaDB connector (infra/stack/connectors/mariaavro.json): its name and topic prefix.
CONNECTOR = "mariaavro"


def binlog_position(file: str, pos: int) -> tuple[int, int]:
    """A binlog position as ``(file number, byte)``, ordered as MariaDB writes them."""
    match = re.search(r"(\d+)$", file)
    return (int(match.group(1)) if match else -1, int(pos))


def wait_for_capture(stack: Any, *, connector: str = CONNECTOR, timeout: float = 120.0,
                     say: Say | None = None, poll: float = 0.5) -> CaptureResult:
    """Commit a marker and wait until ``connector``'s committed offset reaches the position before it.

    Returns:
        ``target_lsn`` is the binlog position waited for (``file:pos``); ``problem`` says why not when
        ``ok`` is false.
    """
    say = say or (lambda _line: None)
    maria, connect = stack.component("mariadb"), stack.component("connect")
    db = stack.settings.mariadb_db
    status = maria.admin("SHOW MASTER STATUS").split()
    target_file, target_pos = status[0], int(status[1])
    maria.admin(f"REPLACE INTO `{db}`.`{MARKER_TABLE}` VALUES (1, NOW(6))")
    target = binlog_position(target_file, target_pos)
    started = last_said = time.monotonic()
    reached: tuple[int, int] | None = None
    while True:
        offsets = connect.offsets(connector)
        if offsets:
            reached = binlog_position(offsets[0]["offset"]["file"], offsets[0]["offset"]["pos"])
            if reached >= target:
                return CaptureResult(f"{target_file}:{target_pos}", True, time.monotonic() - started)
        elapsed = time.monotonic() - started
        if elapsed >= timeout:
            return CaptureResult(f"{target_file}:{target_pos}", False, elapsed,
                                 problem=f"connector {connector} has committed {reached} after {timeout:.0f} s, "
                                         f"not yet {target}")
        if time.monotonic() - last_said >= 5.0:
            say(f"  waiting for {connector}: at {reached}, target {target}")
            last_said = time.monotonic()
        time.sleep(poll)
