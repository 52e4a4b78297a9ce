"""Time to accuracy: does a balanced plan change what the model learns, and how fast it gets there?

Synthesizes a labelled nuScenes-style dataroot (``lidarshard synth --labels``), scans it once, splits
the *scenes* into train and validation (the last ``--val-scenes`` scenes by name), builds one train
manifest per (strategy, seed) with ``build --from-samples`` and one validation manifest, then trains
``examples/train_ddp.py``'s segmentation net on the lidarseg labels (2 gloo ranks, one CPU thread
each) with every sampler and seed: ``distributed`` (PyTorch's DistributedSampler over the same train
samples) and each lidarshard strategy. A seed fixes the model initialisation, the plan and the
DistributedSampler shuffle, so runs with one seed differ only in the sampler.

After every epoch each run records validation mIoU (classes present in the validation labels) and
loss, and the epoch's training wall time (evaluation not included). Prints per run, then per sampler:
final mIoU mean / std / min-max over seeds, training wall time per epoch, and the time to reach the
target (``--target-frac`` of the best final mIoU of all runs; cumulative training wall time at the
first epoch at or above it); writes a plot of mIoU vs training wall time for all runs (``--plot``).

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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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
    samples = pq.read_table(scan / "samples.parquet")
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
        _cli(
            "synth",
            str(root),
            "--scenes",
            str(args.scenes),
            "--keyframes-per-scene",
            str(args.keyframes),
            "--labels",
            "--seed",
            "0",
        )
    scan_flags = ["--nuscenes-version", "v1.0-synth", "--sweeps", str(args.sweeps)]
    if not (scan / "samples.parquet").exists():
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


def summarize(runs: list[dict[str, Any]], target_frac: float) -> dict[str, dict[str, Any]]:
    """Per sampler: final mIoU mean/std/min/max, s/epoch, mean time to target (None if a run missed).

    Args:
        runs: ``{"sampler", "seed", "curve": [(cumulative train s, val mIoU)], "epoch_s": [...]}``.
    """
    target = target_frac * max(r["curve"][-1][1] for r in runs)
    out: dict[str, dict[str, Any]] = {"_target": {"miou": target}}
    for name in dict.fromkeys(r["sampler"] for r in runs):
        mine = [r for r in runs if r["sampler"] == name]
        finals = [r["curve"][-1][1] for r in mine]
        reach = [time_to_target(r["curve"], target) for r in mine]
        out[name] = {
            "runs": len(mine),
            "final_mean": statistics.fmean(finals),
            "final_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "final_min": min(finals),
            "final_max": max(finals),
            "s_per_epoch": statistics.fmean(s for r in mine for s in r["epoch_s"]),
            "reached": sum(t is not None for t in reach),
            "time_to_target": statistics.fmean(t for t in reach if t is not None) if any(reach) else None,
        }
    return out


def _plot(runs: list[dict[str, Any]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    colors = {}
    for r in runs:
        color = colors.setdefault(r["sampler"], f"C{len(colors)}")
        t, m = zip(*[(0.0, r["miou0"]), *r["curve"]], strict=True)
        ax.plot(
            t,
            m,
            "-o",
            ms=3,
            color=color,
            alpha=0.8,
            label=r["sampler"] if r["seed"] == runs[0]["seed"] else None,
        )
    ax.axhline(target, color="0.5", ls="--", lw=1, label="target")
    ax.set_xlabel("training wall time, s (2 gloo ranks x 1 CPU thread; evaluation excluded)")
    ax.set_ylabel("validation mIoU")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"plot: {path}")


def _print(runs: list[dict[str, Any]], summary: dict[str, dict[str, Any]]) -> None:
    print(f"\n{'sampler':<12}{'seed':>5}{'s/epoch':>9}  val mIoU per epoch")
    for r in runs:
        curve = " ".join(f"{m:.3f}" for _, m in r["curve"])
        print(f"{r['sampler']:<12}{r['seed']:>5}{statistics.fmean(r['epoch_s']):>9.1f}  {curve}")
    target = summary["_target"]["miou"]
    base = summary.get("distributed", {}).get("time_to_target")
    print(f"\ntarget mIoU {target:.3f}")
    print(f"{'sampler':<12}{'final mIoU':>18}{'min..max':>14}{'s/epoch':>9}{'to target s':>13}{'vs dist':>9}")
    for name, s in summary.items():
        if name.startswith("_"):
            continue
        tt = s["time_to_target"]
        reach = f"{tt:.0f} ({s['reached']}/{s['runs']})" if tt is not None else f"- (0/{s['runs']})"
        ratio = f"{tt / base:.2f}x" if tt is not None and base else "-"
        print(
            f"{name:<12}{s['final_mean']:>10.3f} ± {s['final_std']:.3f}"
            f"{s['final_min']:>7.3f}..{s['final_max']:.3f}{s['s_per_epoch']:>9.1f}{reach:>13}{ratio:>9}"
        )


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
                epochs = result["epochs"]
                clock = 0.0
                curve = []
                for e in epochs:
                    clock += e["wall_s"]
                    curve.append((clock, e["val_miou"]))
                runs.append(
                    {
                        "sampler": label,
                        "seed": seed,
                        "curve": curve,
                        "epoch_s": [e["wall_s"] for e in epochs],
                        "val_loss": [e["val_loss"] for e in epochs],
                        "miou0": result["val_initial"]["val_miou"],
                        "class_points": result["epochs"][-1]["val_class_points"],
                    }
                )
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
