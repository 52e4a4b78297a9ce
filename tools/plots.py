"""PNG figures for ``lidarshard report`` and ``lidarshard calibrate``: numpy arrays in, PNG bytes out.

matplotlib is optional (``pip install "lidarshard[report]"``) and imported lazily. Figures are built
with ``matplotlib.figure.Figure`` and rendered by Agg, never through pyplot: no display, no global
backend switch, safe in headless workers and threads.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from lidarshard.transforms.plan.metrics import load_linearity

__all__ = [
    "size_histogram",
    "step_balance",
    "rank_totals",
    "bucket_composition",
    "rejects_by_reason",
    "repeat_counts",
    "predicted_vs_measured",
    "residuals",
]

_DPI = 100
_CHOSEN, _RANDOM = "#1f77b4", "#d62728"


def _figure(
    width: float = 7.5, height: float = 3.8, nrows: int = 1, ncols: int = 1, **kw: Any
) -> tuple[Any, Any]:
    """A new (Figure, axes) pair; raises ImportError naming the extra when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            'lidarshard report and calibrate plots need matplotlib: pip install "lidarshard[report]"'
        ) from e
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, **kw)
    return fig, axes


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _bucket_colors(k: int) -> NDArray[np.float64]:
    from matplotlib import colormaps

    return colormaps["viridis"](np.linspace(0.05, 0.95, max(k, 1)))


def size_histogram(
    costs: NDArray[np.float64], bucket_ids: NDArray[np.int32], edges: NDArray[np.float64], unit: str
) -> bytes:
    """Histogram of per-sample cost, stacked and coloured by bucket, bucket edges dashed.

    Args:
        costs: (N,) predicted cost per accepted sample. bucket_ids: (N,) its bucket.
        edges: (K-1,) bucket edges, cost units. unit: axis label for cost.
    """
    fig, ax = _figure()
    costs = np.asarray(costs, dtype=np.float64)
    k = len(edges) + 1
    lo, hi = (float(costs.min()), float(costs.max())) if costs.size else (0.0, 1.0)
    log = lo > 0 and hi / lo > 20
    bins = np.geomspace(lo, hi, 41) if log else np.linspace(lo, hi if hi > lo else lo + 1, 41)
    colors = _bucket_colors(k)
    groups = [costs[bucket_ids == j] for j in range(k)]
    labels = [f"bucket {j} ({len(g)})" for j, g in enumerate(groups)]
    ax.hist(groups, bins=bins, stacked=True, color=colors[:k], label=labels, edgecolor="none")
    for e in edges:
        ax.axvline(e, color="black", lw=0.8, ls="--", alpha=0.7)
    if log:
        ax.set_xscale("log")
    if k <= 12:
        ax.legend(fontsize=8, ncols=2 if k > 6 else 1, title="bucket (samples)", title_fontsize=8)
    ax.set_xlabel(f"predicted cost per sample ({unit}){', log scale' if log else ''}")
    ax.set_ylabel("samples")
    ax.set_title(f"Sample sizes: {costs.size} samples in {k} cost buckets (dashed: bucket edges)")
    return _png(fig)


def step_balance(
    chosen: NDArray[np.float64], baseline: NDArray[np.float64], strategy: str, epoch: int, unit: str
) -> bytes:
    """Per-step rank load of the chosen plan and of the random baseline: the slowest and the mean
    rank (top) and their ratio (bottom; what DDP waits for, relative to the work done).

    Args:
        chosen: (S, W) cost per rank per step under ``strategy``. baseline: (S', W) under ``random``.
    """
    fig, (top, bottom) = _figure(7.5, 5.6, nrows=2, sharex=True)
    for loads, name, color in ((baseline, "random (same pool)", _RANDOM), (chosen, strategy, _CHOSEN)):
        mean, peak = loads.mean(axis=1), loads.max(axis=1)
        ratio = np.divide(peak, mean, out=np.ones_like(mean), where=mean > 0)
        lin = load_linearity(loads)
        steps = np.arange(len(ratio))
        marker = "." if len(ratio) <= 60 else None
        top.plot(steps, peak, color=color, lw=1.2, marker=marker, label=f"{name}: slowest rank")
        top.plot(steps, mean, color=color, lw=1.0, ls="--", label=f"{name}: mean rank")
        bottom.plot(
            steps,
            ratio,
            color=color,
            lw=1.2,
            marker=marker,
            label=f"{name}: linearity {lin:.3f}, worst step {ratio.max(initial=1.0):.2f}",
        )
    top.set_ylabel(f"rank load ({unit})")
    top.set_title(f"Epoch {epoch}: per-step rank load (DDP waits for the slowest rank)")
    top.legend(fontsize=7, ncols=2)
    bottom.axhline(1.0, color="grey", lw=0.8, ls=":")
    bottom.set_ylim(bottom=min(0.98, bottom.get_ylim()[0]))
    bottom.set_xlabel("step")
    bottom.set_ylabel("slowest / mean rank")
    bottom.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)
    return _png(fig)


def rank_totals(chosen: NDArray[np.float64], baseline: NDArray[np.float64], strategy: str) -> bytes:
    """Each rank's epoch total relative to the epoch mean, chosen plan (bars) vs random (crosses).

    Args:
        chosen: (E, W) total cost per rank per epoch. baseline: (E, W) the same under ``random``.
    """
    fig, ax = _figure()
    e, w = chosen.shape
    width = 0.8 / e
    x = np.arange(w)
    for i in range(e):
        pos = x - 0.4 + width * (i + 0.5)
        for loads, kind in ((chosen, "bar"), (baseline, "marker")):
            mean = loads[i].mean()
            dev = 100.0 * (loads[i] / mean - 1.0) if mean > 0 else np.zeros(w)
            spread = float(np.abs(dev).max(initial=0.0))
            if kind == "bar":
                ax.bar(
                    pos,
                    dev,
                    width * 0.9,
                    color=f"C{i}",
                    label=f"{strategy}, epoch {i}: within ±{spread:.1f}%",
                )
            else:
                ax.plot(
                    pos, dev, "x", color=f"C{i}", mew=2, label=f"random, epoch {i}: within ±{spread:.1f}%"
                )
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks(x, [str(r) for r in x] if w <= 32 else None)
    ax.set_xlabel("rank")
    ax.set_ylabel("epoch total vs mean rank (%)")
    ax.set_title("Per-rank total load per epoch (predicted cost)")
    ax.legend(fontsize=8, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    return _png(fig)


def bucket_composition(counts: NDArray[np.int64], epoch: int) -> bytes:
    """Samples of each bucket in every step (all ranks together): stacked bars, or a step x bucket
    heat map when there are more than 150 steps.

    Args:
        counts: (S, K) samples of bucket k in step s.
    """
    fig, ax = _figure()
    s, k = counts.shape
    title = f"Epoch {epoch}: bucket composition of each step (0 = cheapest)"
    if s > 150:
        image = ax.imshow(
            counts.T,
            aspect="auto",
            origin="lower",
            cmap="Greys",
            interpolation="nearest",
            extent=(-0.5, s - 0.5, -0.5, k - 0.5),
        )
        from matplotlib.ticker import MaxNLocator

        fig.colorbar(image, ax=ax, label="samples in step", ticks=MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("bucket")
        ax.set_title(title)
        ax.set_xlabel("step")
        return _png(fig)
    colors = _bucket_colors(k)
    steps = np.arange(s)
    bottom = np.zeros(s)
    for j in range(k):
        ax.bar(steps, counts[:, j], 1.0, bottom=bottom, color=colors[j], label=f"bucket {j}", lw=0)
        bottom = bottom + counts[:, j]
    if k <= 12:
        ax.legend(fontsize=7, ncols=min(k, 6), loc="upper center", bbox_to_anchor=(0.5, -0.18))
    ax.set_xlim(-0.5, s - 0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("samples in step (all ranks)")
    ax.set_title(title)
    return _png(fig)


def rejects_by_reason(reasons: Mapping[str, int]) -> bytes:
    """Horizontal bars: rejected inputs per reason."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = _figure(height=max(2.2, 0.9 + 0.35 * len(reasons)))
    items = sorted(reasons.items(), key=lambda kv: (kv[1], kv[0]))
    if not items:
        ax.text(0.5, 0.5, "no rejected inputs", ha="center", va="center", fontsize=12)
        ax.set_axis_off()
    else:
        names, values = zip(*items, strict=True)
        ax.barh(names, values, color="#8c564b")
        for y, v in enumerate(values):
            ax.text(v, y, f" {v}", va="center", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("rejected inputs")
        ax.margins(x=0.12)
    ax.set_title(f"Rejected inputs by reason ({sum(reasons.values())} total)")
    return _png(fig)


#: Epochs ``repeat_counts`` draws bars for (the manifest holds them all).
MAX_EPOCH_BARS = 8


def repeat_counts(
    expected: Mapping[str, float], realized: Sequence[Mapping[str, float]], mode: str | None
) -> bytes:
    """Grouped bars per class: expected copies per epoch (black) beside the realized copies of the
    first ``MAX_EPOCH_BARS`` epochs."""
    names = sorted(expected, key=lambda c: (len(c), c))  # class indices in numeric order
    realized = realized[:MAX_EPOCH_BARS]
    fig, ax = _figure(width=min(20.0, max(7.5, 0.3 * len(names) * (1 + len(realized)))))
    x = np.arange(len(names), dtype=np.float64)
    width = 0.8 / (1 + len(realized))
    ax.bar(x, [expected[c] for c in names], width, color="black", label="expected")
    for i, r in enumerate(realized):
        ax.bar(
            x + (i + 1) * width, [r.get(c, 0.0) for c in names], width, color=f"C{i % 10}", label=f"epoch {i}"
        )
    ax.set_xticks(x + 0.4 - width / 2, names)
    ax.set_xlabel("lidarseg class index" if names != ["all"] else "")
    ax.set_ylabel("sample copies per epoch")
    ax.set_title(f"Expected vs realized copies ({mode})")
    ax.legend(fontsize=8, ncol=min(4, 1 + len(realized)))
    return _png(fig)


def predicted_vs_measured(
    predicted: NDArray[np.float64], measured: NDArray[np.float64], unit: str, what: str, note: str = ""
) -> bytes:
    """Scatter of the manifest's predicted cost vs measured ms, least-squares line and r^2.

    Args:
        predicted: (n,) predicted cost (``unit``). measured: (n,) ms. what: "sample" or "rank-step".
        note: optional text for the lower right corner (e.g. measured vs predicted plan linearity).
    """
    fig, ax = _figure(6.0, 4.2)
    ax.scatter(predicted, measured, s=10, alpha=0.6, color=_CHOSEN, lw=0)
    if predicted.size >= 2 and np.ptp(predicted) > 0:
        slope, icept = np.polyfit(predicted, measured, 1)
        r2 = float(np.corrcoef(predicted, measured)[0, 1] ** 2)
        xs = np.array([predicted.min(), predicted.max()])
        ax.plot(xs, icept + slope * xs, color="black", lw=1, label=f"least squares, r² = {r2:.3f}")
        ax.legend(fontsize=8, loc="upper left")
    ax.set_xlabel(f"predicted cost per {what} ({unit})")
    ax.set_ylabel(f"measured time per {what} (ms)")
    if note:
        ax.text(
            0.98,
            0.03,
            note,
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"},
        )
    ax.set_title(f"Cost model check: predicted vs measured ({predicted.size} timings)")
    return _png(fig)


def idle_bars(epochs: list[int], measured: list[float], plan: list[float], random: list[float]) -> bytes:
    """Per epoch, the share of the run ranks spent waiting: measured (recorded timings), and on the cost
    model fitted to them, the plan's and a random plan's of the same samples (fractions in [0, 1])."""
    fig, ax = _figure(6.0, 3.6)
    x = np.arange(len(epochs))
    for k, (values, name, color) in enumerate(
        (
            (measured, "measured", "0.35"),
            (plan, "plan, fitted model", _CHOSEN),
            (random, "random plan, fitted model", _RANDOM),
        )
    ):
        ax.bar(x + (k - 1) * 0.27, 100 * np.asarray(values), width=0.27, label=name, color=color)
    ax.set_xticks(x, [str(e) for e in epochs])
    ax.set_xlabel("epoch")
    ax.set_ylabel("ranks idle (% of the run)")
    ax.legend(fontsize=8)
    ax.set_title("Idle time: measured, and what a random plan would have cost")
    return _png(fig)


def residuals(fitted: NDArray[np.float64], measured: NDArray[np.float64], title: str) -> bytes:
    """Two panels: measured vs fitted (with y = x) and residual vs fitted, both in ms."""
    fig, (left, right) = _figure(9.0, 3.8, ncols=2)
    left.scatter(fitted, measured, s=10, alpha=0.6, color=_CHOSEN, lw=0)
    lo = float(min(fitted.min(), measured.min())) if fitted.size else 0.0
    hi = float(max(fitted.max(), measured.max())) if fitted.size else 1.0
    left.plot([lo, hi], [lo, hi], color="black", lw=1, label="y = x")
    left.legend(fontsize=8, loc="upper left")
    left.set_xlabel("fitted (ms)")
    left.set_ylabel("measured (ms)")
    left.set_title("measured vs fitted")
    right.scatter(fitted, measured - fitted, s=10, alpha=0.6, color=_CHOSEN, lw=0)
    right.axhline(0.0, color="black", lw=1)
    right.set_xlabel("fitted (ms)")
    right.set_ylabel("measured - fitted (ms)")
    right.set_title("residuals")
    fig.suptitle(title, fontsize=10)
    return _png(fig)
