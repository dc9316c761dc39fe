"""The gate's verdict on a batch: what each expectation found, which rows are held back and why, and
the batch's status -- from GX's results, whichever engine ran them (:mod:`ingest.quality.gate`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa

from ingest.config import QualityPolicy
from ingest.quality.suites import ExpectationInfo
from ingest.records.audit import QualityStatus

_SAMPLES: Final = 5


@dataclass(slots=True)
class Outcome:
    """What one expectation found in one batch."""

    info: ExpectationInfo
    policy: QualityPolicy
    success: bool
    unexpected: int = 0
    rows: list[int] = field(default_factory=list)  # positions in the validated frame (map expectations)
    observed: Any = None  # aggregate expectations: GX's observed value
    error: str | None = None  # GX could not evaluate it

    @property
    def names_rows(self) -> bool:
        """The failure points at rows (otherwise it is about the whole batch)."""
        # A map expectation that failed without naming rows cannot say which: the batch answers for it.
        return self.info.row_level and self.error is None and (bool(self.rows) or not self.unexpected)


@dataclass(slots=True)
class Hold:
    """Why one validated row is held back: the expectations (names) and their observed values."""

    expectations: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


@dataclass(slots=True)
class QualityReport:
    """The gate's verdict on one batch.

    Attributes:
        status: ``passed``, ``warned``, ``quarantined``, ``failed`` or ``skipped`` (nothing to validate).
        evaluated: expectations evaluated.
        failed: expectations that failed.
        failures: unexpected count per failed expectation (an aggregate one counts every row).
        held: winners to hold back, by their index in the winners list given to :meth:`QualityGate.check`.
        rows_validated: rows in the validated frame.
        outcomes: per-expectation details.
    """

    status: QualityStatus = "skipped"
    evaluated: int = 0
    failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    held: dict[int, Hold] = field(default_factory=dict)
    rows_validated: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def failures_json(self) -> str:
        return json.dumps(self.failures, sort_keys=True)


def judge(outcomes: list[Outcome], rows: pa.Table, total: int, validated: Sequence[int]) -> QualityReport:
    """The report of a validation's ``outcomes`` (row positions in ``rows``): what failed, the holds
    (``validated[pos]`` for the row at ``pos``, each with its reasons) and the status. ``total``: rows
    validated (``rows`` may hold only the failing ones)."""
    report = QualityReport(rows_validated=total)
    report.outcomes = outcomes
    report.evaluated = len(report.outcomes)
    failing = [o for o in report.outcomes if not o.success]
    report.failed = len(failing)
    report.failures = {o.info.name: o.unexpected if o.names_rows else total for o in failing}
    for o in failing:
        if o.policy != "quarantine":
            continue
        for pos in (o.rows if o.names_rows else range(rows.num_rows)):
            hold = report.held.setdefault(validated[pos], Hold())
            hold.expectations.append(o.info.name)
            hold.reasons.append(_describe_row(o, _row(rows, pos)))
    fail = any(o.policy == "fail" for o in failing)
    report.status = ("failed" if fail else "quarantined" if report.held else "warned" if failing else "passed")
    return report


def _row(rows: pa.Table, pos: int) -> dict[str, Any]:
    """One validated row's values (a held row, to describe)."""
    return rows.slice(pos, 1).to_pylist()[0]


def exception_message(info: Any) -> str | None:
    """GX's exception info (flat, or nested per metric) as one message, if it raised."""
    if not info:
        return None
    entries = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    for entry in entries:
        if entry.get("raised_exception"):
            return str(entry.get("exception_message") or "GX could not evaluate the expectation")[:300]
    return None


def _value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe_row(outcome: Outcome, row: dict[str, Any]) -> str:
    name = outcome.info.name
    if outcome.error is not None:
        return f"{name}: could not be evaluated ({outcome.error}); the whole batch is held"
    if not outcome.info.row_level:
        return f"{name}: observed {_value(outcome.observed)} for the batch; the whole batch is held"
    observed = ", ".join(f"{c}={_value(row.get(c))}" for c in outcome.info.columns)
    return f"{name}: observed {observed}"


def gate_message(batch_id: int, gate: list[Outcome], rows: pa.Table, total: int) -> str:
    parts = []
    for o in gate:
        if o.error is not None:
            parts.append(f"{o.info.name} could not be evaluated: {o.error}")
        elif not o.info.row_level:
            parts.append(f"{o.info.name} failed for the batch: observed {_value(o.observed)}")
        else:
            samples = []
            for pos in o.rows[:_SAMPLES]:
                row = _row(rows, pos)
                keys = json.loads(row["_cdc_key_columns"] or "[]")
                key = ", ".join(f"{k}={_value(row.get(k))}" for k in keys)
                values = ", ".join(f"{c}={_value(row.get(c))}" for c in o.info.columns)
                samples.append(f"({key}) {values}")
            parts.append(f"{o.info.name} failed for {o.unexpected} of {total} rows, e.g. " + "; ".join(samples))
    return (f"batch {batch_id}: expectations under policy 'fail' failed; nothing was committed and the offsets "
            f"did not advance: " + " | ".join(parts))
