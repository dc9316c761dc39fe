"""Decode stage: one Kafka message (key, value, coordinates) -> ChangeEvent | ControlRecord.

The journey of a message: the wire reader for the configured format (:mod:`.avro` for
Confluent-framed Avro, :mod:`.jsonconv` for JsonConverter JSON) turns bytes into a record and the
cached plan of its schema; :mod:`.envelope` reads what the record means (envelope, flattened row or
control record) and builds the position and key; :mod:`.semantic` converts the column values, and
:mod:`.parts` gathers them in the decode step's output format. Every
failure is a :class:`ingest.errors.DecodeError` whose reason says what was wrong, for quarantine.

Use one :class:`MessageDecoder` per table (or per task) and call :meth:`MessageDecoder.decode` for
each message: it caches schema plans. It pickles without its caches, so it can be shipped to Spark
workers (for example inside ``mapInArrow``).
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Callable
from typing import Any, Final, Literal

from ingest.decode.avro import AvroCodec
from ingest.decode.envelope import KeyReader, ValuePlan, to_event, tombstone
from ingest.decode.jsonconv import JsonCodec
from ingest.decode.registry import SchemaRegistry
from ingest.errors import ConfigError, DecodeError
from ingest.model import ChangeEvent, ControlRecord, KafkaCoordinates

__all__ = ["MessageDecoder", "decode_message"]

ValueFormat = Literal["avro", "json"]
#: Reads value bytes into ``(record, plan)``; ``plan`` is ``None`` for schemaless JSON.
ValueReader = Callable[[bytes], tuple[Any, ValuePlan | None]]
# Anything else escaping the readers is a bug in our handling of odd input, still a bad message.
_UNEXPECTED: Final = (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError,
                      ArithmeticError, struct.error, binascii.Error, RecursionError)


class MessageDecoder:
    """Decodes Debezium messages of one value format.

    Args:
        value_format: ``avro`` (Confluent wire format; keys are framed Avro too) or ``json``
            (Kafka Connect JsonConverter, with or without the ``schema``/``payload`` wrapper).
        registry: schema registry; required for ``avro``.
        key_columns: primary-key override from the table config. When given, key values are read
            from the after image (the before image for deletes) by these names, and the Kafka key
            only for a column the image lacks. ``None`` or empty: the Kafka key's columns are the key.
        keep_before: also convert the before image of creates, updates and reads (only a delete's
            before image is ever applied; the stream's decode step skips the others).

    Raises:
        ConfigError: unknown ``value_format``, or ``avro`` without a registry.
    """

    def __init__(self, *, value_format: ValueFormat, registry: SchemaRegistry | None,
                 key_columns: tuple[str, ...] | None = None, keep_before: bool = True) -> None:
        if value_format not in ("avro", "json"):
            raise ConfigError(f"value_format must be 'avro' or 'json', not {value_format!r}")
        if value_format == "avro" and registry is None:
            raise ConfigError("value_format 'avro' needs a schema registry")
        self.value_format: ValueFormat = value_format
        self.registry = registry
        self.key_columns: tuple[str, ...] | None = tuple(key_columns) if key_columns else None
        self.keep_before = keep_before
        self._start()

    def _start(self) -> None:
        if self.value_format == "avro":
            assert self.registry is not None  # checked in __init__
            avro = AvroCodec(self.registry)
            self._read_value: ValueReader = avro.read_value
            self._read_key: KeyReader = avro.read_key
            self._key_names: Callable[[bytes | None], tuple[str, ...] | None] = avro.key_names
        else:
            codec = JsonCodec()
            self._read_value = codec.read_value
            self._read_key = codec.read_key
            self._key_names = codec.key_names

    def __getstate__(self) -> dict[str, Any]:
        # Caches hold fastavro-parsed schemas and closures; workers rebuild them on first use.
        return {"value_format": self.value_format, "registry": self.registry, "key_columns": self.key_columns,
                "keep_before": self.keep_before}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.value_format = state["value_format"]
        self.registry = state["registry"]
        self.key_columns = state["key_columns"]
        self.keep_before = state.get("keep_before", True)
        self._start()

    def event_of(self, record: Any, plan: ValuePlan | None, key: bytes | None,
                 coords: KafkaCoordinates) -> ChangeEvent | ControlRecord:
        """:meth:`decode` from a value already read with :meth:`read_value`.

        Raises:
            DecodeError: the record is not a change Debezium could have sent.
        """
        try:
            return to_event(record, plan, key=key, read_key=self._read_key, key_columns=self.key_columns,
                            coords=coords, keep_before=self.keep_before)
        except DecodeError:
            raise
        except _UNEXPECTED as exc:
            raise DecodeError(f"decode: unexpected {type(exc).__name__}: {exc}") from exc

    def read_value(self, value: bytes) -> tuple[Any, ValuePlan | None]:
        """The raw record of a value and its schema's plan (no conversion; see :mod:`.columnar`).

        Raises:
            DecodeError: the bytes are not a value of this format.
        """
        return self._read_value(value)

    def read_key(self, key: bytes | None) -> dict[str, Any] | None:
        """The values of a message's Kafka key, ``{column: value}`` (``None`` for a message without key).

        Raises:
            DecodeError: the bytes are not a key of this format.
        """
        return self._read_key(key)

    def key_names(self, key: bytes | None) -> tuple[str, ...] | None:
        """The primary-key columns of a message: the configured ones, else the Kafka key schema's fields.

        ``None`` when the key's schema alone cannot say, or lets a key column be null (the message
        then takes :meth:`decode`, which reads the key's values). Otherwise the key's values are
        read from the row image, where Debezium writes the same values.
        """
        if self.key_columns:
            return self.key_columns
        return self._key_names(key)

    def __repr__(self) -> str:
        return f"MessageDecoder(value_format={self.value_format!r}, key_columns={self.key_columns!r})"

    def decode(self, key: bytes | None, value: bytes | None,
               coords: KafkaCoordinates) -> ChangeEvent | ControlRecord:
        """Decode one message.

        Args:
            key: Kafka key bytes (``None`` if the message has none).
            value: Kafka value bytes (``None`` is a Debezium tombstone).
            coords: topic, partition and offset of the message.

        Returns:
            The change, or the control record (tombstone, heartbeat, schema change, transaction
            boundary, logical message) to count as skipped.

        Raises:
            DecodeError: the message cannot be decoded; ``reason`` says why.
        """
        if value is None:
            try:
                return tombstone(key, self._read_key, self.key_columns)
            except _UNEXPECTED as exc:
                return ControlRecord("tombstone", key_error=f"key: unexpected {type(exc).__name__}: {exc}")
        try:
            record, plan = self._read_value(value)
            return to_event(record, plan, key=key, read_key=self._read_key, key_columns=self.key_columns,
                            coords=coords, keep_before=self.keep_before)
        except DecodeError:
            raise
        except _UNEXPECTED as exc:
            raise DecodeError(f"decode: unexpected {type(exc).__name__}: {exc}") from exc


_decoders: dict[tuple[str, int, tuple[str, ...] | None], tuple[Any, MessageDecoder]] = {}


def decode_message(key: bytes | None, value: bytes | None, coords: KafkaCoordinates, *,
                   value_format: ValueFormat, registry: SchemaRegistry | None,
                   key_columns: tuple[str, ...] | None = None) -> ChangeEvent | ControlRecord:
    """Decode one message with a decoder kept per (format, registry, key columns).

    Convenience for callers without a decoder of their own; see :class:`MessageDecoder`.

    Raises:
        DecodeError: the message cannot be decoded.
        ConfigError: bad ``value_format``/``registry`` combination.
    """
    cache_key = (value_format, id(registry), tuple(key_columns) if key_columns else None)
    entry = _decoders.get(cache_key)
    # The entry holds the registry itself, so its id cannot be reused by another object meanwhile.
    if entry is None or entry[0] is not registry:
        if len(_decoders) >= 32:
            _decoders.clear()
        decoder = MessageDecoder(value_format=value_format, registry=registry, key_columns=key_columns)
        entry = (registry, decoder)
        _decoders[cache_key] = entry
    return entry[1].decode(key, value, coords)

