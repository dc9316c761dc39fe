"""A speed shim for one Great Expectations validation: each expectation builds its configuration once.

GX 1.x rebuilds ``Expectation.configuration`` -- a pydantic ``dict()`` of the expectation plus a
regex over its class name -- every time the property is read, and one validation of the demo's
``orders`` suite reads it almost a thousand times: 40 % of a validation's time, and most of GX's
fixed cost per micro-batch (counted once with cProfile; ``benchmarks/bench_quality.py`` measures
the whole validation cost per batch).

Inside :func:`memoized_configurations` the property is computed once per expectation object and
kept until the block ends. GX builds fresh expectation objects for each validation and does not
change them while validating, so every result is the same: ``tests/quality/test_gx_shim.py``
compares whole validation results with and without the shim, passing and failing. The shim is
active only on the GX version it was checked against (:data:`CHECKED_VERSION`); on any other the
block changes nothing, and that test fails until someone checks the new version.

Not thread-safe on its own: callers hold the gate's GX lock around the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

CHECKED_VERSION: Final = "1.24.1"


def active() -> bool:
    """The installed GX is the version the shim was checked against."""
    import great_expectations

    return great_expectations.__version__ == CHECKED_VERSION


@contextmanager
def memoized_configurations() -> Iterator[None]:
    """Within the block, ``Expectation.configuration`` is built once per expectation object."""
    if not active():
        yield
        return
    from great_expectations.expectations.expectation import Expectation

    original = Expectation.__dict__["configuration"]
    # id -> (object, configuration); keeping the object alive means no id is reused in the block.
    memo: dict[int, tuple[Any, Any]] = {}

    def configuration(self: Any) -> Any:
        hit = memo.get(id(self))
        if hit is None:
            hit = memo[id(self)] = (self, original.fget(self))
        return hit[1]

    Expectation.configuration = property(configuration)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        Expectation.configuration = original  # type: ignore[method-assign]
        memo.clear()
