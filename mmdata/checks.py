"""Checks for values that come from untrusted metadata: `dataset.json`, manifests, importers' JSON.

Each check returns the value in its proper type or raises `ValueError` saying what is wrong; the
caller turns that into the error of its layer (`StoreError`, `SourceError`) with the file named.
Nothing here trusts a type: JSON numbers may arrive as strings, lists or booleans, and text may
hold lone surrogates that no file format can store.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from mmdata.errors import OptionError

MAX_JSON_BYTES = 64 << 20
MAX_JSON_DEPTH = 64
MAX_NAME_BYTES = 200  # a stream's name is a folder of a Zarr store: file systems hold 255 bytes a component
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def dump_json(value: Any, indent: int | None = None, sort_keys: bool = False) -> str:
    """`value` as JSON that every parser reads (what `parse_json` reads back): a number that is not finite (a
    NaN a recording holds, a figure computed from it) is written as null, never as the `NaN` / `Infinity` that
    JSON does not have; numpy numbers and arrays as JSON numbers and lists."""
    try:
        return json.dumps(value, allow_nan=False, indent=indent, sort_keys=sort_keys, default=_plain)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False, indent=indent, sort_keys=sort_keys, default=_plain)


def _plain(value: Any) -> Any:
    """What `dump_json` writes for a value `json` does not know: numpy's as Python's, anything else as text."""
    if isinstance(value, np.ndarray | np.generic):
        return _finite(value.tolist())
    return str(value)


def _finite(value: Any) -> Any:
    """`value` with every float that is not finite (in dicts, lists, tuples and numpy values) replaced by None."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    if isinstance(value, np.ndarray | np.generic):
        return _finite(value.tolist())
    return value


def parse_json(data: str | bytes, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON document of at most `max_bytes`, nested at most `max_depth` deep, with valid text."""
    if len(data) > max_bytes:
        raise ValueError(f"is {len(data)} bytes, more than the {max_bytes} a metadata file may hold")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ValueError(f"nests deeper than {max_depth} levels") from exc
    check_json_value(value, max_depth)
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"holds {name}, which is not a JSON number")


def check_json_value(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ValueError unless `value` is plain JSON: dicts with text keys, lists, valid text,
    finite numbers, booleans and null, nested at most `max_depth` deep."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)) and depth > max_depth:
            raise ValueError(f"nests deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ValueError(f"has a key {key!r} that is not text")
                text_problem(key)
                pending.append((child, depth + 1))
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            text_problem(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"holds {item}, which is not a JSON number")
        elif item is not None and not isinstance(item, (bool, int, float)):
            raise ValueError(f"holds a {type(item).__name__}, which JSON cannot store")


def text_problem(text: str) -> None:
    """Raise ValueError when `text` cannot be stored as UTF-8 (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text {text[max(0, exc.start - 10) : exc.end + 10]!r} holds an unpaired surrogate (not valid Unicode)"
        ) from exc


def as_text(value: Any, what: str, max_length: int = 1 << 20) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is {shown(value)}, not text")
    if len(value) > max_length:
        raise ValueError(f"{what} is {len(value)} characters long, more than {max_length}")
    text_problem(value)
    return value


def as_int(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    """An integer (not a bool, a float or a string holding one) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} is {shown(value)}, not an integer")
    number = int(value)
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(f"{what} is {number}, outside [{low}, {high}]")
    return number


def as_number(value: Any, what: str, low: float | None = None, high: float | None = None, positive=False) -> float:
    """A finite number (int or float, not a bool or a string) within [low, high] (and > 0 if `positive`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} is {shown(value)}, not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} is {number}, not a finite number")
    if positive and number <= 0:
        raise ValueError(f"{what} is {number:g}; it must be above 0")
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(f"{what} is {number:g}, outside [{low:g}, {high:g}]")
    return number


def stream_name_problem(name: Any) -> str | None:
    """Why `name` cannot name a stream, or None. Names become tar member names, Zarr array paths
    and manifest columns (`<name>/count`), so they hold no `/`, `\\`, control characters or a
    leading dot, fit a file name (200 bytes in UTF-8), and are not `task` (the text stream)."""
    if not isinstance(name, str) or not name:
        return f"stream name {shown(name)} is not a non-empty text"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        return f"stream name of {size} bytes in UTF-8 is longer than {MAX_NAME_BYTES}"
    if "/" in name or "\\" in name or _CONTROL.search(name):
        return f"stream name {name!r} holds '/', '\\' or a control character"
    if name.startswith(".") or name != name.strip():
        return f"stream name {name!r} starts with a dot or has spaces at its ends"
    try:
        text_problem(name)
    except ValueError as exc:
        return f"stream name {exc}"
    return None


def relative_path_problem(path: Any) -> str | None:
    """Why `path` is not a plain relative path inside its root (no `..`, not absolute), or None."""
    if not isinstance(path, str) or not path:
        return f"path {shown(path)} is not a non-empty text"
    if path.startswith(("/", "\\")) or "\\" in path or re.match(r"^[A-Za-z]:", path) or _CONTROL.search(path):
        return f"path {path!r} is absolute or holds '\\' or control characters"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return f"path {path!r} has an empty, '.' or '..' component"
    return None


def inside(root: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether `path`, with every symbolic link resolved, lies inside `root` (also resolved)."""
    resolved_root = Path(root).resolve()
    resolved = Path(path).resolve()
    return resolved == resolved_root or resolved_root in resolved.parents


def shown(value: Any, length: int = 60) -> str:
    """`value`'s repr cut to `length` characters, for messages about values from untrusted input."""
    text = repr(value)
    return text if len(text) <= length else text[: length - 3] + "..."


def option_number(value: Any, what: str, low: float, high: float, error: type[OptionError] = OptionError) -> float:
    """A public option that is a finite number in [low, high] (not a bool or text), or `error` naming it."""
    try:
        return as_number(value, what, low, high)
    except ValueError as exc:
        raise error(str(exc)) from None


def option_bool(value: Any, what: str) -> bool:
    """A public option that is True or False (not 1, "yes" or None), or an OptionError naming it."""
    if not isinstance(value, bool):
        raise OptionError(f"{what} is True or False, not {value!r:.60}")
    return value


def option_int(value: Any, what: str, low: int, high: int, error: type[OptionError] = OptionError) -> int:
    """A public option that is a whole number in [low, high] (not a bool, a float or text), or `error`."""
    try:
        return as_int(value, what, low, high)
    except ValueError as exc:
        raise error(str(exc)) from None
