"""Engine size per precision (issue #39: INT8 engines larger than FP32 on TensorRT-RTX), and where the bytes go.

The examples' real models (squeezenet-cls, ppocr-cls, ppocr-det, ppocr-rec) through trtflow's own stages: prepare
(opset 17), precision (FP16), calibrate (INT8: the default recipe, and with `float_depthwise: false`, Q/DQ on the
depthwise Convs too as ModelOpt places it), each variant built by the installed TensorRT flavour at each profile
below, all in the same run. Per engine: MB, the ratio against the FP32 engine of the same profile, and what the plan
holds: the number of JIT kernels whose CUDA source it carries and those bytes (TensorRT-RTX 1.7 stores each as
text starting `#undef __HAS_FP8`; 0 where that is not so), the rest (weights, stored constants, metadata). The
ONNX column is the variant's initializer bytes. Calibration uses random inputs: the ranges do not change the size.

    python bench/engine_size.py [MODEL ...]
"""
from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import onnx
from rich.console import Console
from rich.table import Table

from trtflow.artifact import Artifact, Inputs
from trtflow.pipelines.params.build import BuildStage
from trtflow.pipelines.params.calibrate import CalibrateStage
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.pipelines.params.prepare import PrepareStage
from trtflow.stages.build import stage as build
from trtflow.stages.calibrate import stage as calibrate
from trtflow.stages.precision import stage as precision
from trtflow.stages.prepare import stage as prepare

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def static(shape: list[int]) -> dict[str, list[int]]:
    return {"min": shape, "opt": shape, "max": shape}


# model -> (ONNX, input, sample shape, {profile: shape range}): each example's own profile, and larger ones
MODELS: dict[str, tuple[Path, str, list[int], dict[str, dict[str, list[int]]]]] = {
    "squeezenet": (EXAMPLES / "squeezenet-cls/models/squeezenet1_1.onnx", "input", [1, 3, 224, 224],
                   {"bs1": static([1, 3, 224, 224]), "bs32": static([32, 3, 224, 224])}),
    "ppocr-cls": (EXAMPLES / "ppocr-cls/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "x", [1, 3, 48, 192],
                  {"lines (dynamic)": {"min": [1, 3, 48, 48], "opt": [8, 3, 48, 192], "max": [32, 3, 48, 640]},
                   "1x48x192": static([1, 3, 48, 192]), "32x48x640": static([32, 3, 48, 640])}),
    "ppocr-det": (EXAMPLES / "ppocr-det/models/ch_PP-OCRv4_det_infer.onnx", "x", [1, 3, 256, 256],
                  {"256x256": static([1, 3, 256, 256]), "960x960": static([1, 3, 960, 960]),
                   "dynamic": {"min": [1, 3, 256, 256], "opt": [1, 3, 640, 640], "max": [4, 3, 960, 960]}}),
    "ppocr-rec": (EXAMPLES / "ppocr-rec/models/ch_PP-OCRv4_rec_infer.onnx", "x", [1, 3, 48, 320],
                  {"1x48x320": static([1, 3, 48, 320]), "8x48x320": static([8, 3, 48, 320])}),
}
SOURCE = re.compile(rb"#undef __HAS_FP8\n[\t\n\r\x20-\x7e]{10000,}")


def kernel_source(plan: Path) -> tuple[int, int]:
    """(kernels, bytes) of the CUDA source TensorRT-RTX stores in a plan."""
    found = [m.end() - m.start() for m in SOURCE.finditer(plan.read_bytes())]
    return len(found), sum(found)


def weight_bytes(model: Path) -> int:
    m = onnx.load(str(model))
    return sum(len(i.raw_data) or onnx.numpy_helper.to_array(i).nbytes for i in m.graph.initializer)


def variants(name: str, tmp: Path) -> dict[str, Path]:
    src, inp, shape, _ = MODELS[name]
    random = {"random": True, "samples": 2, "shapes": {inp: shape}}

    def run(stage: Any, params: Any, model: Path, label: str) -> Path:
        (tmp / label).mkdir()
        return stage.run(params, Inputs({"model": Artifact(model, "onnx", label)}), tmp / label).outputs["model"]
    fp32 = run(prepare, PrepareStage.model_validate({"kind": "prepare", "target_opset": 17, "preflight": "off",
                                                     "input_shapes": {inp: shape}}), src, "fp32")
    out = {"fp32": fp32,
           "fp16": run(precision, PrecisionStage.model_validate({"kind": "precision", "data": random, "holdout": 1}),
                       fp32, "fp16")}
    for label, recipe in (("int8", {}), ("int8 dw", {"float_depthwise": False})):
        params = CalibrateStage.model_validate({"kind": "calibrate", "data": random, "holdout": 0,
                                                "method": "minmax", **recipe})
        out[label] = run(calibrate, params, fp32, label.replace(" ", "-"))
    return out


def measure(name: str, tmp: Path) -> list[dict[str, Any]]:
    models = variants(name, tmp)
    profiles = {p: {MODELS[name][1]: r} for p, r in MODELS[name][3].items()}
    rows = []
    for profile, shapes in profiles.items():
        out = tmp / f"build-{len(rows)}"
        out.mkdir()
        arts = [Artifact(path, "onnx", label, label.replace(" ", "_")) for label, path in models.items()]
        result = build.run(BuildStage.model_validate({"kind": "build", "profiles": {"p": shapes}}),
                           Inputs({"models": arts}), out)
        cells = {c["variant"]: c for c in json.loads(result.outputs["report"].read_text())["cells"]}
        fp32 = cells["fp32"]["engine_bytes"]
        for label, path in models.items():
            cell = cells[label.replace(" ", "_")]
            kernels, source = kernel_source(result.outputs["engines"] / cell["name"] / "engine.plan")
            rows.append({"model": name, "profile": profile, "variant": label, "mb": cell["engine_bytes"] / 1e6,
                         "ratio": cell["engine_bytes"] / fp32, "kernels": kernels, "source_mb": source / 1e6,
                         "rest_mb": (cell["engine_bytes"] - source) / 1e6, "onnx_mb": weight_bytes(path) / 1e6})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(MODELS), help=f"of {', '.join(MODELS)}")
    args = ap.parse_args()
    if set(args.models) - set(MODELS):
        ap.error(f"unknown model(s) {', '.join(sorted(set(args.models) - set(MODELS)))}; known: {', '.join(MODELS)}")
    runtime = build.backend("auto")
    table = Table(title=f"engine size by precision, {runtime.flavour} {runtime.version} (int8: calibrate's default; "
                        f"int8 dw: float_depthwise: false)", title_justify="left")
    for col in ("model", "profile", "variant", "engine MB", "x FP32", "JIT kernels", "their source MB", "rest MB",
                "ONNX weights MB"):
        table.add_column(col, justify="left" if col in ("model", "profile", "variant") else "right")
    for name in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            for r in measure(name, Path(tmp)):
                table.add_row(r["model"], r["profile"], r["variant"], f"{r['mb']:.2f}", f"{r['ratio']:.2f}",
                              str(r["kernels"]), f"{r['source_mb']:.2f}", f"{r['rest_mb']:.2f}", f"{r['onnx_mb']:.2f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
