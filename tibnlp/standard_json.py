"""JSON that every parser reads, for the result and record files tibnlp writes.

Python's `json.dumps` writes a float that is not finite as a bare `NaN` or `Infinity`: Python
reads it back, but jq, `JSON.parse` and most other readers refuse the whole file. A score that
is not known (a flip rate with no text read, any score of an empty part) is NaN, so these
files are written with it as `null`, and the readers that expect a float read a `null` back
as NaN (`nan_for_null`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def finite(data: Any) -> Any:
    """`data` with every float that is not finite (in dicts, lists and tuples) as None."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, Mapping):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


def dumps(data: Any, **kwargs: Any) -> str:
    """`json.dumps(data, **kwargs)` as standard JSON: NaN and ±inf written as null."""
    return json.dumps(finite(data), allow_nan=False, **kwargs)


def nan_for_null(value: Any) -> Any:
    """A float field as read back from `dumps`' JSON: None (a NaN or inf written) is NaN."""
    return math.nan if value is None else value


def nan_for_nulls(values: Any) -> Any:
    """`nan_for_null` of each value of a dict of floats (anything else as it is)."""
    if not isinstance(values, dict):
        return values
    return {k: nan_for_null(v) for k, v in values.items()}
