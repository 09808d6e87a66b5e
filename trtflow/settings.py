"""trtflow's own environment variables (`TRTFLOW_*`), each read here and only here, through a typed reader that
checks it: a bad value is one line naming the variable, its value and what it takes (SpecError, exit 2), never a
silent default. `trtflow` checks them all before any command (`check_all`); docs/prefect.md (Environment variables)
lists them, and a test keeps that list and `ALL` the same.

A variable set to the empty string is a bad value, not a default: an empty value is usually a shell variable that
was meant to hold something (`TRTFLOW_STATE_DIR=$STATE` with STATE unset). Unset it for the default."""
from __future__ import annotations

import math
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from trtflow.errors import SpecError

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a machine name or GPU kind in a work pool or queue name
SHOWN_CHARS = 80  # of a bad value in its error


@dataclass(frozen=True)
class Setting(ABC):
    name: str

    @property
    @abstractmethod
    def accepts(self) -> str:
        """What it takes, as its error and docs/prefect.md say it."""

    @abstractmethod
    def get(self) -> object:
        """Its value, checked; the default when unset."""

    def _raw(self) -> str | None:
        """The value set (None: unset); an empty one is refused."""
        raw = os.environ.get(self.name)
        if raw == "":
            raise self._bad(raw)
        return raw

    def _bad(self, raw: str) -> SpecError:
        shown = repr(raw) if len(raw) <= SHOWN_CHARS else f"{raw[:SHOWN_CHARS]!r}..."  # repr: control characters
        return SpecError(f"environment variable {self.name}={shown} is not {self.accepts}",
                         hint=f"correct it, or unset {self.name} for the default")


@dataclass(frozen=True)
class Number(Setting):
    default: float
    low: float
    high: float
    unit: str

    @property
    def accepts(self) -> str:
        return f"a number of {self.unit} from {self.low:g} to {self.high:g} (default {self.default:g})"

    def get(self) -> float:
        raw = self._raw()
        if raw is None:
            return self.default
        try:
            value = float(raw)
        except ValueError:
            raise self._bad(raw) from None
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise self._bad(raw)
        return value


@dataclass(frozen=True)
class Flag(Setting):
    @property
    def accepts(self) -> str:
        return "1 (on) or 0 (off, the default)"

    def get(self) -> bool:
        raw = self._raw()
        if raw not in (None, "0", "1"):
            raise self._bad(raw)
        return raw == "1"


@dataclass(frozen=True)
class Choice(Setting):
    choices: tuple[str, ...]  # the first is the default

    @property
    def accepts(self) -> str:
        return " or ".join(f"{c}{' (the default)' if i == 0 else ''}" for i, c in enumerate(self.choices))

    def get(self) -> str:
        raw = self._raw()
        if raw is None:
            return self.choices[0]
        if raw not in self.choices:
            raise self._bad(raw)
        return raw


@dataclass(frozen=True)
class Label(Setting):
    """A name Prefect work pools and queues take (None: unset, the caller's default)."""

    @property
    def accepts(self) -> str:
        return "a name of letters, digits, '.', '_' and '-' that starts with a letter or digit"

    def get(self) -> str | None:
        raw = self._raw()
        if raw is not None and not LABEL.fullmatch(raw):
            raise self._bad(raw)
        return raw


@dataclass(frozen=True)
class Directory(Setting):
    """An absolute path (None: unset, the caller's default): a relative one would move with the working directory,
    and a quoted `~` is not expanded by the shell."""

    @property
    def accepts(self) -> str:
        return "an absolute path (without control characters)"

    def get(self) -> Path | None:
        raw = self._raw()
        if raw is None:
            return None
        if not os.path.isabs(raw) or any(ord(c) < 32 for c in raw):
            raise self._bad(raw)
        return Path(raw)


@dataclass(frozen=True)
class Block(Setting):
    """A Prefect block, `<kind>/<name>` (None: unset)."""
    kinds: tuple[str, ...]

    @property
    def accepts(self) -> str:
        return " or ".join(f"{kind}/<block name>" for kind in self.kinds)

    def get(self) -> tuple[str, str] | None:
        raw = self._raw()
        if raw is None:
            return None
        kind, _, name = raw.partition("/")
        if kind not in self.kinds or not LABEL.fullmatch(name):
            raise self._bad(raw)
        return kind, name


@dataclass(frozen=True)
class Database(Setting):
    """Where trtflow's background Prefect server keeps its state: `sqlite` (Prefect's own file), `local` (a
    PostgreSQL cluster trtflow keeps in its state directory) or a PostgreSQL URL for Prefect's asyncpg driver."""

    @property
    def accepts(self) -> str:
        return "sqlite, local or a postgresql+asyncpg:// URL"

    def get(self) -> str:
        raw = self._raw()
        return "sqlite" if raw is None else self.check(raw)

    def check(self, raw: str) -> str:
        """`raw` if it is one of what it accepts, else the error naming the variable."""
        if raw in ("sqlite", "local") or (raw.startswith("postgresql+asyncpg://") and raw.isprintable()
                                          and " " not in raw):
            return raw
        raise self._bad(raw)

    def _bad(self, raw: str) -> SpecError:
        # a URL may hold a password, wherever it sits: the value is never repeated
        return SpecError(f"environment variable {self.name} is not {self.accepts} (its value is not shown: it may "
                         f"hold a password)", hint=f"correct it, or unset {self.name} for sqlite")


@dataclass(frozen=True)
class Budget:
    """A memory budget: `size` bytes the process's resident memory stays under, or a `share` of the memory available
    when a run starts, for the run to add (one of the two)."""
    size: int | None = None
    share: float | None = None


SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?", re.IGNORECASE)
SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
MIN_BUDGET = 2**26  # 64 MiB: less does not hold ONNX Runtime itself
PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")


def _bytes(text: str) -> float | None:
    """A size such as 8GiB, 512MiB or 1.5G in bytes (binary units); None where it is not one, or not finite."""
    size = SIZE.fullmatch(text.strip())
    value = float(size.group(1)) * SIZE_UNITS[size.group(2).upper()] if size else None
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class Memory(Setting):
    """A memory budget (`Budget`): a size such as 8GiB or 512MiB (binary units: 1G is 1GiB), or a share of the
    available memory such as 50%."""
    default_share: float

    @property
    def accepts(self) -> str:
        return (f"a size such as 8GiB or 512MiB (at least 64MiB), or a share of the available memory from 1% to 100% "
                f"(default {self.default_share:.0%})")

    def get(self) -> Budget:
        raw = self._raw()
        if raw is None:
            return Budget(share=self.default_share)
        text = raw.strip()
        if share := PERCENT.fullmatch(text):
            value = float(share.group(1))
            if not 1 <= value <= 100:
                raise self._bad(raw)
            return Budget(share=value / 100)
        value = _bytes(text)
        if value is None or value < MIN_BUDGET:
            raise self._bad(raw)
        return Budget(size=int(value))


@dataclass(frozen=True)
class Bytes(Setting):
    """A size such as 2GiB or 512MiB (binary units, as the memory budget reads them); 0 turns the thing off."""
    default: int

    @property
    def accepts(self) -> str:
        return f"a size such as 2GiB or 512MiB, or 0 for none (default {self.default / 2**30:g}GiB)"

    def get(self) -> int:
        raw = self._raw()
        if raw is None:
            return self.default
        value = _bytes(raw)
        if value is None:
            raise self._bad(raw)
        return int(value)


# at least one of `trtflow run`'s health checks, which come every 3 s (flows/cli/run.py SERVER_CHECK_S)
SERVER_PATIENCE = Number("TRTFLOW_SERVER_PATIENCE", default=300.0, low=3.0, high=86400.0, unit="seconds")
PREFECT_SERVER = Choice("TRTFLOW_PREFECT_SERVER", choices=("background", "ephemeral"))
IN_PROCESS = Flag("TRTFLOW_IN_PROCESS")
MACHINE = Label("TRTFLOW_MACHINE")
GPU_KIND = Label("TRTFLOW_GPU_KIND")
STATE_DIR = Directory("TRTFLOW_STATE_DIR")
CACHE_DIR = Directory("TRTFLOW_CACHE_DIR")
STORE_CREDENTIALS = Block("TRTFLOW_STORE_CREDENTIALS", kinds=("secret", "aws-credentials"))
SERVER_DATABASE = Database("TRTFLOW_SERVER_DATABASE")
POSTGRES_BIN = Directory("TRTFLOW_POSTGRES_BIN")
# what a stage's ONNX Runtime run may take (stages/ort/memory.py): half the available memory leaves room for the
# stages beside it and for the stage's own Python work around the run
MEMORY_BUDGET = Memory("TRTFLOW_MEMORY_BUDGET", default_share=0.5)
# how much of the store's shared/references/ the FP32 reference outputs may fill (stages/ort/references.py): the
# least used are removed beyond it
REFERENCE_CACHE = Bytes("TRTFLOW_REFERENCE_CACHE", default=2 * 2**30)

ALL: tuple[Setting, ...] = (SERVER_PATIENCE, PREFECT_SERVER, IN_PROCESS, MACHINE, GPU_KIND, STATE_DIR, CACHE_DIR,
                            STORE_CREDENTIALS, SERVER_DATABASE, POSTGRES_BIN, MEMORY_BUDGET, REFERENCE_CACHE)


def check_all() -> None:
    """Every variable set, checked (the first bad one raises)."""
    for setting in ALL:
        setting.get()
