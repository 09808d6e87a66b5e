"""One rule for the names that become directories, file names, code or markup: stage names, build profiles and
targets, output names, the pipeline's and Triton's model names. (Paths read back from a store, its manifests' and
its shared keys, follow `trtflow.paths`; release records are named by their version.)

A name comes from a pipeline file, a model or a store that someone else wrote, so it is checked where it enters,
by `problem()`, and refused with one line naming its key path: never made safe by replacing characters later (two
names could then meet in one directory). Names with no such use (ONNX tensor and node names) are not restricted:
they are escaped where they are shown (`trtflow.markdown`, `html.escape`) and never formatted into code.
"""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema

MAX_LENGTH = 64  # a cell's directory joins three names: far below a file system's 255 bytes
MODEL_MAX_LENGTH = 100  # Triton adds '_preprocess' / '_ensemble' to a model's name

# No '/', no leading '.' or '-', no '..': a name is one path component and never an option. No '.' at all where
# names are joined with '.' (a build cell is 'variant.profile.target'), or a name could pose as two.
PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # a stage: `inputs:` refer to 'stage.output'
DOTTED = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a pipeline's or Triton model's name (one directory)

RULES = {
    PLAIN: "letters, digits, '_' and '-', not starting with '-'",
    IDENTIFIER: "letters, digits, '_' and '-', starting with a letter or '_'",
    DOTTED: "letters, digits, '_', '-' and '.', starting with a letter or digit",
}


def problem(value: object, pattern: re.Pattern[str] = PLAIN, max_length: int = MAX_LENGTH) -> str | None:
    """Why `value` cannot be a name of this kind, or None."""
    if not isinstance(value, str):
        return f"a name must be text, not {type(value).__name__}"
    shown = value if len(value) <= 40 else value[:40] + "..."
    if not value:
        return "a name cannot be empty"
    if len(value) > max_length:
        return f"{shown!r} is {len(value)} characters long: at most {max_length}"
    if not pattern.fullmatch(value) or ".." in value:
        return f"{shown!r} is not a name trtflow can use as a file name: {RULES[pattern]}"
    return None


def _checked(pattern: re.Pattern[str], max_length: int, what: str) -> tuple[AfterValidator, WithJsonSchema]:
    def check(value: str) -> str:
        why = problem(value, pattern, max_length)
        if why:
            raise ValueError(why)
        return value
    schema = {"type": "string", "pattern": f"^{pattern.pattern}$", "maxLength": max_length, "description": what}
    return AfterValidator(check), WithJsonSchema(schema)


Name = Annotated[(str, *_checked(PLAIN, MAX_LENGTH, "a name: " + RULES[PLAIN]))]
StageName = Annotated[(str, *_checked(IDENTIFIER, MAX_LENGTH, "a stage's name: " + RULES[IDENTIFIER]))]
ModelName = Annotated[(str, *_checked(DOTTED, MODEL_MAX_LENGTH, "a model's name: " + RULES[DOTTED]))]


# validate's repair of a variant is the variant '<variant>.repaired', its engines '<engine>.repaired'
REPAIRED = ".repaired"


def repaired(name: str) -> str:
    """The name of the repaired variant (or engine) made from `name`."""
    return name + REPAIRED


def is_repaired(name: str) -> bool:
    return name.endswith(REPAIRED)


def unrepaired(name: str) -> str:
    """The variant (or engine) a repaired one was made from; any other name as it is."""
    return name.removesuffix(REPAIRED)
