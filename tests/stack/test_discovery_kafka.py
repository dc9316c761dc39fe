"""Discovery against the real broker: Kafka's topic list, its internal topics left out, odd topics refused."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from ingest import secrets
from ingest.config import DiscoverySpec
from ingest.discovery import with_discovered
from ingest.errors import ConfigError
from ingest.source import KafkaSource, source_for
from ingest.source.kafka import admin_config
from tests.stack.helpers import stack_config

pytestmark = pytest.mark.stack


def test_kafka_topics_are_discovered_and_a_transaction_topic_is_refused(stack: Any, tmp_path: Path) -> None:
    config = stack_config("json", tmp_path / "work")
    spec = config.source.kafka
    assert spec is not None
    prefix = f"disc{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}.public.alpha", f"{prefix}.public.beta-2", f"{prefix}.transaction"]
    admin = AdminClient(admin_config(spec, secrets.lookup(spec.credentials_env, config.secrets_path)))
    for future in admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names]).values():
        future.result(timeout=30)
    try:
        source = source_for(config)
        assert isinstance(source, KafkaSource)
        topics = source.topics()
        assert set(names) <= set(topics) and not any(t.startswith("__") for t in topics)

        tables = config.model_copy(update={"tables": (), "discover": DiscoverySpec(
            topic_pattern=rf"{prefix}\.public\.[^.]+", defaults={"delete_mode": "soft"})})
        found = with_discovered(tables, source).tables
        assert [(t.name, t.topic, t.delete_mode) for t in found] == [
            ("public_alpha", names[0], "soft"), ("public_beta_2", names[1], "soft")]

        wide = tables.model_copy(update={"discover": DiscoverySpec(topic_pattern=rf"{prefix}\..+")})
        with pytest.raises(ConfigError, match=rf"'{prefix}\.transaction' matches discover\.topic_pattern"):
            with_discovered(wide, source)
    finally:
        for future in admin.delete_topics(names).values():
            future.result(timeout=30)
