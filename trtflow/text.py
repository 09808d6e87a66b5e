"""Small text helpers shared by every layer."""
from __future__ import annotations

import difflib
import re


def closest(name: str, options: list[str]) -> str | None:
    """The option `name` was probably meant to be: same letters in another case, or a near spelling."""
    same = [o for o in options if o.lower() == name.lower()]
    close = same or difflib.get_close_matches(name, options, n=1)
    return close[0] if close else None


def suggestion(name: str, options: list[str]) -> str | None:
    """"did you mean 'x'?", or None: for an error's hint."""
    match = closest(name, options)
    return f"did you mean '{match}'?" if match else None


def did_you_mean(name: str, options: list[str]) -> str:
    """" (did you mean 'x'?)", or "": to append to an error message."""
    hint = suggestion(name, options)
    return f" ({hint})" if hint else ""


def pattern_hint(pattern: str, names: list[str]) -> str:
    """For a regex that must match a whole name and matches none: " (...)" naming the names it matches a part of
    (tf2onnx's and TensorFlow's names are long paths a user quotes a piece of), else a near spelling, or ""."""
    try:
        inside = [n for n in names if re.search(pattern, n)]
    except re.error:
        inside = []
    if inside:
        more = f" and {len(inside) - 1} more" if len(inside) > 1 else ""
        return (f" (a pattern matches whole node names; it matches part of '{inside[0]}'{more}: "
                f"'.*{pattern}.*' would match them)")
    hint = suggestion(pattern, names)
    if hint is None and names:  # a misspelt piece of a long name: the name sharing the longest run of characters

        def shared(n: str) -> int:
            return difflib.SequenceMatcher(None, pattern, n).find_longest_match(0, len(pattern), 0, len(n)).size
        best = max(names, key=shared)
        hint = f"did you mean '{best}'?" if shared(best) >= max(4, len(pattern) // 2) else None
    return f" ({hint})" if hint else ""


def listed(items: list[str], most: int, sep: str = ", ") -> str:
    """The first `most` items joined by `sep`, and how many more: 'a, b, c, and 2 more'."""
    more = f"{sep}and {len(items) - most} more" if len(items) > most else ""
    return sep.join(items[:most]) + more


def first_line(message: object) -> str:
    """The first non-empty line of a tool's message or an exception's (its type's name if it says nothing)."""
    line = next((ln.strip() for ln in str(message).splitlines() if ln.strip()), "")
    return line or (type(message).__name__ if isinstance(message, BaseException) else "")


def distinct(a: float, b: float, digits: int = 5) -> tuple[str, str]:
    """`a` and `b` with at least `digits` significant digits and as many more as it takes to tell them apart (a
    failure must never read `0.99999 < 0.99999`)."""
    sa, sb = f"{a:.{digits}g}", f"{b:.{digits}g}"
    d = digits
    while sa == sb and a != b and d < 17:
        d += 1
        sa, sb = f"{a:.{d}g}", f"{b:.{d}g}"
    return sa, sb
