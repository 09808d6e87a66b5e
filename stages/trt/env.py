"""What TensorRT runs on here: the installed flavour (found without importing it: importing TensorRT loads its
libraries for good), its version as the module reports it (in a child process), the CUDA runtime and driver,
the GPUs, the OS and the CPU architecture. The records builds keep of them (`Backend`, `TensorRT`, `Gpu`) are in
`records.py`."""
from __future__ import annotations

import functools
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter

from trtflow import child, files
from trtflow.records import Recorded
from trtflow.stages.trt.records import Backend, Gpu
from trtflow.stages.trt.records import TensorRT as TensorRT  # re-exported: flows/keys.py's fingerprint reads it here
from trtflow.state import state_dir

# (module, flavour, distributions that may carry its version); full TensorRT first: it is what users deploy
FLAVOURS = (
    ("tensorrt", "tensorrt", ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11",
                              "tensorrt_cu13_bindings", "tensorrt_cu12_bindings")),
    ("tensorrt_rtx", "tensorrt-rtx", ("tensorrt-rtx-cu13", "tensorrt-rtx-cu12", "tensorrt_rtx_cu13_bindings",
                                      "tensorrt_rtx_cu12_bindings", "tensorrt-rtx")),
)

INSTALL_HINT = "pip install tensorrt-rtx-cu13 (parses and builds without a GPU), or install TensorRT"


def find_tensorrt(only: str | None = None) -> Backend | None:
    """The preferred installed flavour, or with `only` ("tensorrt" / "tensorrt_rtx") that module's, if installed."""
    for module, flavour, dists in FLAVOURS:
        if only is not None and module != only:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            continue
        version = "unknown"
        for dist in dists:
            try:
                version = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
        return Backend(flavour=flavour, module=module, version=version)
    return None


class Platform(Recorded):
    """What an engine is built for besides the GPU: the OS and the CPU architecture."""
    os: str
    arch: str


class NvidiaSystem(BaseModel):
    """The driver, the CUDA version it supports and the GPUs; all empty on a machine without an NVIDIA driver."""
    model_config = ConfigDict(frozen=True)

    driver: str | None = None
    cuda_driver: str | None = None
    gpus: list[Gpu] = []


class ProbeAnswer(BaseModel):
    """What the TensorRT module reports of itself in a child process; None where it cannot tell."""
    model_config = ConfigDict(frozen=True)

    version: str | None = None
    cuda_runtime: str | None = None


class _KeptProbe(BaseModel):
    """An entry of the probe's cache file: the answer, and what it depended on."""
    stamp: list[Any]
    answer: ProbeAnswer


_PROBE_CACHE = TypeAdapter(dict[str, _KeptProbe])  # module -> its entry


class VersionRequest(BaseModel):
    module: str


class VersionResponse(BaseModel):
    version: str | None = None
    cuda_runtime: str | None = None
    error: str | None = None


def _versions(request: VersionRequest, folder: Path) -> VersionResponse:
    """In the child (`trtflow.child`'s convention): importing TensorRT loads its libraries (and with them CUDA's)
    into the process for good."""
    import ctypes
    import ctypes.util

    out = VersionResponse()
    try:
        out.version = str(importlib.import_module(request.module).__version__)
    except Exception as exc:  # noqa: BLE001 - a broken install says so in the fingerprint
        out.error = f"{type(exc).__name__}: {exc}"
    path = None
    try:
        from cuda import pathfinder

        path = pathfinder.load_nvidia_dynamic_lib("cudart").abs_path
    except Exception:  # noqa: BLE001 - no cuda-pathfinder, or no CUDA runtime wheel
        path = ctypes.util.find_library("cudart")
    if path:
        try:
            v = ctypes.c_int()
            if ctypes.CDLL(path).cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
                out.cuda_runtime = f"{v.value // 1000}.{v.value % 1000 // 10}"
        except Exception:  # noqa: BLE001 - a library that is not what it says: no version
            pass
    return out


PROBE_CACHE = "tensorrt-probe.json"  # in the state directory: the last answer, and what it depended on


def _probe_stamp(module: str) -> list[Any]:
    """What the probe's answer depends on and that moves when TensorRT or CUDA is installed, upgraded, replaced
    or removed: the interpreter, the module's own file, every directory on the import path (pip and conda add and
    remove entries there), the dynamic linker's cache and the variables that steer library search. The same
    stamp: the same answer, without a child process (0.5 s of every run, cached ones included)."""
    spec = None
    try:
        spec = importlib.util.find_spec(module)  # finds the file, imports nothing of TensorRT's
    except (ImportError, ValueError):
        pass
    stamp: list[Any] = [module, sys.executable, os.environ.get("LD_LIBRARY_PATH"), os.environ.get("CUDA_HOME"),
                        os.environ.get("CUDA_PATH"), os.environ.get("PYTHONPATH")]
    for path in [spec.origin if spec and spec.origin else "", "/etc/ld.so.cache", *sys.path]:
        try:
            st = os.stat(path or ".")
            stamp.append([path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
        except OSError:
            stamp.append([path, None])
    return stamp


@functools.lru_cache(maxsize=4)
def probe(module: str) -> ProbeAnswer:
    """The version `module` itself reports (a TensorRT from a tarball or a container has no pip metadata) and the
    CUDA runtime version the process would load, from a child process; None where it cannot tell. The answer is
    kept in the state directory with `_probe_stamp`, and asked again only when that moves."""
    cache = state_dir() / PROBE_CACHE
    stamp = _probe_stamp(module)
    try:
        kept = _PROBE_CACHE.validate_python(files.read_json(cache, files.RECORD_BYTES))
    except (OSError, ValueError):  # none yet, or unreadable: asked afresh, and written anew
        kept = {}
    mine = kept.get(module)
    if mine is not None and mine.stamp == json.loads(json.dumps(stamp)):
        return mine.answer
    answer = _ask(module)
    if answer.version is not None:  # a broken install is asked again next time
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            kept[module] = _KeptProbe(stamp=stamp, answer=answer)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(_PROBE_CACHE.dump_python(kept, mode="json")))
            os.replace(tmp, cache)
        except OSError:  # only a cache
            pass
    return answer


def _ask(module: str) -> ProbeAnswer:
    found = None
    with tempfile.TemporaryDirectory(prefix="trtflow-version-") as folder:
        try:
            outcome = child.call("trtflow.stages.trt.env", VersionRequest(module=module), VersionResponse,
                                 Path(folder), 120)
            found = outcome.response if isinstance(outcome, child.Answered) else None
        except (OSError, subprocess.SubprocessError, ValueError, child.Killed):  # unknown: asked again next time
            pass
    found = found or VersionResponse()
    return ProbeAnswer(version=found.version, cuda_runtime=found.cuda_runtime)


def tensorrt_version(backend: Backend) -> str:
    """The module's own version, else the pip metadata's."""
    return probe(backend.module).version or backend.version


def platform_facts() -> Platform:
    """The OS and the CPU architecture (not the kernel release: a kernel update does not change an engine)."""
    return Platform(os=platform.system(), arch=platform.machine())


@functools.lru_cache(maxsize=1)
def nvidia_system() -> NvidiaSystem:
    """The driver, the CUDA version it supports and the GPUs, through NVML (`nvidia-ml-py`), else `nvidia-smi`.
    Empty on a machine without an NVIDIA driver (as on CI).

    UNVERIFIED on a GPU: no machine this project is tested on has one; the NVML calls are the documented ones and
    the nvidia-smi query is the documented CSV one (both are tested against recorded answers)."""
    found = _from_nvml()
    return found if found is not None else _from_nvidia_smi()


def gpus() -> list[Gpu]:
    """The GPUs (name, compute capability, memory, driver); empty where there is none."""
    return nvidia_system().gpus


def _from_nvml() -> NvidiaSystem | None:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no nvidia-ml-py, NVMLError_LibraryNotFound / _DriverNotLoaded / ...
        return None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
            cuda_driver = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except Exception:  # noqa: BLE001 - an NVML older than the call
            cuda_driver = None
        found = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            found.append(Gpu(name=_text(pynvml.nvmlDeviceGetName(h)), compute_capability=f"{major}.{minor}",
                             memory_mb=int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20, driver=driver))
        return NvidiaSystem(driver=driver, cuda_driver=cuda_driver, gpus=found)
    except Exception:  # noqa: BLE001 - a query this driver refuses: let nvidia-smi answer
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _from_nvidia_smi() -> NvidiaSystem:
    none = NvidiaSystem()
    if shutil.which("nvidia-smi") is None:
        return none
    query = _nvidia_smi(["--query-gpu=name,compute_cap,driver_version,memory.total", "--format=csv,noheader,nounits"])
    if query is None:
        return none
    found = []
    for line in query.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            found.append(Gpu(name=parts[0], compute_capability=parts[1],
                             memory_mb=int(parts[3]) if parts[3].isdigit() else None, driver=parts[2]))
    # the plain banner is the only place nvidia-smi prints the CUDA version the driver supports
    m = re.search(r"CUDA Version:\s*([0-9.]+)", _nvidia_smi([]) or "")
    return NvidiaSystem(driver=found[0].driver if found else None, cuda_driver=m.group(1) if m else None, gpus=found)


def _nvidia_smi(args: list[str]) -> str | None:
    """What `nvidia-smi ARGS` prints when it succeeds within 20 s, else None."""
    try:
        ended = child.run(["nvidia-smi", *args], 20, what="nvidia-smi")
    except (OSError, child.Killed):
        return None
    return ended.stdout if isinstance(ended, child.Exited) and ended.returncode == 0 else None


if __name__ == "__main__":
    raise SystemExit(child.serve(VersionRequest, _versions))
