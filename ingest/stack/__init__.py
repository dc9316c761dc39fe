"""The real production path on this machine: PostgreSQL 15, Kafka 4.3 (KRaft), Kafka Connect with
Debezium 3.6, Apicurio Registry 3.3 and nginx (basic auth in front of the registry), started on
loopback from Debian packages and Maven Central jars, without Docker (docs/stack.md).

Command line: ``python -m ingest.stack up|down|status|restart|env|jars``. From Python::

    from ingest.stack import Stack
    stack = Stack.from_env()
    stack.up()
"""

from ingest.stack.errors import StackError
from ingest.stack.settings import StackSettings
from ingest.stack.stack import ORDER, ComponentStatus, Stack

__all__ = ["ORDER", "ComponentStatus", "Stack", "StackError", "StackSettings"]
