"""How each output's users judge it, guessed from its shape and the op that makes it: the task metrics of
validate (and of the FP16/INT8 pre-flights). An output that could be judged two ways is refused, naming `--task`."""
from __future__ import annotations

from dataclasses import dataclass

from trtflow.errors import SpecError
from trtflow.metrics.builtin.ctc import CTCMetric
from trtflow.metrics.builtin.decision import DecisionMetric
from trtflow.metrics.builtin.detections import DetectionsMetric
from trtflow.metrics.builtin.embedding import EmbeddingMetric
from trtflow.metrics.builtin.image import ImageMetric
from trtflow.metrics.builtin.map_iou import MapMetric
from trtflow.metrics.builtin.regression import RegressionMetric
from trtflow.metrics.builtin.topk import TopKMetric
from trtflow.metrics.outputs import OutputMetrics
from trtflow.pipelines.init import LAYOUTS, TASKS
from trtflow.pipelines.init.model import ModelFacts, Tensor

PROBABILITIES = ("Softmax", "LogSoftmax", "Sigmoid")
CLASS_WORDS = ("logit", "prob", "class", "cls", "score", "pred")
EMBEDDING_WORDS = ("embed", "feat", "vector", "descriptor", "pooler", "hidden")
MAP_THRESHOLD = {"segment": 0.5, "ocr-det": 0.3}  # ocr-det: PaddleOCR's DB box threshold
# values per sample up to which a float output with no class semantics (no Softmax or Sigmoid, not named as classes
# or an embedding) is taken for a regression: MOS scores, a box, a pose; more are class logits or an embedding
SMALL = 8
OTHER = "other: no task metric, each output judged by one cosine with FP32's pooled over every sample"
REGRESS = "regress: values judged by their errors against FP32's, in the output's own units"


@dataclass(frozen=True)
class Judgement:
    """One output: its task and metrics (None: judged by one cosine pooled over every sample), and why, for the
    comment."""
    output: Tensor
    task: str | None
    metrics: OutputMetrics | None
    why: str


@dataclass(frozen=True)
class TaskPlan:
    judged: tuple[Judgement, ...]

    def metrics(self) -> dict[str, OutputMetrics]:
        return {j.output.name: j.metrics for j in self.judged if j.metrics is not None}

    def tasks(self) -> list[str]:
        return list(dict.fromkeys(j.task for j in self.judged if j.task))


class _Ambiguous(Exception):
    def __init__(self, why: str, choices: tuple[str, ...], flag: str = "--task") -> None:
        super().__init__(why)
        self.why, self.choices, self.flag = why, choices, flag


def guess(model: ModelFacts, task: str | None, layout: str | None) -> TaskPlan:
    """Every output's judgement; refused (SpecError naming every flag it needs, at once) where outputs are
    ambiguous, where no output says its task, or where --task fits none."""
    judged, unclear = [], []
    images_in = any(_image_shaped(t) for t in model.inputs)
    for out in model.outputs:
        try:
            judged.append(_judge(out, task, layout, images_in))
        except _Ambiguous as amb:
            unclear.append((out, amb))
    if unclear:
        said = "; ".join(f"output '{out.name}' {out.shown()}: {amb.why}" for out, amb in unclear)
        flags: dict[str, list[str]] = {}
        for _, amb in unclear:
            choices = amb.choices + (("other",) if amb.flag == "--task" and "other" not in amb.choices else ())
            flags.setdefault(amb.flag, [])
            flags[amb.flag] += [c for c in choices if c not in flags[amb.flag]]
        hint = ", and ".join(" or ".join(f"{flag} {c}" for c in choices) for flag, choices in flags.items())
        if "--task" in flags:
            hint += f"; {REGRESS}; {OTHER}"
        if "--layout" in flags:
            hint += "; a head of another layout: metrics.<output>.detections.decode: package.module:function"
        lead = "cannot tell the task" if "--task" in flags else "cannot tell the layout"
        raise SpecError(f"{lead}: {said}", hint=f"give {hint}")
    plan = TaskPlan(tuple(judged))
    if task not in (None, "other") and not plan.metrics():
        extra = ("; a detector whose head is no YOLO layout: --task other, then declare "
                 "metrics.<output>.detections.decode: package.module:function (docs/pipeline.md)"
                 if task == "detect" else "")
        raise SpecError(f"--task {task} fits no output of the model ("
                        + "; ".join(f"'{o.name}' {o.shown()}" for o in model.outputs) + ")",
                        hint=f"give another --task ({', '.join(TASKS)}); {OTHER}" + extra)
    if task is None and not plan.metrics():
        raise SpecError("cannot tell the task from the model's outputs ("
                        + "; ".join(f"'{j.output.name}' {j.output.shown()}: {j.why}" for j in judged) + ")",
                        hint=f"give --task ({', '.join(TASKS)}); {REGRESS}; {OTHER}")
    return plan


def _named(out: Tensor, words: tuple[str, ...]) -> bool:
    return any(w in out.name.lower() for w in words)


def _classify(out: Tensor, why: str) -> Judgement:
    classes = out.dims[-1] if out.rank > 1 else 1
    if classes == 1:
        return _score(out)
    k = 5 if isinstance(classes, int) and classes > 5 else 1
    what = "top-1 and top-5 agreement" if k == 5 else "top-1 agreement"
    return Judgement(out, "classify", OutputMetrics(topk=TopKMetric(k=k)), f"{why}: {what} with FP32")


def _score(out: Tensor) -> Judgement:
    """One score per sample: a top-1 over one class agrees whatever the candidate gives, so its decision at a
    threshold (a probability's 0.5, a logit's 0) and its error."""
    threshold = 0.5 if out.producer == "Sigmoid" or _named(out, ("prob",)) else 0.0
    said = f"a probability{' from a Sigmoid' if out.producer == 'Sigmoid' else ''}" if threshold else "a logit"
    return Judgement(out, "classify", OutputMetrics(decision=DecisionMetric(threshold=threshold),
                                                    regression=RegressionMetric()),
                     f"{out.shown()} one score per sample, {said}: the share of samples decided as FP32 decides "
                     f"them at {threshold} (set decision.threshold to yours), and the score's error against FP32's "
                     f"(regression)")


def _regress(out: Tensor, why: str) -> Judgement:
    return Judgement(out, "regress", OutputMetrics(regression=RegressionMetric()),
                     f"{why}: a regression, judged by its errors against FP32's in the output's own units (worst and "
                     f"mean absolute error, per element and per sample); set regression.within to the largest error "
                     f"its users accept, in those units (unset: at most 0.1% / 1% / 5% of the reference's spread "
                     f"over the samples for FP32 / FP16 / INT8)")


def _embed(out: Tensor, why: str, pool: str = "none") -> Judgement:
    metric = EmbeddingMetric(pool="mean") if pool == "mean" else EmbeddingMetric()
    return Judgement(out, "embed", OutputMetrics(embedding=metric),
                     f"{why}: each sample's embedding cosine with FP32")


def _image_shaped(t: Tensor) -> bool:
    """[N, 1 or 3, H, W] or [N, H, W, 1 or 3] float: an image (as a model takes or makes one)."""
    return t.rank == 4 and t.is_float() and (t.dims[1] in (1, 3) or t.dims[3] in (1, 3))


def _image(out: Tensor, why: str) -> Judgement:
    layout = "nchw" if out.dims[1] in (1, 3) else "nhwc"
    return Judgement(out, "image", OutputMetrics(image=ImageMetric(layout=layout)),
                     f"{why}: PSNR, pixels within one level (of 255) and SSIM against FP32's image; its values are "
                     f"taken as 0..1 (set image.range to the output's, e.g. [0, 255])")


def _judge(out: Tensor, task: str | None, layout: str | None, images_in: bool = False) -> Judgement:
    plain = Judgement(out, None, None, "no task metric: judged by one cosine with FP32's, pooled over every sample")
    if task == "image":
        return _image(out, f"{out.shown()} an image (--task image)") if _image_shaped(out) else plain
    if task == "other" or not out.is_float():
        return plain if task == "other" else Judgement(out, None, None, f"{out.dtype}: {plain.why}")
    if task == "regress":
        return _regress(out, f"{out.shown()} values (--task regress)")
    if out.rank in (1, 2):
        return _rank2(out, task) or plain
    if out.rank == 3:
        return _rank3(out, task, layout) or plain
    if out.rank == 4:
        return _rank4(out, task, images_in) or plain
    return Judgement(out, None, None, f"rank {out.rank}: {plain.why}")


def _rank2(out: Tensor, task: str | None) -> Judgement | None:
    made = f" from a {out.producer}" if out.producer else ""
    if task == "classify":
        return _classify(out, f"[N, C] scores{made}")
    if task == "embed":
        return _embed(out, f"[N, D] vectors{made}")
    if task is not None:
        return None
    if out.producer in PROBABILITIES:
        return _classify(out, f"[N, C] class probabilities{made}")
    if out.normalized:
        return _embed(out, f"[N, D] vectors divided by their L2 norm{made}")
    if _named(out, CLASS_WORDS):
        return _classify(out, f"[N, C] class scores (named so){made}")
    if _named(out, EMBEDDING_WORDS):
        return _embed(out, f"[N, D] vectors (named so){made}")
    values = out.dims[1] if out.rank == 2 else 1
    if isinstance(values, int) and values <= SMALL:
        return _regress(out, f"{out.shown()} values{made}, no class semantics (no Softmax or Sigmoid, not named as "
                             f"classes; class logits: --task classify)")
    raise _Ambiguous(f"[N, C] values{made}, class logits or an embedding", ("classify", "embed"))


def _rank3(out: Tensor, task: str | None, layout: str | None) -> Judgement | None:
    softmax_last = out.producer in ("Softmax", "LogSoftmax") and out.producer_axis == 2
    if task == "ocr-rec" or (task is None and softmax_last):
        return Judgement(out, "ocr-rec", OutputMetrics(ctc=CTCMetric(blank=0)),
                         f"[N, T, C] per-step class scores{' from a Softmax' if softmax_last else ''}, a CTC text "
                         f"recognizer (blank 0, as PaddleOCR): decoded text exact and character error rate vs FP32")
    if task == "embed":
        return _embed(out, "[N, T, D] token vectors, mean-pooled", pool="mean")
    if task == "detect" or (task is None and _looks_like_head(out)):
        return _detections(out, layout)
    if task is not None:
        return None
    raise _Ambiguous("[N, A, B] values: a text recognizer's steps, a detection head or token vectors",
                     ("ocr-rec", "detect", "embed"))


def _looks_like_head(out: Tensor) -> bool:
    """[N, 4+C, A] or [N, A, 5+C] with many anchors: a YOLO head."""
    a, b = out.dims[1], out.dims[2]
    return isinstance(a, int) and isinstance(b, int) and max(a, b) >= 1000 and 6 <= min(a, b) < 1000


def _detections(out: Tensor, layout: str | None) -> Judgement:
    a, b = out.dims[1], out.dims[2]
    if layout is None:
        if not (isinstance(a, int) and isinstance(b, int)):
            raise _Ambiguous("a detection head whose layout its dynamic dimensions do not tell", LAYOUTS, "--layout")
        if b == 6:
            raise _Ambiguous("boxes after the model's own NMS (x1, y1, x2, y2, score, class) or a YOLOv5 head of one "
                             "class", ("end2end", "yolov5"), "--layout")
        if b > a:
            layout = "yolov8"
        else:
            raise _Ambiguous(f"a YOLOv5 head ({b} = 5 + {b - 5} classes) or a transposed YOLOv8 head (4 + {b - 4} "
                             f"classes)", ("yolov5", "yolov8"), "--layout")
    why = {"yolov5": "[N, A, 5+C]: cx, cy, w, h, objectness, class scores",
           "yolov8": "[N, 4+C, A]: cx, cy, w, h, class scores per anchor",
           "end2end": "[N, K, 6]: boxes after the model's own NMS"}[layout]
    return Judgement(out, "detect", OutputMetrics(detections=DetectionsMetric(layout=layout)),
                     f"a detection head, {layout} {why}: boxes matched to FP32's (recall, precision, IoU)")


def _rank4(out: Tensor, task: str | None, images_in: bool) -> Judgement | None:
    channels = out.dims[1]
    if task not in (None, "segment", "ocr-det"):
        return None
    sigmoid = out.producer == "Sigmoid"
    softmax = out.producer in ("Softmax", "LogSoftmax") and out.producer_axis == 1
    if task is None and images_in and channels == 3 and not softmax and not sigmoid:
        return _image(out, "[N, 3, H, W] from an image input: an image (super-resolution, restoration)")
    if channels == 1:
        if task is None and not sigmoid:
            raise _Ambiguous(f"[N, 1, H, W] values from a {out.producer or 'graph input'}, not probabilities: a map "
                             f"of logits, a one-channel image, or neither",
                             ("segment", "ocr-det", "image", "other") if images_in else ("segment", "ocr-det", "other"))
        kind = task or "segment"
        threshold = MAP_THRESHOLD[kind] if sigmoid else 0.0
        said = f"probabilities from a Sigmoid, regions above {threshold}" if sigmoid else \
            f"logits, regions above {threshold} (probability 0.5)"
        if task is None:
            said += " (PaddleOCR's text detector marks text above 0.3: --task ocr-det)"
        return Judgement(out, kind, OutputMetrics(map_iou=MapMetric(threshold=threshold)),
                         f"[N, 1, H, W] map of {said}: IoU of the regions with FP32's")
    if isinstance(channels, int) and (softmax or task == "segment"):
        classes = list(range(1, min(channels, 1001)))
        return Judgement(out, "segment", OutputMetrics(map_iou=MapMetric(classes=classes, axis=1)),
                         f"[N, C, H, W] class scores{' from a Softmax' if softmax else ''}: each pixel's class is "
                         f"the argmax; IoU per class with FP32's (classes 1..{channels - 1}: 0 taken as background)")
    if task is None:
        raise _Ambiguous(f"[N, {channels}, H, W] values from a {out.producer or 'graph input'}: class scores of a "
                         f"segmentation, or feature maps", ("segment", "other"))
    return None
