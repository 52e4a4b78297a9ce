"""Time to accuracy: does a balanced plan change what the model learns, and how fast it gets there?

Synthesizes a labelled nuScenes-style dataroot (``lidarshard synth --labels``), scans it once, splits
the *scenes* into train and validation (the last ``--val-scenes`` scenes by name), builds one train
manifest per (strategy, seed) with ``build --from-samples`` and one validation manifest, then trains
``examples/train_ddp.py``'s segmentation net on the lidarseg labels (2 gloo ranks, one CPU thread
each) with every sampler and seed: ``distributed`` (PyTorch's DistributedSampler over the same train
samples) and each lidarshard strategy. A seed fixes the model initialisation, the plan and the
DistributedSampler shuffle, so runs with one seed differ only in the sampler.

After every epoch each run records validation mIoU (classes present in the validation labels) and
loss, and two training clocks (evaluation not included): the epoch's wall time, and its critical-path
CPU time ``sum over steps of max over ranks`` of each rank's thread CPU time for forward + backward
(what the epoch would take on otherwise idle cores: other processes on a shared host stretch the wall
clock, not the thread CPU time). Prints per run, then per sampler: final mIoU mean / std / min-max
over seeds, both clocks per epoch, and the time to reach the target (``--target-frac`` of the best
final mIoU of all runs; cumulative time at the first epoch at or above it) on both clocks; writes a
plot of mIoU vs both clocks for all runs (``--plot``). ``--workdir W --reuse`` keeps finished runs.

    python benchmarks/accuracy_bench.py                      # full size (~30 min on 2 idle cores)
    python benchmarks/accuracy_bench.py --scenes 4 --val-scenes 2 --epochs 2 --seeds 0   # smoke run
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
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from synthetic import synth_args

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train_ddp.py"

__all__ = ["main", "summarize", "time_to_target"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=None, help="keep inputs and results here (default: temp)")
    p.add_argument("--scenes", type=int, default=20, help="scenes synthesized (train + validation)")
    p.add_argument("--val-scenes", type=int, default=5, help="scenes held out for validation")
    p.add_argument("--keyframes", type=int, default=4, help="synth --keyframes-per-scene")
    p.add_argument("--sweeps", type=int, default=3, help="previous sweeps aggregated per keyframe")
    p.add_argument("--batch-size", type=int, default=2, help="samples per rank per step")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    p.add_argument("--strategies", default="balanced,mixed", help="lidarshard strategies to compare")
    p.add_argument(
        "--train-args", default="--width 32 --optimizer adam --lr 0.01", help="extra flags for train_ddp.py"
    )
    p.add_argument("--target-frac", type=float, default=0.95, help="target = this x best final mIoU")
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "accuracy.png")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--reuse", action="store_true", help="keep run results already in --workdir")
    return p.parse_args(argv)


def _env() -> dict[str, str]:
    path = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _run(cmd: list[str]) -> None:
    print("+ " + shlex.join(cmd[2:] if cmd[1] == "-m" else cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL)


def _cli(*args: str) -> None:
    """``lidarshard ARGS`` with this interpreter (works without an installed entry point)."""
    _run([sys.executable, "-m", "lidarshard.pipelines.cli", *args, "--runner=FnApiRunner"])


def _split(root: Path, scan: Path, val_scenes: int, work: Path) -> tuple[Path, Path, int, int]:
    """Write train/val samples tables, split by scene (the last ``val_scenes`` names validate)."""
    tables = next(root.glob("v1.0-*"))
    scenes = {s["token"]: s["name"] for s in json.loads((tables / "scene.json").read_text())}
    scene_of = {
        s["token"]: scenes[s["scene_token"]] for s in json.loads((tables / "sample.json").read_text())
    }
    held = set(sorted(set(scenes.values()))[-val_scenes:])
    samples = pq.read_table(scan / "samples")
    is_val = pa.array([scene_of[s] in held for s in samples["sample_id"].to_pylist()])
    paths = work / "train_samples.parquet", work / "val_samples.parquet"
    train, val = samples.filter(pc.invert(is_val)), samples.filter(is_val)
    pq.write_table(train, paths[0])
    pq.write_table(val, paths[1])
    return *paths, train.num_rows, val.num_rows


def _prepare(args: argparse.Namespace, work: Path, seeds: list[int], strategies: list[str]) -> dict:
    """Synthesize, scan, split, build; returns {"val": dir, (strategy, seed): dir, ...}."""
    root, scan = work / "dataroot", work / "scan"
    if not root.exists():
        _cli(*synth_args(root, args.scenes, args.keyframes), "--labels")
    scan_flags = ["--nuscenes-version", "v1.0-synth", "--sweeps", str(args.sweeps)]
    if not (scan / "samples").is_dir():
        _cli("scan", str(root), str(scan), *scan_flags)
    train, val, n_train, n_val = _split(root, scan, args.val_scenes, work)
    print(f"train samples {n_train}, validation samples {n_val} ({args.val_scenes} of {args.scenes} scenes)")
    out = {"val": work / "val"}
    if not (out["val"] / "_SUCCESS").exists():
        _cli("build", str(out["val"]), "--from-samples", str(val), "--world-size", "1", "--batch-size", "1")
    for strategy in strategies:
        for seed in seeds:
            out[strategy, seed] = work / f"train_{strategy}_{seed}"
            if not (out[strategy, seed] / "_SUCCESS").exists():
                _cli(
                    "build",
                    str(out[strategy, seed]),
                    "--from-samples",
                    str(train),
                    "--world-size",
                    "2",
                    "--batch-size",
                    str(args.batch_size),
                    "--epochs",
                    str(args.epochs),
                    "--seed",
                    str(seed),
                    "--strategy",
                    strategy,
                )
    return out


def _train(args: argparse.Namespace, manifest: Path, val: Path, sampler: str, seed: int, out: Path) -> dict:
    if args.reuse and out.exists():
        return json.loads(out.read_text())
    cmd = [
        sys.executable,
        str(TRAIN),
        "--manifest",
        str(manifest),
        "--val-manifest",
        str(val),
        "--targets",
        "lidarseg",
        "--sampler",
        sampler,
        "--seed",
        str(seed),
        "--epochs",
        str(args.epochs),
        "--json-out",
        str(out),
        *shlex.split(args.train_args),
    ]
    _run(cmd)
    return json.loads(out.read_text())


def time_to_target(curve: list[tuple[float, float]], target: float) -> float | None:
    """Cumulative time of the first ``(time, miou)`` point with miou >= target; None if never."""
    return next((t for t, m in curve if m >= target), None)


def _mean(values: list[float | None]) -> float | None:
    done = [v for v in values if v is not None]
    return statistics.fmean(done) if done else None


def summarize(runs: list[dict[str, Any]], target_frac: float) -> dict[str, dict[str, Any]]:
    """Per sampler: final mIoU mean/std/min/max; per clock (``wall``, ``cpu``) s/epoch and the mean
    time to target over the runs that reached it.

    Args:
        runs: ``{"sampler", "seed", "miou": [per epoch], "wall": [s per epoch], "cpu": [s per epoch]}``.
    """
    target = target_frac * max(r["miou"][-1] for r in runs)
    out: dict[str, dict[str, Any]] = {"_target": {"miou": target}}
    for name in dict.fromkeys(r["sampler"] for r in runs):
        mine = [r for r in runs if r["sampler"] == name]
        finals = [r["miou"][-1] for r in mine]
        row: dict[str, Any] = {
            "runs": len(mine),
            "final_mean": statistics.fmean(finals),
            "final_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "final_min": min(finals),
            "final_max": max(finals),
            "cpu_linearity": statistics.fmean(r["cpu_linearity"] for r in mine),
        }
        for clock in ("wall", "cpu"):
            reach = [time_to_target(_curve(r, clock), target) for r in mine]
            row[f"{clock}_s_per_epoch"] = statistics.fmean(s for r in mine for s in r[clock])
            row[f"{clock}_to_target"] = _mean(reach)
            row[f"{clock}_reached"] = sum(t is not None for t in reach)
        out[name] = row
    return out


def _curve(run: dict[str, Any], clock: str) -> list[tuple[float, float]]:
    """[(cumulative seconds on ``clock`` after epoch e, mIoU after epoch e)]."""
    t, out = 0.0, []
    for s, m in zip(run[clock], run["miou"], strict=True):
        t += s
        out.append((t, m))
    return out


def _plot(runs: list[dict[str, Any]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110, sharey=True)
    titles = {"wall": "training wall time, s (shared host)", "cpu": "critical-path CPU time, s"}
    colors: dict[str, str] = {}
    for r in runs:
        color = colors.setdefault(r["sampler"], f"C{len(colors)}")
        for ax, clock in zip(axes, ("wall", "cpu"), strict=True):
            t, m = zip(*[(0.0, r["miou0"]), *_curve(r, clock)], strict=True)
            first = r["seed"] == runs[0]["seed"]
            ax.plot(t, m, "-o", ms=3, color=color, alpha=0.75, label=r["sampler"] if first else None)
    for ax, clock in zip(axes, ("wall", "cpu"), strict=True):
        ax.axhline(target, color="0.5", ls="--", lw=1, label="target" if clock == "wall" else None)
        ax.set_xlabel(titles[clock])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation mIoU")
    axes[0].legend(loc="lower right")
    fig.suptitle("2 gloo ranks x 1 CPU thread; one line per (sampler, seed); evaluation excluded")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"plot: {path}")


def _print(runs: list[dict[str, Any]], summary: dict[str, dict[str, Any]]) -> None:
    print(f"\n{'sampler':<12}{'seed':>5}{'wall s/ep':>10}{'cpu s/ep':>9}  val mIoU per epoch")
    for r in runs:
        curve = " ".join(f"{m:.3f}" for m in r["miou"])
        wall, cpu = statistics.fmean(r["wall"]), statistics.fmean(r["cpu"])
        print(f"{r['sampler']:<12}{r['seed']:>5}{wall:>10.1f}{cpu:>9.1f}  {curve}")
    points = runs[0]["class_points"]
    chance = max(points.values()) / sum(points.values()) / len(points)  # constant majority-class guess
    print(
        f"\nchance mIoU (majority class everywhere) {chance:.3f}; untrained nets {min(r['miou0'] for r in runs):.3f}"
        f"..{max(r['miou0'] for r in runs):.3f}"
    )
    print(f"target mIoU {summary['_target']['miou']:.3f} ({len(runs)} runs)")
    print(
        f"{'sampler':<12}{'final mIoU':>16}{'min..max':>14}{'cpu lin':>8}"
        + "".join(f"{c + ' s/ep':>11}{c + ' to target':>18}{'vs dist':>8}" for c in ("wall", "cpu"))
    )
    base = summary.get("distributed", {})
    for name, s in summary.items():
        if name.startswith("_"):
            continue
        cells = ""
        for c in ("wall", "cpu"):
            tt, b = s[f"{c}_to_target"], base.get(f"{c}_to_target")
            reach = f"{tt:.0f} ({s[f'{c}_reached']}/{s['runs']})" if tt is not None else f"- (0/{s['runs']})"
            ratio = f"{tt / b:.2f}x" if tt is not None and b else "-"
            cells += f"{s[f'{c}_s_per_epoch']:>11.1f}{reach:>18}{ratio:>8}"
        print(
            f"{name:<12}{s['final_mean']:>8.3f} ± {s['final_std']:.3f}"
            f"{s['final_min']:>7.3f}..{s['final_max']:.3f}{s['cpu_linearity']:>8.3f}{cells}"
        )


def _record(result: dict[str, Any], sampler: str, seed: int) -> dict[str, Any]:
    """One run's per-epoch series from train_ddp's JSON summary."""
    epochs = result["epochs"]
    return {
        "sampler": sampler,
        "seed": seed,
        "miou": [e["val_miou"] for e in epochs],
        "val_loss": [e["val_loss"] for e in epochs],
        "wall": [e["wall_s"] for e in epochs],
        "cpu": [float(np.asarray(e["cpu_s"]).max(axis=0).sum()) for e in epochs],  # (W, steps) -> s
        "cpu_linearity": result["cpu_linearity"],  # sum_steps mean_rank / sum_steps max_rank CPU time
        "miou0": result["val_initial"]["val_miou"],
        "class_points": result["val_initial"]["val_class_points"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    strategies = [s for s in args.strategies.split(",") if s]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        manifests = _prepare(args, work, seeds, strategies)
        runs = []
        for seed in seeds:  # samplers interleaved per seed, so host load drifts hit all alike
            for sampler in ["distributed", *strategies]:
                manifest = manifests[strategies[0] if sampler == "distributed" else sampler, seed]
                label = "distributed" if sampler == "distributed" else sampler
                result = _train(
                    args,
                    manifest,
                    manifests["val"],
                    "distributed" if sampler == "distributed" else "lidarshard",
                    seed,
                    work / f"run_{label}_{seed}.json",
                )
                runs.append(_record(result, label, seed))
    summary = summarize(runs, args.target_frac)
    _print(runs, summary)
    _plot(runs, summary["_target"]["miou"], args.plot)
    print(f"benchmark wall time {time.perf_counter() - start:.0f} s")
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "summary": summary}
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
