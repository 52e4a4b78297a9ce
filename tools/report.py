"""``lidarshard report OUT [--timings DIR | t.csv]``: plots and a summary of a built manifest directory.

Writes ``OUT/report/report.html`` and its PNGs next to it in ``OUT/report/`` (``--output-dir`` to
put them elsewhere, e.g. when OUT is read-only). ``report/`` is not part of the manifest contract:
it is not listed in ``_manifest.json['files']`` and a rebuild of OUT removes it.

The random baseline is recomputed, not read: ``lidarshard.transforms.core.planner.plan_samples`` with
the manifest's settings (``PlanConfig.from_manifest``) plans each epoch again and gives its
``baseline``, the ``random`` plan of the same pool behind the manifest's ``random_linearity``. The
chosen plan is read by ``loaders.epoch_plan.read_epoch_plan``, the one reader of an epoch's plan. Plain
Python, no Beam pipeline.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard import schemas
from lidarshard.loaders import load_manifest, read_samples
from lidarshard.loaders.epoch_plan import EpochRows, read_epoch_plan
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools import fit as cal
from lidarshard.tools import plots, timed_balance
from lidarshard.tools.epoch_seconds import epoch_lines
from lidarshard.tools.outputs import check_output_path
from lidarshard.tools.report_page import epoch_figure, page
from lidarshard.tools.timings import (
    Timings,
    at_mean_speed,
    check_this_plan,
    fit_cost,
    missing_timings,
    observe,
    read_timings_at,
)
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.planner import as_planned, plan_samples
from lidarshard.transforms.declare import Parser, option
from lidarshard.transforms.io import storage
from lidarshard.transforms.plan.epoch_time import time_factors
from lidarshard.transforms.plan.explain import plan_buys
from lidarshard.transforms.plan.metrics import load_linearity, rank_costs
from lidarshard.transforms.value_checks import int_in, path

__all__ = [
    "run",
    "ReportData",
    "load",
    "read_plan",
    "read_epochs",
    "plan_table",
    "write_report",
    "summarize",
    "plan_in_words",
    "REPORT_DIR",
]

#: Sub-directory of OUT that holds the report (not part of the manifest contract).
REPORT_DIR = schemas.REPORT_DIR


def read_epochs(
    out: str, m: Manifest, samples: pa.Table, epochs: Sequence[int] | None = None
) -> list[EpochRows]:
    """Every epoch's plan (or ``epochs``'), read by ``read_epoch_plan`` (the files verified, every
    sample_id looked up in ``samples``), each with its ``cost`` and ``bucket_id`` columns."""
    ids = samples.column("sample_id")
    wanted = range(m.epochs) if epochs is None else epochs
    return [read_epoch_plan(out, m, e, ids, ["cost", "bucket_id"]) for e in wanted]


def plan_table(epochs: list[EpochRows]) -> pa.Table:
    """All epochs' plan rows (epoch, step, rank, slot, sample_id, cost, bucket_id), sorted by
    (epoch, step, rank, slot)."""
    cols = ["epoch", "step", "rank", "slot", "sample_id", "cost", "bucket_id"]
    parts = [
        r.table.append_column("epoch", pa.array(np.full(r.table.num_rows, r.epoch, np.int64))).select(cols)
        for r in epochs
    ]
    table = pa.concat_tables(parts) if parts else pa.table({c: pa.array([], pa.int64()) for c in cols})
    return table.sort_by([(k, "ascending") for k in ("epoch", "step", "rank", "slot")])


def read_plan(out: str, m: Manifest | None = None, samples: pa.Table | None = None) -> pa.Table:
    """Every epoch's and rank's plan rows (``plan_table`` of ``read_epochs``); ``m`` and ``samples``
    are read from ``out`` when not given."""
    m = load_manifest(out) if m is None else m
    samples = read_samples(out, ["sample_id"]) if samples is None else samples
    return plan_table(read_epochs(out, m, samples))


@dataclass
class ReportData:
    """What the plots need, all in predicted-cost units of the manifest's cost model."""

    manifest: Manifest
    samples: pa.Table  # the samples (scored), all parts
    plan: pa.Table  # all epochs' plan rows: epoch, step, rank, slot, sample_id, cost, bucket_id
    chosen: list[NDArray[np.float64]]  # per epoch (S_e, W) cost per rank per step
    baseline: list[NDArray[np.float64]]  # the same under ``random`` on the same pool
    reasons: dict[str, int]  # rejects per reason
    plans: list[tuple[NDArray[np.int64], NDArray[np.int64]]] = field(default_factory=list)  # per epoch
    # (the plan, the random plan of the same pool): (S, W, M) samples rows, -1 empty


def load(out: str) -> ReportData:
    """Read a committed manifest directory and recompute each epoch's random baseline.

    Raises:
        ValueError: the manifest or a plan row is not usable (``lidarshard validate`` names it).
    """
    m = load_manifest(out)
    samples = read_samples(out)
    epochs = read_epochs(out, m, samples)
    cfg = PlanConfig.from_manifest(m)
    chosen, baseline, plans = [], [], []
    for e, read in enumerate(epochs):
        planned = as_planned(samples, e, cfg)  # the costs that planned epoch e (a re-plan's cost_history)
        costs = planned.column("cost").to_numpy()
        plans.append((read.plan, plan_samples(planned, e, cfg).baseline))
        chosen.append(rank_costs(plans[-1][0], costs))
        baseline.append(rank_costs(plans[-1][1], costs))
    try:
        reasons_col = storage.read_parquet(storage.join(out, schemas.REJECTS_FILE)).column("reason")
        reasons = {str(r["values"]): int(r["counts"]) for r in pc.value_counts(reasons_col).to_pylist()}
    except FileNotFoundError:
        reasons = dict(m.counts.rejected_by_reason)
    return ReportData(m, samples, plan_table(epochs), chosen, baseline, reasons, plans)


def cost_unit(m: Manifest) -> str:
    """Axis label for the manifest's cost units."""
    return {"points": "points", "voxels": "occupied voxels"}.get(m.cost_model.name, "linear-model units")


def _step_buckets(data: ReportData, epoch: int) -> NDArray[np.int64]:
    """(S, K) samples of each bucket per step of ``epoch``."""
    part = data.plan.filter(pc.equal(data.plan.column("epoch"), epoch))
    steps = part.column("step").to_numpy().astype(np.int64)
    ids = part.column("bucket_id").to_numpy().astype(np.int64)  # as planned: a re-plan's epochs differ
    k = max(data.manifest.buckets.k, int(ids.max()) + 1 if ids.size else 0)
    counts = np.zeros((int(steps.max()) + 1 if steps.size else 0, k), dtype=np.int64)
    np.add.at(counts, (steps, ids), 1)
    return counts


def _spread(loads: NDArray[np.float64]) -> float:
    """Largest |rank total / mean - 1| over ranks, in percent."""
    tot = loads.sum(axis=0)
    return float(100 * np.abs(tot / tot.mean() - 1).max()) if tot.mean() > 0 else 0.0


def _timings(data: ReportData, path: str, epoch: int) -> tuple[dict[str, bytes], list[str]]:
    """Predicted-vs-measured figure and summary lines for timings (recorder files or a CSV)."""
    read = read_timings_at(path)
    check_this_plan(read, data.manifest, lambda _: data.plan, epoch)  # placed in this plan, or refused
    timed = observe(read, data.samples, lambda: data.plan, epoch)
    obs, timings = timed.obs, timed.raw
    pred, ms = obs.column("cost").to_numpy(), obs.column("ms").to_numpy()
    what = timed.timed
    unit = cost_unit(data.manifest)
    r2 = float(np.corrcoef(pred, ms)[0, 1] ** 2) if obs.num_rows > 1 and np.ptp(pred) > 0 else float("nan")
    lines = [
        f"timings: {obs.num_rows} of {timings.num_rows} rows matched ({what}); "
        f"predicted vs measured r^2 {r2:.3f}"
    ]
    factors = time_factors(data.manifest.rank_speed, data.manifest.world_size)  # a rank-step: cost x factor
    if "world_size" in obs.column_names:  # recorder: the steps every rank recorded, any plan
        rows = [
            {
                "epoch": r["epoch"],
                "steps": r["steps"],
                "measured": r["measured"]["linearity"],
                "predicted": r["predicted"]["linearity"],
                "max_mean": (r["measured"]["max_mean"], r["predicted"]["max_mean"]),
            }
            for r in timed_balance.measured_balance(
                obs, {"predicted": pred * factors[obs.column("rank").to_numpy()]}
            )
        ]
    else:
        rows = timed_balance.plan_linearity(timings, data.plan, data.manifest.batch_size, epoch)
    if not rows and {"step", "rank"} <= set(timings.column_names):
        lines.append("  (no step of this plan is fully timed: the timings come from another plan or sampler)")
    for row in rows:
        lines.append(
            f"  epoch {row['epoch']}: measured linearity {row['measured']:.3f} "
            f"(predicted {row['predicted']:.3f}) over {row['steps']} fully timed steps"
            + (
                f"; {100 * (1 - row['measured']):.1f}% idle; step max/mean measured {row['max_mean'][0]:.3f} "
                f"(predicted {row['max_mean'][1]:.3f})"
                if "max_mean" in row
                else ""
            )
        )
    note = "\n".join(
        f"epoch {r['epoch']} linearity: predicted {r['predicted']:.3f}, measured {r['measured']:.3f}"
        for r in rows[:4]
    )
    lines += [
        "  " + line for line in epoch_lines(data.manifest, data.chosen, timings if read.recorded else None)
    ]
    figs = {"predicted_vs_measured.png": plots.predicted_vs_measured(pred, ms, unit, what, note)}
    if "world_size" in obs.column_names and rows:
        idle = _what_if(
            data, at_mean_speed(read, data.manifest.rank_speed), epoch, [r["epoch"] for r in rows]
        )
        for (e, plan_idle, random_idle), row in zip(idle, rows, strict=True):
            lines.append(
                f"  epoch {e}: {100 * (1 - row['measured']):.1f}% idle measured; on the measured model (the "
                f"fit) this plan {100 * plan_idle:.1f}% idle, a random plan {100 * random_idle:.1f}%"
            )
        measured = [1 - r["measured"] for r in rows]
        figs["idle.png"] = plots.idle_bars(
            [e for e, _, _ in idle], measured, [i[1] for i in idle], [i[2] for i in idle]
        )
    return figs, lines


def _what_if(
    data: ReportData, timings: Timings, epoch: int, epochs: list[int]
) -> list[tuple[int, float, float]]:
    """(epoch, idle fraction of the plan, of a random plan of the same pool) under the cost model fitted
    to ``timings`` (``timings.fit_cost``, as ``calibrate`` writes it): what the measured
    model says balance saved."""
    fit, _ = fit_cost(timings, data.samples, lambda: data.plan, epoch)
    feats = cal.sample_features(data.samples, fit.q)
    per_sample = fit.predict(
        np.stack(
            [
                np.ones(data.samples.num_rows),
                feats.column("points").to_numpy(),
                np.nan_to_num(feats.column("voxels").to_numpy(zero_copy_only=False)),
            ],
            axis=1,
        )
    )
    factors, out = time_factors(data.manifest.rank_speed, data.manifest.world_size), []
    for e in epochs:
        if e >= 0 and data.plans:  # a cycled run's epoch e trained the plan of e % epochs
            chosen, random = data.plans[e % len(data.plans)]
            out.append(
                (
                    e,
                    1 - load_linearity(rank_costs(chosen, per_sample, fit.launch) * factors),
                    1 - load_linearity(rank_costs(random, per_sample, fit.launch) * factors),
                )
            )
    return out


def plan_in_words(m: Manifest) -> list[str]:
    """What the plan buys, one line per epoch, worded as the build's summary words it (``plan_buys``)."""
    return [line for line in map(plan_buys, m.balance) if line]


def summarize(data: ReportData) -> list[str]:
    """Terminal summary lines (also shown in the HTML): first what the plan buys, in plain words."""
    m, c = data.manifest, data.manifest.counts
    rej = ", ".join(f"{r} {n}" for r, n in sorted(data.reasons.items()))
    lines = plan_in_words(m) + [
        f"{c.accepted} samples accepted, {c.rejected} rejected{f' ({rej})' if rej else ''}; "
        f"{m.buckets.k} buckets over cost model {m.cost_model.name}",
        f"plan {m.strategy}: world size {m.world_size}, batch {m.batch_size}, "
        f"{m.epochs} epoch(s) of {list(m.steps_per_epoch)} steps",
    ]
    speeds = np.asarray(m.rank_speed or 1.0, dtype=np.float64)  # the ranks' times: cost / speed
    for e, (ch, rnd) in enumerate(zip(data.chosen, data.baseline, strict=True)):
        worst = (ch.max(axis=1) / np.maximum(ch.mean(axis=1), 1e-300)).max(initial=1.0)
        worst_r = (rnd.max(axis=1) / np.maximum(rnd.mean(axis=1), 1e-300)).max(initial=1.0)
        lines.append(
            f"epoch {e}: linearity {load_linearity(ch):.3f} (random {load_linearity(rnd):.3f}); worst step max/mean "
            f"{worst:.2f} (random {worst_r:.2f}); rank totals within {_spread(ch):.1f}% "
            f"(random {_spread(rnd):.1f}%)"
            + ("" if m.rank_speed is None else f"; at the ranks' speeds {load_linearity(ch / speeds):.3f} "
               f"(random {load_linearity(rnd / speeds):.3f})")
        )  # fmt: skip
    rep = m.repeat
    if rep:
        ids = data.samples.column("bucket_id").to_numpy()
        expected = data.samples.column("weight").to_numpy() * np.asarray(m.buckets.weights)[ids]
        ratio = [np.mean([r.get(k, 0.0) for r in rep.realized]) / v for k, v in rep.expected.items() if v > 0]
        lines.append(
            f"weights {rep.mode}: {expected.sum():.1f} sample copies expected per epoch, planned "
            f"{', '.join(str(p) for p in c.planned)}; realized/expected per class "
            f"{min(ratio, default=1.0):.3f}..{max(ratio, default=1.0):.3f} (repeat.png)"
        )
    return lines


def write_report(
    data: ReportData, out: str, directory: str, epoch: int | None, timings: str | None
) -> list[str]:
    """Render every figure and the HTML page into ``directory``; returns the summary lines. ``epoch``: the
    epoch of the per-step figures (None: every epoch, up to ``plots.MAX_EPOCH_BARS``)."""
    if epoch is not None and not 0 <= epoch < len(data.chosen):
        raise ValueError(f"--epoch {epoch} not in 0..{len(data.chosen) - 1}")
    m = data.manifest
    unit = cost_unit(m)
    lines = summarize(data)
    files = {
        "sizes.png": plots.size_histogram(
            data.samples.column("cost").to_numpy(),
            data.samples.column("bucket_id").to_numpy(),
            np.asarray(m.buckets.edges, dtype=np.float64),
            unit,
        ),
        "rank_totals.png": plots.rank_totals(
            np.stack([c.sum(axis=0) for c in data.chosen]),
            np.stack([c.sum(axis=0) for c in data.baseline]),
            m.strategy,
        ),
    }
    if data.reasons:  # no empty panel when nothing was rejected (the summary says "0 rejected")
        files["rejects.png"] = plots.rejects_by_reason(data.reasons)
    shown = range(min(len(data.chosen), plots.MAX_EPOCH_BARS)) if epoch is None else [epoch]
    for e in shown:  # every epoch's per-step figures (or --epoch's): the first as step_balance.png
        at = e == shown[0]
        files[epoch_figure("step_balance.png", e, at)] = plots.step_balance(
            data.chosen[e], data.baseline[e], m.strategy, e, unit
        )
        files[epoch_figure("buckets.png", e, at)] = plots.bucket_composition(_step_buckets(data, e), e)
    if len(shown) < len(data.chosen):
        lines.append(
            f"per-step figures of epochs 0-{shown[-1]} of {len(data.chosen)}: --epoch E shows another"
        )
    if m.repeat:
        rep = m.repeat
        files["repeat.png"] = plots.repeat_counts(rep.expected, rep.realized, rep.mode)
    if timings:
        figs, more = _timings(data, timings, shown[0])
        files |= figs
        lines += more
    files["report.html"] = page(out, lines, set(files), len(plan_in_words(m)))
    for name, content in files.items():
        storage.write_bytes(storage.join(directory, name), content)
    return lines


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    """``lidarshard report``'s arguments."""

    out: str = option(
        "a manifest directory written by lidarshard build", positional=True, check=path(), metavar="OUT"
    )
    timings: str | None = option(
        "the training recorder's timings-rank-*.parquet (a directory or one file), or a CSV of measured ms "
        "(sample_id and/or step, rank): adds predicted vs measured and the measured linearity", None, check=path())  # fmt: skip
    epoch: int | None = option("the one epoch of the per-step plots", None, check=int_in(0), metavar="E",
                               shown="every epoch, up to 8")  # fmt: skip
    output_dir: str | None = option("where to write", None, check=path(), shown=f"OUT/{REPORT_DIR}")


def parser() -> Parser:
    """The ``report`` command line: the arguments of ``ReportOptions``."""
    return Parser("lidarshard report", __doc__.split("\n\n")[0], ReportOptions)


def run(argv: list[str] | None = None) -> int:
    args, _ = parser().read(argv)
    missing = missing_timings(args.timings) if args.timings is not None else None
    if missing:
        print(f"lidarshard report: {missing}", file=sys.stderr)
        return 2
    directory = args.output_dir or f"{args.out.rstrip('/')}/{REPORT_DIR}"
    try:
        check_output_path(directory, "--output-dir", is_dir=True)
        data = load(args.out)
        lines = write_report(data, args.out, directory, args.epoch, args.timings)
    except (ValueError, OSError, ImportError) as e:
        print(f"lidarshard report: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    print(f"wrote {directory}/report.html")
    return 0


if __name__ == "__main__":
    sys.exit(run())
