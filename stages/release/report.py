"""Stage `release`'s report: per target the engine shipped (its Triton version and config) and every other
engine with its numbers and why it was not shipped; the provenance chain; the preprocessing as declared."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from trtflow import markdown
from trtflow.artifact import Provenance
from trtflow.pipelines.params.parity import ParityTolerances
from trtflow.precisions import Precision
from trtflow.stages.benchmark.report import RunSpread
from trtflow.stages.compare.records import Labelled
from trtflow.stages.onnx.records import Composition
from trtflow.stages.prepare.report import OffloadRecord, RewriteRecord
from trtflow.stages.release.estimate import Estimate
from trtflow.stages.release.triton.contract import Contract
from trtflow.stages.trt.records import BuiltOn
from trtflow.stages.validate.report import ShapeResult


class Option(BaseModel):
    """One engine as the release weighs it: what it is and every number the earlier stages measured for it."""
    name: str
    variant: str
    precision: Precision
    target: str
    profiles: list[str]
    engine_bytes: int
    engine_sha256: str
    repaired_from: str | None = None  # validate's repaired engine: the failing engine it replaces
    validated: bool | None = None  # None: no validate stage checked it
    accuracy: dict[str, dict[str, float]] = {}  # output -> task metric (or cosine) -> value, against FP32
    accuracy_runtime: str | None = None
    shapes: list[ShapeResult] = []  # validate's row per shape it checked the engine at
    accuracy_drop: float | None = None  # the largest loss on any of them
    drop_metric: str | None = None  # where ("output/metric"): the metric that lost the most
    p99_ms: float | None = None
    p99_batch: int | None = None  # the batch the p99 was measured at (the smallest measured)
    samples_per_s: float | None = None  # the most measured, at any batch its profiles take
    samples_per_s_batch: int | None = None  # the batch that number was measured at
    measured_by: str | None = None  # the runtime of those numbers
    spread: float | None = None  # the benchmark's own jitter: (p90 - median) / median latency of its iterations
    run_spread: RunSpread | None = None  # across this machine's runs of the engine: the largest of its cells'
    higher_precision_nodes: int | None = None  # nodes left in FP32 (FP16 variant) / unquantized (INT8 variant)
    nodes: int | None = None  # of how many
    refused: str | None = None  # why it may not ship (None: eligible)
    contract_changes: list[str] = []  # what its serving contract changes against the latest published version's
    rank: int | None = None  # 1 = shipped; eligible engines ranked by the rule
    labelled: Labelled | None = None  # its accuracy against the data's labels (validate's `labels:`)
    composition: Composition | None = None  # its variant's compute by precision, as TensorRT builds it
    estimate: Estimate | None = None  # its speed on its target's GPU class, from the composition (not measured)

    def cells(self) -> list[str]:
        """Its row in the card's and summary's table, unescaped (the HTML card escapes it; `md_row()` is its
        Markdown)."""
        named = len(self.accuracy) > 1  # several outputs: say which output each number is of
        acc = "; ".join(f"{o + ' ' if named else ''}{m} {v:.4g}" for o, ms in self.accuracy.items()
                        for m, v in ms.items()) or "-"
        kept = _number(self.higher_precision_nodes, "", f" of {self.nodes}" if self.nodes else "")
        p99 = _number(self.p99_ms, ".4g", f" (batch {self.p99_batch})")
        drop = _number(self.accuracy_drop, ".2%", f" on {self.drop_metric}" if self.drop_metric else "")
        rate = _number(self.samples_per_s, ".4g",
                       f" (batch {self.samples_per_s_batch})" if self.samples_per_s_batch else "")
        return [self.name, self.precision, acc, drop, p99, rate,
                f"{self.engine_bytes / 1e6:.2f}", kept,
                self.composition.mac_share.text() if self.composition else "-",
                "**shipped**" if self.rank == 1 else (self.refused or f"ranked {self.rank}")]

    def md_row(self) -> str:
        """Its table row in Markdown: names and the refusal as literal text, the shipped engine's verdict in bold."""
        cells = self.cells()
        cells[:4] = [markdown.text(c) for c in cells[:4]]  # the rest are numbers, formatted here
        if self.rank != 1:
            cells[9] = markdown.text(cells[9])
        return "| " + " | ".join(cells) + " |"


def _number(value: float | None, spec: str, said: str) -> str:
    """A table cell: the number in format `spec` followed by what is `said` of it, or "-" where it is unknown."""
    return "-" if value is None else format(value, spec) + said


HEADER = ["engine", "precision", "accuracy vs FP32", "drop", "p99 ms", "samples/s", "MB", "nodes in higher precision",
          "MACs by precision",
          "verdict"]


class ValidFor(BuiltOn):
    """What a released engine is valid for: the TensorRT and the machine that built it, its target, the
    compatibility it was built with, and its validity on the machine that released it."""
    target: str | None = None
    hardware_compatibility: str | None = None
    version_compatible: bool | None = None
    validity_here: str | None = None  # "VALID" | "INVALID" | "SUBOPTIMAL" | None: not checked


class ShippedPlugin(BaseModel):
    """A TensorRT plugin the shipped engine was built with, as the release ships it: a library copied beside the
    Triton repository, or a Python module the serving process must import (stock Triton cannot)."""
    key: str  # its key path in the pipeline file: "plugins[0]"
    label: str  # as declared
    file: str | None = None  # the library's copy, relative to the stage's output directory (None: a Python module)
    sha256: str  # the declared file's digest (the library, or the module's source)
    entry: str | None = None  # the library's function that registers its creators (Triton does not call it)
    namespace: str = ""
    python: str | None = None  # the module that registers the creators when imported
    loaded_by: str  # how the serving process loads it


class TargetRelease(BaseModel):
    target: str
    chosen: Option | None
    version: int | None = None
    new_version: bool = False  # False: a release of this engine as `version` was published before
    why_none: str | None = None
    held: str | None = None  # why no engine of this run replaces the previous version (it stays the one served)
    options: list[Option]  # every engine of the target, the chosen first, then by rank, refused last
    repository: str | None = None  # the Triton model repository, relative to the stage's output directory
    config: str | None = None  # its config.pbtxt
    models: list[str] = []  # the models in the repository: the engine's, and the preprocessing's and ensemble's
    max_batch_size: int = 0
    batch_note: str = ""  # why there is no batch dimension
    environment: ValidFor = ValidFor()
    contract: Contract | None = None  # what a client may send and gets back (also contract.json in the repository)
    contract_changes: list[str] = []  # against the previous version of this model and target
    previous_version: int | None = None  # that version: the latest one published before this release
    previous: str | None = None  # the engine the previous version shipped, where it is still an option
    stability: str = ""  # why the previous choice was kept, or replaced, and the margin weighed
    precision_order: str = ""  # what ordered engines of different precisions (an estimate, a GPU measurement)
    rolls_back_to: int | None = None  # the earlier version whose engine this new version ships again
    request_example: str = ""  # a Python script (tritonclient) that sends the model a request
    configs: dict[str, str] = {}  # the preprocessing and ensemble models' config.pbtxt, by model name
    requirements: list[str] = []  # the Python packages the preprocessing model needs in Triton's Python backend
    plugins: list[ShippedPlugin] = []  # the TensorRT plugins the engine needs wherever it is deserialized
    server: str = ""  # the command that starts Triton on the repository, where the plugins need saying


class ParitySummary(BaseModel):
    """Parity's verdict on the declared preprocessing, as the card states it."""
    verdict: str
    images: int
    top1: float | None = None  # the model's top-1 agreement on deploy vs training tensors
    tolerances: ParityTolerances | None = None


class ReleaseReport(BaseModel):
    model_name: str
    rule: dict[str, Any]
    targets: list[TargetRelease]
    lineage: list[Provenance]
    preprocessing: list[dict[str, Any]] | None = None  # the declared deploy steps
    parity: ParitySummary | None = None  # parity's verdict on them
    labelled: Labelled | None = None  # the FP32 reference's accuracy against the data's labels
    rewrites: list[RewriteRecord] = []  # what prepare changed in the model: the rewrites it kept
    offload: OffloadRecord | None = None  # what prepare gave ONNX Runtime (`offload: onnxruntime`)
    numbers_note: str = ""  # which runtime measured the numbers, where it was not TensorRT
    warnings: list[str] = []

    @classmethod
    def read(cls, path: Path) -> "ReleaseReport":
        return cls.model_validate_json(path.read_text())

    @property
    def shipped(self) -> list[TargetRelease]:
        return [t for t in self.targets if t.chosen is not None]

    @property
    def held(self) -> list[TargetRelease]:
        return [t for t in self.targets if t.held is not None]

    def summary(self) -> str:
        lines = [f"### release · {markdown.code(self.model_name)} · "
                 f"{len(self.shipped)}/{len(self.targets)} target(s) shipped", "",
                 f"rule: {rule_text(self.rule, markdown.text)}", ""]
        for t in self.targets:
            if t.held is not None:
                lines += [f"**{markdown.text(t.target)}**: previous version {t.version} kept: "
                          f"{markdown.text(t.held)}", ""]
            elif t.chosen is None:
                lines += [f"**{markdown.text(t.target)}**: nothing shipped: {markdown.text(t.why_none)}", ""]
            else:
                lines += [f"**{markdown.text(t.target)}**: {markdown.code(t.chosen.name)} as version {t.version}"
                          + ("" if t.new_version else " (released before: same engine, same version)")
                          + (f" (rolls back to version {t.rolls_back_to}'s engine)" if t.rolls_back_to else "")
                          + f" · Triton repository {markdown.code(t.repository)} · max_batch_size {t.max_batch_size}",
                          ""]
            lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
            lines += [o.md_row() for o in t.options] + [""]
            if t.precision_order:
                lines += [f"Order across precisions: {markdown.text(t.precision_order)}", ""]
        if self.numbers_note:
            lines += [markdown.text(self.numbers_note), ""]
        lines += [f"**warning**: {markdown.text(w)}" for w in self.warnings]
        return "\n".join(lines) + "\n"


def rule_text(rule: dict[str, Any], name: Callable[[Any], str] = str) -> str:
    """The rule in words; `name`: how a name is written (`markdown.text` in Markdown)."""
    parts = [f"require {name(rule['require'])}", f"prefer {name(rule['prefer'])}"]
    if rule.get("max_accuracy_drop") is not None:
        on = ("accuracy against the labels, top-1 or text read exactly, below FP32's" if rule.get("accuracy") ==
              "labels" else "on the metrics pooled over every sample; the worst image's, region's or sample's are "
                            "held by validate's bounds, as are errors in an output's own units (a regression's, a "
                            "function's better lower), shown as values")
        parts.append(f"max accuracy drop {rule['max_accuracy_drop']:.2%} ({on})")
    for key in ("variants", "profiles"):
        if rule.get(key):
            parts.append(f"{key} {', '.join(name(n) for n in rule[key])}")
    return ", ".join(parts)
