"""Human-readable sizes and durations for the CLIs, and text from stores and sources made safe for a terminal."""

from __future__ import annotations

import re

from mmdata.errors import MmdataError

# C0 and C1 control characters and DEL: a line break would split the one-line error, an escape sequence would
# drive the terminal (retitle it, recolour it, move the cursor) from a file name or a task written by anyone.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def terminal_text(text: object) -> str:
    """`text` with each control character written as its escape (`\\n`, `\\x1b`), for printing."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], str(text))


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(text: str) -> int:
    """'1GB', '500MB', '64MiB' or a number of bytes."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise MmdataError(f"cannot read size '{text}'; write it like 1GB, 500MB or 64MiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def format_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(seconds, 60)
    if minutes < 60:
        return f"{int(minutes)} min {rest:.0f} s"
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)} h {int(minutes)} min"
