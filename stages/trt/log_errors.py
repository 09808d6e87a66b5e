"""TensorRT's log, read for the one line a user needs: the first error it reports, on one line, whole words only.

A Myelin error is one log entry of several lines ("Error during shape inference of <expression>, name=<node>
Error is: <what>", repeated), which TensorRT itself may cut mid-word; the line given is the first "what" and the
node it names. The full log stays in the build's `build.log`.
"""
from __future__ import annotations

import re

ERROR = re.compile(r"^\[(?:ERROR|INTERNAL_ERROR)\]\s*")
CODE = re.compile(r"^(?:[\w:]+: )?Error Code \d+: ")
SOURCE = re.compile(r"\[[\w./-]+\.(?:cpp|cc|h|hpp|cu):\d+:?[^\]]*\]\s*")
# "In operator() at /_src/optimizer/common/shape/shapeContext.cpp:4633": where in TensorRT's own source
SOURCE_AT = re.compile(r"\s*\bIn [\w:~<>]+(?:\(\))? at [\w./-]+\.(?:cpp|cc|h|hpp|cu):\d+")
MYELIN = re.compile(r"Error during (.+?)\bof\b.*?name=([^\s,;)]+).*?Error is:\s*(.+?)(?:;|\n|$)", re.S)
LIMIT = 300


def first_error(log: list[str], fallback: str = "no error in the log") -> str:
    """The first error entry of `log` (lines as `trt.parse` keeps them), as one line."""
    entry = next((line for line in log if ERROR.match(line)), None)
    if entry is None:
        return fallback
    text = CODE.sub("", ERROR.sub("", entry))
    found = MYELIN.search(text)
    if found:
        during, node, what = found.groups()
        text = f"{text.split('(')[0].strip()}: {what.strip().rstrip('.')} (node {node}, {during.strip()})"
    return shorten(SOURCE_AT.sub("", SOURCE.sub("", text)))


def shorten(text: str, limit: int = LIMIT) -> str:
    """`text` on one line, at most `limit` characters, cut only between words."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
