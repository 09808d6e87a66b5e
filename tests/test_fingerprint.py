"""The environment fingerprint: TensorRT's version from the module itself, the CUDA runtime, the GPUs through NVML or
nvidia-smi, the OS and architecture; `plan` names each field that changed.

No GPU and no NVIDIA driver here: the NVML and nvidia-smi paths are exercised against recorded answers (a stand-in
`pynvml` module, an `nvidia-smi` script printing a real driver's output). They prove our parsing and fallbacks,
not what a driver says."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from trtflow.flows import fingerprint as fp
from trtflow.flows import keys
from trtflow.stages.trt import env

# nvidia-smi 550.54.15 on an RTX A4000 and an A100 (a real two-GPU machine's answers, as the CSV query prints them)
SMI_CSV = "NVIDIA RTX A4000, 8.6, 550.54.15, 16376\nNVIDIA A100-SXM4-80GB, 8.0, 550.54.15, 81920\n"
SMI_BANNER = """Mon Nov 23 10:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""


@pytest.fixture
def fresh(monkeypatch):
    env.nvidia_system.cache_clear()
    env.probe.cache_clear()
    yield
    env.nvidia_system.cache_clear()
    env.probe.cache_clear()


@pytest.mark.tensorrt
def test_tensorrt_version_comes_from_the_module(fresh, tensorrt_backend):
    import importlib
    module = importlib.import_module(tensorrt_backend.module)
    found = env.probe(tensorrt_backend.module)
    assert found["version"] == module.__version__
    assert found["cuda_runtime"] and found["cuda_runtime"].split(".")[0].isdigit()
    got = fp.fingerprint(("tensorrt",))
    assert got["tensorrt"] == {"flavour": tensorrt_backend.flavour, "version": module.__version__}
    assert got["cuda"]["runtime"] == found["cuda_runtime"]
    assert got["platform"]["os"] and got["platform"]["arch"]


def _stand_in_tensorrt(tmp_path: Path, monkeypatch, init: str) -> Path:
    """A `tensorrt` package without pip metadata, importable here and in the probe's child process."""
    pkg = tmp_path / "site" / "tensorrt"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    return pkg


def test_a_tensorrt_without_pip_metadata_is_still_versioned(fresh, tmp_path, monkeypatch):
    """A TensorRT installed from a tarball or present in a container has no distribution metadata: the version the
    module reports is the one in the key, so its upgrade triggers a rebuild."""
    pkg = _stand_in_tensorrt(tmp_path, monkeypatch, "__version__ = '10.13.3.9'\n")
    info = env.find_tensorrt("tensorrt")
    assert info.version == "unknown"  # no pip metadata
    assert env.tensorrt_version(info) == "10.13.3.9"
    assert fp.fingerprint(("tensorrt",))["tensorrt"] == {"flavour": "tensorrt", "version": "10.13.3.9"}
    (pkg / "__init__.py").write_text("__version__ = '11.0.0.4'\n")
    env.probe.cache_clear()
    new = fp.fingerprint(("tensorrt",))
    assert new["tensorrt"]["version"] == "11.0.0.4"


def test_a_broken_module_falls_back_to_metadata(fresh, tmp_path, monkeypatch):
    _stand_in_tensorrt(tmp_path, monkeypatch, "raise ImportError('libnvinfer.so.10: cannot open shared object file')\n")
    info = env.find_tensorrt("tensorrt")
    assert env.probe("tensorrt")["version"] is None
    assert env.tensorrt_version(info) == info.version


def _fake_smi(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "answers.csv").write_text(SMI_CSV)
    (bin_dir / "banner.txt").write_text(SMI_BANNER)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nif [ -n \"$1\" ]; then cat {bin_dir}/answers.csv\n"
                      f"else cat {bin_dir}/banner.txt; fi\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_gpus_from_nvidia_smi_when_nvml_is_unavailable(fresh, tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch)
    monkeypatch.setattr(env, "_from_nvml", lambda: None)
    system = env.nvidia_system()
    assert system["driver"] == "550.54.15" and system["cuda_driver"] == "12.4"
    assert system["gpus"] == [
        {"name": "NVIDIA RTX A4000", "compute_capability": "8.6", "memory_mb": 16376, "driver": "550.54.15"},
        {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "memory_mb": 81920, "driver": "550.54.15"}]
    got = fp.fingerprint(("gpu",))
    assert got["gpu"]["1"] == {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "memory_mb": 81920}
    assert got["driver"] == "550.54.15" and got["cuda"] == {"driver": "12.4"}


class _FakeNvml(types.ModuleType):
    """Answers as nvidia-ml-py returns them for one RTX 4090 on driver 560.35.03 (CUDA 12.6)."""

    def __init__(self, driver: str = "560.35.03", cuda: int = 12060):
        super().__init__("pynvml")
        self.driver, self.cuda = driver, cuda

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlSystemGetDriverVersion(self): return self.driver
    def nvmlSystemGetCudaDriverVersion_v2(self): return self.cuda
    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return object()
    def nvmlDeviceGetCudaComputeCapability(self, h): return (8, 9)
    def nvmlDeviceGetName(self, h): return b"NVIDIA GeForce RTX 4090"
    def nvmlDeviceGetMemoryInfo(self, h): return types.SimpleNamespace(total=24564 * 2**20, used=0, free=0)


def test_nvml_first_and_plan_names_the_changed_fields(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    old = fp.fingerprint(("gpu",))
    assert old == {"gpu": {"0": {"name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9", "memory_mb": 24564}},
                   "cuda": {"driver": "12.6"}, "driver": "560.35.03"}
    env.nvidia_system.cache_clear()
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml("570.86.10", 12080))
    new = fp.fingerprint(("gpu",))
    assert keys.diff(old, new) == ['cuda.driver "12.6" -> "12.8"', 'driver "560.35.03" -> "570.86.10"']
    assert "RTX 4090 (sm8.9), driver 570.86.10" in fp.describe(new)


def test_no_driver_no_gpu(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setattr(env, "_from_nvml", lambda: None)
    assert env.nvidia_system() == {"driver": None, "cuda_driver": None, "gpus": []}
    assert fp.fingerprint(("gpu",))["gpu"] is None
    assert json.dumps(fp.fingerprint(fp.ALL))  # serializable as it enters the keys


def test_the_version_probe_is_asked_again_only_when_what_it_depends_on_moves(fresh, tmp_path, monkeypatch):
    """The probe's child process (0.5 s of every run, cached ones included) is skipped while the module's file, the
    import path, the linker's cache and the library variables are as when it last answered."""
    monkeypatch.setenv("TRTFLOW_STATE_DIR", str(tmp_path / "state"))
    pkg = _stand_in_tensorrt(tmp_path, monkeypatch, "__version__ = '10.13.3.9'\n")
    asked = []
    real = env.child.call
    monkeypatch.setattr(env.child, "call", lambda *a, **k: asked.append(1) or real(*a, **k))
    assert env.probe("tensorrt")["version"] == "10.13.3.9" and len(asked) == 1
    env.probe.cache_clear()  # a new process
    assert env.probe("tensorrt")["version"] == "10.13.3.9" and len(asked) == 1, "answered from the cache"
    (pkg / "__init__.py").write_text("__version__ = '10.13.3.9'\n")  # the same bytes, written again: ctime moves
    env.probe.cache_clear()
    assert env.probe("tensorrt")["version"] == "10.13.3.9" and len(asked) == 2
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    env.probe.cache_clear()
    env.probe("tensorrt")
    assert len(asked) == 3
