"""Great Expectations suites: loaded by GX from their JSON, named, and checked against their table.

A suite is a file ``<expectations_dir>/<name>.json`` in GX Core 1.x's own suite format (what a GX
file context writes: ``name``, ``expectations`` of ``{type, kwargs, meta}``, ``meta``), so GX and
its tools read it as they are. Loading is strict where GX is lenient: ``ExpectationSuite(...)``
logs and drops an expectation it does not know, so each one is built on its own with
``ExpectationConfiguration.to_domain_obj()`` and any error names the file, the expectation and
what is wrong. That happens at start-up (:func:`load_suite` is called by the engine before any
query runs), never in the middle of the stream.

Every expectation gets a *name* the audit, the quarantine and the config refer to: its
``meta.name`` if given, otherwise ``<type>(<columns>)``, e.g.
``expect_column_values_to_match_regex(email)`` (``#2``, ``#3`` ... when a suite repeats one).
Its policy comes, most specific first, from the table's ``expectation_policies``, the
expectation's ``meta.policy``, then the table's ``quality_policy``.

GX costs seconds to import; it is imported here lazily and its one ephemeral context is built once
per process (:func:`gx_context`).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, get_args

from ingest.config import QualityPolicy, TableSpec
from ingest.errors import SuiteError, SuiteMismatchError

log = logging.getLogger(__name__)

POLICIES: Final = frozenset(get_args(QualityPolicy))
#: Expectations about the set of columns itself: they need every column in the validated frame,
#: and a column they name need not exist (that is what they check).
WHOLE_TABLE_TYPES: Final = frozenset({
    "expect_table_columns_to_match_set", "expect_table_columns_to_match_ordered_list",
    "expect_table_column_count_to_equal", "expect_table_column_count_to_be_between", "expect_column_to_exist",
})
_COLUMN_KWARGS: Final = ("column", "column_A", "column_B")

_LOCK = threading.RLock()
_context: Any = None
_cache: dict[tuple[str, int, int], LoadedSuite] = {}


def gx_context() -> Any:
    """The process's one ephemeral GX data context (import and set-up paid once, on first use)."""
    global _context
    with _LOCK:
        if _context is None:
            # Great Expectations (seconds to import): only when a suite is loaded
            import great_expectations as gx
            from great_expectations.data_context.types.base import ProgressBarsConfig

            # GX logs its set-up at INFO (temporary docs directories ...): not the engine's news.
            # One of its modules sets its own logger to INFO on import, so that one is quietened too.
            for name in ("great_expectations", "great_expectations.data_context.types.base"):
                gx_log = logging.getLogger(name)
                if gx_log.level in (logging.NOTSET, logging.INFO):
                    gx_log.setLevel(logging.WARNING)
            context = gx.get_context(mode="ephemeral")
            # Progress bars would print one line per metric and batch into the engine's output.
            context.variables.progress_bars = ProgressBarsConfig(globally=False)
            _context = context
        return _context


@dataclass(frozen=True, slots=True)
class ExpectationInfo:
    """One expectation of a suite, as the engine sees it.

    Attributes:
        name: how audit, quarantine and config refer to it (see module docstring).
        type: GX expectation type, e.g. ``expect_column_values_to_be_between``.
        id: the expectation's id in the GX suite (results are matched back by it).
        columns: columns it reads (its domain).
        row_level: a map expectation: GX names the failing rows. Otherwise it judges the batch.
        meta_policy: ``meta.policy`` from the suite, if any.
        whole_table: it is about the table's set of columns (see :data:`WHOLE_TABLE_TYPES`).
    """

    name: str
    type: str
    id: str
    columns: tuple[str, ...]
    row_level: bool
    meta_policy: QualityPolicy | None
    whole_table: bool


@dataclass(slots=True)
class LoadedSuite:
    """A GX ``ExpectationSuite`` and what the engine knows about each of its expectations."""

    name: str
    path: Path
    gx_suite: Any
    expectations: list[ExpectationInfo] = field(default_factory=list)

    @property
    def columns(self) -> set[str]:
        """Columns the suite reads (those a whole-table expectation names are checks, not reads)."""
        return {c for e in self.expectations if not e.whole_table for c in e.columns}

    @property
    def needs_all_columns(self) -> bool:
        return any(e.whole_table for e in self.expectations)

    def names(self) -> list[str]:
        return [e.name for e in self.expectations]


def suite_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.json"


def load_suite(directory: Path, name: str) -> LoadedSuite:
    """Load ``<directory>/<name>.json`` with GX, strictly (cached per file version and process).

    Raises:
        SuiteError: the file is missing or not JSON, names another suite, or an expectation is
            unknown to GX, has invalid arguments or an invalid ``meta.policy``.
    """
    path = suite_path(directory, name)
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise SuiteError(f"expectations suite {name!r}: file {path} not found") from None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    with _LOCK:
        if key not in _cache:
            _cache[key] = _load(path, name)
        return _cache[key]


def _load(path: Path, name: str) -> LoadedSuite:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SuiteError(f"{path}: not a readable JSON suite: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("expectations"), list):
        raise SuiteError(f"{path}: not a Great Expectations suite (expected an object with an 'expectations' list)")
    if doc.get("name") not in (None, name):
        raise SuiteError(f"{path}: the file holds suite {doc.get('name')!r}, not {name!r}")

    gx_context()  # imports GX once; the classes below come from it
    # Great Expectations (seconds to import): only when a suite is loaded
    import great_expectations as gx
    from great_expectations.expectations.expectation import (
        ColumnMapExpectation,
        ColumnPairMapExpectation,
        MulticolumnMapExpectation,
    )
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration
    from great_expectations.expectations.metadata_types import FailureSeverity

    built: list[Any] = []
    infos: list[ExpectationInfo] = []
    seen: set[str] = set()
    for index, raw in enumerate(doc["expectations"]):
        where = f"{path}: expectations[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise SuiteError(f"{where}: an expectation needs a 'type'")
        kwargs = raw.get("kwargs") or {}
        meta = dict(raw.get("meta") or {})
        policy = meta.get("policy")
        if policy is not None and policy not in POLICIES:
            raise SuiteError(f"{where} ({raw['type']}): meta.policy {policy!r} is not one of {sorted(POLICIES)}")
        # Results are matched back to expectations by id; GX only assigns ids to suites it stores.
        exp_id = str(raw.get("id") or uuid.uuid4())
        try:
            extra = {k: raw[k] for k in ("notes", "description") if raw.get(k) is not None}
            if raw.get("severity"):
                extra["severity"] = FailureSeverity(raw["severity"])
            config = ExpectationConfiguration(type=raw["type"], kwargs=kwargs, meta=meta, id=exp_id, **extra)
            expectation = config.to_domain_obj()  # raises where ExpectationSuite(...) would only log
        except Exception as exc:  # GX raises its own, pydantic's and plain errors for bad configs
            raise SuiteError(f"{where}: {raw['type']} is not a valid expectation: {_in_one_line(exc)}") from exc
        label = _unique(expectation_name(raw["type"], kwargs, meta), seen)
        infos.append(ExpectationInfo(
            name=label, type=raw["type"], id=exp_id, columns=tuple(_columns(kwargs)),
            row_level=isinstance(expectation, ColumnMapExpectation | ColumnPairMapExpectation
                                 | MulticolumnMapExpectation),
            meta_policy=policy,
            whole_table=raw["type"] in WHOLE_TABLE_TYPES or bool(kwargs.get("row_condition")),
        ))
        built.append(config)
    if len({i.id for i in infos}) != len(infos):
        raise SuiteError(f"{path}: two expectations share an id")
    suite = gx.ExpectationSuite(name=name, expectations=built, meta=doc.get("meta") or {}, notes=doc.get("notes"))
    log.info("loaded expectations suite %s (%d expectations) from %s", name, len(infos), path)
    return LoadedSuite(name, path, suite, infos)


def expectation_name(type_: str, kwargs: dict[str, Any], meta: dict[str, Any]) -> str:
    """``meta.name`` if given, else ``<type>(<columns>)`` or just ``<type>`` for table expectations."""
    if meta.get("name"):
        return str(meta["name"])
    columns = _columns(kwargs)
    return f"{type_}({', '.join(columns)})" if columns else type_


def _columns(kwargs: dict[str, Any]) -> list[str]:
    out = [str(kwargs[k]) for k in _COLUMN_KWARGS if kwargs.get(k) is not None]
    return out + [str(c) for c in kwargs.get("column_list") or []]


def _unique(name: str, seen: set[str]) -> str:
    label, n = name, 1
    while label in seen:
        n += 1
        label = f"{name}#{n}"
    seen.add(label)
    return label


def _in_one_line(exc: BaseException) -> str:
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return f"{type(exc).__name__}: {text[:400]}" if text else type(exc).__name__


def effective_policies(spec: TableSpec, suite: LoadedSuite) -> dict[str, QualityPolicy]:
    """Policy of every expectation for this table (config override > meta.policy > table policy).

    Raises:
        SuiteError: ``expectation_policies`` names an expectation the suite does not have.
    """
    names = set(suite.names())
    unknown = sorted(set(spec.expectation_policies) - names)
    if unknown:
        raise SuiteError(
            f"table {spec.name!r}: expectation_policies names {unknown}, which suite {suite.name!r} does not have "
            f"(its expectations: {sorted(names)})"
        )
    return {e.name: spec.expectation_policies.get(e.name) or e.meta_policy or spec.quality_policy
            for e in suite.expectations}


def check_columns(spec: TableSpec, suite: LoadedSuite, columns: Iterable[str], *, where: str) -> None:
    """Raise if the suite reads a column the table (or batch) does not have.

    Raises:
        SuiteError: before a batch, against the Delta table's schema (``where='table'``) or, before the
            table exists, the columns its source has now (``where`` names them).
        SuiteMismatchError: on a batch, before anything is committed (``where='batch'``).
    """
    have = set(columns)
    missing = {e.name: [c for c in e.columns if c not in have] for e in suite.expectations if not e.whole_table}
    missing = {name: cols for name, cols in missing.items() if cols}
    if not missing:
        return
    detail = "; ".join(f"{name} reads {cols}" for name, cols in missing.items())
    message = (f"suite {suite.name!r} ({suite.path}) names columns the {where} does not have: {detail} "
               f"(columns: {sorted(have)})")
    if where != "batch":
        raise SuiteError(f"table {spec.name!r}: {message}")
    raise SuiteMismatchError(spec.name, message + "; nothing was committed")
