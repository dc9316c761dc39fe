"""What the configuration's models share: the strict base model, name rules, durations, the policy,
writer and placement names."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
SOURCE_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}\.[A-Za-z_][A-Za-z0-9_$]{0,62}$")
SECRET_OPTION = re.compile(r"(?i)password|jaas|secret|token")
URL_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@]*@")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

#: What failing expectations do: record only, quarantine the failing rows, or stop the table's batch.
QualityPolicy = Literal["warn", "quarantine", "fail"]
#: Who writes a table's Delta commits (:mod:`ingest.commit`).
WriterName = Literal["delta-rs", "delta-spark"]
#: Where a table's batch is assembled, reduced and planned (:mod:`ingest.apply.placement`).
PlacementName = Literal["driver", "executors"]


def _parse_duration(value: Any) -> Any:
    """Accept ``7d``/``12h``/``30m`` besides pydantic's seconds and ISO-8601 forms."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    return value


Duration = Annotated[timedelta, BeforeValidator(_parse_duration)]


class Model(BaseModel):
    """Unknown fields are errors; a loaded configuration does not change."""

    model_config = ConfigDict(extra="forbid", frozen=True)
