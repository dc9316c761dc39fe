"""The quality gate of one table: validate a micro-batch with its GX suite and decide what happens.

**What is validated.** The batch's net change per key: the winning after-image of every key once
the batch is reduced -- exactly the rows the MERGE would write. An intermediate change that a later
one of the same key supersedes in the batch never reaches the table, so it is not judged, and
"keys unique within the batch" is a real check on these rows. Deletes have no after image and
truncates no row: neither is validated (they always apply). Unchanged-TOAST placeholders are
validated as null.

**Row identity.** The pandas frame handed to GX is indexed by position among the validated
winners (the winners' Arrow table without its deletes). Map expectations (column, column-pair and
multicolumn) run with result format ``COMPLETE``, whose ``unexpected_index_list`` holds those
positions, so each failing row leads back to its change, its Kafka coordinates and raw bytes. Other
(aggregate) expectations judge the batch as a whole.

**On Spark** (``quality.validate_on``; a gate given a session) the frame is a Spark DataFrame of
the same rows and GX runs its Spark execution engine. A Spark row has no index, so GX names the
failing rows by the table's primary key columns (``unexpected_index_column_names``), which the
frame carries beside the suite's columns, and the gate maps each key back to its position: the
same verdict, holds and reasons as on pandas. GX's Spark engine runs a few Spark jobs per
expectation, so a batch with few rows to validate (``quality.driver_rows``, under
``validate_on: auto``) is collected and validated on pandas all the same.

**Policies** (per expectation, see :func:`ingest.quality.suites.effective_policies`): ``warn``
records; ``quarantine`` holds back the failing rows -- for an aggregate expectation, or one GX could
not evaluate, that is every validated row of the batch; ``fail`` raises
:class:`~ingest.errors.QualityGateError` before anything is written. An expectation that passes
thanks to ``mostly`` has passed: its few unexpected rows are applied. The verdict -- holds, their
reasons, the status -- is :mod:`ingest.quality.verdict`'s.

**Cost.** GX runs with one ephemeral context, one data source (pandas on the driver, or Spark)
and one batch definition per table, all made once per process; per batch only the frame is new,
and it holds only the columns the suite reads (on Spark also the key columns). The suite is
validated with result format ``BASIC`` (counts and a few sample values); only the map
expectations that failed are validated again with ``COMPLETE``, for their row indexes -- the usual
clean batch does not pay for index lists, and a failing one ends with the same results as if the
whole suite had run ``COMPLETE``. :mod:`.gx_shim` removes GX's largest fixed cost per validation.
A process-wide lock serializes GX calls (tables run their batches in parallel threads and GX does
not document thread safety), on Spark too: two tables' validations do not run as concurrent Spark jobs.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from ingest.columns import arrow_type, delta_type_name, normalize
from ingest.commit.state import load_state
from ingest.config import IngestConfig, TableSpec
from ingest.errors import QualityGateError, TableError
from ingest.model import ColumnSpec
from ingest.quality.gx_shim import memoized_configurations
from ingest.quality.results import ResultStore
from ingest.quality.spark_rows import build_spark_frame, frame_of_winners, positions_by_key, rows_named, rows_of_keys
from ingest.quality.suites import (
    LoadedSuite,
    check_columns,
    effective_policies,
    gx_context,
    load_suite,
)
from ingest.quality.verdict import Outcome, QualityReport, exception_message, gate_message, judge

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

FIRST_PASS: Final = {"result_format": "BASIC", "partial_unexpected_count": 5}
RESULT_FORMAT: Final = {"result_format": "COMPLETE", "partial_unexpected_count": 5}
DATASOURCE: Final = "cdc_micro_batches"
SPARK_DATASOURCE: Final = "cdc_micro_batches_spark"
_GX_LOCK = threading.Lock()


class QualityGate:
    """Validates one table's batches with its suite (see module docstring).

    Args:
        spec: the table.
        suite: its loaded suite.
        results: where full validation results go (``None``: not kept).
        spark: the session to validate in (``None``: pandas, on the driver).
        driver_rows: with a session, batches of at most this many validated rows are validated on
            the driver all the same (``quality.driver_rows``; 0: every batch on Spark).
    """

    def __init__(self, spec: TableSpec, suite: LoadedSuite, *, results: ResultStore | None = None,
                 spark: Any = None, driver_rows: int = 0) -> None:
        self.spec = spec
        self.suite = suite
        self.policies = effective_policies(spec, suite)
        self.results = results
        #: validate on a Spark DataFrame in this session (GX's Spark execution engine), not on pandas
        self.spark = spark
        self.driver_rows = driver_rows if spark is not None else 0
        self._infos = {e.id: e for e in suite.expectations}  # by GX expectation id
        self._expectations = {e.id: e for e in suite.gx_suite.expectations}
        self._definitions: dict[bool, Any] = {}  # GX's batch definition, by whether it is Spark's
        with _GX_LOCK:  # made now: the engine builds its gates beside Spark's start
            if spark is not None:
                self._definition(on_spark=True)
            if spark is None or self.driver_rows:
                self._definition(on_spark=False)

    @classmethod
    def for_table(cls, config: IngestConfig, spec: TableSpec, *, spark: Any = None,
                  table_columns: Sequence[ColumnSpec] | None = None) -> QualityGate | None:
        """Load the table's suite and check it fits the table (start-up; ``None`` without a suite).

        ``spark``: the session to validate in; the caller decides which tables get it (the engine
        by :meth:`IngestConfig.validates_on_spark`). Without it, the gate validates on the driver,
        as ``ingest quality`` and ``ingest replay`` do. ``table_columns``: the existing Delta
        table's columns, which the suite must find (``None``: a table not created yet, checked on
        its first batch instead, still before any commit).

        Raises:
            SuiteError: the suite cannot be loaded, an override names an unknown expectation, or
                the suite reads a column the existing Delta table lacks.
        """
        if not spec.expectations:
            return None
        suite = load_suite(config.expectations_dir, spec.expectations)
        small = config.quality.driver_rows if config.quality.validate_on == "auto" else 0
        gate = cls(spec, suite, results=ResultStore(config.quality_results_dir / spec.name,
                                                    config.quality.keep_results),
                   spark=spark, driver_rows=small)
        if table_columns is not None:
            check_columns(spec, suite, [c.name for c in table_columns], where="table")
        return gate

    @classmethod
    def at_start(cls, config: IngestConfig, spec: TableSpec, *, spark: Any = None) -> QualityGate | None:
        """:meth:`for_table` against the table's columns as its Delta log holds them now (none before its
        first commit): the gate a run, a replay and ``ingest quality check`` build (``ingest check`` builds it
        with :meth:`for_table`, and before the first commit checks the suite against the source's columns).

        Raises:
            SuiteError: as :meth:`for_table`.
        """
        return cls.for_table(config, spec, spark=spark,
                             table_columns=load_state(config.table_path(spec.name)).columns)

    def check(self, winners: pa.Table, table_columns: Sequence[ColumnSpec] | None, *,
              batch_id: int, run_id: str) -> QualityReport:
        """Validate the batch's winners (one row per key, columnar); returns what to hold back, by row.

        Raises:
            SuiteMismatchError: the suite reads a column neither the table nor the batch has.
            QualityGateError: an expectation under policy ``fail`` failed (its result is stored first).
        """
        mask = pc.not_equal(winners["_cdc_op"], "d") if winners.num_rows else pa.array([], pa.bool_())
        validated = pc.indices_nonzero(mask).to_pylist() if winners.num_rows else []
        if not validated:
            return QualityReport()
        types = _column_types(table_columns, winners.schema)
        check_columns(self.spec, self.suite, types, where="batch")
        wanted = self._wanted(types)
        rows = winners.filter(mask)
        keys: tuple[str, ...] = ()
        on_spark = self.spark is not None and rows.num_rows > self.driver_rows
        if on_spark:
            keys = tuple(json.loads(rows["_cdc_key_columns"][0].as_py() or "[]"))
            frame = build_spark_frame(self.spark, rows, wanted | {k: types[k] for k in keys if k in types})
        else:
            frame = build_frame(rows, wanted)
        result = self._validate(frame, keys, on_spark=on_spark)
        del frame  # nothing of the batch may outlive it (memory stays flat over many batches)
        return self._judge(result, self._outcomes(result, rows, keys, on_spark=on_spark), rows, rows.num_rows,
                           validated, batch_id=batch_id, run_id=run_id)

    def check_frame(self, winners: DataFrame, table_columns: Sequence[ColumnSpec] | None,
                    key_columns: tuple[str, ...], *, batch_id: int, run_id: str) -> tuple[QualityReport, pa.Table]:
        """:meth:`check` of winners that stay on Spark's executors (``plan_on: executors``).

        GX validates a projection of ``winners`` itself. The rows its failing expectations name by
        key are the only ones collected (every validated row when a failure under ``quarantine``
        names none: the whole batch is then held). A batch of at most :attr:`driver_rows` validated
        rows is collected whole, validated by :meth:`check` instead and returned whole: one Spark job,
        where GX's Spark engine runs a few per expectation. Returns the report and those rows: ``report.held``
        indexes them.

        Raises:
            TableError: the gate has no Spark session.
            SuiteMismatchError, QualityGateError: as :meth:`check`.
        """
        # pyspark: only for winners left on Spark's executors
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_schema

        if self.spark is None:
            raise TableError(self.spec.name, "validating winners on the executors needs a gate with a Spark session")
        schema = to_arrow_schema(winners.schema, timezone="UTC", prefers_large_types=False)
        live = winners.where(F.col("_cdc_op") != F.lit("d"))
        total = live.count()
        if not total:
            return QualityReport(), schema.empty_table()
        if total <= self.driver_rows:
            rows = normalize(live.toArrow())
            return self.check(rows, table_columns, batch_id=batch_id, run_id=run_id), rows
        types = _column_types(table_columns, schema)
        check_columns(self.spec, self.suite, types, where="batch")
        frame = frame_of_winners(live, self._wanted(types) | {k: types[k] for k in key_columns})
        result = self._validate(frame, key_columns, on_spark=True)
        del frame
        rows = rows_named(live, key_columns, result)
        outcomes = self._outcomes(result, rows, key_columns, on_spark=True)
        if any(not o.success and o.policy == "quarantine" and not o.names_rows for o in outcomes):
            rows = normalize(live.toArrow())  # the whole batch is held: every row goes to quarantine
            outcomes = self._outcomes(result, rows, key_columns, on_spark=True)
        return self._judge(result, outcomes, rows, total, range(rows.num_rows), batch_id=batch_id,
                           run_id=run_id), rows

    def _wanted(self, types: dict[str, str]) -> dict[str, str]:
        """The columns the suite reads, of ``types``."""
        return types if self.suite.needs_all_columns else {c: types[c] for c in types if c in self.suite.columns}

    def _validate(self, frame: Any, keys: tuple[str, ...], *, on_spark: bool) -> Any:
        """GX's validation result of ``frame`` (a Spark DataFrame when ``on_spark``, else pandas) with
        the suite, failing map expectations run again to name their rows (by ``keys`` on Spark)."""
        with _GX_LOCK, memoized_configurations():
            validator = self._validator(frame, on_spark=on_spark)
            result = validator.validate_expectation_suite(self.suite.gx_suite)
            self._name_failing_rows(validator, result, keys, on_spark=on_spark)
        return result

    def _judge(self, result: Any, outcomes: list[Outcome], rows: pa.Table, total: int, validated: Sequence[int], *,
               batch_id: int, run_id: str) -> QualityReport:
        """:func:`~ingest.quality.verdict.judge`'s report, stored; raises for a failure under policy ``fail``."""
        report = judge(outcomes, rows, total, validated)
        self._store(report, result, batch_id=batch_id, run_id=run_id)
        if report.status == "failed":
            gate = [o for o in report.outcomes if not o.success and o.policy == "fail"]
            raise QualityGateError(self.spec.name, gate_message(batch_id, gate, rows, total),
                                   [o.info.name for o in gate])
        return report

    def _validator(self, frame: Any, *, on_spark: bool) -> Any:
        """A GX validator of the frame, in result format :data:`FIRST_PASS`.

        GX's own ``Batch.validate`` would load (copy and fingerprint) the frame twice: once for the
        ``Batch`` and once inside the validator it makes; this one loads it once for both passes.
        """
        # Great Expectations (seconds to import): only when a suite validates
        from great_expectations.validator.v1_validator import Validator

        return Validator(self._definition(on_spark=on_spark), result_format=dict(FIRST_PASS),
                         batch_parameters={"dataframe": frame})

    def _definition(self, *, on_spark: bool) -> Any:
        """The table's GX batch definition on Spark or pandas (hold :data:`_GX_LOCK`)."""
        if on_spark not in self._definitions:
            self._definitions[on_spark] = _batch_definition(self.spec.name, spark=on_spark)
        return self._definitions[on_spark]

    def _name_failing_rows(self, validator: Any, result: Any, keys: tuple[str, ...], *, on_spark: bool) -> None:
        """Validate again, with every unexpected row's index, each map expectation that failed.

        On Spark a row has no index: GX names it by ``keys``, the table's primary key columns, and
        the expectation's own columns (see :func:`~ingest.quality.spark_rows.rows_of_keys`).
        """
        validator.result_format = dict(RESULT_FORMAT) | (
            {"unexpected_index_column_names": list(keys)} if on_spark else {})
        for n, r in enumerate(result.results):
            expectation_id = r.expectation_config.id
            if r.success or not self._infos[expectation_id].row_level or exception_message(r.exception_info):
                continue
            result.results[n] = validator.validate_expectation(self._expectations[expectation_id])

    def _outcomes(self, result: Any, rows: pa.Table, keys: tuple[str, ...], *, on_spark: bool) -> list[Outcome]:
        outcomes = []
        by_key: dict[tuple[Any, ...], list[int]] | None = None  # built for the first row named by key
        for r in result.results:
            info = self._infos[r.expectation_config.id]
            res = r.result or {}
            error = exception_message(r.exception_info)
            named = list(res.get("unexpected_index_list") or [])
            if on_spark and named:  # named by key; without a key none is: the batch answers
                if by_key is None and keys:
                    by_key = positions_by_key(rows, keys)
                named = rows_of_keys(named, keys, by_key, rows) if by_key is not None else []
            outcomes.append(Outcome(
                info=info, policy=self.policies[info.name], success=bool(r.success) and error is None,
                unexpected=int(res.get("unexpected_count") or 0), rows=named,
                observed=res.get("observed_value"), error=error,
            ))
        order = {e.id: n for n, e in enumerate(self.suite.expectations)}
        return sorted(outcomes, key=lambda o: order[o.info.id])

    def _store(self, report: QualityReport, result: Any, *, batch_id: int, run_id: str) -> None:
        if self.results is None:
            return
        document = result.to_json_dict()
        for r in document.get("results", []):
            # A pandas filter expression listing every unexpected index: large and of no use later.
            (r.get("result") or {}).pop("unexpected_index_query", None)
        self.results.write(run_id=run_id, batch_id=batch_id, document={
            "table": self.spec.name, "suite": self.suite.name, "run_id": run_id, "batch_id": batch_id,
            "status": report.status, "rows_validated": report.rows_validated, "policies": self.policies,
            "failures": report.failures, "rows_held": len(report.held),
            "names": {e.id: e.name for e in self.suite.expectations}, "validation_result": document,
        })


def _batch_definition(table: str, *, spark: bool = False) -> Any:
    """The table's whole-dataframe batch definition, made once per process and reused for every batch
    (on Spark: a Spark data source that reuses the running session and does not cache the frame)."""
    context = gx_context()
    sources = context.data_sources
    name = SPARK_DATASOURCE if spark else DATASOURCE
    if name in sources.all():
        source = sources.get(name)
    elif spark:
        with warnings.catch_warnings():  # GX warns of an argument it sets itself (force_reuse_spark_context)
            warnings.simplefilter("ignore", DeprecationWarning)
            source = sources.add_spark(name, persist=False)
    else:
        source = sources.add_pandas(name)
    asset = source.get_asset(table) if table in source.get_asset_names() else source.add_dataframe_asset(table)
    names = {d.name for d in asset.batch_definitions}
    return (asset.get_batch_definition("micro_batch") if "micro_batch" in names
            else asset.add_batch_definition_whole_dataframe("micro_batch"))


def _column_types(table_columns: Sequence[ColumnSpec] | None, winners: pa.Schema) -> dict[str, str]:
    """Delta type of every column of the table and of the batch (the batch's types win)."""
    types = {c.name: c.type for c in table_columns or ()}
    types.update({f.name: delta_type_name(f.type) for f in winners if not f.name.startswith("_cdc_")})
    return types


def build_frame(rows: pa.Table, columns: dict[str, str]) -> Any:
    """The pandas frame GX validates: one row per winner (index = position), typed columns.

    Numbers become int64 / float64, decimals float64: GX's pandas metrics take their vectorized
    path only for those dtypes (``column.dtype in [int, float]``) and map a Python function over
    every value otherwise -- ten times slower on a 100k-row batch. Unchanged-TOAST placeholders are
    null in the batch already. A column the batch lacks (the table has it) is all null.
    """
    arrays: dict[str, pa.Array | pa.ChunkedArray] = {}
    for name, type_name in columns.items():
        array = rows[name] if name in rows.column_names else pa.nulls(rows.num_rows, arrow_type(type_name))
        if pa.types.is_integer(array.type) and array.type != pa.int64():
            array = array.cast(pa.int64())
        elif pa.types.is_decimal(array.type) or pa.types.is_floating(array.type):
            array = array.cast(pa.float64())
        arrays[name] = array
    # One Arrow table converted at once builds pandas' blocks far faster than column by column.
    return pa.table(arrays).to_pandas() if arrays else pa.table({"_": pa.nulls(rows.num_rows)}).to_pandas()[[]]
