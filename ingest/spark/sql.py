"""Spark SQL text: identifiers and string literals quoted as Spark reads them."""

from __future__ import annotations


def ident(name: str) -> str:
    """Quote an identifier for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def string(value: str) -> str:
    """A Spark SQL string literal (Spark escapes with backslashes; two quotes would be two literals)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
