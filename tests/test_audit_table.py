"""The audit table as a continuous run appends to it: kept open, packed, and shared with other writers."""

from __future__ import annotations

from ingest.lake import delta
from ingest.lake.delta import PACK_AFTER_FILES, open_table
from ingest.records import audit
from ingest.records.audit import AuditRecord


def _record(batch_id: int, table: str = "t") -> AuditRecord:
    return AuditRecord(table=table, run_id="run", batch_id=batch_id, received=1, inserted=1)


def test_a_run_opens_the_audit_table_once_and_keeps_its_files_few(tmp_path, monkeypatch):
    path = tmp_path / "_cdc_audit"
    opened = []
    real = delta.open_table
    monkeypatch.setattr(delta, "open_table", lambda p: opened.append(p) or real(p))
    log = audit.AuditLog()
    appends = PACK_AFTER_FILES + 5
    for batch_id in range(appends):
        log.append(path, [_record(batch_id)])
    # the first append finds no table and creates it; the second opens it; the rest bring it up to date
    assert len(opened) == 2
    assert sorted(audit.read(path)["batch_id"].to_pylist()) == list(range(appends))
    table = open_table(path)
    assert table is not None and len(table.file_uris()) <= PACK_AFTER_FILES < appends


def test_rows_another_writer_appends_meanwhile_are_kept(tmp_path):
    path = tmp_path / "_cdc_audit"
    log = audit.AuditLog()
    for batch_id in range(PACK_AFTER_FILES + 3):
        log.append(path, [_record(batch_id)])
        audit.append(path, [_record(batch_id, table="other")])  # another run, opening the table afresh
    rows = audit.read(path).to_pylist()
    assert sorted((r["table"], r["batch_id"]) for r in rows) == sorted(
        (t, b) for t in ("t", "other") for b in range(PACK_AFTER_FILES + 3))
