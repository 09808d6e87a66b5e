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

from trtflow.flows import keys
from trtflow.flows import keys as fp
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
    assert found.version == module.__version__
    assert found.cuda_runtime and found.cuda_runtime.split(".")[0].isdigit()
    got = fp.fingerprint(("tensorrt",))
    assert got.tensorrt == env.TensorRT(flavour=tensorrt_backend.flavour, version=module.__version__)
    assert got.cuda.runtime == found.cuda_runtime
    assert got.platform.os and got.platform.arch
    assert list(got.to_json()) == ["tensorrt", "cuda", "platform"] and list(got.to_json()["cuda"]) == ["runtime"]


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
    assert fp.fingerprint(("tensorrt",)).to_json()["tensorrt"] == {"flavour": "tensorrt", "version": "10.13.3.9"}
    (pkg / "__init__.py").write_text("__version__ = '11.0.0.4'\n")
    env.probe.cache_clear()
    new = fp.fingerprint(("tensorrt",))
    assert new.tensorrt.version == "11.0.0.4"


def test_a_broken_module_falls_back_to_metadata(fresh, tmp_path, monkeypatch):
    _stand_in_tensorrt(tmp_path, monkeypatch, "raise ImportError('libnvinfer.so.10: cannot open shared object file')\n")
    info = env.find_tensorrt("tensorrt")
    assert env.probe("tensorrt").version is None
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
    assert system.driver == "550.54.15" and system.cuda_driver == "12.4"
    assert [g.model_dump() for g in system.gpus] == [
        {"name": "NVIDIA RTX A4000", "compute_capability": "8.6", "memory_mb": 16376, "driver": "550.54.15"},
        {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "memory_mb": 81920, "driver": "550.54.15"}]
    got = fp.fingerprint(("gpu",)).to_json()
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
    assert old.to_json() == {"gpu": {"0": {"name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9",
                                           "memory_mb": 24564}}, "cuda": {"driver": "12.6"}, "driver": "560.35.03"}
    env.nvidia_system.cache_clear()
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml("570.86.10", 12080))
    new = fp.fingerprint(("gpu",))
    assert keys.diff(old, new) == ['cuda.driver "12.6" -> "12.8"', 'driver "560.35.03" -> "570.86.10"']
    assert "RTX 4090 (sm8.9), driver 570.86.10" in fp.describe(new)


def test_no_driver_no_gpu(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setattr(env, "_from_nvml", lambda: None)
    assert env.nvidia_system() == env.NvidiaSystem(driver=None, cuda_driver=None, gpus=[])
    assert fp.fingerprint(("gpu",)).to_json() == {"cuda": {"driver": None}, "gpu": None, "driver": None}
    assert json.dumps(fp.fingerprint(fp.ALL).to_json())  # serializable as it enters the keys


def test_the_version_probe_is_asked_again_only_when_what_it_depends_on_moves(fresh, tmp_path, monkeypatch):
    """The probe's child process (0.5 s of every run, cached ones included) is skipped while the module's file, the
    import path, the linker's cache and the library variables are as when it last answered."""
    monkeypatch.setenv("TRTFLOW_STATE_DIR", str(tmp_path / "state"))
    pkg = _stand_in_tensorrt(tmp_path, monkeypatch, "__version__ = '10.13.3.9'\n")
    asked = []
    real = env.child.call
    monkeypatch.setattr(env.child, "call", lambda *a, **k: asked.append(1) or real(*a, **k))
    assert env.probe("tensorrt").version == "10.13.3.9" and len(asked) == 1
    env.probe.cache_clear()  # a new process
    assert env.probe("tensorrt").version == "10.13.3.9" and len(asked) == 1, "answered from the cache"
    (pkg / "__init__.py").write_text("__version__ = '10.13.3.9'\n")  # the same bytes, written again: ctime moves
    env.probe.cache_clear()
    assert env.probe("tensorrt").version == "10.13.3.9" and len(asked) == 2
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    env.probe.cache_clear()
    env.probe("tensorrt")
    assert len(asked) == 3


# As trtflow wrote it before the record was typed (#40), on a machine with TensorRT-RTX and one RTX 4090: the JSON in
# every manifest and check-env record, and the key of a stage that depends on it. A change here re-keys every
# environment-dependent stage on every machine.
PINNED_JSON = ('{"tensorrt": {"flavour": "tensorrt-rtx", "version": "1.7.1.116"}, "cuda": {"runtime": "13.0", '
               '"driver": "12.6"}, "platform": {"os": "Linux", "arch": "x86_64"}, "gpu": {"0": {"name": '
               '"NVIDIA GeForce RTX 4090", "compute_capability": "8.9", "memory_mb": 24564}}, "driver": "560.35.03"}')
PINNED_KEY = "d48c60b1d335dc0104e21057f440f581"  # of keys.key_parts("build", "1", {}, {}, <that>), KEY_FORMAT 4
# a record of trtflow before the CUDA versions were in it (commit 7c66961): GPUs listed, each with its driver
OLD_JSON = ('{"tensorrt": {"flavour": "tensorrt", "version": "10.3.0"}, "gpu": [{"name": "NVIDIA A100-SXM4-80GB", '
            '"compute_capability": "8.0", "driver": "550.54.15"}]}')


def test_the_fingerprint_json_and_key_are_as_before_it_was_typed(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    monkeypatch.setattr(fp, "find_tensorrt", lambda: env.Backend(flavour="tensorrt-rtx", module="tensorrt_rtx",
                                                                 version="1.7.1.116"))
    monkeypatch.setattr(fp, "probe", lambda module: env.ProbeAnswer(version="1.7.1.116", cuda_runtime="13.0"))
    monkeypatch.setattr(fp, "platform_facts", lambda: env.Platform(os="Linux", arch="x86_64"))
    got = fp.fingerprint(fp.ALL)
    assert json.dumps(got.to_json()) == PINNED_JSON
    parts = keys.key_parts("build", "1", {}, {}, got)
    assert keys.stage_key(parts) == PINNED_KEY
    recorded = keys.KeyParts.model_validate(parts)
    assert recorded.env == got and json.dumps(recorded.model_dump(mode="json")["env"]) == PINNED_JSON


NO_GPU_JSON = ('{"tensorrt": {"flavour": "tensorrt-rtx", "version": "1.7.1.116"}, "cuda": {"runtime": "13.0", '
               '"driver": null}, "platform": {"os": "Linux", "arch": "x86_64"}, "gpu": null, "driver": null}')
# no TensorRT, and fields a later trtflow added
LATER_JSON = ('{"tensorrt": null, "cuda": {"runtime": null}, "platform": {"os": "Linux", "arch": "aarch64", '
              '"libc": "musl"}, "python": "0.0"}')


@pytest.mark.parametrize("stored", [PINNED_JSON, OLD_JSON, NO_GPU_JSON, LATER_JSON])
def test_stored_environments_load_and_are_written_back_as_they_were(stored):
    """In manifests and last.json (a manifest that does not load is no result: `verify --repair` removes it), and in
    check-env's record: older shapes and fields a later trtflow adds survive, byte for byte."""
    from trtflow.flows.machine import MachineRecord
    from trtflow.flows.manifest import Manifest

    data = json.loads(stored)
    last = keys.LastRun.parse({"key": "k", "parts": {"format": 2, "env": data}})
    assert last is not None and json.dumps(last.to_json()["parts"]["env"]) == stored
    manifest = Manifest.parse({"key": "k", "status": "ok", "outputs": {}, "key_parts": {"env": data},
                               "environment": {"fingerprint": data}}, "k")
    assert manifest is not None and json.dumps(manifest.to_json()["environment"]["fingerprint"]) == stored
    assert json.dumps(MachineRecord.model_validate({"fingerprint": data}).model_dump(mode="json")["fingerprint"]) \
        == stored
    assert fp.describe(last.parts.env) != "-"


def test_an_old_record_against_todays_names_what_changed():
    old = fp.Environment.model_validate_json(OLD_JSON)
    assert fp.describe(old) == "tensorrt 10.3.0; NVIDIA A100-SXM4-80GB (sm8.0), driver None"
    assert list(old.gpus) == ["0"] and old.gpus["0"].name == "NVIDIA A100-SXM4-80GB"
    new = fp.Environment.model_validate_json(PINNED_JSON)
    assert 'tensorrt.version "10.3.0" -> "1.7.1.116"' in keys.diff(old, new)
