"""The real production path on this machine: PostgreSQL 15, Kafka 4.3 (KRaft), Kafka Connect with
Debezium 3.6, Apicurio Registry 3.3 and nginx (basic auth in front of the registry), and MinIO for a lake on S3,
started on loopback from Debian packages, Maven Central jars and a Go module, without Docker
(docs/stack.md).

Command line: ``python -m harness.stack up|down|status|restart|env|jars``. From Python::

    from harness.stack import Stack
    stack = Stack.from_env()
    stack.up()
"""

from harness.stack.errors import StackError
from harness.stack.settings import StackSettings
from harness.stack.stack import CDC_COMPONENTS, ORDER, ComponentStatus, Stack

__all__ = ["CDC_COMPONENTS", "ORDER", "ComponentStatus", "Stack", "StackError", "StackSettings"]
