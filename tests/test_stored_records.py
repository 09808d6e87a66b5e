"""Records on users' disks written before #40 typed them (build.json, the build, benchmark and release reports, the
engine cache's keys): each loads into its model and is written back byte for byte, and the engine cache finds what
it kept. The records below are as trtflow wrote them then; the GPU ones come from machines this project has not got
(the shapes NVML and nvidia-smi give, see tests/test_fingerprint.py)."""
from __future__ import annotations

import hashlib
import json

from trtflow.stages.benchmark.report import Measurement
from trtflow.stages.build.report import BuildEnvironment, CellRow
from trtflow.stages.release.card import _environment_text
from trtflow.stages.release.report import TargetRelease
from trtflow.stages.trt import engine_cache
from trtflow.stages.trt.records import Backend, Built, Cell, Gpu, TelemetrySummary

# this machine's (no GPU: TensorRT-RTX's verdict with the log line that says why), as `Built.write` wrote it
BUILT_HERE = """{
  "status": "ok",
  "failures": [],
  "runtime": "tensorrt-rtx 1.7.1.116",
  "seconds": 0.281,
  "engine_bytes": 5399628,
  "layers": 71,
  "options": {
    "compute_capability": "sm86"
  },
  "validity": {
    "checked": true,
    "validity": "INVALID",
    "diagnostics": [],
    "reason": "[INTERNAL_ERROR] Error reading CUDA GPU properties (cudaError 35)"
  },
  "environment": {
    "tensorrt": {
      "flavour": "tensorrt-rtx",
      "version": "1.7.1.116"
    },
    "gpu": null
  },
  "peak_host_memory_mb": 232.0,
  "engine_sha256": "2c3bdc1a1a3ecfc792e9a6b71c3afd80b0e7c0b3db9190a7a1d960f2fc68fb49",
  "warnings": []
}
"""
# full TensorRT on a GPU machine: every option applied, a TensorRT without the validity check, a reason that is null
BUILT_ON_A_GPU = {"status": "ok", "failures": [], "runtime": "tensorrt 10.13.3.9", "seconds": 41.5,
                  "engine_bytes": 9000000, "layers": 80,
                  "options": {"optimization_level": 5, "workspace": 1073741824, "aux_streams": 2,
                              "hardware_compatibility": "ampere_plus", "version_compatible": True, "strip_plan": True,
                              "weight_streaming": True, "legacy_precision": ["fp16", "int8"]},
                  "validity": {"checked": True, "validity": "INVALID", "diagnostics": [], "reason": None},
                  "environment": {"tensorrt": {"flavour": "tensorrt", "version": "10.13.3.9"},
                                  "gpu": [{"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0",
                                           "memory_mb": 81920, "driver": "550.54.15"}]},
                  "warnings": []}
# an older TensorRT, no options, a GPU as nvidia-smi listed it before the memory was asked for
BUILT_UNCHECKED = {"status": "ok", "failures": [], "runtime": "tensorrt 8.6.1", "seconds": 20.0, "engine_bytes": 1000,
                   "layers": 12, "options": {},
                   "validity": {"checked": False, "reason": "this TensorRT has no Runtime.get_engine_validity"},
                   "environment": {"tensorrt": {"flavour": "tensorrt", "version": "8.6.1"},
                                   "gpu": [{"name": "Tesla T4", "compute_capability": "7.5", "driver": "535.104.05"}]},
                   "warnings": []}


def _written(built: Built) -> str:
    return built.model_dump_json(indent=2, exclude_none=True) + "\n"  # as Built.write writes build.json


def test_build_records_are_written_back_as_they_were():
    assert _written(Built.model_validate_json(BUILT_HERE)) == BUILT_HERE
    for record in (BUILT_ON_A_GPU, BUILT_UNCHECKED):
        text = json.dumps(record, indent=2) + "\n"
        built = Built.model_validate_json(text)
        assert _written(built) == text
        # and through the build worker's response, which the build stage reads back (trtflow.child writes it so)
        assert _written(Built.model_validate_json(_written(built))) == text
    built = Built.model_validate(BUILT_ON_A_GPU)
    assert built.options.version_compatible and built.options.legacy_precision == ["fp16", "int8"]
    assert built.environment.gpu[0].driver == "550.54.15" and built.validity.reason is None
    assert not Built.model_validate(BUILT_UNCHECKED).validity.checked


def test_the_build_report_row_and_environment_keep_nulls():
    cell = Cell(name="m.p.sm86", variant="m", precision="fp32", model="m.onnx", profiles=[], target="sm86",
                backend=Backend(flavour="tensorrt-rtx", module="tensorrt_rtx", version="1.7.1.116"), options={})
    row = CellRow.of(cell, Built.model_validate_json(BUILT_HERE))
    assert '"gpu": null' in row.model_dump_json(indent=1, exclude_none=True)
    assert '"reason":"[INTERNAL_ERROR]' in row.model_dump_json(exclude_none=True)
    env = BuildEnvironment(tensorrt=cell.backend, gpu=None)
    assert env.model_dump_json(exclude_none=True) == ('{"tensorrt":{"flavour":"tensorrt-rtx","module":"tensorrt_rtx",'
                                                      '"version":"1.7.1.116"},"gpu":null}')


def test_the_engine_cache_finds_engines_kept_before():
    """The cell key hashes this machine's GPUs as JSON: the same bytes as when they were dicts, or every engine kept
    in every engine cache would be rebuilt once."""
    cell = Cell(name="m.p.native", variant="m", precision="fp16", model="m.onnx", profiles=[], target="native",
                backend=Backend(flavour="tensorrt", module="tensorrt", version="10.13.3.9"), options={})
    gpus = [{"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "memory_mb": 81920, "driver": "550.54.15"}]
    for machine in (gpus, []):
        # the fields an offloaded variant's piece added since (chain, piece, model_profiles) are not in a whole cell's
        spec = cell.model_dump(mode="json", exclude={"name", "model", "timing_cache", "variant", "chain", "piece",
                                                     "model_profiles"})
        blob = json.dumps({"format": engine_cache.FORMAT, "cell": spec, "model": "ab" * 32, "machine": machine or None},
                          sort_keys=True)
        before = hashlib.sha256(blob.encode()).hexdigest()[:32]
        assert engine_cache.cell_key(cell, "ab" * 32, [Gpu.model_validate(g) for g in machine]) == before


def test_what_a_release_is_valid_for_reads_as_it_was_recorded():
    env = {"tensorrt": {"flavour": "tensorrt", "version": "10.13.3.9"},
           "gpu": [{"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "memory_mb": 81920,
                    "driver": "550.54.15"}],
           "target": "native", "hardware_compatibility": "ampere_plus", "version_compatible": True,
           "validity_here": None}
    target = TargetRelease.model_validate({"target": "native", "chosen": None, "options": [], "environment": env})
    assert json.loads(target.model_dump_json())["environment"] == env
    assert list(json.loads(target.model_dump_json())["environment"]) == list(env)
    assert _environment_text(target.environment) == (
        "tensorrt 10.13.3.9; target native; built on NVIDIA A100-SXM4-80GB (compute capability 8.0, driver "
        "550.54.15); serve it with a Triton whose TensorRT backend links tensorrt 10.13.3.9 (a Triton release's "
        "notes name its TensorRT; an engine loads only on the TensorRT version that built it); hardware "
        "compatibility: ampere_plus; version compatible: True")
    assert TargetRelease(target="x", chosen=None, options=[]).model_dump()["environment"] == {}


def test_benchmark_environments_and_telemetry_are_written_back_as_they_were():
    measured = {"cell": "m.opt", "candidate": "m", "variant": "m", "precision": "fp16", "profile": None,
                "point": "opt", "shapes": {}, "environment": {"runtime": "trtexec (TensorRT 10.13.3)",
                                                              "tensorrt": "10.13.3", "gpu": "NVIDIA A100 driver 550"},
                "result": {"has_summary": True}}
    m = Measurement.model_validate(measured)
    assert json.loads(m.model_dump_json())["environment"] == measured["environment"]
    onnx = m.environment.model_copy(update={"runtime": "onnxruntime-cpu", "host": "AMD EPYC x2"})
    assert onnx.differs(m.environment) == ["host", "runtime"]
    assert m.environment.differs(m.environment.model_copy()) == []
    for tele in ({"available": False, "why": "no NVIDIA GPU telemetry on this machine (NVMLError_LibraryNotFound)"},
                 {"available": True, "samples": 0},
                 {"available": True, "samples": 2, "gpu_util": {"min": 90, "max": 99, "mean": 94.5},
                  "power_w": {"min": 250.5, "max": 301.0, "mean": 275.75}, "throttled": ["software power cap"]}):
        assert json.loads(TelemetrySummary.model_validate(tele).model_dump_json()) == tele
        assert TelemetrySummary.model_validate(tele).model_dump_json() == json.dumps(tele, separators=(",", ":"))
