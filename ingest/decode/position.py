"""Where a change stands in its database's log: a comparable :class:`SourcePosition` from Debezium's
``source`` block, per connector (the order :mod:`ingest.rules.ordering` applies changes in)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from ingest.errors import DecodeError
from ingest.model import MAX_COMPONENT, KafkaCoordinates, SourcePosition

_BINLOG_NUMBER: Final = re.compile(r"(\d+)$")
_LOG_SEQUENCE: Final = re.compile(r"^[0-9A-Fa-f]+(:[0-9A-Fa-f]+)*$")  # SQL Server / Db2 LSN text


def source_position(source: Mapping[str, Any], phase: int, coords: KafkaCoordinates, *,
                    trust_connector: bool) -> SourcePosition:
    """Comparable position of a change from its Debezium ``source`` block.

    Each connector's fields, as Debezium documents them:

    * PostgreSQL: ``(commit point, lsn, 0)`` where the commit point is ``source.sequence[0]`` (the
      last committed LSN; ``lsn`` alone does not order transactions). A snapshot read -- the
      initial one or a re-snapshot after lost offsets or a new slot -- carries no commit point
      (``[null, "<lsn>"]``): it is consistent as of its LSN, so that LSN is its commit point and it
      orders against streamed changes by it (and before them at the same point, by phase).
    * MySQL/MariaDB: ``(binlog file number, pos, row)``.
    * SQL Server and Db2: ``(commit_lsn, change_lsn, event_serial_no)``, LSNs read as hexadecimal.
    * Oracle: ``(commit_scn, scn, txSeq)`` (``ssn`` when ``txSeq`` is absent); a snapshot read has
      no ``commit_scn`` and orders by its ``scn``.
    * MongoDB: ``(ts_ms, ord, 0)`` -- the oplog's cluster time and its ordinal.
    * Anything else: the Kafka ``(partition, offset)`` as a fallback position (see
      :mod:`ingest.rules.ordering` for how those compare).

    Args:
        source: the ``source`` block (or the fields a flattened row kept from it).
        phase: :data:`SNAPSHOT` for snapshot reads, :data:`STREAMED` for changes.
        coords: Kafka coordinates for the fallback.
        trust_connector: take ``source.connector`` as proof of the layout (envelopes); flattened
            rows only carry what was asked for, so there the position fields must be present.

    Raises:
        DecodeError: a position field is present but malformed.
    """
    connector = source.get("connector") if trust_connector else None
    get = source.get
    lsn = get("lsn")
    if connector == "postgresql" or lsn is not None:
        committed, sequence_lsn = _pg_sequence(get("sequence"))
        lsn = _position_int("lsn", lsn if lsn is not None else sequence_lsn)
        return SourcePosition(lsn if committed is None else committed, lsn, 0, phase)
    file, pos = get("file"), get("pos")
    if connector in ("mysql", "mariadb") or (file is not None and pos is not None):
        return SourcePosition(_binlog_number(file), _position_int("pos", pos), _position_int("row", get("row")), phase)
    commit_lsn, change_lsn = get("commit_lsn"), get("change_lsn")
    if connector in ("sqlserver", "db2") or commit_lsn is not None or change_lsn is not None:
        change = _log_sequence("change_lsn", change_lsn)
        commit = _log_sequence("commit_lsn", commit_lsn)
        return SourcePosition((change or 0) if commit is None else commit, change or 0,
                              _position_int("event_serial_no", get("event_serial_no")), phase)
    scn = get("scn")
    if connector == "oracle" or scn is not None:
        event_scn = _position_int("scn", scn)
        commit_scn = get("commit_scn")
        sequence = get("txSeq") if get("txSeq") is not None else get("ssn")
        return SourcePosition(event_scn if commit_scn is None else _position_int("commit_scn", commit_scn),
                              event_scn, _position_int("txSeq", sequence), phase)
    ordinal = get("ord")
    if connector == "mongodb" or ordinal is not None:
        return SourcePosition(_position_int("ts_ms", get("ts_ms")), _position_int("ord", ordinal), 0, phase)
    return SourcePosition.kafka(coords.partition, coords.offset)


def _pg_sequence(sequence: Any) -> tuple[int | None, Any]:
    """``(commit point or None, lsn text)`` from ``source.sequence``."""
    if sequence is None:
        return None, None
    if type(sequence) is str and sequence.startswith('["') and sequence.endswith('"]'):
        # The usual '["<committed>","<lsn>"]' without a JSON parse; anything else takes json.loads.
        committed, _, lsn = sequence[2:-2].partition('","')
        if committed.isdigit() and lsn.isdigit():
            return _position_int("sequence[0]", committed), lsn
    try:
        items = json.loads(sequence) if isinstance(sequence, str) else sequence
    except ValueError as exc:
        raise DecodeError(f"envelope: source.sequence is not a JSON array: {sequence!r}") from exc
    if not isinstance(items, list) or len(items) != 2:
        raise DecodeError(f"envelope: source.sequence is not a [lastCommittedLsn, lsn] pair: {sequence!r}")
    return (None if items[0] is None else _position_int("sequence[0]", items[0])), items[1]


def _log_sequence(field: str, value: Any) -> int | None:
    """An SQL Server / Db2 LSN (``00000027:00000758:0003``) as a number; ``None``/``NULL`` -> None."""
    if value is None or value == "NULL":
        return None
    if type(value) is not str or not _LOG_SEQUENCE.match(value):
        raise DecodeError(f"envelope: source.{field} is not a hexadecimal log sequence number: {value!r}")
    return _position_int(field, int(value.replace(":", ""), 16))


def _binlog_number(file: Any) -> int:
    if file is None:
        return 0
    match = _BINLOG_NUMBER.search(str(file))
    if match is None:
        raise DecodeError(f"envelope: cannot read a binlog sequence number from source.file {file!r}")
    return _position_int("file", int(match.group(1)))


def _position_int(field: str, value: Any) -> int:
    if value is None:
        return 0
    try:
        number = int(value) if type(value) is int or type(value) is str else None
    except ValueError:
        number = None
    if number is None or not 0 <= number <= MAX_COMPONENT:
        raise DecodeError(f"envelope: source.{field} is not an unsigned integer of at most 128 bits: {value!r}")
    return number


def optional_int(value: Any) -> int | None:
    # Documentation samples show timestamps as strings; accept those, ignore anything else.
    if type(value) is int:
        return value
    if type(value) is str and value.lstrip("-").isdigit():
        return int(value)
    return None
