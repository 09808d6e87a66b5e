"""The one writer of YAML a person runs: `trtflow init`'s pipeline.yaml, `init-deploy`'s prefect.yaml, the lines
validate's repair says to paste. Whatever a name holds (a model's tensor and node names are anyone's text), a value
or a comment can never end its line, add a key, or read differently in a terminal than it parses.

YAML reads U+0085, U+2028 and U+2029 as line breaks, and a terminal shows a bidirectional override as reordered
text: in a comment either could make a line that looks like a comment define a stage. So every value is written
as one flow-style scalar, double-quoted with escapes wherever it is not a plain word; comments escape the same
characters; and the finished text is checked to hold none of them outside an escape.
"""
from __future__ import annotations

import math
import numbers
import re
import textwrap

import yaml

# Everything that is a line break or a control to YAML or a terminal: C0 but tab and line feed, DEL, C1 (U+0085 is
# YAML's NEL), YAML's two Unicode line breaks, the bidirectional embeddings, overrides, isolates and marks, the BOM.
LINE_BREAKS = "\x85\u2028\u2029"  # YAML's beyond CR and LF (NEL, LINE and PARAGRAPH SEPARATOR)
BIDI_OVERRIDES = "\u202a-\u202e\u2066-\u2069"  # embeddings, overrides, isolates: a terminal reorders the line
BIDI_MARKS = "\u200e\u200f\u061c\ufeff"  # LRM, RLM, ALM, and the BOM (a zero-width no-break space mid-text)
# What may stand in YAML only inside a quoted string (written there as an escape); the loader refuses it elsewhere
UNSAFE_OUTSIDE_QUOTES = f"{LINE_BREAKS}{BIDI_OVERRIDES}{BIDI_MARKS}"
BREAKS_AND_CONTROLS = f"\x00-\x08\x0b-\x1f\x7f-\x9f{UNSAFE_OUTSIDE_QUOTES}"
UNSAFE = re.compile(f"[{BREAKS_AND_CONTROLS}]")
_UNSAFE_IN_COMMENT = re.compile(f"[\t\n{BREAKS_AND_CONTROLS}]")  # a comment is one line: a line feed too
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")
MAX_IMPLICIT_KEY = 1024  # YAML: a key longer than this needs the explicit '? ' form
_NAMED = {"\\": "\\\\", '"': '\\"', "\t": "\\t", "\n": "\\n", "\r": "\\r", "\x00": "\\0", "\x85": "\\N",
          "\u2028": "\\L", "\u2029": "\\P"}


def _escape(ch: str, named: bool = True) -> str:
    if named and ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def quoted(text: str) -> str:
    """`text` as a double-quoted scalar on one line: every quote, backslash, break and control escaped."""
    return '"' + re.sub(rf'[\\"\t\n{BREAKS_AND_CONTROLS}]', lambda m: _escape(m.group()), text) + '"'


def scalar(value: object, interpolated: bool = False) -> str:
    """One value on one line, reading back as exactly `value`: None, bool, int, float, str, or lists and mappings
    of them (flow style). `interpolated`: the file is a pipeline file, whose string values are read with ${VAR}
    interpolation: every '$' in one is written '$$' (mapping keys are not interpolated)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):  # numpy's too
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return ".nan"
        if not math.isfinite(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)  # YAML 1.1 (PyYAML) reads '1e-05' as text: its mantissa needs a '.'
        return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text
    if isinstance(value, str):
        return _string(value.replace("$", "$$") if interpolated else value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(scalar(v, interpolated) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(_entry(_string(k) if isinstance(k, str) else scalar(k), scalar(v, interpolated))
                               for k, v in value.items()) + "}"
    raise TypeError(f"no YAML scalar for {type(value).__name__}")


def _string(text: str) -> str:
    return text if _PLAIN.fullmatch(text) and yaml.safe_load(text) == text else quoted(text)


def _entry(key: str, value: str) -> str:
    return f"? {key} : {value}" if len(key) > MAX_IMPLICIT_KEY else f"{key}: {value}"


def comment_text(text: str) -> str:
    """Text for a comment: breaks, controls and bidirectional marks shown as escapes, never acted on."""
    return _UNSAFE_IN_COMMENT.sub(lambda m: _escape(m.group(), named=False), text)


def visible(text: str) -> str:
    """`text` for a terminal: every break and control but line feeds and tabs shown as an escape."""
    return UNSAFE.sub(lambda m: _escape(m.group(), named=False), text)


class YamlLines:
    """A YAML file built line by line: values through `scalar`, comments through `comment_text`, and the whole
    checked at the end (`text`)."""

    def __init__(self, width: int = 118, comment_at: int = 48) -> None:
        self.lines: list[str] = []
        self.width, self.comment_at = width, comment_at

    def add(self, text: str, comment: str = "") -> None:
        """A line (its values made by `scalar`), its comment at the comment column, or on a line of its own above
        where that would be too long."""
        if comment:
            comment = comment_text(comment)
            at = max(self.comment_at - 1, len(text) + 1)
            if at + 2 + len(comment) > self.width:
                self.comment(comment, len(text) - len(text.lstrip()))
            else:
                text = f"{text.ljust(at)} # {comment}"
        self.lines.append(text)

    def comment(self, text: str, indent: int = 0) -> None:
        """A comment line, wrapped at the width (continuations indented two more spaces than the text)."""
        text = comment_text(text)
        lead = " " * indent + "# "
        more = lead + " " * (len(text) - len(text.lstrip()) + 2)
        self.lines += textwrap.wrap(text, self.width, initial_indent=lead, subsequent_indent=more,
                                    break_long_words=False, break_on_hyphens=False) or [lead.rstrip()]

    def text(self) -> str:
        return checked("\n".join(self.lines) + "\n")


def checked(text: str) -> str:
    """`text`, once it is certain to hold no raw break or control but line feeds and tabs (everything the writers
    put in is escaped: finding one is a bug in a writer, never a file written)."""
    bad = UNSAFE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        raise AssertionError(f"YAML writer left U+{ord(bad.group()):04X} raw on line {line}")
    return text
