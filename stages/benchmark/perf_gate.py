"""The benchmark's regression gate: each measured cell against its baseline — the same engine (or variant) at
the same shape, measured in the same environment. Results from another GPU, driver, TensorRT version or runtime
are never compared; the report says why a cell was skipped."""
from __future__ import annotations

from trtflow.stages.benchmark.report import Baseline, Measurement
from trtflow.stages.trtexec.result import PerfRecord, Stats

# gate key -> (measure, statistic, "lower" or "higher" is better)
METRICS = {"throughput_regression": ("throughput_qps", None, "higher"),
           "mean_regression": ("latency_ms", "mean", "lower"),
           "p99_regression": ("latency_ms", "p99", "lower")}


def value(result: PerfRecord, measure: str, stat: str | None) -> float | None:
    v = getattr(result, measure)
    if stat is not None:
        v = getattr(v, stat) if isinstance(v, Stats) else None
    return float(v) if isinstance(v, (int, float)) else None


def check(cells: list[Measurement], baseline: dict[str, Baseline], bounds: dict[str, float | None]
          ) -> tuple[list[str], list[str]]:
    """(violations, skipped): one line per regression beyond its bound, and per cell that was not compared;
    `baseline` is keyed by cell."""
    violations, skipped = [], []
    for cell in cells:
        base = baseline.get(cell.cell)
        if base is None:
            skipped.append(f"{cell.cell}: no baseline for this cell")
            continue
        diff = cell.environment.differs(base.environment)
        if diff:
            skipped.append(f"{cell.cell}: the baseline was measured elsewhere ({', '.join(diff)} differ)")
            continue
        for key, bound in bounds.items():
            if bound is None:
                continue
            measure, stat, better = METRICS[key]
            now, then = value(cell.result, measure, stat), value(base.result, measure, stat)
            if now is None or then is None or then == 0:
                skipped.append(f"{cell.cell}: {key.removesuffix('_regression')} is missing on one side")
                continue
            change = (then - now) / then if better == "higher" else (now - then) / then
            if change > bound:
                name = measure + (f" {stat}" if stat else "")
                unit = "qps" if measure == "throughput_qps" else "ms"
                violations.append(f"{cell.cell}: {name} {now:.4g} {unit} against the baseline's {then:.4g} "
                                  f"{unit}, {change:.1%} worse, beyond the bound {bound:.0%}")
    return violations, skipped
