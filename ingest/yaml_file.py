"""YAML the engine reads from people (the configuration, the secrets file): strict, and its errors
in one line.

PyYAML's safe loader keeps the last of a key given twice in one mapping without a word -- a second
``tables:`` would replace the first, a secret named twice would use whichever came last -- and its
messages run over several lines that quote the file. Here a repeated key is an error, and an error
is one line with its line and column.
"""

from __future__ import annotations

from typing import Any

import yaml


class RepeatedKeyError(yaml.constructor.ConstructorError):
    """A key given twice in one mapping; its ``problem`` names the key and nothing else of the file."""


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` brings keys a mapping may override
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise RepeatedKeyError(None, None, f"the key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """``text``'s document, as :func:`yaml.safe_load` reads it but refusing a repeated key.

    Raises:
        yaml.YAMLError: not valid YAML, or :class:`RepeatedKeyError` (see :func:`where`, :func:`problem`).
    """
    return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader


def where(exc: yaml.YAMLError) -> str:
    """Where a YAML error is, as ``line L, column C`` (from 1), or ``""`` when the parser did not say."""
    mark = getattr(exc, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error: where it is and what, without the quoted lines of the file."""
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"not valid YAML: {where(exc)}: {what}" if where(exc) else f"not valid YAML: {what}"
