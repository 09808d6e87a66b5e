"""Stage `calibrate`: INT8 explicit quantization (Q/DQ) from calibration data, with a CPU accuracy pre-flight.

ONNX Runtime's quantization tools configured as ModelOpt configures them for TensorRT: Q/DQ format, symmetric
INT8 activations and weights, per-channel weights, bias left in float (TensorRT rejects an INT32
DequantizeLinear), Q/DQ on the inputs of the quantized ops only, attention's MatMuls in float; and, unlike
ModelOpt, depthwise Convs in float (TensorRT-RTX pads their INT8 groups to 4 channels); the report names every node
left in float and why (`left_in_float`); and, beyond ModelOpt, bias correction: each quantized node's float bias
absorbs the mean error its INT8 rounding causes (bias.py). bench/int8.py measures it against ModelOpt on trained
models.
Calibration streams: statistics are folded into the calibrator every few samples, so memory does not grow with the
number of samples. The per-tensor ranges are an output of their own (`ranges.json`).
"""
from __future__ import annotations

import contextlib
import io
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from trtflow.artifact import Inputs, StageResult
from trtflow.errors import StageError
from trtflow.metrics.outputs import declared
from trtflow.pipelines.params.calibrate import CalibrateStage
from trtflow.pipelines.params.precision import FallbackSpec
from trtflow.stage_code import StageCode
from trtflow.stages.calibrate import bias
from trtflow.stages.calibrate.report import CalibrateReport, RangeCheck
from trtflow.stages.compare import gate
from trtflow.stages.compare.accuracy import Comparison
from trtflow.stages.onnx import model_io, offload
from trtflow.stages.onnx.composition import composition
from trtflow.stages.onnx.fp16_emulation import emulated
from trtflow.stages.onnx.graph import default_opset, nodes_in_subgraphs, output_floors, require_op_types
from trtflow.stages.ort import calibration, fp16_fallback, fp16_remainder, qdq, quant_prep, simulation
from trtflow.stages.ort import runner as ort_runner
from trtflow.stages.ort.ranges import magnitudes
from trtflow.stages.ort.references import References
from trtflow.stages.ort.runner import FP32, session
from trtflow.stages.ort.samples import SampleSource
from trtflow.text import did_you_mean, first_line

VERSION = "12"  # 2: TensorRT's entropy and percentile rules; ranges and table bounds for random inputs. 3: no threshold
# past the largest |x|. 4: the model carries its recipe (qdq.RECIPE). 5: Q/DQ on the quantized ops' inputs only,
# attention's MatMuls in float, no weight-scale adjustment for INT32 biases (ModelOpt's INT8 recipe), method
# percentile 99.999 by default, checked against the full ranges like entropy (bench/int8.py). 6: the range check
# tries the rule, the other histogram rule and the full ranges, judged by mean relative error (RangeCheck). 7: the
# range check's task metrics as measured (were signed) and the one that decided (its warning quoted the errors).
# 8: depthwise Convs in float (float_depthwise: TensorRT-RTX pads their INT8 groups to 4 channels). 9: the pre-flight
# simulated and measured by validate's code (simulation.py), naming its samples and graph; quantized nodes counted.
# 10: bias correction (bias.py: the kept model's float biases absorb the mean error of its rounding, stored in the
# recipe for validate's repair); the range check's task metrics replace the rule's ranges only when at least as good
# on every one and better on one (the first metric's lead decided alone). 11: remainder (fp16: the unquantized
# remainder in FP16, fp16_remainder.py). 12: |x| histograms only for the tensors a Q/DQ pair may go on (the quantized
# ops' inputs); the others, whose ranges ONNX Runtime's quantizer asks for but uses in no Q/DQ, at their full range
ENTROPY_CHECK_SAMPLES = 8  # calibration samples on which the candidate ranges are compared (RangeCheck)
FLUSH_EVERY = 16  # at most this many samples' intermediate outputs are held before being folded in
# below this many calibration samples the report warns (min_samples is the hard limit). Measured with bench/int8.py
# --sweep 4 8 16 32 (default recipe, trained models, real inputs, held out): the pooled task metric did not depend on
# the count from 4 up (PP-OCRv4 rec text exact 0.49 / 0.51 / 0.51 / 0.50 of 96 lines; ddddocr's detector IoU
# 0.859 / 0.870 / 0.860 / 0.862 on 48 scenes) but its worst scene did (IoU 0.09 at 4-16, 0.42 at 32); and the range
# check (ENTROPY_CHECK_SAMPLES) judges on fewer than its 8 samples below 8
RECOMMENDED_SAMPLES = 8


def run(params: CalibrateStage, inputs: Inputs, out_dir: Path) -> StageResult:
    work = out_dir / "work"
    work.mkdir()
    src = inputs.one("model").path
    model = model_io.load(src)
    ref = session(src, role=FP32)
    fp32 = References.of(inputs, inputs.one("model")).of_session(ref)
    data = SampleSource(params.data, inputs, ref.get_inputs(), "calibrate", model)
    warnings: list[str] = []
    calib, hold = _split(data, params, warnings)
    data.check_reference(fp32)
    gate.check_metrics("calibrate", params.metrics, ref)
    left, applied = _check_model(model, params, warnings)
    excluded = set(left)

    pre = work / "pre.onnx"
    warnings += quant_prep.pre_process(src, pre, work)
    # the pre-processing fuses and renames nodes (MatMul + Add -> Gemm): the recipe's rules apply to the graph that
    # is quantized too
    left.update({k: v for k, v in qdq.left_in_float(onnx.load(str(pre), load_external_data=False),
                                                     params.quantize_ops, params.float_attention,
                                                     *applied).items() if k not in left})
    excluded = set(left)
    ranges, out = out_dir / "ranges.json", out_dir / "model.onnx"
    reference: list[tuple[Any, Any]] = []  # the range check's FP32 outputs, from the safeguards' pass when it runs
    keep_fp32 = _fp16_safeguards(pre, data, calib[:ENTROPY_CHECK_SAMPLES], work, reference) \
        if params.remainder == "fp16" else None
    job = _Job(params, data, ref, fp32, pre, excluded, work, warnings, keep_fp32, reference)
    calibrated, full_range, check = _quantize(job, calib, out, ranges)
    if check and (chosen := check.warning()):
        warnings.append(chosen)
    remainder_fp32 = _fp16_remainder(job, hold or calib, out) if keep_fp32 is not None else None
    if full_range:
        warnings.append(f"{len(full_range)} tensor(s) had too few values for the entropy rule (fewer than "
                        f"{calibration.MIN_VALUES_FOR_KL}) and keep their full range; more calibration samples "
                        f"give them a threshold")

    # the INT8 variant simulated and measured as validate simulates and measures it (simulation.py)
    sim = simulation.simulate(out, model, "int8")
    acc = simulation.measure(fp32, sim.session(work), data.feeds(hold), sim, params.metrics, output_floors(model),
                             "calibrate")
    if not hold:
        warnings.append("no held-out samples: the accuracy pre-flight did not run (set holdout, add data)")
    else:  # the bounds validate holds INT8 to by default: cosine, or the declared task metrics; NaN/Inf
        warnings += gate.preflight_warnings(acc, "int8", params.metrics, "the INT8 variant")
    if not data.from_files:
        warnings.append("calibrated on random inputs: the ranges say nothing about real activations; give "
                        "data.images or data.tensors from the deployment's distribution")

    cache = {"trt_calibration_cache": write_trt_cache(ranges, out_dir / "calibration.cache")
             } if params.trt_calibration_cache else {}
    outputs = {"model": out, "ranges": ranges, "report": out_dir / "report.json", **cache}
    shutil.rmtree(work)

    quantized = onnx.load(str(out), load_external_data=False)
    n_q = sum(n.op_type == "QuantizeLinear" for n in quantized.graph.node)
    n_nodes = len(qdq.quantized_nodes(quantized))  # what validate's repair counts as the INT8 nodes
    corrected = len(getattr(qdq.recipe(quantized).tensors, qdq.BIAS, {}))
    left_in_float = _left_in_float(quantized, params.quantize_ops, left)
    made = composition(quantized, {k: list(v.shape) for k, v in data.sample(hold.start if hold else 0).items()})
    if mostly_fp32 := made.mostly_fp32("int8"):
        warnings.append(mostly_fp32)
    report = CalibrateReport(method=params.method,
                             percentile=params.percentile if params.method == "percentile" else None,
                             data=data.label, calibration_samples=calibrated, holdout_samples=len(hold),
                             full_range_tensors=full_range, range_check=check,
                             excluded_nodes=sorted(excluded), left_in_float=left_in_float,
                             quantize_ops=params.quantize_ops, quantize_outputs=params.quantize_outputs,
                             quantize_linear_nodes=n_q, quantized_nodes=n_nodes, bias_corrected=corrected,
                             accuracy=acc, composition=made,
                             remainder="fp32" if remainder_fp32 is None else "fp16",
                             remainder_fp32=remainder_fp32 or {},
                             holdout=f"{_which(hold)} of {data.label}", warnings=warnings)
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2) + "\n")
    metrics = {"calibration_samples": calibrated, "quantize_linear_nodes": n_q, "quantized_nodes": n_nodes,
               "nan_inf": acc.nonfinite(), "fp32_mac_share": made.mac_share.fp32}
    return StageResult(outputs=outputs, summary=report.summary(), metrics=metrics, warnings=warnings)


def _fp16_safeguards(pre: Path, data: SampleSource, probe: range, work: Path,
                     reference: list[tuple[Any, Any]]) -> dict[str, str]:
    """The nodes an FP16 remainder keeps in FP32 (node -> why): what the precision stage's fallback rules keep, on
    the samples the range check runs (up to ENTROPY_CHECK_SAMPLES calibration samples). The same pass appends
    their FP32 outputs to `reference` (one forward pass per sample fewer: the safeguards cost calibrate ~30%)."""
    model = model_io.load(pre)
    fallback = FallbackSpec()
    seen = magnitudes(model, work, data.feeds(probe), reference)
    return fp16_fallback.out_of_range(model, seen, fallback.data_max, fallback.init_max, offload.kept_float(model))


def _fp16_remainder(job: _Job, probe_on: range, out: Path) -> dict[str, str] | None:
    """The Q/DQ model at `out` with its unquantized remainder made FP16 (fp16_remainder.py), in place, checked on
    the first sample of `probe_on`: the nodes kept FP32 and why. None, with a warning, where no FP16 remainder
    could be made (the model stays as quantized)."""
    try:
        model, kept = fp16_remainder.convert(model_io.load(out), job.fp16_keep or {}, job.data.sample(probe_on.start),
                                             job.work)
    except fp16_remainder.RemainderError as exc:
        job.warnings.append(f"the unquantized remainder stays FP32: {exc}; remainder: fp32 says so without trying")
        return None
    model_io.save(model, out)
    return kept


def _which(samples: range) -> str:
    """Which samples a range is, in words: 'samples 13-16' (counting from 1)."""
    if not samples:
        return "no samples"
    if len(samples) == 1:
        return f"sample {samples[0] + 1}"
    return f"samples {samples[0] + 1}-{samples[-1] + 1}"


def _split(data: SampleSource, params: CalibrateStage, warnings: list[str]) -> tuple[range, range]:
    """Calibration samples and held-out ones; too few calibration samples is an error or a warning."""
    if len(data) == 0:
        raise StageError("calibrate: the calibration set is empty")
    calib, hold = data.split(params.holdout)
    if len(calib) < params.min_samples:
        msg = f"calibrate: {len(calib)} calibration sample(s), fewer than min_samples {params.min_samples}"
        if params.on_too_few == "error":
            raise StageError(msg + " (add data, or set on_too_few: warn)")
        warnings.append(msg)
    elif len(calib) < RECOMMENDED_SAMPLES and data.from_files:
        warnings.append(f"{len(calib)} calibration sample(s), fewer than {RECOMMENDED_SAMPLES}: the ranges are chosen "
                        f"(and checked) on few inputs, and the worst inputs suffer first; give more samples from the "
                        f"deployment's distribution")
    return calib, hold


def _check_model(model: onnx.ModelProto, params: CalibrateStage,
                 warnings: list[str]) -> tuple[dict[str, str], tuple[bool, bool]]:
    """The nodes excluded from quantization (node -> why), once the model is known to be quantizable, and whether
    the small-ops and depthwise rules apply (not when they would leave every node in float: a model of such
    ops only is quantized as asked, with a warning)."""
    opset = default_opset(model) or 0
    if opset < 13:  # QuantizeLinear's axis (per-channel) and TensorRT's Q/DQ support start at opset 13
        raise StageError(f"calibrate: Q/DQ quantization needs opset >= 13, the model is at opset {opset}; "
                         f"set target_opset: 17 in the prepare stage")
    applied = (params.float_small_ops, params.float_depthwise)
    excluded = _excluded_nodes(model, params, *applied)
    if any(applied) and not any(n.op_type in params.quantize_ops and n.name not in excluded for n in model.graph.node):
        relaxed = _excluded_nodes(model, params, False, False)
        if len(relaxed) < len(excluded):
            why = "; ".join(sorted({w for w in excluded.values() if w in (qdq.SMALL_CONV, qdq.SMALL_GEMM,
                                                                          qdq.DEPTHWISE_CONV)}))
            warnings.append(f"every {'/'.join(params.quantize_ops)} node is left in float by the recipe ({why}): "
                            f"quantized them anyway, as asked (TensorRT may run them in higher precision)")
            excluded, applied = relaxed, (False, False)
    inside = [(owner, n) for owner, n in nodes_in_subgraphs(model) if n.op_type in params.quantize_ops]
    if inside:  # ONNX Runtime's static Q/DQ quantizer leaves subgraphs alone
        owners = sorted({owner for owner, _ in inside})
        warnings.append(f"{len(inside)} {'/'.join(sorted({n.op_type for _, n in inside}))} node(s) inside the "
                        f"subgraphs of {', '.join(owners[:5])} are not quantized (control flow stays in float)")
    if not any(n.op_type in params.quantize_ops and n.name not in excluded for n in model.graph.node):
        where = f"; its {len(inside)} such node(s) sit inside control flow ({', '.join(owners[:3])}), which is " \
                f"not quantized" if inside else ""
        rules = sorted({why for why in excluded.values() if why in RECIPE_SWITCHES})
        switch = "; ".join(f"{RECIPE_SWITCHES[why]} quantizes the nodes left in float as: {why}" for why in rules)
        raise StageError(f"calibrate: nothing to quantize: the model has no {'/'.join(params.quantize_ops)} node "
                         f"outside the exclusions and subgraphs{where}", hint=switch or None)
    return excluded, applied


@dataclass(frozen=True)
class _Job:
    """What quantizing needs besides the samples to calibrate on and where to write."""
    params: CalibrateStage
    data: SampleSource
    ref: Any  # the FP32 model's session
    fp32: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]  # its outputs on a feed (references.py)
    pre: Path  # the model after ONNX Runtime's quantization pre-processing
    excluded: set[str]  # nodes left in float
    work: Path
    warnings: list[str]  # the stage's, which quantizing adds to
    fp16_keep: dict[str, str] | None = None  # with remainder: fp16, the nodes it keeps FP32 (None: FP32 remainder)
    reference: list[tuple[Any, Any]] = field(default_factory=list)  # (feed, FP32 outputs) of the range check's
    # samples, where already run

    def judged(self, model: Path) -> Any:
        """A session of the Q/DQ `model` as the variant will run: with the FP16 remainder, converted and emulated
        (no ONNX Runtime check: the kept model gets it in `_fp16_remainder`)."""
        if self.fp16_keep is None:
            return session(model)
        try:
            converted, _ = fp16_remainder.convert(model_io.load(model), self.fp16_keep, None, self.work)
        except fp16_remainder.RemainderError:
            return session(model)  # the kept model's conversion fails the same way and says so
        path = model.with_suffix(".judged.onnx")
        model_io.save(emulated(converted), path)
        return session(path)


def _quantize(job: _Job, calib: range, out: Path, ranges: Path) -> tuple[int, list[str], RangeCheck | None]:
    """Statistics streamed over the calibration samples, thresholds as TensorRT chooses them, then Q/DQ into
    `out` (and the ranges into `ranges`). Returns the samples used, the tensors too sparse for the entropy rule,
    and the range check (`RangeCheck`: the rule's ranges, the other histogram rule's and the full ranges, each
    run on the calibration samples; the closest to FP32 is kept)."""
    params, data, ref, pre, excluded, work = job.params, job.data, job.ref, job.pre, job.excluded, job.work
    with contextlib.redirect_stdout(io.StringIO()):  # ONNX Runtime prints its calibration steps
        rule = calibration.Rule(params.method, params.percentile, params.entropy_floor)
        cal = calibration.calibrate(pre, list(params.quantize_ops), rule, data.feeds(calib), len(calib), work,
                                    FLUSH_EVERY, params.quantize_outputs)

    def write(candidate: calibration.Rule, model: Path, ranges_out: Path, histograms: bool) -> tuple[Any, list[str]]:
        tensors = cal.ranges(candidate)
        # a candidate's cache goes without the histograms (the quantizer reads only the ranges; writing 2048 bins
        # per tensor as JSON cost seconds per candidate): the one kept is saved whole below
        qdq.write(pre, model, ranges_out, tensors if histograms else calibration.ranges_only(tensors),
                  params.per_channel, params.quantize_ops, excluded, params.quantize_outputs)
        return tensors, list(cal.full_range) if candidate.method == "entropy" else []

    def correct() -> None:
        """The kept model's float biases absorb the mean error of its rounding (bias.py): the range check
        weighs the ranges' clipping; the rounding's mean error is taken out whichever ranges are kept."""
        if not params.bias_correction:
            return
        try:
            qdq.add_bias(out, bias.corrections(out, pre, lambda: data.feeds(calib[:bias.MAX_SAMPLES]), work))
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime failing on the measuring graph: the model as written
            job.warnings.append(f"bias correction skipped: measuring the INT8 rounding's mean error failed "
                                f"({type(exc).__name__}: {first_line(exc)}); the model is quantized without it")

    if params.method == "minmax" or not params.entropy_check:
        full_range = write(rule, out, ranges, histograms=True)[1]
        correct()
        return cal.samples, full_range, None
    other = "entropy" if params.method == "percentile" else "percentile"
    candidates = {params.method: rule, other: calibration.Rule(other, params.percentile, params.entropy_floor),
                  "full_range": calibration.Rule("minmax")}
    probe = calib[:ENTROPY_CHECK_SAMPLES]
    task, errors, sparse, tensors, higher = {}, {}, {}, {}, {}
    reference = job.reference or [(feed, job.fp32(feed)) for feed in data.feeds(probe)]
    for label, candidate in candidates.items():
        model, ranges_out = work / f"{label}.onnx", work / f"{label}.json"
        tensors[label], sparse[label] = write(candidate, model, ranges_out, histograms=False)
        task[label], errors[label], higher = _closeness(reference, job.judged(model), params.metrics,
                                                        ref.get_outputs())
    used, decided_by = _choose(list(candidates), task, errors, higher)
    shutil.copy(work / f"{used}.onnx", out)
    correct()
    qdq.save_ranges(tensors[used], ranges)
    check = RangeCheck(samples=len(probe), errors={k: round(v, 6) for k, v in errors.items()},
                       task={k: {m: round(v, 6) for m, v in t.items()} for k, t in task.items() if t},
                       used=used, rule=params.method, decided_by=decided_by)
    return cal.samples, sparse[used], check


def _choose(order: list[str], task: dict[str, dict[str, float]], errors: dict[str, float],
            higher: dict[str, bool]) -> tuple[str, str | None]:
    """The candidate kept (`order[0]` is the rule's), and the task metric that set it apart from the rule's.
    Declared task metrics decide: the rule stands unless another candidate is at least as good on every one of them
    and better on one (of several such, the best in declaration order, each toward its better end): on a few
    calibration samples the relative error over whole outputs is a weaker guide than the rule (ddddocr's OCR:
    entropy had the smallest error and read 5% fewer held-out lines exactly), and so is one metric against the
    others (ddddocr's detector: the full ranges found 1 box more of 99 on 8 calibration scenes than the percentile
    ones, with precision 0.929 against 0.938 and box IoU 0.909 against 0.946, and kept the same recall on 200
    other scenes at 3.6 points less precision). Without them, the relative error. `higher`: output/metric ->
    whether higher is better."""
    rule = order[0]
    if not task[rule]:
        return min(order, key=lambda k: (errors[k], order.index(k))), None

    def standing(k: str) -> list[float]:
        return [v if higher[m] else -v for m, v in task[k].items()]

    better = [k for k in order[1:] if standing(k) != standing(rule)
              and all(a >= b for a, b in zip(standing(k), standing(rule)))]
    if not better:
        return rule, None
    used = max(better, key=lambda k: (standing(k), -order.index(k)))
    return used, next((m for m in task[rule] if task[used][m] != task[rule][m]), None)


def _closeness(reference: list[tuple[Any, Any]], cand: Any, metrics: dict[str, Any],
               outputs: list[Any]) -> tuple[dict[str, float], float, dict[str, bool]]:
    """How close a candidate stays to FP32 on `reference` ((feed, FP32 outputs) pairs): its declared task metrics
    (output/metric -> value; metrics whose direction is not known are left out), its mean relative L2 error, and
    whether each metric is better higher (trtflow's own, or as a callable's declaration says)."""
    cmp = Comparison(metrics, None, "calibrate")
    errors: list[float] = []
    for feed, r in reference:
        g = ort_runner.run(cand, feed)
        cmp.add(r, g, feed)
        errors += ort_runner.relative_errors(r, g)
    acc = cmp.result(simulation.SIMULATION["int8"])
    task, higher = {}, {}
    for out in (o.name for o in outputs if declared(metrics, o.name)):
        values = acc.outputs[out].task_values if out in acc.outputs else {}
        for name, up in gate.directions(out, list(values), {}, metrics).items():
            task[f"{out}/{name}"], higher[f"{out}/{name}"] = values[name], up
    return task, float(np.mean(errors)) if errors else 0.0, higher


def _excluded_nodes(model: Any, params: CalibrateStage, small: bool, depthwise: bool) -> dict[str, str]:
    names = [n.name for n in model.graph.node if n.name]
    for name in params.exclude_nodes:
        if name not in names:
            raise StageError(f"calibrate: exclude_nodes: no node named '{name}'{did_you_mean(name, names)}")
    require_op_types(model, params.exclude_ops, "calibrate: exclude_ops")
    excluded = qdq.left_in_float(model, params.quantize_ops, params.float_attention, small, depthwise)
    if params.min_weight_params:
        sizes = {i.name: int(np.prod(i.dims)) for i in model.graph.initializer}
        excluded.update({n.name: f"fewer than {params.min_weight_params} weight parameters (min_weight_params)"
                         for n in model.graph.node if n.op_type in params.quantize_ops
                         and max((sizes.get(t, 0) for t in n.input[:2]), default=0) < params.min_weight_params})
    excluded.update({n.name: f"exclude_ops: {n.op_type}" for n in model.graph.node if n.op_type in params.exclude_ops})
    excluded.update({name: "exclude_nodes" for name in params.exclude_nodes})
    return excluded | offload.kept_float(model)


# the recipe's own exclusions and the setting that turns each off
RECIPE_SWITCHES = {qdq.ATTENTION: "float_attention: false", qdq.SMALL_CONV: "float_small_ops: false",
                   qdq.SMALL_GEMM: "float_small_ops: false", qdq.DEPTHWISE_CONV: "float_depthwise: false"}


def _left_in_float(quantized: onnx.ModelProto, quantize_ops: list[str], why: dict[str, str]) -> dict[str, str]:
    """Every node of the quantized op types that reads no DequantizeLinear in the written model, and why."""
    dq = {o for n in quantized.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name: why.get(n.name, "ONNX Runtime's quantizer did not quantize it (no quantizable input)")
            for n in quantized.graph.node
            if n.op_type in quantize_ops and not any(t in dq for t in n.input)}


def write_trt_cache(ranges: Path, out: Path, version: str | None = None) -> Path:
    """The TensorRT <= 10 implicit-quantization calibration cache: a header line, then
    `tensor: <big-endian hex of the float32 scale>` with scale = amax / 127."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    if version is None:
        from trtflow.stages.trt.env import find_tensorrt
        trt = find_tensorrt()
        version = "100000"
        if trt and trt.flavour == "tensorrt" and trt.major in (8, 9, 10):
            major, minor, patch = (trt.version.split(".") + ["0", "0"])[:3]
            version = str(int(major) * (1000 if int(major) < 10 else 10000) + int(minor) * 100 + int(patch))
    lines = [f"TRT-{version}-EntropyCalibration2"]
    data = load_tensors_data(ranges)
    for name, td in sorted(data.data.items()):
        lo, hi = (float(np.asarray(v).max()) if np.size(v) == 1 else float(np.abs(v).max()) for v in td.range_value)
        amax = max(abs(lo), abs(hi))
        scale = amax / 127.0 if amax > 0 else 1.0 / 127.0
        lines.append(f"{name}: {struct.pack('>f', scale).hex()}")
    out.write_text("\n".join(lines) + "\n")
    return out


CODE = StageCode(run, report=CalibrateReport)  # what the flow reaches the kind through (trtflow/stage_code.py)
