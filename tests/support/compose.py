"""Compose files read as their engine would: values with `${NAME:-default}` resolved."""

import re
from typing import Any


def interpolate(value: Any) -> str:
    """A compose value as a string, with `${NAME:-default}` resolved to its default."""
    resolved = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))
    assert "$" not in resolved, f"{value!r}: only ${{NAME:-default}} interpolation is expected"
    return resolved
