"""A PostgreSQL connector whose handling modes are not Debezium's defaults, on the stack.

Many deployments set ``decimal.handling.mode=string`` or ``double``, ``time.precision.mode=connect``,
``binary.handling.mode=hex`` or ``base64``, ``interval.handling.mode=string``. The engine writes what
such a connector sends: text where a decimal would be, milliseconds where microseconds would be.
``verify --source-db`` reads the source table as the connector sends it once ``source.debezium``
names those modes, and says what to set when the lake's columns hold another kind of value
(docs/types.md#other-handling-modes).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from ingest.config import TableSpec
from tests.harness import ingest_cli
from tests.stack.helpers import (
    PREFIX,
    change_count,
    config_file,
    fresh_schema,
    mariadb_config,
    own_connector,
    run_and_verify,
    stack_config,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.stack]

SCHEMA = "modes"  # a previous run's schema and topics are dropped first
COLUMNS = ("c_num numeric(12,2), c_vnum numeric, c_money money, c_time time, c_time3 time(3), c_ts timestamp, "
           "c_ts3 timestamp(3), c_tstz timestamptz, c_interval interval, c_bytea bytea, c_numarr numeric(12,2)[], "
           "c_tsarr timestamp[]")
ROWS = [
    "(1, 12.50, 3.14159265358979323846, 9.99, '13:14:15.123456', '01:02:03.456', '2024-01-02 03:04:05.678901', "
    "'2024-01-02 03:04:05.678', '2024-01-02 03:04:05.678901+02', '1 day 02:03:04.5', '\\x00ff10', '{1.50,-2.25,NULL}', "
    "'{\"2024-01-02 03:04:05.678901\"}')",
    "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "(3, -0.01, 1e-20, -1.00, '23:59:59.999999', '00:00:00', '1900-01-01 00:00:00', '9999-12-31 23:59:59.999', "
    "'1969-12-31 23:59:59.999999+00', '-1 year -13 mons -00:00:01.5', '\\x', '{}', '{}')",
    "(4, 'NaN', 'Infinity', -123.45, '24:00:00', '00:00:00.999', '1969-12-31 23:59:59.999999', "
    "'1969-12-31 23:59:59.9995', '2024-01-02 03:04:05+00', '00:00:04.1', '\\x0a0b', '{1e3}', "
    "'{\"1969-12-31 23:59:59.999999\"}')",
]
#: Per case: the converter (the stack connector whose configuration is copied), the modes, and what
#: the lake holds for row 1 in the columns the modes change (read through ``ingest query``).
CASES = {
    "text": ("avro", {"decimal.handling.mode": "string", "time.precision.mode": "connect",
                      "binary.handling.mode": "hex", "interval.handling.mode": "string"},
             {"c_num": "12.50", "c_time": 47_655_123_000, "c_ts": "2024-01-02 03:04:05.678000+00:00",
              "c_interval": "P0Y0M1DT2H3M4.5S", "c_bytea": "00ff10", "c_numarr": '["1.50", "-2.25", null]'}),
    "double": ("json", {"decimal.handling.mode": "double", "time.precision.mode": "adaptive_time_microseconds",
                        "binary.handling.mode": "base64", "interval.handling.mode": "numeric"},
               {"c_num": 12.5, "c_time": 47_655_123_456, "c_ts": "2024-01-02 03:04:05.678901",
                "c_interval": 93_784_500_000, "c_bytea": "AP8Q", "c_numarr": "[1.5, -2.25, null]"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_verify_reads_the_source_as_a_connector_of_other_modes_sends_it(
        stack: Any, pg_dsn: str, tmp_path: Path, case: str) -> None:
    fmt, modes, lake_row = CASES[case]
    fresh_schema(stack, pg_dsn, SCHEMA, [f"{prefix}.{SCHEMA}.m" for prefix in PREFIX.values()],
                 f"CREATE TABLE {SCHEMA}.m (id integer PRIMARY KEY, {COLUMNS})",
                 f"INSERT INTO {SCHEMA}.m VALUES {', '.join(ROWS)}")
    name = f"modes{case}{uuid.uuid4().hex[:6]}"
    with own_connector(stack, PREFIX[fmt], name, {**modes, "table.include.list": f"{SCHEMA}.m"}):
        topic = f"{name}.{SCHEMA}.m"
        wait_until(f"the snapshot of {SCHEMA}.m in {topic}", lambda: change_count(topic) >= len(ROWS), timeout=120)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {SCHEMA}.m SET c_num = 1.25, c_interval = '5 minutes' WHERE id = 2")
            conn.execute(f"DELETE FROM {SCHEMA}.m WHERE id = 3")
        wait_until(f"two more changes in {topic}", lambda: change_count(topic) >= len(ROWS) + 2)
        settings = stack_config(fmt, tmp_path / "work", schema=SCHEMA, tables=["m"])
        spec = settings.tables[0].model_copy(update={"topic": topic})
        config = write_config(settings.model_copy(update={"tables": (spec,)}), tmp_path / "c.yaml")
        _lake_holds_what_was_sent_and_verify_needs_the_modes(config, pg_dsn, lake_row, modes, "c_ts")


def _lake_holds_what_was_sent_and_verify_needs_the_modes(config: Path, dsn: str, lake_row: dict[str, Any],
                                                         modes: dict[str, str], local_time: str) -> str:
    """Run; row 1 holds ``lake_row``; verify reading Debezium's defaults finds rows different and says
    what to set, naming the ``local_time`` column (a timestamp without zone) when the connector sends
    it as Connect's zoned Timestamp; with ``source.debezium`` set to ``modes`` it finds the table
    equal (its report, joined)."""
    run = ingest_cli("run", "-c", str(config))
    assert run.returncode == 0, run.stdout + run.stderr
    query = ingest_cli("query", "-c", str(config), "--format", "json",
                       f"SELECT {', '.join(lake_row)} FROM m WHERE id = 1")
    assert query.returncode == 0, query.stdout + query.stderr
    assert json.loads(query.stdout) == lake_row

    verify = ingest_cli("verify", "-c", str(config), "--source-db", dsn, "--wait", "5")
    assert verify.returncode != 0 and "DIFFERENT" in verify.stdout, verify.stdout + verify.stderr
    flat = " ".join(verify.stdout.split())
    assert "columns of another kind than verify reads from the source: 'c_num'" in flat, verify.stdout
    assert "name its values there" in flat, verify.stdout
    zoned = f"'{local_time}' timestamp[us, tz=UTC] (verify reads timestamp[us])"
    assert (zoned in flat) == (modes.get("time.precision.mode") == "connect"), verify.stdout

    data = yaml.safe_load(config.read_text())
    data["source"]["debezium"] = modes
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    return run_and_verify(config, dsn)


MARIADB_ROWS = [
    "(1, 12.50, '13:14:15.123456', '2024-01-02 03:04:05.678901', x'00ff10', 1.5)",
    "(2, NULL, NULL, NULL, NULL, NULL)",
    "(3, -0.01, '-01:02:03.000500', '1969-12-31 23:59:59.999999', x'', -2.25)",
]
MARIADB_CASES = {
    "text": ({"decimal.handling.mode": "string", "time.precision.mode": "connect", "binary.handling.mode": "hex"},
             {"c_num": "12.50", "c_time": 47_655_123_000, "c_dt": "2024-01-02 03:04:05.678000+00:00",
              "c_bin": "00ff10", "c_dbl": 1.5}),
    "double": ({"decimal.handling.mode": "double", "binary.handling.mode": "base64-url-safe"},
               {"c_num": 12.5, "c_time": 47_655_123_456, "c_dt": "2024-01-02 03:04:05.678901",
                "c_bin": "AP8Q", "c_dbl": 1.5}),
}


@pytest.mark.parametrize("case", list(MARIADB_CASES))
def test_verify_reads_a_mariadb_table_as_a_connector_of_other_modes_sends_it(
        stack: Any, tmp_path: Path, case: str) -> None:
    modes, lake_row = MARIADB_CASES[case]
    s = stack.settings
    suffix = uuid.uuid4().hex[:6]
    name, table = f"mariamodes{suffix}", f"modes_{suffix}"
    conn = stack.component("mariadb").connect(s.mariadb_db)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, c_num DECIMAL(12,2), c_time TIME(6), "
                    "c_dt DATETIME(6), c_bin VARBINARY(10), c_dbl DOUBLE)")
        cur.execute(f"INSERT INTO {table} VALUES {', '.join(MARIADB_ROWS)}")
    conn.commit()
    try:
        with own_connector(stack, "mariaavro", name, {**modes, "table.include.list": f"{s.mariadb_db}.{table}"}):
            topic = f"{name}.{s.mariadb_db}.{table}"
            wait_until(f"the snapshot of {table} in {topic}", lambda: change_count(topic) >= len(MARIADB_ROWS),
                       timeout=120)
            settings = mariadb_config(tmp_path / "work", s.mariadb_db)
            config = config_file(settings.model_copy(update={"tables": (TableSpec(name="m", topic=topic),)}),
                                 tmp_path / "c.yaml")
            report = _lake_holds_what_was_sent_and_verify_needs_the_modes(config, s.mariadb_url(), lake_row, modes,
                                                                          "c_dt")
            outside = ("-1 day, 22:57:56.999500 is no time of day, and with time.precision.mode=connect Debezium "
                       "sends it as null")
            assert (outside in report) == (modes.get("time.precision.mode") == "connect"), report
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        conn.close()
