"""Validate's measuring step: the FP32 reference (run once per sample, whatever the candidates), the shape sets
a candidate is checked at (a profile's min/opt/max, data made into each), and one candidate's outputs against the
reference's over every sample: per shape set, its worst samples, its errors for the histogram, and its count
against the labels."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from trtflow import progress
from trtflow.artifact import Inputs
from trtflow.errors import StageError
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.compare import labels as labels_mod
from trtflow.stages.compare.accuracy import Comparison
from trtflow.stages.compare.tensor_stats import TensorStats
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.graph import name_nodes, output_floors
from trtflow.stages.ort import memory
from trtflow.stages.ort import runner as ort_runner
from trtflow.stages.ort.references import References
from trtflow.stages.ort.runner import FP32, session
from trtflow.stages.ort.samples import Feeds, SampleSource
from trtflow.stages.trt.engines import Candidate
from trtflow.stages.validate import labelling

ERROR_SAMPLE = 200_000  # absolute errors kept per output for the histogram


@dataclass
class ReferenceModel:
    """The FP32 reference: its model (nodes named as the precision stage names them, so node names agree), its
    file and session, and its outputs per sample, computed once however many candidates are checked."""
    model: onnx.ModelProto
    path: Path
    session: Any
    floors: dict[str, float]  # output -> its least scale (onnx.graph.output_floors)
    kept: References  # its outputs on a feed, computed once across stages and runs
    outputs: dict[tuple[str, str, int], dict[str, np.ndarray]] = field(default_factory=dict)

    def run(self, feed: Feeds, source: SampleSource) -> dict[str, np.ndarray]:
        """The reference's outputs on `feed`; inputs it cannot run on named with the fix (`source.failure`)."""
        try:
            return self.kept.outputs(feed, lambda f: ort_runner.run(self.session, f))
        except StageError:  # the memory budget's refusal (memory.py): one line naming the shape already
            raise
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own exception types
            raise source.failure(exc) from None

    def comparing(self, shapes: dict[str, list[int]]) -> int:
        """What comparing a candidate's outputs with the reference's takes at these input shapes (memory.py)."""
        graph = memory.graph_of(self.session)
        return memory.COMPARISON * graph.bound(shapes).outputs if graph is not None else 0

    @classmethod
    def load(cls, inputs: Inputs, work: Path) -> "ReferenceModel":
        source = inputs.one("reference")
        model = model_io.load(source.path)
        name_nodes(model)
        path = work / "reference.onnx"
        model_io.save(model, path)
        return cls(model, path, session(path, role=FP32), output_floors(model), References.of(inputs, source))


@dataclass
class Scoring:
    """Counting against the labels during one candidate's pass: the candidate's tally, and the FP32 reference's
    (only in the first candidate's pass: the reference's outputs are every candidate's)."""
    candidate: labelling.Tally
    reference: labelling.Tally | None


@dataclass
class Measured:
    """A candidate against the reference: over every sample, per shape set, the input shapes seen per shape set,
    and a bounded sample of the absolute errors per output (for the histogram)."""
    total: Comparison
    per_set: list[Comparison] = field(default_factory=list)
    shapes: list[list[dict[str, list[int]]]] = field(default_factory=list)
    errors: dict[str, list[np.ndarray]] = field(default_factory=dict)


def measure(runner: Callable[[Feeds, int], dict[str, np.ndarray]], sets: list[ShapeSet], reference: ReferenceModel,
             metrics: dict[str, Any], ranked: list | None = None,
             scoring: Scoring | None = None, what: str = "") -> Measured:
    """The candidate against the reference over every sample of every shape set (one comparison serves both where
    there is one set). `ranked`, when given, receives (how far the sample's outputs are off, its source, its index)
    per sample; `scoring` counts each sample file's class or text against its label, each file once, at one shape
    set. `what`, when given, is reported as progress per sample (a long input's samples take seconds each)."""
    measured = Measured(Comparison(metrics, reference.floors))
    total, done = sum(len(s.source) for s in sets), 0
    # the labels are scored at one shape: the profile's opt point where there is one (a dynamic profile's min may
    # squeeze a text line to 48 pixels), else the first
    scored = next((s for s in sets if s.name.endswith(".opt")), sets[0])
    for shape_set in sets:
        cmp = measured.total if len(sets) == 1 else Comparison(metrics, reference.floors)
        seen, source = [], shape_set.source
        for i in range(len(source)):
            feed = source.sample(i)
            shapes = {k: list(v.shape) for k, v in feed.items()}
            if shapes not in seen:
                seen.append(shapes)
            key = (shape_set.name, json.dumps(shapes), i)
            ref_cache = reference.outputs
            with memory.reserved(reference.comparing(shapes)):  # the runs leave room for comparing their outputs
                if key not in ref_cache:
                    ref_cache[key] = reference.run(feed, source)
                got = runner(feed, shape_set.profile(feed))
            if scoring is not None and shape_set is scored:
                files = source.files_of(i)
                scoring.candidate.add(labels_mod.Scored(got, feed, files, source.pre))
                if scoring.reference is not None:
                    scoring.reference.add(labels_mod.Scored(ref_cache[key], feed, files, source.pre))
            cmp.add(ref_cache[key], got, feed)
            if cmp is not measured.total:
                measured.total.add(ref_cache[key], got, feed)
            if ranked is not None:
                ranked.append((how_far_off(ref_cache[key], got), source, i))
            done += 1
            if what:
                progress.report(what, done, total)
            for name, r in ref_cache[key].items():
                kept = measured.errors.setdefault(name, [])
                left = ERROR_SAMPLE - sum(map(len, kept))
                if left > 0:  # elements spread over the output, at most `left` (whole, an output at a profile's max
                    # is hundreds of MB in float64)
                    step = max(1, r.size // left)
                    kept.append(np.abs(r.ravel()[::step][:left].astype(np.float64)
                                       - got[name].ravel()[::step][:left].astype(np.float64)))
        measured.per_set.append(cmp)
        measured.shapes.append(seen)
    return measured


def how_far_off(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    """One sample's worst output: 1 - cosine, as the layerwise search measures it (2 where the candidate turned
    finite values non-finite, so such a sample ranks first)."""
    worst = 0.0
    for name, r in ref.items():
        stats = TensorStats()
        stats.add(r, got[name], None)
        if stats.bad:
            return 2.0
        worst = max(worst, stats.drift)
    return worst


def worst_samples(ranked: list, n: int) -> list[tuple[Any, int]]:
    """The n samples whose outputs are off the most: where the layerwise search looks."""
    return [(source, i) for _, source, i in sorted(ranked, key=lambda x: -x[0])[:n]]


@dataclass
class ShapeSet:
    """Samples at one shape (a profile's min, opt or max; or the data as given, where no profile is dynamic): a
    row of the report."""
    name: str  # "<profile>.<point>", or "data"
    source: SampleSource
    profile: Callable[[Feeds], int]  # a feed -> the index of the engine's profile it runs on


def sample_sets(params: ValidateStage, inputs: Inputs, ref: ReferenceModel, cand: Candidate) -> list[ShapeSet]:
    """A shape set per profile and `profile_shapes` point (the same shapes once): random data drawn at it, files
    made into it (`SampleSource.at`) where a profile is dynamic. Files for static profiles (or no profile) are
    taken as they are, each fitted to a profile (or refused)."""
    data = params.data
    src = SampleSource(data, inputs, ref.session.get_inputs(), "validate", ref.model)
    if not len(src):
        raise StageError(f"validate: data: no samples found ({src.label}); check the glob in data.images / "
                         f"data.tensors, or use data: {{random: true}}")
    if cand.profiles and (data.random or any(p.dynamic for p in cand.profiles)):
        sets: list[ShapeSet] = []
        seen: list[dict[str, list[int]]] = []
        for index, prof in enumerate(cand.profiles):
            for point in params.profile_shapes:
                shapes = prof.at(point)
                if shapes in seen:
                    continue
                seen.append(shapes)
                sets.append(ShapeSet(f"{prof.name}.{point}", src.at(shapes), lambda feed, i=index: i))
        return sets
    return [ShapeSet("data", src, lambda feed: profile_for(feed, cand))]


def profile_for(feed: Feeds, cand: Candidate) -> int:
    if not cand.profiles:
        return 0
    for index, prof in enumerate(cand.profiles):
        if prof.fits({name: x.shape for name, x in feed.items()}):
            return index
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feed.items())
    have = "; ".join(p.describe() for p in cand.profiles)
    raise StageError(f"validate: a sample ({shapes}) fits no optimization profile of engine '{cand.name}' "
                     f"({have}): give data of shapes the engine was built for, or add a profile to the build stage")
