"""The one exception type of the local stack controller."""

from __future__ import annotations


class StackError(RuntimeError):
    """A component could not be provided, started or stopped.

    The first line of the message is one sentence naming what is missing or what failed; further
    lines, if any, carry the tail of the component's log.
    """
