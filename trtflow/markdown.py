"""Values written into Markdown (stage summaries shown as Prefect artifacts, the model card): names and messages come
from models, pipeline files and stores, so each is escaped where it is interpolated, never trusted to be plain.

CommonMark lets a backslash escape any ASCII punctuation; escaping all of it means no value can open an HTML tag
(`<img onerror=...>`), a link, emphasis, a heading or a table cell. A line break would end a table row or a list
item: it becomes a space. Code spans render their content literally (no HTML), but a backtick in the value would
close the span: the fence is made longer than any run of backticks inside.
"""
from __future__ import annotations

import re
import string
from urllib.parse import quote

_PUNCT = re.compile("([" + re.escape(string.punctuation) + "])")
_BREAKS = re.compile(r"[\r\n\t\v\f\x85\u2028\u2029]+")


def text(value: object) -> str:
    """`value` as literal Markdown text: every ASCII punctuation character escaped, line breaks folded."""
    return _PUNCT.sub(r"\\\1", _BREAKS.sub(" ", str(value)))


def code(value: object, cell: bool = False) -> str:
    """`value` as an inline code span. `cell`: inside a table row, where GFM splits on `|` before it reads code
    spans (`\\|` is the one escape a table's code span honours)."""
    s = _BREAKS.sub(" ", str(value))
    if cell:
        s = s.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def row(cells: list[object]) -> str:
    """A table row of literal texts."""
    return "| " + " | ".join(text(c) for c in cells) + " |"


def image(alt: object, path: object) -> str:
    """A picture: `alt` as literal text, `path` (relative) percent-encoded, so that it can neither end the link nor
    name a scheme (`javascript:`)."""
    return f"![{text(alt)}]({quote(str(path))})"


def block(body: str, info: str = "") -> list[str]:
    """A fenced code block (`info`: our own language name). Its fence is longer than any run of backticks in
    `body`: a line of them would otherwise close it, and the rest of `body` would be read as Markdown."""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, body.rstrip(), fence]
