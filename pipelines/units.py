"""Human-friendly quantities in the YAML: sizes ("2GiB"), durations ("10m"), percentages ("10%")."""
from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "t": 10**12, "tb": 10**12}
DURATION_UNITS = {"": "1", "s": "1", "m": "60", "min": "60", "h": "3600", "ms": "0.001", "us": "0.000001"}


def parse_size(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("expected a size such as 2GiB or 512MiB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in SIZE_UNITS:
        raise ValueError(f"invalid size {value!r} (expected e.g. 2GiB, 512MiB or a number of bytes)")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).lower()])


def parse_duration(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 10m or 2h")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"a duration must be a finite number of seconds, not {value}")
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in DURATION_UNITS:
        raise ValueError(f"invalid duration {value!r} (expected e.g. 90s, 10m or 2h)")
    # in decimal: 100us is the 0.0001 s written as a number, not 9.999999999999999e-05
    return float(Decimal(m.group(1)) * Decimal(DURATION_UNITS[m.group(2).lower()]))


def parse_fraction(value: object) -> float:
    """'10%' -> 0.1; plain numbers are taken as fractions already."""
    if isinstance(value, bool):
        raise ValueError("expected a percentage such as 10%")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"a percentage must be a finite number, not {value}")
        return float(value)
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*%\s*", str(value))
    if not m:
        raise ValueError(f"invalid percentage {value!r} (expected e.g. 10%)")
    return float(m.group(1)) / 100.0


def _number_or(pattern: str, example: str) -> WithJsonSchema:
    return WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0},
                                     {"type": "string", "pattern": pattern, "examples": [example]}]})


Size = Annotated[int, BeforeValidator(parse_size), PlainSerializer(int),
                 _number_or(r"^\s*\d+(\.\d+)?\s*[a-zA-Z]*\s*$", "2GiB")]
Duration = Annotated[float, BeforeValidator(parse_duration), PlainSerializer(float),
                     _number_or(r"^\s*\d+(\.\d+)?\s*[a-zA-Z]*\s*$", "10m")]
Fraction = Annotated[float, BeforeValidator(parse_fraction), PlainSerializer(float),
                     _number_or(r"^\s*-?\d+(\.\d+)?\s*%\s*$", "10%")]
