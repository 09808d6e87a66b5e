"""Errors about the user's pipeline file: one line naming the file, line, key path and what to do."""
from __future__ import annotations


class TrtflowError(Exception):
    """Base of every error shown to the user as one line (no traceback unless --verbose)."""


class SpecError(TrtflowError):
    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 path: tuple | None = None, hint: str | None = None):
        self.message, self.file, self.line, self.path, self.hint = message, file, line, path, hint
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.line == 0:
            where = f"--set {format_path(self.path)}: " if self.path else "--set: "
            return f"{where}{self.message}" + (f" ({self.hint})" if self.hint else "")
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        key = f"{format_path(self.path)}: " if self.path else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{key}{self.message}{hint}"


def format_path(path: tuple | None) -> str:
    out = ""
    for part in path or ():
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
