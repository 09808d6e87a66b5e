"""Pictures of a comparison: the error distribution per output, and the drift node by node along the graph."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from trtflow import phases
from trtflow.stages.compare.records import LayerRow


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on build machines
    import matplotlib.pyplot as plt

    return plt


@phases.timed("plots")
def error_histograms(errors: dict[str, list[np.ndarray]], path: Path, title: str) -> Path:
    """One histogram of |candidate - reference| per output (log-spaced bins: errors span decades)."""
    plt = _pyplot()
    names = list(errors)
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(4.2 * max(len(names), 1), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        e = np.concatenate(errors[name]) if errors[name] else np.zeros(1)
        e = e[np.isfinite(e)]
        positive = e[e > 0]
        if positive.size:
            bins = np.logspace(np.log10(positive.min()), np.log10(positive.max()) + 1e-9, 50)
            ax.hist(positive, bins=bins, color="#4477aa")
            ax.set_xscale("log")
        exact = f"{(e == 0).mean():.0%} exact, " if e.size else "no finite error, "
        ax.set_title(f"{name}\n{exact}max {e.max(initial=0):.3g}", fontsize=9)
        ax.set_xlabel("|error|")
    axes[0][0].set_ylabel("elements")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


@phases.timed("plots")
def layer_drift(rows: list[LayerRow], first: LayerRow | None, path: Path, title: str) -> Path:
    """1 - cosine of every compared tensor in graph order, the first bad node marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    drift = np.array([max(r.drift, 1e-9) for r in rows])
    ax.plot(np.arange(len(rows)), drift, lw=1, color="#4477aa")
    bad = [i for i, r in enumerate(rows) if r.nonfinite]
    if bad:
        ax.scatter(bad, drift[bad], color="#cc3311", s=10, label="non-finite")
    if first is not None:
        i = next(k for k, r in enumerate(rows) if r.tensor == first.tensor)
        ax.axvline(i, color="#cc3311", ls="--", lw=1)
        ax.annotate(first.node, (i, drift[i]), fontsize=8, color="#cc3311")
    ax.set_yscale("log")
    ax.set_xlabel("tensor, in graph order")
    ax.set_ylabel("1 - cosine vs reference")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


@phases.timed("plots")
def latency_histograms(samples: dict[str, list[float]], path: Path, title: str) -> Path:
    """One histogram of per-iteration latency per cell, with its median and p99 marked."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(samples), 1, figsize=(8, 1.8 * len(samples) + 0.6), squeeze=False)
    for ax, (name, values) in zip(axes[:, 0], samples.items()):
        a = np.asarray(values)
        hi = np.percentile(a, 99.5)
        ax.hist(a[a <= hi], bins=60, color="#4c72b0")
        for q, style in ((50, "-"), (99, "--")):
            ax.axvline(np.percentile(a, q), color="#c44e52", linestyle=style, linewidth=1)
        ax.set_title(f"{name}: median {np.median(a):.3g} ms, p99 {np.percentile(a, 99):.3g} ms (n={a.size})",
                     fontsize=9)
        ax.set_xlabel("ms", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
