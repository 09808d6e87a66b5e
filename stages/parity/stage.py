"""Stage `parity`: the declared deploy preprocessing, checked against the training transforms.

Writes the resolved preprocessing (`preprocess.json`, the one source of truth later stages run), compares it with
the training reference on the sample images (pixels and, when a model is at hand, the model's outputs), and when
they disagree names the usual cause, or the combination of usual causes, that brings them into agreement, checks
that fix on every image (and on the model's predictions) and prints the corrected YAML.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from trtflow import phases
from trtflow.artifact import Artifact, Inputs, StageResult
from trtflow.errors import StageError, StageFailed
from trtflow.metrics.builtin.topk import TopK
from trtflow.pipelines.params.parity import ParityStage, ParityTolerances
from trtflow.stage_code import StageCode
from trtflow.stages.compare.accuracy import OutputStats
from trtflow.stages.image import preprocess
from trtflow.stages.image.headers import check_images
from trtflow.stages.image.steps import Steps
from trtflow.stages.parity import diagnosis as dx
from trtflow.stages.parity import training_ref
from trtflow.stages.parity.picture import worst_picture
from trtflow.stages.parity.report import (
    AfterFix,
    ChannelStats,
    Diagnosis,
    ModelParity,
    ParityReport,
    Prediction,
    passes,
)

VERSION = "3"  # 2: combined diagnosis, per-image predictions, the fix checked on every image. 3: every image's
# metrics with all their fields (typed)
DIAGNOSIS_SAMPLES = 4


def run(params: ParityStage, inputs: Inputs, out_dir: Path) -> StageResult:
    images = inputs.many("images")[: params.max_images]
    check_images([a.path for a in images], "parity: images")
    steps = preprocess.canonical(params.deploy)
    pre = preprocess.Preprocessor(steps)
    train_fn, train_label = training_ref.build(params.training, inputs.many("training_tensors"), images)

    rows, tensors = [], []
    for art in images:
        with phases.phase(phases.IMAGES):
            d = pre(art.path)
        t = train_fn(art.path)
        m = dx.pixel_metrics(d, t)
        m.image, m.channels = art.path.name, _channel_stats(d, t) if m.shape_ok else None
        rows.append(m)
        tensors.append((art.path, d, t))
    tol = params.tolerances
    passed = [passes(m, tol) for m in rows]

    pixel_ok = all(passed)
    diagnosis = None
    if not pixel_ok:
        order = sorted(range(len(rows)), key=lambda i: -rows[i].mean_abs)[:DIAGNOSIS_SAMPLES]
        diagnosis = dx.diagnose(steps, [(tensors[i][0], tensors[i][2]) for i in order], tol)

    model_check = None
    if "model" in inputs:
        model_check = _model_check(inputs.one("model").path, tensors, rows, tol, diagnosis)
    model_ok = model_check is None or model_check.ok
    if diagnosis and diagnosis.steps:
        diagnosis.after_fix = _after_fix(diagnosis.steps, tensors, inputs.optional("model"), tol)

    worst = max(range(len(rows)), key=lambda i: rows[i].mean_abs)
    picture = None
    if rows[worst].shape_ok:
        picture = worst_picture(tensors[worst][1], tensors[worst][2], out_dir / "worst.png",
                                title=f"{rows[worst].image}: deploy | training | |difference|")

    preprocess.save(steps, out_dir / "preprocess.json")
    report = ParityReport(verdict="pass" if pixel_ok and model_ok else "fail", preprocess_digest=pre.digest,
                          steps=steps, runtimes={"deploy": f"opencv {cv2.__version__}", "training": train_label},
                          tolerances=tol, images=rows, model=model_check, diagnosis=diagnosis,
                          worst_image=rows[worst].image)
    (out_dir / "report.json").write_text(json.dumps(report.model_dump(), indent=2, default=_json) + "\n")
    outputs = {"preprocess": out_dir / "preprocess.json", "report": out_dir / "report.json",
               **({"picture": picture} if picture else {})}
    summary = report.summary(picture)
    finite = [r.mean_abs for r in rows if r.shape_ok]
    metrics = {"images": len(rows), "failing_images": passed.count(False),
               "worst_mean_abs": max(finite) if finite else None,
               "top1_agreement": model_check.top1 if model_check else None}
    result = StageResult(outputs=outputs, summary=summary, metrics=metrics)

    if pixel_ok and model_ok:
        return result
    message = report.failure_line()
    if params.on_mismatch == "warn":
        result.warnings.append(message)
        return result
    raise StageFailed(message, result)


def _channel_stats(d: np.ndarray, t: np.ndarray) -> list[ChannelStats]:
    d, t = dx.align(d, t)
    axis = 0 if d.ndim == 3 and d.shape[0] <= 4 else -1
    n = d.shape[axis] if d.ndim == 3 else 1
    stats = []
    for c in range(n):
        dc = np.take(d, c, axis=axis) if d.ndim == 3 else d
        tc = np.take(t, c, axis=axis) if t.ndim == 3 else t
        stats.append(ChannelStats(deploy_mean=float(dc.mean()), training_mean=float(tc.mean()),
                                     deploy_std=float(dc.std()), training_std=float(tc.std())))
    return stats


def _after_fix(steps: Steps, tensors: list, model: Artifact | None, tol: ParityTolerances) -> AfterFix:
    """The suggested fix run on every image (the search looked at the worst few), and the model on its tensors."""
    pre = preprocess.Preprocessor(steps)
    fixed = [(path, pre(path), t) for path, _, t in tensors]
    rows = [dx.pixel_metrics(d, t) for _, d, t in fixed]
    out = AfterFix(images=len(rows), passing=sum(passes(m, tol) for m in rows),
                      worst_mean_abs=max(m.mean_abs for m in rows), worst_max_abs=max(m.max_abs for m in rows))
    if model is not None and out.passing == out.images:
        try:
            out.model = _model_check(model.path, fixed, rows, tol)
        except StageError as exc:  # the training tensors themselves do not fit the model: said, not raised here
            out.model = ModelParity(ran=False, reason=str(exc))
    return out


def _model_check(model: Path, tensors: list, rows: list, tol: ParityTolerances,
                 diagnosis: Diagnosis | None = None) -> ModelParity:
    """The model's outputs on the deploy tensors vs on the training tensors (ONNX Runtime, CPU)."""
    from trtflow.stages.ort.runner import PARITY, RUNTIME, fit_to_input, session

    sess = session(model, role=PARITY)
    inp = sess.get_inputs()[0]
    want = list(inp.shape)
    first = tensors[0][1]
    if fit_to_input(first, inp) is None:
        while first.ndim < len(want):
            first = first[None]
        shape = list(first.shape)
        if len(want) == 4 and len(shape) == 4 and isinstance(want[1], int) and shape[1] != want[1] \
                and shape[1] in (1, 3) and want[1] in (1, 3):
            fix = (diagnosis.fix if diagnosis else None) or f"read: {'rgb' if want[1] == 3 else 'gray'}"
            raise StageError(f"the preprocessed images have {shape[1]} channel(s) but the model's input "
                             f"'{inp.name}' wants {want[1]} ({fix} fixes it)")
        raise StageError(f"the preprocessed shape {shape} does not fit the model's input "
                         f"'{inp.name}' {want}; fix the resize/crop/layout/batch steps")
    deploy_in = [fit_to_input(d, inp) for _, d, _ in tensors]
    out_name = sess.get_outputs()[0].name
    stats = OutputStats()  # the training side is the reference
    predictions = []
    for (path, _, t), d_in in zip(tensors, deploy_in):
        t_in = fit_to_input(t, inp)
        if t_in is None or t_in.shape != d_in.shape:
            return ModelParity(ran=False, reason="deploy and training tensors have different shapes", ok=False)
        a = sess.run([out_name], {inp.name: d_in})[0]
        b = sess.run([out_name], {inp.name: t_in})[0]
        stats.add(b, a)
        if a.ndim == 2 and a.shape[1] > 1 and a.shape[0] == 1:  # per image: what a trained model makes of each side
            predictions.append(Prediction(image=Path(path).name, training=int(b[0].argmax()),
                                             deploy=int(a[0].argmax()), training_score=float(b[0].max()),
                                             deploy_score=float(a[0].max())))
    result = ModelParity(ran=True, runtime=RUNTIME, output=out_name, max_abs_diff=stats.max_abs)
    top = next((m for m in stats.task or [] if isinstance(m, TopK) and m.rows), None)
    if top is not None:  # a classifier's scores: top-1 and top-5 agreement
        result.top1, result.top5, result.predictions = top.top1 / top.rows, top.topk / top.rows, predictions
        result.ok = tol.top1 is None or result.top1 >= tol.top1
    return result


def _json(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


CODE = StageCode(run, report=ParityReport)  # what the flow reaches the kind through (trtflow/stage_code.py)
