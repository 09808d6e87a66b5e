"""Choosing the engine to ship among a target's engines: why an engine may not ship (validate failed it, the rule
requires a verdict it has not got, it lost more accuracy than allowed, the rule names other variants or
profiles), and the order of the others by the declared preference."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from trtflow import names
from trtflow.errors import StageError
from trtflow.pipelines.params.release import Select
from trtflow.pipelines.schema import NOT_A_SHARE, WORST_CASE, metric_direction
from trtflow.stages.compare.accuracy import Accuracy
from trtflow.stages.compare.labels import Labelled
from trtflow.stages.release.report import Option


def accuracy_drop(acc: Accuracy, weigh: bool) -> tuple[dict[str, dict[str, float]], float | None, str | None]:
    """Per output, the task metrics validate measured (the cosine where an output has none), and the largest
    loss against the FP32 reference among them with where it is ("output/metric"): 1 - the value of a metric
    better higher (an agreement, an IoU: a share), the value of one better lower (an error rate). A metric that
    did not come out finite lost everything (1). The worst item's metrics (`WORST_CASE`: the worst image's F1,
    the worst region's IoU, the worst sample's embedding cosine) and PSNR (decibels, not a share) are shown, not
    weighed: validate's tolerances bound them. `weigh` (select.max_accuracy_drop is set): every other metric must
    be weighed, so one whose direction nothing declares, or a function's value that is no share in [0, 1], is an
    error; otherwise such a metric is shown and not weighed."""
    shown: dict[str, dict[str, float]] = {}
    worst, where = None, None
    for output, metrics in acc.outputs.items():
        task = {m: float(v) for m, v in metrics.task_values.items() if v is not None}
        if not task:
            task = {"cosine": metrics.cosine}
        shown[output] = task
        known = acc.directions.get(output, {})
        for metric, value in task.items():
            if metric in WORST_CASE or metric in NOT_A_SHARE:
                continue
            direction = known.get(metric, metric_direction(metric))
            if direction is None:
                if weigh:
                    raise StageError(
                        f"release: select.max_accuracy_drop weighs every metric validate measured, and nothing says "
                        f"whether '{output}/{metric}' is better higher or lower: declare it in validate's "
                        f"metrics.{output}.callable ({{function: ..., higher: [{metric}]}} or lower: [{metric}]), "
                        f"or bound it in validate's tolerances.{output} with {{min: x}} / {{max: x}}")
                continue
            if weigh and metric_direction(metric) is None and math.isfinite(value) and not 0.0 <= value <= 1.0:
                raise StageError(
                    f"release: select.max_accuracy_drop weighs losses as shares, and your function's metric "
                    f"'{output}/{metric}' is {value:.4g}, outside [0, 1]: return a share (e.g. 1 - error / scale) "
                    f"to weigh it, or leave max_accuracy_drop out and bound it in validate's tolerances")
            drop = (1.0 - value if direction else value) if math.isfinite(value) else 1.0
            if worst is None or drop > worst:
                worst, where = drop, f"{output}/{metric}"
    return shown, worst, where


def labelled_drop(candidate: Labelled | None, fp32: Labelled | None) -> tuple[float | None, str | None]:
    """The candidate's accuracy against the labels (top-1, or text read exactly) below FP32's (0 where it is as
    good or better), and where; (None, None) where validate had no labels."""
    if candidate is None or fp32 is None:
        return None, None
    return max(0.0, fp32.values[fp32.main] - candidate.values[candidate.main]), f"labels/{candidate.main}"


def worst_drop(acc: Accuracy, shapes: list[Any], weigh: bool) -> tuple[dict[str, dict[str, float]],
                                                                         float | None, str | None]:
    """`accuracy_drop` over all samples, and where validate checked several profile shapes, the largest drop at
    any one of them ("<profile>.<point>: output/metric"): an engine is only as good as its worst shape."""
    shown, worst, where = accuracy_drop(acc, weigh)
    if len(shapes) > 1:
        for shape in shapes:
            _, drop, at = accuracy_drop(replace(acc, outputs=shape.outputs), weigh)
            if drop is not None and (worst is None or drop > worst):
                worst, where = drop, f"{shape.name}: {at}"
    return shown, worst, where


def refusal(option: Option, rule: Select, verdict: str | None, checked: bool) -> str | None:
    """Why `option` may not ship under `rule`; `verdict` is validate's reason to refuse it (None: it passed or
    was not checked), `checked` whether a validate stage judged it."""
    if verdict is not None and checked:
        return f"failed validation: {verdict}"
    if rule.require == "validated" and not checked:
        return "not validated (select.require: validated)"
    if rule.variants and option.variant not in rule.variants and \
            (option.repaired_from is None or names.unrepaired(option.variant) not in rule.variants):
        return f"variant '{option.variant}' is not among select.variants"
    if rule.profiles and not set(option.profiles) & set(rule.profiles):
        return f"profile {', '.join(option.profiles)} is not among select.profiles"
    if rule.accuracy == "labels" and option.labelled is None:
        return "select.accuracy: labels, but validate scored it against no labels (give validate labels:)"
    if rule.max_accuracy_drop is not None and option.accuracy_drop is not None \
            and option.accuracy_drop > rule.max_accuracy_drop:
        return (f"accuracy drop {option.accuracy_drop:.2%} on {option.drop_metric} > select.max_accuracy_drop "
                f"{rule.max_accuracy_drop:.2%}")
    return None


def preference(option: Option, prefer: str) -> tuple[float, ...]:
    inf = math.inf
    if prefer == "throughput":
        first = -option.samples_per_s if option.samples_per_s is not None else inf
    elif prefer == "p99_latency":
        first = option.p99_ms if option.p99_ms is not None else inf
    else:
        first = float(option.engine_bytes)
    return first, float(option.engine_bytes)


def rank(options: list[Option], rule: Select) -> list[Option]:
    """The options, eligible ones first in the rule's order (unmeasured after measured; then the smaller engine,
    then the name), each given its rank; refused ones after, unranked."""
    eligible = sorted((o for o in options if o.refused is None), key=lambda o: (preference(o, rule.prefer), o.name))
    for n, option in enumerate(eligible, 1):
        option.rank = n
    return eligible + [o for o in options if o.refused is not None]


# how much more of its compute an INT8 engine may do in FP32 than the FP16 engine and still be ranked above it on
# numbers no GPU measured (points of the MAC share, and of the other ops' share)
FP32_ALLOWANCE = 0.05


def on_gpu(measured_by: str | None) -> bool:
    """Numbers from TensorRT on a GPU (trtexec, or an engine timed with CUDA events), not a CPU stand-in's."""
    return bool(measured_by) and (measured_by.startswith("trtexec") or "CUDA events" in measured_by)


def int8_over_fp16(ranked: list[Option], rule: Select) -> tuple[list[Option], str]:
    """Where the rule ranks by speed, an INT8 engine ranked above the best FP16 engine stays there only when a GPU
    measured both, or when its composition computes no more in FP32 than the FP16 engine's (its MACs and its other
    ops, within FP32_ALLOWANCE): TensorRT runs an INT8 variant's unquantized remainder in the precision the ONNX
    gives it, and an INT8 engine with an FP32 remainder can be slower than FP16 on a GPU, however a CPU stand-in
    timed it. Others move just below the FP16 engine. Returns the options and what decided ("" when nothing was
    weighed)."""
    if rule.prefer == "size":
        return ranked, ""
    eligible = [o for o in ranked if o.refused is None]
    fp16 = next((o for o in eligible if o.precision == "fp16"), None)
    if fp16 is None:
        return ranked, ""
    said, below = [], []
    for o in eligible[:eligible.index(fp16)]:
        if o.precision != "int8":
            continue
        if on_gpu(o.measured_by) and on_gpu(fp16.measured_by):
            said.append(f"{o.name} above {fp16.name}: measured on a GPU ({o.measured_by})")
        elif (why := _composition_against(o, fp16)) is None:
            said.append(f"{o.name} above {fp16.name}: supported by its composition ({_fp32(o)} in FP32, against "
                        f"{_fp32(fp16)}); not measured on a GPU")
        else:
            below.append(o)
            said.append(f"{o.name} ranked below {fp16.name}: {why}, and no GPU measured them"
                        + (f" ({o.measured_by} did)" if o.measured_by else ""))
    if below:
        rest = [o for o in ranked if o not in below]
        at = rest.index(fp16) + 1
        ranked = _rerank(rest[:at] + below + rest[at:])
    return ranked, "; ".join(said)


def _composition_against(int8: Option, fp16: Option) -> str | None:
    """Why `int8`'s composition does not support ranking it above `fp16` (None: it does)."""
    a, b = int8.composition, fp16.composition
    if a is None or b is None:
        return "the composition of one of them is unknown"
    if a.mac_share.fp32 > b.mac_share.fp32 + FP32_ALLOWANCE or \
            a.other_share.fp32 > b.other_share.fp32 + FP32_ALLOWANCE:
        return f"it computes more in FP32 ({_fp32(int8)}, against {_fp32(fp16)})"
    return None


def _fp32(o: Option) -> str:
    c = o.composition
    assert c is not None
    return f"{c.mac_share.fp32:.0%} of MACs and {c.other_share.fp32:.0%} of other ops"


def _rerank(order: list[Option]) -> list[Option]:
    for n, option in enumerate((o for o in order if o.refused is None), 1):
        option.rank = n
    return order


def keep_previous(ranked: list[Option], previous: str | None, rule: Select) -> tuple[list[Option], str]:
    """`ranked` with the engine the previous version shipped first again, unless the new best beats it on the
    median of `select.min_runs` or more runs of both on this machine, by more than the margin: the largest of
    `select.min_gain` and the benchmark's spread of the two engines, within its run ((p90 - median) / median
    latency of its iterations) and across this machine's runs of them (largest - smallest / median). On a shared
    machine one run's numbers can move 2.5x (an engine measured while another process took the core): numbers that
    move within their noise must not flip the engine a deployment serves. Returns the options and a line saying
    which engine was kept or why it was replaced, with the margin and how it was measured ("" when there is
    nothing to weigh)."""
    prefer = rule.prefer
    if previous is None or not ranked or ranked[0].rank != 1 or ranked[0].name == previous or prefer == "size":
        return ranked, ""
    prev = next((o for o in ranked if o.name == previous), None)
    if prev is None:
        return ranked, f"the previous version's engine {previous} is not among this build's engines"
    if prev.refused is not None:
        return ranked, f"the previous version's engine {previous} may not ship now: {prev.refused}"
    best = ranked[0]
    runs = [o.run_spread.runs if o.run_spread is not None else 1 for o in (best, prev)]
    medians = [None if o.run_spread is None else
               o.run_spread.median_samples_per_s if prefer == "throughput" else o.run_spread.median_p99_ms
               for o in (best, prev)]
    over_time = min(runs) >= max(rule.min_runs, 2) and all(medians)
    new, old = medians if over_time else (
        (best.samples_per_s, prev.samples_per_s) if prefer == "throughput" else (best.p99_ms, prev.p99_ms))
    if not new or not old:
        return ranked, ""
    gain = new / old - 1 if prefer == "throughput" else old / new - 1
    margin, how = _margin(best, prev, rule)
    on = f"{prefer} (the median of this machine's runs)" if over_time else prefer
    if gain > margin and (over_time or rule.min_runs == 1):
        return ranked, f"{best.name} replaces {previous}: {gain:.1%} better on {on}, more than the margin {how}"
    kept = _rerank([prev] + [o for o in ranked if o is not prev])
    if gain > margin:
        return kept, (f"{previous} kept: {best.name} is {gain:.1%} better on {prefer} in this run, more than the "
                      f"margin {how}; it replaces the shipped engine once the median of {rule.min_runs} runs of "
                      f"both on this machine says so (now {runs[0]} and {runs[1]}; select.min_runs)")
    return kept, f"{previous} kept: {best.name} is {gain:.1%} better on {on}, within the margin {how}"


def _margin(best: Option, prev: Option, rule: Select) -> tuple[float, str]:
    """The margin a challenger must beat the incumbent by, and how it was made ("12.0% (the largest of ...)")."""
    within = max(best.spread or 0.0, prev.spread or 0.0)
    pick = (lambda s: s.throughput) if rule.prefer == "throughput" else (lambda s: s.p99)
    across = [pick(o.run_spread) for o in (best, prev) if o.run_spread is not None]
    margin = max(rule.min_gain, within, *[a for a in across if a is not None])
    said = [f"select.min_gain {rule.min_gain:.1%}", f"the spread within this run {within:.1%}"]
    measured = [a for a in across if a is not None]
    if measured:
        runs = " and ".join(str(o.run_spread.runs) for o in (best, prev) if o.run_spread is not None)
        said.append(f"the spread across this machine's runs of them ({runs} runs) {max(measured):.1%}")
    else:
        said.append("no spread across runs yet: the engines were measured here once")
    return margin, f"{margin:.1%} (the largest of: {'; '.join(said)})"


def rollback(ranked: list[Option], ledger_owners: dict[str, int], latest: tuple[int, str] | None,
             rule: Select) -> tuple[list[Option], int | None, str]:
    """Whether the engine ranked first is an earlier version's while a later one is the latest published
    (`ledger_owners`: engine sha256 -> the version that shipped it last; `latest`: (version, engine sha256)).
    Returns the options (the latest version's engine first again where the rule refuses rollbacks and it may
    ship), the version rolled back to (None: no rollback), and a line saying what was done ("" when nothing)."""
    if latest is None or not ranked or ranked[0].rank != 1:
        return ranked, None, ""
    best, (version, owner) = ranked[0], latest
    earlier = ledger_owners.get(best.engine_sha256)
    if best.engine_sha256 == owner or earlier is None or earlier >= version:
        return ranked, None, ""
    if rule.rollback == "allow":
        return ranked, earlier, (f"{best.name} is the engine of version {earlier}, and version {version} was "
                                 f"released since: shipped again as a new version, rolling back to version "
                                 f"{earlier}'s engine (select.rollback: allow)")
    incumbent = next((o for o in ranked if o.engine_sha256 == owner and o.refused is None), None)
    if incumbent is None:
        return ranked, earlier, ""
    return _rerank([incumbent] + [o for o in ranked if o is not incumbent]), None, (
        f"{incumbent.name} (version {version}) kept: {best.name} ranked first, but it is the engine of version "
        f"{earlier}, and shipping it would roll back (select.rollback: allow lets it)")
