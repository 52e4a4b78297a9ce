"""DDP scaling linearity: PyTorch's DistributedSampler vs lidarshard manifests, same data, same model.

Runs ``examples/train_ddp.py`` (2 gloo ranks on CPU, one thread each) twice on the same manifest
directory: once with ``--sampler distributed`` (the baseline: random, size-blind batches) and once
with ``--sampler lidarshard`` (the manifest's balanced plan). Prints, per run, the wall time per epoch
and the measured linearity (sum_steps mean_rank compute / sum_steps max_rank compute), then the ratios.
Target: lidarshard linearity >= 0.95 and >= baseline + 0.1. Columns: ``linearity`` from perf_counter
compute times (the target's measure), ``cpu_lin`` the same from thread CPU time (less sensitive to other
processes on the host), ``points_lin`` / ``cost_lin`` the same ratio over points and over the manifest's
predicted costs of the batches each run actually trained on.

Manifest source, one of:
    --manifest OUT      an existing ``lidarshard build`` output;
    (default)           ``lidarshard synth`` + ``lidarshard build`` into a temp dir (``--scenes``, ...);
    --fixture           synthetic clouds and a manifest from ``lidarshard.write_manifest`` (no Beam
                        pipeline, no scan; the pipeline's planner on their point counts).

    python benchmarks/ddp_bench.py --manifest OUT [--epochs 1] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train_ddp.py"
SAMPLERS = ("distributed", "lidarshard")

__all__ = ["main"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--manifest", type=Path, help="existing manifest dir (lidarshard build output)")
    src.add_argument(
        "--fixture", action="store_true", help="synthetic clouds + lidarshard.write_manifest, no pipeline"
    )
    p.add_argument("--workdir", type=Path, default=None, help="where inputs are written (default: temp)")
    p.add_argument("--scenes", type=int, default=8, help="lidarshard synth --scenes")
    p.add_argument("--batch-size", type=int, default=2, help="samples per rank per step (build)")
    p.add_argument("--plan-epochs", type=int, default=1, help="epochs planned by build / the fixture")
    p.add_argument("--sweeps", type=int, default=9, help="build --sweeps (fixture: 2)")
    p.add_argument("--synth-args", default="--runner=FnApiRunner", help="extra flags for lidarshard synth")
    p.add_argument("--build-args", default="--runner=FnApiRunner", help="extra flags for lidarshard build")
    p.add_argument("--fixture-samples", type=int, default=64)
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default: all planned)")
    p.add_argument("--repeats", type=int, default=1, help="runs per sampler, alternating; medians reported")
    p.add_argument("--train-args", default="", help="extra flags for train_ddp.py (e.g. '--width 128')")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    p.add_argument(
        "--closed-loop",
        action="store_true",
        help="also run 'calibrated': epoch 0 on the manifest's cost model with the StepTimer recording, then "
        "calibrate + re-plan epochs 1.. (train_ddp.py --replan-after 1), and 'identical' (every rank the same "
        "batches: the machine's noise floor); compares epochs 1.. of all four",
    )
    args = p.parse_args(argv)
    if args.closed_loop and args.plan_epochs < 2:
        args.plan_epochs = 3  # epoch 0 measures, epochs 1.. are compared
    return args


def _cli(*args: str) -> None:
    """Run ``lidarshard ARGS`` with this interpreter (works without an installed entry point)."""
    cmd = [sys.executable, "-m", "lidarshard.pipelines.cli", *args]
    print("+ lidarshard " + shlex.join(args), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, env=_env())


def _env() -> dict[str, str]:
    path = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _synth_build(args: argparse.Namespace, work: Path) -> Path:
    data, out = work / "synth", work / "manifest"
    _cli("synth", str(data), "--scenes", str(args.scenes), *shlex.split(args.synth_args))
    _cli(
        "build",
        str(data),
        str(out),
        "--nuscenes-version",
        "v1.0-synth",
        "--sweeps",
        str(args.sweeps),
        "--world-size",
        "2",
        "--batch-size",
        str(args.batch_size),
        "--epochs",
        str(args.plan_epochs),
        *shlex.split(args.build_args),
    )
    return out


def _sweep_transform(k: int) -> list[float]:
    """Row-major 4x4 sweep k -> keyframe transform: a 0.5 m x-translation per sweep."""
    m = np.eye(4)
    m[0, 3] = 0.5 * (k + 1)
    return m.ravel().tolist()


def _fixture(args: argparse.Namespace, work: Path) -> Path:
    """Clouds (keyframe + 2 sweeps, x5 float32) with log-uniform sizes and a manifest planned from
    their point counts by ``lidarshard.write_manifest`` (the pipeline's planner, no Beam run)."""
    import pyarrow as pa

    import lidarshard

    rng = np.random.default_rng(0)  # log-uniform sizes: a few large scenes dominate, as in driving logs
    sizes = np.exp(rng.uniform(np.log(1_000), np.log(12_000), args.fixture_samples)).astype(int)
    (work / "data").mkdir(parents=True, exist_ok=True)
    cols: dict[str, list] = {
        k: [] for k in ("sample_id", "path", "sweep_paths", "sweep_transforms", "num_points")
    }
    for i, n in enumerate(sizes.tolist()):
        files = [work / "data" / f"s{i:05d}{suffix}.pcd.bin" for suffix in ("", "_0", "_1")]
        for f in files:
            rng.normal(scale=20.0, size=(n, 5)).astype(np.float32).tofile(f)
        cols["sample_id"].append(f"s{i:05d}")
        cols["path"].append(str(files[0]))
        cols["sweep_paths"].append([str(f) for f in files[1:]])
        cols["sweep_transforms"].append(_sweep_transform(0) + _sweep_transform(1))
        cols["num_points"].append(3 * n)
    cols["num_in_range"] = cols["num_points"]
    out = work / "out"
    lidarshard.write_manifest(pa.table(cols), str(out), 2, args.batch_size, epochs=args.plan_epochs,
                              cost_model="points")  # fmt: skip
    return out


def _train(manifest: Path, mode: str, args: argparse.Namespace, work: Path, i: int) -> dict[str, Any]:
    out = work / f"run-{mode}-{i}.json"
    sampler = "distributed" if mode == "distributed" else "lidarshard"
    cmd = [sys.executable, str(TRAIN), "--manifest", str(manifest), "--sampler", sampler]
    cmd += ["--json-out", str(out)] + (["--identical"] if mode == "identical" else [])
    if mode == "calibrated":
        cmd += ["--replan-after", "1", "--timings", str(work / f"timings-{i}")]
    if args.epochs is not None:
        cmd += ["--epochs", str(args.epochs)]
    subprocess.run(cmd + shlex.split(args.train_args), check=True, env=_env())
    run = json.loads(out.read_text())
    if args.closed_loop:  # compare the epochs after the calibration only, for every mode
        later = run["epochs"][1:]
        compute = [np.asarray(e["compute_s"], dtype=np.float64) for e in later]  # (W, steps) each
        run["linearity"] = float(sum(c.mean(0).sum() for c in compute) / sum(c.max(0).sum() for c in compute))
        run["wall_s_per_epoch"] = float(np.mean([e["wall_s"] for e in later]))
        planned = [b["linearity"] for b in _manifest_balance(mode, manifest, work, i)[1:]]
        run["planned_linearity_later"] = float(np.mean(planned)) if planned else float("nan")
    return run


def _manifest_balance(mode: str, manifest: Path, work: Path, i: int) -> list[dict]:
    """The balance the plan a mode trained on predicts per epoch (the re-plan's for ``calibrated``)."""
    if mode in ("distributed", "identical"):
        return []
    out = work / f"timings-{i}" / "replan" if mode == "calibrated" else manifest
    return json.loads((out / "_manifest.json").read_text())["balance"]


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def _print_loop(summary: dict[str, dict[str, float]], runs: dict[str, list[dict[str, Any]]]) -> None:
    """The closed loop's table: epochs 1.. of each mode, measured vs the plan's predicted linearity."""
    print("\nclosed loop, epochs 1.. (after one calibration on epoch 0's recorded step times):")
    print(f"{'mode':<12} {'wall s/epoch':>12} {'measured':>9} {'predicted':>10} {'gap':>7}")
    for mode, r in summary.items():
        predicted = _median(runs[mode], "planned_linearity_later")  # nan: no plan of its own
        print(f"{mode:<12} {r['wall_s_per_epoch']:>12.3f} {r['linearity']:>9.4f} {predicted:>10.4f} "
              f"{predicted - r['linearity']:>+7.4f}")  # fmt: skip
    print(
        "identical: every rank trains the same batches, so its linearity is the noise floor of this machine's "
        "step times, the most any plan can measure here"
    )
    print("targets: calibrated measured >= 0.97 at B=2 (0.95 at B=1), predicted - measured <= 0.02")


def main(argv: list[str] | None = None) -> int:
    """Run both samplers on one manifest dir, print the comparison, return the exit status."""
    args = _parse(argv)
    with tempfile.TemporaryDirectory(prefix="ddp_bench-") as tmp:
        work = (args.workdir or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        if args.manifest is not None:
            manifest = args.manifest
        elif args.fixture:
            manifest = _fixture(args, work)
        else:
            manifest = _synth_build(args, work)
        modes = (*SAMPLERS, "calibrated", "identical") if args.closed_loop else SAMPLERS
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in modes}
        for i in range(args.repeats):
            for s in modes if i % 2 == 0 else modes[::-1]:
                runs[s].append(_train(manifest, s, args, work, i))
    keys = ("wall_s_per_epoch", "linearity", "cpu_linearity", "points_linearity", "cost_linearity")
    summary = {s: {k: _median(runs[s], k) for k in keys} for s in modes}
    if args.closed_loop:
        _print_loop(summary, runs)
    base, ours = summary["distributed"], summary["lidarshard"]
    print(f"\nmanifest: {manifest}  (2 gloo ranks, 1 thread each; medians of {args.repeats} run(s))")
    print(
        f"{'sampler':<12} {'wall s/epoch':>12} {'linearity':>10} {'cpu_lin':>8} {'points_lin':>10} {'cost_lin':>8}"
    )
    for s in SAMPLERS:
        r = summary[s]
        print(f"{s:<12} {r['wall_s_per_epoch']:>12.3f} {r['linearity']:>10.4f} "
              f"{r['cpu_linearity']:>8.4f} {r['points_linearity']:>10.4f} {r['cost_linearity']:>8.4f}")  # fmt: skip
    speedup = base["wall_s_per_epoch"] / max(ours["wall_s_per_epoch"], 1e-12)
    gain = ours["linearity"] - base["linearity"]
    ok = ours["linearity"] >= 0.95 and gain >= 0.1
    print(f"wall ratio distributed/lidarshard = {speedup:.3f}x; linearity ratio = "
          f"{ours['linearity'] / max(base['linearity'], 1e-12):.3f}; gain = {gain:+.4f}  "
          f"[target >= 0.95 and >= +0.10: {'met' if ok else 'MISSED'}]")  # fmt: skip
    if args.json_out is not None:
        args.json_out.write_text(json.dumps({"summary": summary, "runs": runs, "speedup": speedup}, indent=1))
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
