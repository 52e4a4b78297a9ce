"""``lidarshard calibrate OUT --timings T``: fit ``linear:c0,a,b`` to measured step timings.

``T`` is the training recorder's Parquet files (``lidarshard.loaders.step_timer.StepTimer``: a directory
of ``timings-rank-*.parquet``, or one of them), whose rows hold each rank-step's own compute time and
sample ids, or a CSV of measured milliseconds per sample (``sample_id, ms``, as written by
``examples/train_ddp.py --emit-timings``) or per rank per step (``step, rank, ms``, optional
``epoch``; mapped to the rank's batch through OUT's plan). The fit ``ms = c0 + a * points + b *
voxels`` (non-negative least squares, see ``lidarshard.tools.fit``) is written as JSON that
``lidarshard build --cost-model @FILE`` accepts, with R^2 and a residual plot next to it::

    {"cost_model": {"name": "linear", "c0": ..., "a": ..., "b": ...}, "r2": ..., "rmse": ...,
     "n": ..., "units": "ms", "dropped_terms": [...], "residual_plot": "cost_model_residuals.png",
     "held_out": {"train", "test", "r2", "rmse", ...}, "linearity": [...], "source": {...},
     "memory_model": {"base_bytes", "bytes_per_point", "bytes_per_voxel", "r2", ...} | null,
     "memory_note": "..."}

From rank-steps whose sample counts differ (``--strategy budget``, ``rebalance``), ``launch_ms`` too: the ms
each rank pays once per rank-step whatever its samples (kernel launches), beside the per-sample terms
(``tools.fit``). ``random_linearity``: a random plan of OUT's samples priced on the fit (launch included);
where it is at least 0.98 the fit says so ("step time hardly depends on size here: expect random's
balance"), as the build's summary of a plan on it does, instead of promising a gain.

``held_out``: the fit refitted on ~80% of the steps (or samples) and scored on the rest
(``tools.fit.held_out_fit``). ``linearity`` (recorder files only): per epoch, over
the steps every rank recorded, the measured ``linearity`` and mean per-step ``max_mean`` next to those
the manifest's cost model (``predicted``) and the fit (``fitted``) give the same steps.

``memory_model`` (``tools.memory_fit``): peak bytes of a rank-step against its points and voxels, fitted to
the recorder's ``peak_bytes`` (null, with ``memory_note`` saying why, without them); ``build
--max-step-memory SIZE --memory-model FILE`` reads it.

The ``cost_model`` holds ``"units": "ms"`` and, from recorder files, ``step_ms``: the mean ms a step lasts
beyond its slowest rank's compute (``tools.epoch_seconds``), so a plan of it predicts each epoch's seconds.
From recorder files also ``rank_speeds`` (``tools.speeds_fit.learn_speeds``: each rank's speed, fastest
1, with its 95% interval, and whether the timings tell the ranks apart) and, only when they do,
``rank_speed``: the list ``build --rank-speed @FILE`` reads.

Default output: ``OUT/report/cost_model.json`` (``report/`` is outside the manifest contract).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lidarshard.loaders import load_manifest, read_samples
from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.records import CostModel
from lidarshard.tools import fit as cal
from lidarshard.tools import memory_fit, timed_balance
from lidarshard.tools.epoch_seconds import step_overhead_ms
from lidarshard.tools.outputs import check_output_path
from lidarshard.tools.report import REPORT_DIR, plan_table, read_epochs, read_plan
from lidarshard.tools.speeds_fit import learn_speeds, speed_lines
from lidarshard.tools.timings import (
    at_mean_speed,
    check_this_plan,
    design,
    fit_cost,
    missing_timings,
    read_timings_at,
)
from lidarshard.transforms.declare import Parser, option
from lidarshard.transforms.features.cost import checked_model
from lidarshard.transforms.io import storage
from lidarshard.transforms.plan import plan_epoch
from lidarshard.transforms.plan.epoch_time import time_factors
from lidarshard.transforms.plan.explain import LITTLE_TO_WIN
from lidarshard.transforms.plan.metrics import equal_count_pool, linearity
from lidarshard.transforms.value_checks import int_in, path

__all__ = ["run", "calibrate"]


def calibrate(out: str, timings_path: str, epoch: int = 0) -> tuple[cal.LinearFit, dict, np.ndarray]:
    """Fit the linear cost model to ``timings_path`` against manifest ``out``.

    Returns:
        (fit, source info for the JSON plus its ``held_out`` and ``linearity`` checks, (n, 2) array of
        [fitted, measured] ms).
    """
    manifest = load_manifest(out)
    samples = read_samples(out)
    timings = read_timings_at(timings_path)
    check_this_plan(  # before a number of theirs sizes anything: placed in this plan, or refused
        timings, manifest, lambda epochs: plan_table(read_epochs(out, manifest, samples, epochs)), epoch
    )
    mean_rank = at_mean_speed(timings, manifest.rank_speed)  # a plan of --rank-speed: one model fits
    fit, (obs, timed, raw, keys) = fit_cost(
        mean_rank, samples, lambda: read_plan(out, manifest, samples), epoch
    )
    x, ms = design(obs), obs.column("ms").to_numpy()
    at = _rank_factors(obs, manifest)  # a rank-step takes its mean-rank time x its rank's factor
    measured = obs.set_column(obs.column_names.index("ms"), "ms", pa.array(ms * at))  # as measured
    launched = obs.column("cost").to_numpy() + (manifest.cost_model.launch_ms or 0.0) * x[:, 3]
    checks = {"predicted": launched * at, "fitted": fit.predict(x) * at}
    source = {
        "manifest": out,
        "timings": timings_path,
        "timed": timed,
        "rows": raw.num_rows,
        "matched": obs.num_rows,
        "manifest_cost_model": manifest.cost_model.to_json(),
        "held_out": cal.held_out_fit(x, ms, keys),
        "linearity": timed_balance.measured_balance(measured, checks)
        if "world_size" in obs.column_names
        else [],
        "memory": memory_fit.memory_model(timings, samples),
        "step_ms": step_overhead_ms(timings.rows) if timings.recorded else None,
        "rank_speeds": learn_speeds(measured, fit.predict(x)) if timings.recorded else None,
        "random_linearity": _random_linearity(manifest, samples, fit),
    }
    return fit, source, np.stack([fit.predict(x), ms], axis=1)


def _random_linearity(manifest: Manifest, samples: pa.Table, fit: cal.LinearFit) -> float:
    """Predicted linearity of a random plan of ``samples`` (epoch 0 of the manifest's W, B and seed) priced on
    ``fit``: each sample its fitted work, each rank-step ``fit.launch`` more."""
    feats = cal.sample_features(samples, fit.q)
    voxels = np.nan_to_num(feats.column("voxels").to_numpy(zero_copy_only=False))
    work = fit.predict(
        np.stack([np.ones(samples.num_rows), feats.column("points").to_numpy(), voxels], axis=1)
    )
    w, b = manifest.world_size, manifest.batch_size
    pool = equal_count_pool(work, w, b)
    plan = plan_epoch("random", pool, w, b, seed=manifest.seed, epoch=0)
    return linearity(plan, pool, fit.launch)


def _rank_factors(obs: pa.Table, manifest: Manifest) -> np.ndarray:
    """(n,) the time factor (``epoch_time.time_factors``) of each observation's rank: ones without
    ``--rank-speed`` or ranks (``at_mean_speed`` divided the times by it before the fit)."""
    if manifest.rank_speed is None or "rank" not in obs.column_names:
        return np.ones(obs.num_rows)
    return time_factors(manifest.rank_speed, manifest.world_size)[obs.column("rank").to_numpy()]


def _residual_png(fit: cal.LinearFit, pairs: np.ndarray, timed: str) -> bytes | None:
    """The residual figure, or None (with a note) when matplotlib is missing."""
    from lidarshard.tools import plots as report_plots

    title = (
        f"ms per {timed} = {fit.c0:.4g} + {fit.a:.4g} x points + {fit.b:.4g} x voxels{_power(fit)}  "
        f"(R² {fit.r2:.3f}, rmse {fit.rmse:.3g} ms, n {fit.n})"
    )
    try:
        return report_plots.residuals(pairs[:, 0], pairs[:, 1], title)
    except ImportError as e:
        print(f"residual plot skipped: {e}", file=sys.stderr)
        return None


def _power(fit: cal.LinearFit) -> str:
    """``^q`` of a fit whose voxel exponent is not 1, else nothing."""
    return f"^{fit.q:g}" if fit.q != 1.0 else ""


def _timed(model: dict, step_ms: float | None, speeds: dict | None) -> dict:
    """The JSON keys of the time a step takes: the model in ``units`` ms with its ``step_ms`` (from recorder
    files), and the ranks' learned speeds (``rank_speeds``; ``rank_speed`` only when they tell the ranks
    apart: what ``--rank-speed @FILE`` reads)."""
    model = model | {"units": "ms"} | ({"step_ms": step_ms} if step_ms is not None else {})
    out: dict = {"cost_model": model}
    if speeds is not None:
        out["rank_speeds"] = speeds
        if speeds["distinguished"]:
            out["rank_speed"] = speeds["speed"]
    return out


def _check_lines(checks: dict) -> list[str]:
    """The held-out score and per-epoch balance, as printed."""
    h = checks["held_out"]
    lines = [
        f"held out {h['test']} of {h['train'] + h['test']}: "
        + (f"R^2 {h['r2']:.4f}, rmse {h['rmse']:.4g} ms" if h["r2"] is not None else h["note"])
    ]
    for row in checks["linearity"]:
        m, p, f = row["measured"], row["predicted"], row["fitted"]
        lines.append(
            f"epoch {row['epoch']} ({row['steps']} steps x {row['world_size']} ranks): linearity measured "
            f"{m['linearity']:.3f}, predicted {p['linearity']:.3f}, fitted {f['linearity']:.3f}; "
            f"step max/mean measured {m['max_mean']:.3f}, predicted {p['max_mean']:.3f}, fitted {f['max_mean']:.3f}"
        )
    return lines


def _random_line(random: float) -> str:
    """What a random plan of OUT's samples is predicted to reach on the fit, and whether a plan can win."""
    line = f"a random plan of these samples, priced on the fit: linearity {random:.3f}"
    if random >= LITTLE_TO_WIN:
        return line + ": step time hardly depends on size here: expect random's balance"
    return line


@dataclass(frozen=True, kw_only=True)
class CalibrateOptions:
    """``lidarshard calibrate``'s arguments."""

    out: str = option("the manifest directory the timings were measured on", positional=True, check=path(),
                      metavar="OUT")  # fmt: skip
    timings: str = option("the recorder's timings-rank-*.parquet (a directory or one file), or a CSV: ms + "
                          "sample_id, or ms + step, rank [, epoch]", check=path())  # fmt: skip
    epoch: int = option("epoch of step/rank timings without an epoch column", 0, check=int_in(0), metavar="E")
    output: str | None = option("JSON to write", None, check=path(), short="-o",
                                shown=f"OUT/{REPORT_DIR}/cost_model.json")  # fmt: skip


def parser() -> Parser:
    """The ``calibrate`` command line: the arguments of ``CalibrateOptions``."""
    return Parser("lidarshard calibrate", __doc__.split("\n\n")[0], CalibrateOptions)


def run(argv: list[str] | None = None) -> int:
    args, _ = parser().read(argv)
    missing = missing_timings(args.timings)
    if missing:
        print(f"lidarshard calibrate: {missing}", file=sys.stderr)
        return 2
    output = args.output or f"{args.out.rstrip('/')}/{REPORT_DIR}/cost_model.json"
    directory, _, name = output.rpartition("/")
    try:
        check_output_path(output, "-o")
        fit, source, pairs = calibrate(args.out, args.timings, args.epoch)
    except (ValueError, OSError) as e:
        print(f"lidarshard calibrate: {e}", file=sys.stderr)
        return 1
    try:  # never write a model the build would refuse (a fit of absurd timings)
        checked_model(CostModel("linear", fit.c0, fit.a, fit.b, fit.q, "ms", None, fit.launch or None))
    except ValueError as e:
        print(f"lidarshard calibrate: the fit is no usable cost model: {e}", file=sys.stderr)
        return 1
    png = _residual_png(fit, pairs, "sample" if source["timed"] == "sample" else "rank-step")
    plot_name = name.removesuffix(".json") + "_residuals.png"
    checks = {k: source.pop(k) for k in ("held_out", "linearity", "random_linearity")}
    memory = source.pop("memory")
    body = (
        fit.to_json("ms") | checks | memory | {"residual_plot": plot_name if png else None, "source": source}
    )
    body |= _timed(body["cost_model"], source.pop("step_ms"), source.pop("rank_speeds"))
    files = {name: (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()}
    if png:
        files[plot_name] = png
    for file_name, data in files.items():
        storage.write_bytes(storage.join(directory or ".", file_name), data)
    print(
        f"fit over {fit.n} timed {source['timed']}s ({source['rows'] - source['matched']} rows unmatched): "
        f"ms = {fit.c0:.6g} + {fit.a:.6g} * points + {fit.b:.6g} * voxels{_power(fit)} per sample"
        + (f" + {fit.launch:.6g} per rank-step" if fit.launch > 0 else "")
        + "\n"
        f"R^2 {fit.r2:.4f}, rmse {fit.rmse:.4g} ms"
        + (f"; dropped (negative when fitted): {', '.join(fit.dropped)}" if fit.dropped else "")
    )
    print("\n".join(_check_lines(checks)))
    print(_random_line(checks["random_linearity"]))
    print(memory_fit.memory_line(memory))
    if body.get("rank_speeds"):
        print("\n".join(speed_lines(body["rank_speeds"])))
    if fit.r2 < 0.5:
        print(
            f"warning: R^2 {fit.r2:.3f} is low; the timings may be too noisy to rank samples", file=sys.stderr
        )
    print(f"wrote {output}; rebuild with --cost-model @{output}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
