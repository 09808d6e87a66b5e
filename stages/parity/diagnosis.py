"""Why deploy and training preprocessing differ: the usual causes, alone or combined, that bring them into agreement.

A bounded beam search over the changes of `causes.candidates`: each round applies every usual change to each kept
set of steps, keeps the `BEAM` results with the smallest difference, and stops at the first round where a change
brings every sample within tolerance, after at most `ROUNDS` rounds. A single cause is found in round one; two
mistakes at once (a deploy pipeline written from memory) in round two. Cost: at most ROUNDS x BEAM x (changes that
apply, about 30) runs of the steps on the few worst images, intermediate images shared between runs. The fix is the
chain of changes, with the difference after each, and the full corrected `deploy:` YAML. What it finds is a
`Diagnosis`, a record of the report's (`report.py`).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from trtflow.errors import StageError
from trtflow.pipelines.params.parity import ParityTolerances
from trtflow.stages.image.preprocess import read_image
from trtflow.stages.image.steps import Normalize, Read, Scale, Step, Steps, apply
from trtflow.stages.parity.causes import candidates
from trtflow.stages.parity.report import ChainStep, Declared, Diagnosis, PixelMetrics, Search, Tried, passes
from trtflow.yaml_text import YamlLines, scalar

ROUNDS = 3  # at most this many changes combined
BEAM = 3  # sets of steps kept from one round to the next
CACHE_BYTES = 256 << 20  # intermediate images kept while searching


def align(deploy: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop leading batch dimensions of size 1 so the two can be compared: down to the other side's rank, and
    both down to one image (3-D) where both are batched (deploy `batch: true` against cv2.dnn.blobFromImage)."""
    while deploy.ndim > train.ndim and deploy.shape[0] == 1:
        deploy = deploy[0]
    while train.ndim > deploy.ndim and train.shape[0] == 1:
        train = train[0]
    while deploy.ndim > 3 and deploy.shape[0] == 1 and train.shape[0] == 1:
        deploy, train = deploy[0], train[0]
    return deploy, train


def pixel_metrics(deploy: np.ndarray, train: np.ndarray) -> PixelMetrics:
    d, t = align(np.asarray(deploy, np.float64), np.asarray(train, np.float64))
    if d.shape != t.shape:
        return PixelMetrics(shape_ok=False, deploy_shape=list(d.shape), training_shape=list(t.shape),
                            max_abs=float("inf"), mean_abs=float("inf"), psnr=0.0)
    diff = np.abs(d - t)
    mse = float(np.mean(diff ** 2))
    data_range = float(t.max() - t.min()) or 1.0
    psnr = float("inf") if mse == 0 else 10 * np.log10(data_range ** 2 / mse)
    return PixelMetrics(shape_ok=True, shape=list(d.shape), max_abs=float(diff.max()), mean_abs=float(diff.mean()),
                        psnr=psnr)


class PrefixRunner:
    """Runs sets of steps on the sample images, reusing the intermediate images of the steps a set shares with
    sets run before: most changes touch one late step, and decoding and resampling are the costly part."""

    def __init__(self, budget: int = CACHE_BYTES):
        self.cache: OrderedDict[tuple[str, tuple[Step, ...]], tuple[np.ndarray, str]] = OrderedDict()
        self.budget, self.used = budget, 0

    def __call__(self, path: Any, steps: Steps) -> np.ndarray:
        keys = [(str(path), tuple(steps[:k + 1])) for k in range(len(steps))]
        start = 0
        for k in range(len(steps) - 1, -1, -1):
            if keys[k] in self.cache:
                self.cache.move_to_end(keys[k])
                img, layout = self.cache[keys[k]]
                start = k + 1
                break
        if start == 0:
            read = steps[0]
            if not isinstance(read, Read):
                raise StageError("'read' must be the first preprocessing step")
            img, layout = read_image(path, read.color, read.depth), "hwc"
            self._put(keys[0], img, layout)
            start = 1
        for k in range(start, len(steps)):
            img, layout = apply(img, steps[k], layout)
            self._put(keys[k], img, layout)
        return img

    def _put(self, key: tuple[str, tuple[Step, ...]], img: np.ndarray, layout: str) -> None:
        if key in self.cache or img.nbytes > self.budget:
            return
        self.cache[key] = (img, layout)
        self.used += img.nbytes
        while self.used > self.budget:
            _, (old, _) = self.cache.popitem(last=False)
            self.used -= old.nbytes


@dataclass(frozen=True)
class _Evaluation:
    """One set of steps run on the samples: within tolerance on all (`ok`), the worst differences and the score
    the search ranks by; or the error the steps raise on these images."""
    ok: bool = False
    mean_abs: float | None = None
    max_abs: float | None = None
    score: tuple[int, float, float] | None = None
    error: str | None = None


@dataclass
class _State:
    steps: Steps
    chain: list[ChainStep] = field(default_factory=list)
    score: tuple[int, float, float] = (0, 0.0, float("inf"))
    ok: bool = False
    conventional: bool = False


def diagnose(steps: Steps, samples: list[tuple[Any, np.ndarray]], tol: ParityTolerances,
             rounds: int = ROUNDS, beam: int = BEAM) -> Diagnosis:
    """Search the usual causes, alone then combined, on the (worst) samples; the shortest chain of changes that
    brings every sample within tolerance, the lowest difference first, is the diagnosis."""
    t0 = time.perf_counter()
    run = PrefixRunner()
    evaluations = 0

    def evaluate(changed: Steps) -> _Evaluation:
        nonlocal evaluations
        evaluations += 1
        try:
            metrics = [pixel_metrics(run(path, changed), train) for path, train in samples]
        except (StageError, cv2.error, ValueError) as exc:  # e.g. a crop larger than the image after the change
            return _Evaluation(error=str(exc).splitlines()[0])
        worst = max(metrics, key=lambda m: m.mean_abs)
        finite = [m.mean_abs for m in metrics if m.shape_ok]
        return _Evaluation(ok=all(passes(m, tol) for m in metrics), mean_abs=worst.mean_abs,
                           max_abs=max(m.max_abs for m in metrics),
                           score=(sum(not m.shape_ok for m in metrics), sum(_shape_gap(m) for m in metrics),
                                  max(finite) if finite else float("inf")))

    first = evaluate(steps)
    start = _State(steps, score=first.score or (len(samples), float("inf"), float("inf")))
    kept, seen, tried = [start], {tuple(steps)}, []
    found: _State | None = None
    done = 0
    for depth in range(1, rounds + 1):
        done = depth
        children = []
        for state in kept:
            for cause, fix, changed in candidates(state.steps):
                key = tuple(changed)
                if key in seen:
                    continue
                seen.add(key)
                ev = evaluate(changed)
                if depth == 1:
                    tried.append(Tried(cause=cause, fix=fix, ok=ev.ok, mean_abs=ev.mean_abs, max_abs=ev.max_abs,
                                       error=ev.error))
                if ev.error is not None:
                    continue
                step = ChainStep(cause=cause, fix=fix, mean_abs=ev.mean_abs, max_abs=ev.max_abs)
                children.append(_State(changed, state.chain + [step], ev.score, ev.ok, _conventional(changed)))
        # Scaling pixels by 1/255 and scaling mean/std by 255 can be equally exact fixes: prefer the one that
        # keeps the usual convention (pixels in 0..1, mean/std on that scale), which is what training code does.
        children.sort(key=lambda s: (s.score[0], round(s.score[1], 6), round(s.score[2], 6), not s.conventional))
        passing = [s for s in children if s.ok]
        if passing:
            found = passing[0]
            break
        # the smallest differences go on, even one that shrinks nothing while fewer than `beam` do: a change of
        # structure (aspect ratio kept, then padded) can need its second change before it helps
        kept = children[:beam]
        if not kept:
            break

    tried.sort(key=lambda t: (not t.ok, round(t.mean_abs if t.mean_abs is not None else float("inf"), 6)))
    result = Diagnosis(declared=Declared(mean_abs=first.mean_abs, max_abs=first.max_abs), tried=tried,
                       search=Search(rounds=done, max_rounds=rounds, beam=beam, evaluations=evaluations,
                                     images=len(samples), seconds=round(time.perf_counter() - t0, 3)))
    if found:
        result.chain, result.steps, result.yaml = found.chain, found.steps, to_yaml(found.steps)
        result.cause, result.fix = ", then ".join(s.cause for s in found.chain), _and([s.fix for s in found.chain])
    return result


def _shape_gap(m: PixelMetrics) -> float:
    """How far apart two shapes are (0 when equal): while shapes differ, the change that brings them closer (1
    channel -> 3, then HWC -> CHW) is the one to keep."""
    if m.shape_ok or m.deploy_shape is None or m.training_shape is None:
        return 0.0
    d, t = m.deploy_shape, m.training_shape
    if len(d) != len(t):
        return 100.0
    return float(sum(abs(np.log(a / b)) for a, b in zip(d, t)))


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _conventional(steps: Steps) -> bool:
    scale = next((s for s in steps if isinstance(s, Scale)), None)
    norm = next((s for s in steps if isinstance(s, Normalize)), None)
    scaled = scale is not None and abs(scale.factor - 1 / 255) < 1e-9
    return scaled and (norm is None or all(0 <= m <= 1 for m in norm.mean))


def friendly(steps: Steps) -> list[dict[str, Any]]:
    """Steps in the form people write them."""
    return [{step.name: step.friendly()} for step in steps]


def to_yaml(steps: Steps) -> str:
    """The deploy steps to paste into the parity stage, by the one writer of YAML a person runs."""
    w = YamlLines()
    w.add("deploy:")
    for step in friendly(steps):
        w.add(f"  - {scalar(step, interpolated=True)}")
    return w.text()
