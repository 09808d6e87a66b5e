"""Stage `prepare`: check, sanitize, convert the opset, simplify, and pre-flight the model with TensorRT.

Every transformation is checked against the model before it with ONNX Runtime; one that fails or changes the
outputs is not applied, and the report says why.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import onnx

from trtflow.artifact import Inputs, StageResult
from trtflow.errors import StageError
from trtflow.pipelines.params.prepare import PrepareStage
from trtflow.pipelines.schema import SampleData
from trtflow.stage_code import StageCode
from trtflow.stages.onnx import graph as onnx_graph
from trtflow.stages.onnx import model_io, offload, simplifier
from trtflow.stages.ort import runner as ort_runner
from trtflow.stages.ort.samples import SampleSource
from trtflow.stages.prepare.report import (
    Conversion,
    ModelCheck,
    OffloadedNode,
    OffloadRecord,
    PrepareReport,
    Simplification,
    Source,
)
from trtflow.stages.prepare.rewriting import Rewriter, explain
from trtflow.stages.trt.env import INSTALL_HINT, find_tensorrt
from trtflow.stages.trt.partition import partition
from trtflow.stages.trt.preflight import run_preflight
from trtflow.stages.trt.records import PreflightReport
from trtflow.text import first_line, listed

VERSION = "5"  # 2: checks on check.data, ranges and table bounds for random inputs. 3: the pre-flight report
# with all its fields (typed). 4: nodes the parser refuses are rewritten (`rewrites`). 5: `offload`


def run(params: PrepareStage, inputs: Inputs, out_dir: Path) -> StageResult:
    src: Path = inputs.one("model").path
    work = out_dir / "work"
    work.mkdir()
    warnings: list[str] = []
    lap = _Stopwatch()

    model, external, full_check = _load_and_check(src, warnings)
    before = onnx_graph.inventory(model)
    lap("check")

    sanitized = onnx_graph.sanitize_dims(model)
    model = _infer_shapes(model, work, warnings)
    path = work / "original.onnx"
    model_io.save(model, path, external=external or None)
    lap("sanitize")

    check = _Checker(params, inputs, model, path)
    model, path, conversion = _convert_opset(model, path, src.name, params.target_opset, check, work, external,
                                             warnings)
    lap("convert")

    simplification = Simplification(requested=False)
    if params.simplify:
        simplification = _simplify(model, path, work, check, external)
        if simplification.applied:
            model, path = model_io.load(work / "simplified.onnx"), work / "simplified.onnx"
        else:
            warnings.append(f"not simplified: {simplification.reason}")
    lap("simplify")

    onnx_graph.rename_dims(model, sanitized)
    constants_moved = onnx_graph.constants_to_initializers(model)
    final = out_dir / "model.onnx"
    model_io.save(model, final, external=external or None)
    lap("save")

    rewriter = Rewriter(model, final, work, check, external)
    for ref in params.code_refs():
        rewriter.user(ref)
    trial = _trial_shapes(model, params.input_shapes, check) if params.trial_build else None
    preflight = _preflight(params.preflight, rewriter.path, trial)
    if preflight.failures and params.rewrites != "none":
        rewriter.refused(preflight.failures)
        lap("rewrite")
        preflight = _preflight(params.preflight, rewriter.path, trial) if rewriter.path != final else preflight
    if rewriter.path != final:
        model = rewriter.model
        model_io.save(model, final, external=external or None)
    for failure in preflight.failures:
        failure.hint = explain(failure, rewriter.records, params.rewrites != "none")
    offloaded = None
    if params.offload == "onnxruntime" and _refused(preflight):
        model, offloaded = _offload(final, check, work)
        model_io.save(model, final, external=external or None)
        lap("offload")
    after, dynamic = onnx_graph.inventory(model), onnx_graph.dynamic_dims(model)
    lap("preflight")
    shutil.rmtree(work)

    report = PrepareReport(
        source=Source(path=str(src), digest=inputs.one("model").digest, external_data=external),
        before=before, after=after, full_check=full_check, sanitized_dims=sanitized, conversion=conversion,
        simplification=simplification, dynamic_dims=dynamic, constants_to_initializers=constants_moved,
        rewrites=rewriter.records, preflight=preflight, offload=offloaded, timings=lap.timings, warnings=warnings)
    (out_dir / "report.json").write_text(json.dumps(report.model_dump(), indent=2, default=str) + "\n")
    metrics = {"nodes_before": before.nodes, "nodes_after": after.nodes,
               "opset": onnx_graph.default_opset(model), "dynamic_dims": len(dynamic),
               "simplified": simplification.applied, "rewrites": sum(r.kept for r in rewriter.records),
               "preflight_failures": len(preflight.failures) if preflight.ran else None,
               "offloaded_nodes": len(offloaded.nodes) if offloaded else 0,
               "seconds": lap.timings}
    if offloaded is None:
        _verdict(preflight, params.fail_on_unsupported, src.name, warnings)
    else:
        warnings.append(f"{len(offloaded.nodes)} node(s) run on ONNX Runtime (offload: onnxruntime): "
                        + ", ".join(f"{n.name} ({n.op_type})" for n in offloaded.nodes[:5]))
    outputs = {"model": final, "report": out_dir / "report.json"}
    return StageResult(outputs=outputs, summary=report.summary(src.name), metrics=metrics, warnings=warnings)


class _Stopwatch:
    """`lap(name)` records the seconds since the previous lap under `name`."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self._last, 4)
        self._last = now


def _load_and_check(src: Path, warnings: list[str]) -> tuple[onnx.ModelProto, bool, dict[str, Any]]:
    """The model, whether it keeps its weights in external data, and the full checker's verdict."""
    external = model_io.has_external_data(model_io.load(src, with_data=False))
    model = model_io.load(src)
    opset, known = _default_opset(src, model), onnx.defs.onnx_opset_version()
    if opset > known:  # the checker lets it through; no converter, runtime or parser here knows its ops
        raise StageError(f"{src.name} declares ONNX opset {opset}, newer than any this onnx {onnx.__version__} "
                         f"knows (up to {known}), let alone ONNX Runtime and TensorRT",
                         hint=f"export it at opset {known} or lower (TensorRT's parser documents the opsets it "
                              f"supports)")
    try:
        onnx.checker.check_model(str(src))
    except onnx.checker.ValidationError as exc:
        raise StageError(f"{src.name} fails the ONNX checker: {first_line(exc)}") from None
    full_check: dict[str, Any] = {"ok": True}
    try:
        onnx.checker.check_model(str(src), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        full_check = {"ok": False, "error": first_line(exc)}
        warnings.append(f"strict shape inference fails on the source model: {first_line(exc)}")
    return model, external, full_check


def _default_opset(src: Path, model: onnx.ModelProto) -> int:
    """The model's ONNX (default-domain) opset; a model without one (an empty file parses as an empty model) is
    not one any converter, runtime or parser here can read."""
    opset = onnx_graph.default_opset(model)
    if opset is not None:
        return opset
    what = "the file is empty" if model.ByteSize() == 0 else "it imports no ONNX (ai.onnx) opset"
    raise StageError(f"{src.name} is not a valid ONNX model: {what}",
                     hint="export it again; its opset_import must name the default domain")


def _convert_opset(model: onnx.ModelProto, path: Path, name: str, target: int | None, checker: "_Checker",
                   work: Path, external: bool, warnings: list[str]) -> tuple[onnx.ModelProto, Path, Conversion | None]:
    """To `target`, checked against the model before; a conversion that changes outputs stops the stage."""
    source_opset = onnx_graph.default_opset(model)
    if not target or target == source_opset:
        return model, path, None
    converted = _convert(model, name, source_opset, target)
    conv_path = work / "converted.onnx"
    model_io.save(converted, conv_path, external=external or None)
    check = checker(path, conv_path)
    if check.ok is False:
        raise StageError(f"converting {name} from opset {source_opset} to {target} changed "
                         f"its outputs ({check.worst()}); leave target_opset unset or pick another opset")
    if check.ok is None:
        warnings.append(f"opset conversion not verified: {check.skipped}")
    return converted, conv_path, Conversion(source=source_opset, to=target, check=check)


def _verdict(preflight: PreflightReport, fail_on_unsupported: bool, name: str, warnings: list[str]) -> None:
    """Nodes TensorRT cannot parse fail the stage (or, if the user chose so, become warnings)."""
    failures = preflight.failures
    if failures and fail_on_unsupported:
        shown = listed([f"{f.node} ({f.op_type}): {f.hint}" if f.node or f.op_type else f"{f.code}: {f.reason}"
                        for f in failures], 3, sep="; ")
        raise StageError(f"TensorRT pre-flight ({preflight.runtime}): {len(failures)} node(s) of {name} "
                         f"cannot be parsed: {shown} (set offload: onnxruntime to run them on ONNX Runtime, "
                         f"or fail_on_unsupported: false to continue)")
    for f in failures:
        warnings.append(f"TensorRT cannot parse node {f.node} ({f.op_type}): {f.hint}")
    trial = preflight.failed_build()
    if trial is not None:
        msg = (f"TensorRT pre-flight ({preflight.runtime}): {name} parses, but the trial build at "
               f"{trial.shapes} fails: {trial.error} ({trial.hint})")
        if fail_on_unsupported and not trial.needs_gpu:
            raise StageError(msg + "; set fail_on_unsupported: false to continue")
        warnings.append(msg)


def _refused(preflight: PreflightReport) -> bool:
    """Whether TensorRT refuses part of the model here: a node it cannot parse, or a trial build that fails for a
    reason other than wanting a GPU."""
    trial = preflight.failed_build()
    return bool(preflight.failures) or trial is not None and not trial.needs_gpu


def _offload(final: Path, check: "_Checker", work: Path) -> tuple[onnx.ModelProto, OffloadRecord | None]:
    """The model with its refused nodes marked for ONNX Runtime (`onnx/offload.py`), cut where the parser's
    partition and trial builds say (`trt/partition.py`); None where no node had to move after all."""
    if check.source is None:
        raise StageError(f"offload: onnxruntime needs ONNX Runtime to run the model, and it cannot: "
                         f"{check.unavailable}", hint="make the model run on ONNX Runtime's CPU kernels first")
    found = partition(final, next(check.source.feeds(range(1))), work / "offload")
    model = model_io.load(work / "offload" / "model.onnx")  # Constants made initializers, every node named
    moved = [OffloadedNode(name=n.name, op_type=n.op_type, why=n.why) for n in found.nodes
             if n.runtime == "onnxruntime"]
    if not moved:
        return model, None
    offload.mark(model, offload.Offload(nodes=[n.name for n in moved]))
    return model, OffloadRecord(parser=found.parser.runtime, nodes=moved,
                                tensorrt_nodes=len(found.nodes) - len(moved), pieces=found.chain.pieces,
                                rounds=found.rounds, trials=len(found.trials))


def _infer_shapes(model: onnx.ModelProto, work: Path, warnings: list[str]) -> onnx.ModelProto:
    try:
        if model.ByteSize() < model_io.EXTERNAL_THRESHOLD:
            return onnx.shape_inference.infer_shapes(model, data_prop=True)
        # over 2 GB the in-memory API cannot serialize; infer on files instead
        tmp_in, tmp_out = work / "infer_in.onnx", work / "infer_out.onnx"
        model_io.save(model, tmp_in, external=True)
        onnx.shape_inference.infer_shapes_path(str(tmp_in), str(tmp_out))
        return model_io.load(tmp_out)
    except Exception as exc:  # noqa: BLE001 - inference is a help, not a requirement
        warnings.append(f"shape inference failed: {first_line(exc)}")
        return model


def _convert(model: onnx.ModelProto, name: str, source: int | None, target: int) -> onnx.ModelProto:
    from onnx import version_converter

    todo = f"pick a target_opset the model's ops exist in (its current opset is {source}), or leave it unset"
    try:
        converted = version_converter.convert_version(model, target)
        onnx.checker.check_model(converted)
    except Exception as exc:  # noqa: BLE001 - the converter raises several types, all meaning "cannot"
        raise StageError(f"cannot convert {name} from opset {source} to {target}: {first_line(exc)}; {todo}") \
            from None
    if onnx_graph.default_opset(converted) != target:
        raise StageError(f"cannot convert {name} from opset {source} to {target}: the converter left it at "
                         f"{onnx_graph.default_opset(converted)}; {todo}")
    return converted


class _Checker:
    """Compares a transformed model with the model before it, in ONNX Runtime, on the check data: `check.data`
    (saved tensors, or random with shapes and ranges), by default `check.samples` random inputs shaped by
    `input_shapes`. Inputs the reference cannot run on stop the stage, naming them (never a silent skip)."""

    def __init__(self, params: PrepareStage, inputs: Inputs, model: onnx.ModelProto, path: Path):
        c = params.check
        self.rtol, self.atol = c.rtol, c.atol
        self.given_data = c.data is not None and c.data.tensors is not None
        data = c.data or SampleData(random=True, samples=c.samples, seed=c.seed)
        data = data.model_copy(update={"shapes": {**params.input_shapes, **data.shapes}})
        self.source: SampleSource | None = None
        self._last: tuple[Path, list] | None = None  # the last model checked and its outputs per sample
        try:
            model_inputs = ort_runner.session(path).get_inputs()
        except Exception as exc:  # noqa: BLE001 - e.g. custom ops ONNX Runtime cannot run
            self.unavailable = first_line(exc)
            return
        self.source = SampleSource(data, inputs, model_inputs, "prepare", model, key="check.data")

    def __call__(self, ref: Path, new: Path) -> ModelCheck:
        if self.source is None:
            return ModelCheck(skipped=f"ONNX Runtime could not run the models: {self.unavailable}")
        known = self._last[1] if self._last is not None and self._last[0] == ref else None
        try:
            found, outputs = ort_runner.compare_models(ref, new, self.source.feeds(range(len(self.source))),
                                                       self.rtol, self.atol, known)
            self._last = (new, outputs)
            return ModelCheck(ok=bool(found), rtol=found.rtol, atol=found.atol, input_shapes=found.input_shapes,
                              runtime=found.runtime, samples=found.samples, outputs=found.outputs,
                              violations=found.violations, data=self.source.label)
        except ort_runner.ReferenceFailed as exc:
            raise self.source.failure(exc.error) from None
        except Exception as exc:  # noqa: BLE001 - the new model fails in ONNX Runtime
            return ModelCheck(skipped=f"ONNX Runtime could not run the models: {first_line(exc)}")


def _simplify(model: onnx.ModelProto, path: Path, work: Path, checker: _Checker, external: bool) -> Simplification:
    onnxsim = simplifier.onnxsim()
    t0 = time.perf_counter()
    try:
        simplified, ok = onnxsim.simplify(model, check_n=0)
    except Exception as exc:  # noqa: BLE001 - onnxsim fails in many ways on unusual graphs
        return Simplification(requested=True, reason=f"onnxsim failed: {first_line(exc)}")
    if not ok:
        return Simplification(requested=True, reason="onnxsim reported its result as invalid")
    out = work / "simplified.onnx"
    model_io.save(simplified, out, external=external or None)
    check = checker(path, out)
    result = Simplification(requested=True, applied=bool(check.ok), check=check,
                            tool=f"onnxsim {getattr(onnxsim, '__version__', '')}".strip(),
                            seconds=round(time.perf_counter() - t0, 3))
    if check.ok is None:
        result.reason = f"could not verify the simplified model: {check.skipped}"
    elif not check.ok:
        result.reason = f"the simplified model's outputs differ from the original ({check.worst()})"
    return result


def _trial_shapes(model: onnx.ModelProto, given: dict[str, list[int]], check: "_Checker") -> dict[str, list[int]]:
    """Concrete shapes for the trial build: those of the check data's first sample where tensors are given, else
    `input_shapes`, else each dimension symbol one value (1 for a batch, 64 for other dynamic dimensions, as the
    checks use)."""
    if check.source is not None and check.given_data:
        given = given | {name: list(x.shape) for name, x in next(check.source.feeds(range(1))).items()}
    return ort_runner.concrete_shapes([(vi.name, [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                                                  for d in vi.type.tensor_type.shape.dim])
                                       for vi in onnx_graph.graph_inputs(model)], given)


def _preflight(mode: str, model: Path, trial: dict[str, list[int]] | None) -> PreflightReport:
    if mode == "off":
        return PreflightReport(ran=False, reason="disabled (preflight: off)")
    if find_tensorrt() is None:
        if mode == "required":
            raise StageError(f"preflight: required, but no TensorRT flavour is installed: {INSTALL_HINT}")
        return PreflightReport(ran=False, reason=f"no TensorRT flavour installed ({INSTALL_HINT})")
    report = run_preflight(model, trial)
    if not report.ran and mode == "required":
        raise StageError(f"TensorRT pre-flight could not run: {report.reason}")
    return report


CODE = StageCode(run, report=PrepareReport)  # what the flow reaches the kind through (trtflow/stage_code.py)
