"""Small text helpers shared by every layer."""
from __future__ import annotations

import difflib


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
