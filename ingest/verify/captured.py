"""What a wait for the source's capture found: the answer every source database gives ``verify``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SlotState:
    """One logical replication slot of the database."""

    name: str
    active: bool
    confirmed: str | None
    caught_up: bool


@dataclass
class CaptureResult:
    """The outcome of a source database's ``wait_for_capture``.

    ``target_lsn`` is the source position waited for: PostgreSQL's WAL position; for MariaDB/MySQL the
    binlog's ``file:position``. ``visible`` is false where the source cannot show how far Debezium has
    read (MariaDB/MySQL): nothing was waited for, ``ok`` is true, and ``verify`` compares until equal.
    """

    target_lsn: str
    ok: bool
    seconds: float
    slots: list[SlotState] = field(default_factory=list)
    markers: int = 0
    marker_error: str | None = None
    #: how often ``on_stall`` was called (the capture was restarted)
    restarts: int = 0
    problem: str | None = None
    visible: bool = True
