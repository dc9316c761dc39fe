"""What one simulated workload holds: its size, its faults and how it is delivered (:class:`WorkloadSpec`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class WorkloadSpec:
    """What to generate. Every field has a default that makes a realistic demo.

    Args:
        events: row-change events in total (snapshot reads + streamed c/u/d/t).
        seed: the same seed gives byte-identical topics and truth.
        partitions: partitions per topic.
        value_format: ``avro`` (AvroConverter + registry) or ``json`` (JsonConverter, schemas on).
        prefix: Debezium ``topic.prefix``; topics are ``<prefix>.public.<table>``.
        duplicate_fraction: share of records delivered a second time, later.
        reorder_fraction: chance per append window that a partition is held back (skew).
        malformed_fraction: extra malformed messages per real change event.
        quality_violation_fraction: share of streamed inserts and updates that write a value the
            demo's expectations suites reject (see :data:`QUALITY_VIOLATIONS`); part of the truth.
        toast_fraction: chance that an update leaving large ``notes`` unchanged sends the
            unchanged-TOAST placeholder.
        truncate: truncate ``orders`` once, mid-stream.
        add_column: add ``customers.loyalty_tier`` mid-stream (a new value schema).
        widen_column: widen ``orders.quantity`` mid-stream, ``smallint`` -> ``integer`` -> ``bigint``
            (two new value schemas; the target must apply both safe widenings).
        initial_customers: rows in ``customers`` before the snapshot.
        initial_products: rows in ``products`` before the snapshot.
        initial_orders: rows in ``orders`` before the snapshot.
        extra_tables: ``ledger_001`` ... beside the shop, one topic each, for whole-database runs;
            together they take about half of the streamed changes (see
            :func:`harness.simulator.model.ledger_table`).
        initial_extra_rows: rows in each extra table before the snapshot.
    """

    events: int = 20_000
    seed: int = 7
    partitions: int = 3
    value_format: Literal["avro", "json"] = "avro"
    prefix: str = "demo"
    duplicate_fraction: float = 0.02
    reorder_fraction: float = 0.1
    malformed_fraction: float = 0.0
    quality_violation_fraction: float = 0.0
    toast_fraction: float = 0.3
    truncate: bool = True
    add_column: bool = True
    widen_column: bool = False
    initial_customers: int = 400
    initial_products: int = 80
    initial_orders: int = 800
    extra_tables: int = 0
    initial_extra_rows: int = 20

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field out of range."""
        for name in ("duplicate_fraction", "reorder_fraction", "malformed_fraction", "quality_violation_fraction",
                     "toast_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"WorkloadSpec.{name} must be within [0, 1], got {getattr(self, name)}")
        for name in ("events", "initial_customers", "initial_products", "initial_orders", "extra_tables",
                     "initial_extra_rows"):
            if getattr(self, name) < 0:
                raise ValueError(f"WorkloadSpec.{name} must be >= 0, got {getattr(self, name)}")
        if self.partitions < 1:
            raise ValueError(f"WorkloadSpec.partitions must be >= 1, got {self.partitions}")
        if self.value_format not in ("avro", "json"):
            raise ValueError(f"WorkloadSpec.value_format must be 'avro' or 'json', got {self.value_format!r}")
