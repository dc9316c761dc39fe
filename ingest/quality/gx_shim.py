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

The block also remembers the ids GX computes for its metrics' keyword dictionaries
(``IDDict.to_id``: a JSON dump of the dictionary through GX's slow generic converter, then MD5). A
validation asks for many ids of a few distinct dictionaries, the same ones batch after batch (a
one-off count on the demo's orders suite: about a thousand ids, 22 dictionaries). An id is
remembered only for a dictionary of plain values (strings, numbers, booleans, None, and lists,
tuples and string-keyed dicts of them), keyed by those values and their types, so equal keys always
mean the same JSON and the same id; anything else is computed as before.

Not thread-safe on its own: callers hold the gate's GX lock around the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

CHECKED_VERSION: Final = "1.24.1"


def active() -> bool:
    """The installed GX is the version the shim was checked against."""
    # Great Expectations (seconds to import): only when a suite validates
    import great_expectations

    return great_expectations.__version__ == CHECKED_VERSION


@contextmanager
def memoized_configurations() -> Iterator[None]:
    """Within the block, ``Expectation.configuration`` is built once per expectation object."""
    if not active():
        yield
        return
    # Great Expectations (seconds to import): only when a suite validates
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
    # Great Expectations (seconds to import): only when a suite validates
    from great_expectations.core.id_dict import IDDict

    original_to_id = IDDict.__dict__["to_id"]

    def to_id(self: Any, id_keys: Any = None, id_ignore_keys: Any = None) -> Any:
        id_keys = None if id_keys is None else list(id_keys)  # read twice below
        id_ignore_keys = None if id_ignore_keys is None else set(id_ignore_keys)
        key = _plain_key(self, id_keys, id_ignore_keys)
        if key is None:
            return original_to_id(self, id_keys, id_ignore_keys)
        found = _IDS.get(key)
        if found is None:
            if len(_IDS) >= _MAX_IDS:
                _IDS.clear()
            found = _IDS[key] = original_to_id(self, id_keys, id_ignore_keys)
        return found

    IDDict.to_id = to_id  # type: ignore[method-assign]
    try:
        yield
    finally:
        Expectation.configuration = original  # type: ignore[method-assign]
        IDDict.to_id = original_to_id  # type: ignore[method-assign]
        memo.clear()


#: ids of plain metric keyword dictionaries, kept across validations (a suite asks for the same ones)
_IDS: dict[Any, Any] = {}
_MAX_IDS: Final = 10_000
_UNCACHEABLE: Final = object()


def _plain_key(data: dict[str, Any], id_keys: Any, id_ignore_keys: Any) -> Any:
    """A hashable key that only equal plain contents share (types included: ``1``, ``1.0`` and
    ``True`` differ, and so do ``0.0`` and ``-0.0``), or ``None`` when a value is anything else."""
    keys = data.keys() if id_keys is None else id_keys
    ignored = getattr(data, "_id_ignore_keys", set()) if id_ignore_keys is None else id_ignore_keys
    items = []
    for k in keys:
        if k in ignored:
            continue
        if not isinstance(k, str):
            return None
        frozen = _freeze(data[k])
        if frozen is _UNCACHEABLE:
            return None
        items.append((k, frozen))
    return (type(data).__name__, tuple(sorted(items)))


def _freeze(value: Any) -> Any:
    if type(value) is float:
        return ("float", repr(value))  # 0.0 == -0.0, but JSON writes them differently
    if value is None or type(value) in (str, int, bool):
        return (type(value).__name__, value)
    if type(value) in (list, tuple):
        inner = tuple(_freeze(v) for v in value)
        return _UNCACHEABLE if any(v is _UNCACHEABLE for v in inner) else (type(value).__name__, inner)
    if type(value) is dict and all(type(k) is str for k in value):
        pairs = tuple(sorted((k, _freeze(v)) for k, v in value.items()))
        return _UNCACHEABLE if any(v is _UNCACHEABLE for _, v in pairs) else ("dict", pairs)
    return _UNCACHEABLE
