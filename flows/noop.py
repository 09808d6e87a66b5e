"""A `trtflow run` where nothing changed, answered in milliseconds (as DVC answers "nothing to do" from file stats).

A full run that finds every stage's result in place (`Runner.reuse_all`) leaves a record in the state directory
(`noop/<digest of the command line and folder>.json`): what it printed, and a witness of everything the stage keys
were computed from. The witness is not a list of its own: it is the ledger the keys' readers wrote while they
read (`trtflow/depends.py`: the pipeline file and every variable it interpolated, every file hashed, every folder a
glob or a directory artifact can reach with links followed, the import path a library's version or the user's code
was found on), plus
- the store: its records and every published file of the results reused, and its folders' listings;
- trtflow's own code (the code lock the keys read among it);
- the machine, for the environment facets (`machine()`): the NVIDIA driver's and GPUs' /proc entries, the CUDA
  toolkit's version file, the stat of `nvidia-smi` and `trtexec` on PATH and of NVML's library (a driver update
  replaces them), the interpreter and its import path, and the variables trtflow, Prefect and the loaders read.
A file is witnessed by the stat of what its path leads to (a link retargeted is a change), a folder by its stat.
Where a reader could not name what it read (`depends.Ledger.cannot`), no record is written.

The next run of the same command in the same folder checks the witness with stat calls only, before importing
anything else. Where all of it holds, every key would come out the same: it prints the record's lines and is done;
where anything differs (or the record is missing or unreadable), the full run decides as always and may write a new
record. A remote (S3) store is never witnessed: its state needs the network.

The record a Prefect user needs: each such run is posted to the Prefect server trtflow would use, as a flow run of
flow `trtflow` in state Completed named "Cached" (tags `trtflow`, `cached`), by a detached process
(`python -m trtflow.flows.noop post RECORD`), so the answer does not wait for it; where no server is running (Prefect's
temporary server would take seconds to start to record that nothing happened), nothing is posted.

Only the standard library and `trtflow.state` are imported here until the witness holds.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from trtflow import depends, files

VERSION = 2  # 2: the witness is the keys' ledger (trtflow/depends.py)
FOLDER = "noop"
MAX_RECORD_BYTES = 16 << 20
ENV_PREFIXES = ("TRTFLOW_", "PREFECT_", "CUDA_", "NVIDIA_")
ENV_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")
DRIVER_VERSION = "/proc/driver/nvidia/version"  # the loaded driver's (present wherever one is loaded)
MACHINE_TEXTS = (DRIVER_VERSION, "/usr/local/cuda/version.json", "/usr/local/cuda/version.txt",
                 "/etc/os-release")
MACHINE_LISTINGS = ("/proc/driver/nvidia/gpus",)
# NVML's library, `nvidia-smi` and `trtexec` on PATH (a driver or TensorRT update replaces them), by their stat
MACHINE_LIBRARIES = ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
                     "/usr/lib64/libnvidia-ml.so.1", "/usr/lib/wsl/lib/libnvidia-ml.so.1")


@dataclass
class Witness:
    files: dict[str, list[int] | None]  # path as read -> the stamp of what it leads to [size, mtime, inode, ctime]
    folders: dict[str, list[int] | None]  # path -> its stamp (a listing changed moves its mtime and ctime)
    variables: dict[str, str | None]  # each ${NAME} the pipeline interpolated -> its value (None: unset)
    machine: dict[str, str]  # machine()'s digests


@dataclass
class Record:
    """`noop/<digest>.json`: what a run that reused every stage printed, and what its keys were computed from."""
    version: int
    argv: list[str]
    cwd: str
    lines: list[str]  # the stage lines, as printed
    done: str  # the last line, "{seconds}" where the time goes
    pipeline: str
    store: str
    witness: Witness

    def __post_init__(self) -> None:
        if isinstance(self.witness, dict):  # as read from JSON
            self.witness = Witness(**self.witness)

    @classmethod
    def read(cls, path: Path) -> Record:
        return cls(**json.loads(files.read_bounded(path, MAX_RECORD_BYTES, follow=False)))


def record_path(argv: list[str], cwd: str) -> Path:
    from trtflow.state import state_dir

    digest = hashlib.sha256(json.dumps([VERSION, cwd, argv]).encode()).hexdigest()[:32]
    return state_dir() / FOLDER / f"{digest}.json"


# ------------------------------------------------------------------------------------------- the fast path

def answer(argv: list[str]) -> int | None:
    """0 after printing the recorded answer when the record of this command in this folder holds; None (nothing
    printed) when the full run must decide."""
    started = time.perf_counter()
    begin()
    try:
        path = record_path(argv, os.getcwd())
        record = Record.read(path)
        if record.version != VERSION or not holds(record.witness):
            return None
    except Exception:  # noqa: BLE001 - no record, a damaged one, a bad setting: the full run decides (and says)
        return None
    out = sys.stdout
    for line in record.lines:
        out.write(line + "\n")
    out.write(record.done.replace("{seconds}", f"{time.perf_counter() - started:.2f}") + "\n")
    out.flush()
    post_detached(path)
    return 0


def holds(witness: Witness) -> bool:
    """Every fact of the witness is as recorded."""
    return difference(witness) is None


def difference(witness: Witness) -> str | None:
    """The first fact of the witness that no longer holds, said ("file /x/m.onnx"); None when all of them do."""
    for name, value in witness.variables.items():
        if os.environ.get(name) != value:
            return f"variable {name}"
    for what, table in (("file", witness.files), ("folder", witness.folders)):
        for path, want in table.items():
            if _stat(path) != want:
                return f"{what} {path}"
    return None if _started is not None and _started == witness.machine else "the machine"


def machine() -> dict[str, str] | None:
    """Digests of what the environment facets of the keys are computed from, read without running anything: the
    driver's, CUDA's and the OS's version files, the installed packages' folders' listings, the variables. Taken
    when the command starts (`begin`): a run sets variables for Prefect, and may add to the import path. None
    where the driver is known only by asking nvidia-smi."""
    texts, listings = hashlib.sha256(), hashlib.sha256()
    for path in MACHINE_TEXTS:
        try:
            with open(path, "rb") as fh:
                texts.update(path.encode() + b"\0" + fh.read(1 << 16) + b"\0")
        except OSError:
            texts.update(path.encode() + b"\0-\0")
    for folder in MACHINE_LISTINGS:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            names = ["-"]
        listings.update(folder.encode() + b"\0" + "\0".join(names).encode() + b"\0")
    on_path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    smi = [_stat(os.path.join(d, "nvidia-smi")) for d in on_path]
    if any(smi) and not os.path.exists(DRIVER_VERSION):
        # an nvidia-smi to ask and no loaded driver's /proc entry: its answer is the driver (a container, a
        # stand-in), and only running it tells: no record stands for it
        return None
    found = smi + [_stat(os.path.join(d, "trtexec")) for d in on_path] + [_stat(p) for p in MACHINE_LIBRARIES]
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES)
    return {"texts": texts.hexdigest(), "listings": listings.hexdigest(),
            "programs": hashlib.sha256(json.dumps(found).encode()).hexdigest(),
            "env": hashlib.sha256(json.dumps([sys.executable, _stat(sys.executable), sys.version, sys.path,
                                                 env]).encode()).hexdigest()}


def _stat(path: str) -> list[int] | None:
    """The file's `files.stamp` (what the keys' digest cache trusts too); None where there is none."""
    try:
        return files.stamp(os.stat(path))
    except OSError:
        return None


_started: dict[str, str] | None = None  # machine() when this command started (begin)


def begin() -> None:
    """The command starts: the machine as it is now, and an empty ledger of what its keys will read."""
    global _started
    _started = machine()
    depends.READ.clear()


# ------------------------------------------------------------------------------------ what the full run records

def write(argv: list[str], runner: Any, lines: list[str], done: str) -> Path | None:
    """The record of a run that reused every stage (after `reuse_all`, which marks each stage's last run): its
    lines, its done line (`{seconds}` for the time) and the witness. Nothing for a store that is not local, or
    where the witness cannot be taken; never an error (a record is only a shortcut). Returns the record's path."""
    from trtflow.flows.store import LocalStore

    if not isinstance(runner.store, LocalStore):
        return None
    try:
        path = record_path(argv, os.getcwd())
        path.parent.mkdir(parents=True, exist_ok=True)  # first: a state folder made inside a witnessed one moves it
        witness = _witness(runner)
        if witness is None:
            return None
        record = Record(VERSION, argv, os.getcwd(), lines, done, str(runner.pipeline.file), runner.store.location,
                        witness)
        files.write_atomic(path, json.dumps(asdict(record)).encode())
        return path
    except OSError:
        return None


def _witness(runner: Any) -> Witness | None:
    """The ledger of what the keys read, with the store's part and trtflow's code; None where the machine was not
    read when the command started (`begin`) or a reader could not name what it read."""
    read = depends.READ
    if _started is None or read.blind:
        return None
    files = set(read.files) | {str(p) for p in _code_files()}
    folders = set(read.folders)
    store = Path(runner.store.root)
    shared = depends.reachable_folders(str(store / "shared")) if (store / "shared").is_dir() else set()
    if shared is None:
        return None
    folders |= {str(store)} | {str(p) for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")}
    folders |= shared
    files |= {str(store / stage / "last.json") for stage in runner.graph.order}
    for directory, manifest in runner.reused:
        files |= {str(directory / "manifest.json")} | {str(directory / rel) for rel in manifest.files}
    files |= {str(p) for folder in shared for p in Path(folder).iterdir() if p.is_file()}
    return Witness({p: _stat(p) for p in sorted(files)}, {p: _stat(p) for p in sorted(folders)},
                   dict(sorted(read.variables.items())), _started)


def _code_files() -> list[Path]:
    """trtflow's own source files and the code lock among them (the user's code is in the ledger: the file each
    function named in the pipeline was read from)."""
    import trtflow
    import trtflow.flows
    import trtflow.pipelines
    import trtflow.stages

    out = []
    for package in (trtflow, trtflow.flows, trtflow.pipelines, trtflow.stages):
        base = Path(package.__file__).parent
        out += [p for p in base.rglob("*") if p.suffix in (".py", ".json") and p.is_file()]
    return out


# -------------------------------------------------------------------------------------------- the Prefect record

def post_detached(record: Path) -> None:
    """Post the run to Prefect from a process of its own that outlives this one (see the module)."""
    import subprocess

    try:
        subprocess.Popen([sys.executable, "-m", "trtflow.flows.noop", "post", str(record)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError:
        pass


API_URL = "PREFECT_API_URL"


def _api_url() -> str | None:
    """The Prefect API trtflow would use, where a server is running: the variable's, else the active Prefect
    profile's, else trtflow's background server when its record proves it alive (none is started to record a run
    that did nothing). Prefect itself is not imported here (a second of CPU for each no-op, beside whatever runs
    next)."""
    from trtflow import settings
    from trtflow.flows import server

    url = os.environ.get(API_URL) or _profile_api_url()
    if url:
        return url
    if settings.PREFECT_SERVER.get() == "ephemeral":
        return None
    rec = server.current()
    return rec.url if rec is not None and server.alive(rec) else None


PREFECT_HOME, PROFILES_PATH, PROFILE = "PREFECT_HOME", "PREFECT_PROFILES_PATH", "PREFECT_PROFILE"


@dataclass
class _Profiles:
    """Prefect's profiles file (what `prefect config set` writes): the active profile and each one's settings."""
    active: Any = None
    profiles: Any = None

    def api_url(self) -> str | None:
        """The active profile's API URL (PREFECT_PROFILE names another one to use)."""
        name = os.environ.get(PROFILE) or self.active
        chosen = self.profiles.get(name) if isinstance(self.profiles, dict) and isinstance(name, str) else None
        url = chosen.get(API_URL) if isinstance(chosen, dict) else None
        return url if isinstance(url, str) and url else None


def _profile_api_url() -> str | None:
    """The API URL the active Prefect profile sets, read from the profiles file where Prefect keeps it
    (PREFECT_PROFILES_PATH, else PREFECT_HOME's profiles.toml)."""
    import tomllib

    home = Path(os.environ.get(PREFECT_HOME) or Path.home() / ".prefect").expanduser()
    path = Path(os.environ.get(PROFILES_PATH) or home / "profiles.toml").expanduser()
    try:
        data = tomllib.loads(files.read_bounded(path, files.RECORD_BYTES).decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    return _Profiles(**{f.name: data[f.name] for f in fields(_Profiles) if f.name in data}).api_url()


@dataclass
class _Created:
    """What Prefect's API answers a create with (the rest of it is not needed)."""
    id: str

    @classmethod
    def of(cls, answer: dict[str, Any]) -> _Created:
        return cls(**{f.name: answer[f.name] for f in fields(cls)})


def post(record_file: Path) -> None:
    import httpx

    from trtflow.flows.run_identity import run_identity

    url = _api_url()
    if url is None:
        return
    record = Record.read(Path(record_file))
    name, tags = run_identity(record.pipeline)
    stages = len(record.lines)
    with httpx.Client(base_url=url.rstrip("/") + "/", timeout=30) as client:
        flow = client.post("flows/", json={"name": "trtflow"})
        flow.raise_for_status()
        client.post("flow_runs/", json={
            "flow_id": _Created.of(flow.json()).id, "name": name, "tags": tags + ["cached"],
            "parameters": {"pipeline_file": record.pipeline, "store": record.store},
            "state": {"type": "COMPLETED", "name": "Cached",
                      "message": f"nothing changed: {stages} stage(s) reused, no stage ran (trtflow's no-op record)"},
        }).raise_for_status()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "post":
        try:
            post(Path(sys.argv[2]))
        except Exception:  # noqa: BLE001 - a record nobody waits for: nothing to say, nowhere to say it
            sys.exit(1)
