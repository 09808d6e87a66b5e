"""Choosing the engine to ship among a target's engines: why an engine may not ship (validate failed it, the rule
requires a verdict it has not got, it lost more accuracy than allowed, the rule names other variants or
profiles), and the order of the others by the declared preference."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from trtflow import names
from trtflow.errors import StageError
from trtflow.metrics.names import metric_direction, not_weighed
from trtflow.pipelines.params.release import Select
from trtflow.stages.compare.records import Accuracy, Labelled
from trtflow.stages.release.report import Option


def accuracy_drop(acc: Accuracy, weigh: bool) -> tuple[dict[str, dict[str, float]], float | None, str | None]:
    """Per output, the task metrics declared for it that validate measured (the cosine where an output has none:
    the top-1/top-k every (batch, classes) output gets is nobody's metric until a tolerance of validate's bounds it,
    which `acc.directions` records), and the largest loss against the FP32 reference among them with where it is
    ("output/metric"): 1 - the value of a metric better higher (an agreement, an IoU: a share), the value of one
    better lower (an error rate). A metric that did not come out finite lost everything (1). What is no share lost
    (`_a_share`) is shown, not weighed: validate's tolerances bound it. `weigh` (select.max_accuracy_drop is set):
    every other metric must be weighed, so one whose direction nothing declares, or a function's value better
    higher that is no share in [0, 1], is an error; otherwise such a metric is shown and not weighed."""
    shown: dict[str, dict[str, float]] = {}
    worst, where = None, None
    for output, metrics in acc.outputs.items():
        known = acc.directions.get(output, {})
        task = {m: float(v) for m, v in metrics.task_values.items()
                if v is not None and (metrics.task is not False or m in known)}
        shown[output] = task = task or {"cosine": metrics.cosine}
        for metric, value in task.items():
            drop = _loss(output, metric, value, known.get(metric, metric_direction(metric)), weigh)
            if drop is not None and (worst is None or drop > worst):
                worst, where = drop, f"{output}/{metric}"
    return shown, worst, where


def _a_share(metric: str, higher: bool) -> bool:
    """Whether what `metric` loses is a share the release may weigh: trtflow's metrics pooled over every sample, and
    a function's metrics better higher (shares, as declared). Not those trtflow's metrics say are not weighed (the
    worst item's: the worst image's F1 moves in steps of one image; decibels; a regression's errors), nor a function's
    metrics better lower: errors in the output's units as often as rates (0.33 MOS is no 33% drop), shown as they
    are and bounded by validate's {max: x}."""
    if not_weighed(metric):
        return False
    return metric_direction(metric) is not None or higher


def _loss(output: str, metric: str, value: float, direction: bool | None, weigh: bool) -> float | None:
    """The share `metric` lost (None: not weighed); an error where `weigh` and it cannot be weighed."""
    if direction is None:
        if weigh and not not_weighed(metric):
            raise StageError(
                f"release: select.max_accuracy_drop weighs every metric validate measured, and nothing says "
                f"whether '{output}/{metric}' is better higher or lower: declare it in validate's "
                f"metrics.{output}.callable ({{function: ..., higher: [{metric}]}} or lower: [{metric}]), "
                f"or bound it in validate's tolerances.{output} with {{min: x}} / {{max: x}}")
        return None
    if not _a_share(metric, direction):
        return None
    if weigh and metric_direction(metric) is None and math.isfinite(value) and not 0.0 <= value <= 1.0:
        raise StageError(
            f"release: select.max_accuracy_drop weighs losses as shares, and your function's metric "
            f"'{output}/{metric}' is {value:.4g}, outside [0, 1]: return a share (e.g. 1 - error / scale) "
            f"to weigh it, or leave max_accuracy_drop out and bound it in validate's tolerances")
    return (1.0 - value if direction else value) if math.isfinite(value) else 1.0


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


def on_gpu(measured_by: str | None) -> bool:
    """Numbers from TensorRT on a GPU (trtexec, or an engine timed with CUDA events), not a CPU stand-in's."""
    return bool(measured_by) and (measured_by.startswith("trtexec") or "CUDA events" in measured_by)


def across_precisions(ranked: list[Option], rule: Select) -> tuple[list[Option], str]:
    """Where the rule ranks by speed among engines of several precisions, their order across precisions: by the
    numbers where a GPU measured every one of them, else by each precision's best estimate on the target's GPU
    class (`estimate.py`). A CPU stand-in runs FP32 fastest and emulates FP16 and INT8, so its numbers keep
    ordering the engines of one precision only. Returns the options and what decided ("" when nothing was)."""
    eligible = [o for o in ranked if o.refused is None]
    if rule.prefer == "size" or len({o.precision for o in eligible}) < 2:
        return ranked, ""
    if all(on_gpu(o.measured_by) for o in eligible):
        return ranked, f"by the numbers a GPU measured ({eligible[0].measured_by})"
    best: dict[str, float] = {}
    for o in eligible:
        best[o.precision] = max(best.get(o.precision, 0.0), o.estimate.samples_per_s if o.estimate else 0.0)
    order = sorted(eligible, key=lambda o: (-best[o.precision], ranked.index(o)))
    return _rerank(order + [o for o in ranked if o.refused is not None]), _estimated(eligible, best)


def _estimated(eligible: list[Option], best: dict[str, float]) -> str:
    """The line saying the order across precisions is an estimate, of what, and what would confirm it."""
    gpu = next((o.estimate.gpu for o in eligible if o.estimate), None)
    ranked = sorted(best, key=lambda p: -best[p])
    rates = ", ".join(f"{p.upper()} ~{best[p]:,.0f}/s" if best[p] else f"{p.upper()} unknown (no composition)"
                      for p in ranked)
    stand_in = next((o.measured_by for o in eligible if o.measured_by and not on_gpu(o.measured_by)), None)
    within = f"; {stand_in}'s numbers order the engines of one precision" if stand_in else ""
    return (f"estimated, not measured: {rates} on {gpu or 'its GPU class'} (compute "
            f"and memory time of each variant's composition at the class's peak rates){within}; a benchmark on "
            f"such a GPU (the pipeline's benchmark stage run there: trtflow run <pipeline> --stage <benchmark>) "
            f"replaces the estimate")


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
    if _nothing_to_weigh(ranked, previous, prefer):
        return ranked, ""
    prev = next((o for o in ranked if o.name == previous), None)
    if prev is None:
        return ranked, f"the previous version's engine {previous} is not among this build's engines"
    if prev.refused is not None:
        return ranked, f"the previous version's engine {previous} may not ship now: {prev.refused}"
    best = ranked[0]
    if _across_precisions(best, prev):
        return _estimated_challenge(ranked, best, prev, rule)
    speeds = _Speeds.of(best, prev, rule)
    if not speeds.new or not speeds.old:
        return ranked, ""
    gain = speeds.new / speeds.old - 1 if prefer == "throughput" else speeds.old / speeds.new - 1
    margin, how = _margin(best, prev, rule)
    on = f"{prefer} (the median of this machine's runs)" if speeds.over_time else prefer
    if gain > margin and (speeds.over_time or rule.min_runs == 1):
        return ranked, f"{best.name} replaces {previous}: {gain:.1%} better on {on}, more than the margin {how}"
    kept = _rerank([prev] + [o for o in ranked if o is not prev])
    if gain > margin:
        runs = speeds.runs
        return kept, (f"{previous} kept: {best.name} is {gain:.1%} better on {prefer} in this run, more than the "
                      f"margin {how}; it replaces the shipped engine once the median of {rule.min_runs} runs of "
                      f"both on this machine says so (now {runs[0]} and {runs[1]}; select.min_runs)")
    return kept, f"{previous} kept: {best.name} is {gain:.1%} better on {on}, within the margin {how}"


def _nothing_to_weigh(ranked: list[Option], previous: str | None, prefer: str) -> bool:
    """No previous engine, none ranked, a tie at the top, the previous engine first already, or size preferred
    (it does not move between runs)."""
    if previous is None or not ranked or prefer == "size":
        return True
    return ranked[0].rank != 1 or ranked[0].name == previous


def _across_precisions(best: Option, prev: Option) -> bool:
    """Engines of two precisions whose CPU numbers cannot order them: the estimate decides."""
    return best.precision != prev.precision and not (on_gpu(best.measured_by) and on_gpu(prev.measured_by))


@dataclass(frozen=True)
class _Speeds:
    """The new best's and the previous engine's numbers compared: the medians of this machine's runs where both
    have `select.min_runs` (at least two), else this run's."""
    new: float | None
    old: float | None
    over_time: bool
    runs: tuple[int, int]

    @classmethod
    def of(cls, best: Option, prev: Option, rule: Select) -> _Speeds:
        runs = (_runs(best), _runs(prev))
        medians = (_median(best, rule.prefer), _median(prev, rule.prefer))
        if min(runs) >= max(rule.min_runs, 2) and all(medians):
            return cls(medians[0], medians[1], True, runs)
        return cls(_this_run(best, rule.prefer), _this_run(prev, rule.prefer), False, runs)


def _runs(option: Option) -> int:
    return option.run_spread.runs if option.run_spread is not None else 1


def _median(option: Option, prefer: str) -> float | None:
    spread = option.run_spread
    if spread is None:
        return None
    return spread.median_samples_per_s if prefer == "throughput" else spread.median_p99_ms


def _this_run(option: Option, prefer: str) -> float | None:
    return option.samples_per_s if prefer == "throughput" else option.p99_ms


def _estimated_challenge(ranked: list[Option], best: Option, prev: Option, rule: Select) -> tuple[list[Option], str]:
    """An engine of another precision than the shipped one, ranked first by the estimate: it replaces the shipped
    engine when its estimate is better by more than select.min_gain (an estimate does not move between runs)."""
    new, old = (o.estimate.samples_per_s if o.estimate else 0.0 for o in (best, prev))
    gain = new / old - 1 if old else 0.0
    if gain > rule.min_gain:
        return ranked, (f"{best.name} replaces {prev.name}: {gain:.1%} faster by the estimate on its GPU class, "
                        f"more than select.min_gain {rule.min_gain:.1%} (no GPU measured both)")
    kept = _rerank([prev] + [o for o in ranked if o is not prev])
    return kept, (f"{prev.name} kept: {best.name} is {gain:.1%} faster by the estimate, within select.min_gain "
                  f"{rule.min_gain:.1%} (no GPU measured both)")


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
