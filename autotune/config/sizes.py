"""Human-readable byte sizes ("16GiB", "512MB", 1e9) for memory budgets."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(value: str | int | float) -> int:
    """Bytes in ``value``: an integer, or a number with a unit (``"16GiB"``, ``"1.5 GB"``).

    Bare ``K``/``M``/``G`` are binary units, as in ``ulimit`` and PyTorch's memory tools.

    Raises:
        ValueError: if the value is not a positive size.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 16GiB, got {value!r}")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        match = _SIZE.match(value)
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"expected a size such as 16GiB or 512MB, got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"a size must be positive, got {value!r}")
    return size


def split_size_error(
    flag: str, value: str | int | None, next_words: list[str] | None
) -> str | None:
    """What is wrong where the shell split a size in two (``--device-memory 16 GB``): the
    unit arrives as a word of its own, which a command would take for its next argument (the
    script to tune). None where nothing was split.

    Example:
        >>> split_size_error("--device-memory", "16", ["GB"])
        "--device-memory 16 GB: a size is one word, 16GB (or quoted: '16 GB')"
        >>> split_size_error("--device-memory", "16GB", ["train.py"]) is None
        True
    """
    unit = next_words[0] if next_words else ""
    if value is None or not unit or unit.lower() not in _UNITS:
        return None
    return f"{flag} {value} {unit}: a size is one word, {value}{unit} (or quoted: '{value} {unit}')"


def format_size(num_bytes: float, decimals: int = 1) -> str:
    """``1536`` → ``"1.5 KiB"``: binary units, ``decimals`` decimals.

    Example:
        >>> format_size(1536), format_size(100 * 2**20 - 1, decimals=3)
        ('1.5 KiB', '100.000 MiB')
    """
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.{decimals}f} {unit}"
        size /= 1024
    return f"{size:.{decimals}f} TiB"


def format_sizes_apart(first: float, second: float) -> tuple[str, str]:
    """Both sizes, with as many decimals as it takes to show them unequal (up to three, then
    in bytes), so a comparison never reads ``0.09 GiB exceeds 0.09 GiB``.

    Example:
        >>> format_sizes_apart(95.41 * 2**20, 95.44 * 2**20)
        ('95.41 MiB', '95.44 MiB')
    """
    if first != second:
        for decimals in (1, 2, 3):
            shown = format_size(first, decimals), format_size(second, decimals)
            if shown[0] != shown[1]:
                return shown
        return f"{first:.0f} B", f"{second:.0f} B"
    return format_size(first), format_size(second)
