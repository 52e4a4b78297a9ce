"""Rank speeds learned from training, on a 2-rank run where one rank is really slower.

``examples/train_ddp.py`` trains 2 gloo ranks x 1 thread, each rank pinned to its own core (the bench sets
the affinity of the ranks it started, by their start order = rank order) and a CPU burner process pinned to
rank 1's core, so rank 1 gets about half a core: a slower rank, with no sleep anywhere in lidarshard.

1. run A, on a plan of the ``points`` cost model (``lidarshard.write_manifest``, equal speeds): epoch 0
   records (``--replan-after 1 --timings T``), rank 0 calibrates (``lidarshard calibrate``: the ms cost
   model and, from the same files, each rank's speed) and epoch 1 trains the calibrated re-plan, which
   knows the cost but not the speeds;
2. the bench re-plans with what calibrate learned: ``write_manifest(..., cost_model="@fit.json",
   rank_speed="@fit.json", strategy="budget")`` (budget gives each rank work in proportion to its speed;
   without distinguished speeds the calibrated model alone), and predicts each epoch's seconds
   (``lidarshard.transforms.plan.epoch_time``, as the report and the build's summary do);
3. run B trains that plan, pinned and burned the same way: epoch 0 records (the speeds already planned
   for), epochs 1.. train its own re-calibration (the speeds kept); ``lidarshard report`` of the plan
   run B trained (AWARE's epoch 0, then its re-plan) ``--timings`` then prints epoch 0's predicted against
   the recorder's measured seconds.

Prints the learned speeds with their 95% intervals and the measured linearity of the ranks' compute times
(what a speed-aware plan evens out) of run A's epochs 0 (default) and 1 (calibrated, speed-blind) and run
B's (speed-aware), and run B's predicted against measured epoch seconds. Consistency lines (``check:``)
say whether the numbers hold together; the smoke test reads them.

    python benchmarks/speeds_bench.py [--samples 96] [--batch-size 2] [--max-steps N] [--json-out r.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train_ddp.py"

__all__ = ["main"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=96, help="synthetic clouds (log-uniform sizes)")
    p.add_argument("--batch-size", type=int, default=2, help="samples per rank per step")
    p.add_argument("--after-epochs", type=int, default=2, help="epochs run B trains (>= 2: epoch 0 records)")
    p.add_argument("--max-steps", type=int, default=None, help="cap steps per epoch (smoke runs)")
    p.add_argument("--cores", default="0,1", help="the two cores: rank r on core r, the burner on the second")
    p.add_argument(
        "--no-burner", action="store_true", help="equal ranks (the learned speeds should be 'cannot tell')"
    )
    p.add_argument("--train-args", default="", help="extra flags for train_ddp.py (e.g. '--width 64')")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    args.cores = [int(c) for c in args.cores.split(",")]
    if len(args.cores) != 2:
        p.error("--cores needs two cores")
    if args.after_epochs < 2:
        p.error("--after-epochs must be >= 2 (run B records epoch 0 for the report and re-plans from 1)")
    return args


def _env() -> dict[str, str]:
    path = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _fixture(work: Path, n: int, batch: int, epochs: int) -> tuple[Any, Path]:
    """``n`` clouds (x5 float32) of log-uniform sizes and their ``points`` plan: (samples table, OUT)."""
    import pyarrow as pa

    import lidarshard

    rng = np.random.default_rng(0)
    sizes = np.exp(rng.uniform(np.log(1_000), np.log(16_000), n)).astype(int)
    (work / "data").mkdir(parents=True, exist_ok=True)
    ids, paths = [f"s{i:05d}" for i in range(n)], []
    for i, size in enumerate(sizes.tolist()):
        paths.append(str(work / "data" / f"{ids[i]}.pcd.bin"))
        rng.normal(scale=20.0, size=(size, 5)).astype(np.float32).tofile(paths[-1])
    samples = pa.table({"sample_id": ids, "path": paths, "num_points": sizes, "num_in_range": sizes})
    out = work / "default"
    lidarshard.write_manifest(samples, str(out), 2, batch, epochs=epochs, cost_model="points")
    return samples, out


def _children(pid: int) -> list[int]:
    """The ranks ``mp.spawn`` started under ``pid``, in start order (= rank order)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and b"spawn_main" in cmd:
            found.append((int(fields[19]), int(entry)))  # (start time in ticks, pid)
    return [p for _, p in sorted(found)]


def _pin(pid: int, core: int) -> None:
    """Every thread of process ``pid`` on ``core`` (threads started later inherit it)."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), {core})
    except OSError:  # the process or a thread ended
        pass


def _train(cmd: list[str], cores: list[int]) -> None:
    """Run train_ddp.py, pinning rank r's threads to ``cores[r]`` while it runs (polled every 0.2 s)."""
    proc = subprocess.Popen(cmd, env=_env())
    done = threading.Event()

    def keep_pinned() -> None:
        while not done.wait(0.2):
            ranks = _children(proc.pid)
            if len(ranks) == 2:
                for pid, core in zip(ranks, cores, strict=True):
                    _pin(pid, core)

    watcher = threading.Thread(target=keep_pinned, daemon=True)
    watcher.start()
    try:
        code = proc.wait()
    finally:
        done.set()
        watcher.join()
    if code != 0:
        raise SystemExit(f"train_ddp.py failed ({code}): {' '.join(cmd)}")


def _burner(core: int) -> subprocess.Popen:
    """A busy loop pinned to ``core`` (the slower rank's share of it: about half)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(proc.pid, {core})
    return proc


def _measured(epoch: dict) -> float:
    """Measured linearity of one train_ddp epoch: sum_s mean_r compute / sum_s max_r compute."""
    c = np.asarray(epoch["compute_s"], dtype=np.float64)  # (W, steps)
    return float(c.mean(0).sum() / c.max(0).sum()) if c.size else 1.0


def _predicted_seconds(out: Path, max_steps: int | None) -> list[float]:
    """Each epoch's predicted seconds (its first ``max_steps`` steps) of a manifest with a calibrated ms
    model: the function the report and the build's summary use."""
    from lidarshard.loaders import load_manifest, read_samples
    from lidarshard.tools.epoch_seconds import plan_loads
    from lidarshard.transforms.plan.epoch_time import epoch_ms, time_factors

    m = load_manifest(str(out))
    factors = time_factors(m.rank_speed, m.world_size)
    step_ms = m.cost_model.step_ms or 0.0
    loads = plan_loads(str(out), m, read_samples(str(out)))
    return [epoch_ms(load[:max_steps], factors, step_ms) / 1000 for load in loads]


def _run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import lidarshard

    samples, default = _fixture(work, args.samples, args.batch_size, epochs=2)
    base = [sys.executable, str(TRAIN), "--sampler", "lidarshard", *args.train_args.split()]
    base += ["--max-steps", str(args.max_steps)] if args.max_steps else []
    timings = work / "timings"
    _train([*base, "--manifest", str(default), "--replan-after", "1", "--timings", str(timings),
            "--json-out", str(work / "a.json")], args.cores)  # fmt: skip
    fit = timings / "cost_model.json"  # what train_ddp's rank 0 calibrated after epoch 0
    body = json.loads(fit.read_text())
    learned = body["rank_speeds"]
    aware = work / "aware"
    # budget gives each rank work in proportion to its speed; an equal-count plan cannot (README)
    speeds = {"rank_speed": f"@{fit}", "strategy": "budget"} if learned["distinguished"] else {}
    lidarshard.write_manifest(samples, str(aware), 2, args.batch_size, epochs=args.after_epochs,
                              cost_model=f"@{fit}", **speeds)  # fmt: skip
    again = work / "timings-b"
    _train([*base, "--manifest", str(aware), "--replan-after", "1", "--timings", str(again),
            "--json-out", str(work / "b.json")], args.cores)  # fmt: skip
    report = subprocess.run(  # on the plan run B trained: AWARE's epoch 0, then its re-plan (switch_plan)
        [sys.executable, "-m", "lidarshard.pipelines.cli", "report", str(again / "replan"), "--timings", str(again),
         "--output-dir", str(work / "report")],
        env=_env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    a, b = (json.loads((work / n).read_text()) for n in ("a.json", "b.json"))
    # epoch 0 trained AWARE's plan, epochs 1.. the re-plan run B calibrated after it (the speeds kept)
    predicted = (
        _predicted_seconds(aware, args.max_steps)[:1]
        + _predicted_seconds(again / "replan", args.max_steps)[1:]
    )
    return {
        "learned": learned,
        "speeds_planned": bool(learned["distinguished"]),
        "step_ms": body["cost_model"].get("step_ms"),
        "default": _measured(a["epochs"][0]),
        "calibrated": _measured(a["epochs"][1]),
        "speed_aware": [_measured(e) for e in b["epochs"]],
        "predicted_s": predicted,
        "measured_s": [e["wall_s"] for e in b["epochs"]],
        "calibrated_predicted_s": _predicted_seconds(timings / "replan", args.max_steps)[1],
        "calibrated_measured_s": a["epochs"][1]["wall_s"],
        "report": [line.strip() for line in report.stdout.splitlines() if " s for " in line],
        "planned_speed_linearity": [
            e.get("speed_linearity") for e in json.loads((aware / "_manifest.json").read_text())["balance"]
        ],
    }


def _print(r: dict[str, Any], burner: bool) -> None:
    learned = r["learned"]
    print("learned speeds (fastest = 1; 95% bootstrap interval):")
    for k, (s, lo, hi) in enumerate(
        zip(learned["speed"], learned["speed_low"], learned["speed_high"], strict=False)
    ):
        print(f"  rank {k}: {s:.3f} ({lo:.3f}..{hi:.3f}) over {learned['steps'][k]} steps")
    print(f"  {learned['note']}")
    print("measured linearity of the ranks' compute times (speed-aware):")
    print(f"  run A epoch 0, default plan (points model):      {r['default']:.4f}")
    print(f"  run A epoch 1, calibrated re-plan, speed-blind:  {r['calibrated']:.4f}")
    for e, lin in enumerate(r["speed_aware"]):
        how = "learned speeds, budget" if r["speeds_planned"] else "no speeds told apart "
        print(f"  run B epoch {e}, calibrated, {how}:  {lin:.4f}")
    p, m = r["calibrated_predicted_s"], r["calibrated_measured_s"]
    print(f"run A epoch 1: predicted {p:.3f} s, measured {m:.3f} s ({100 * (p - m) / m:+.1f}%)")
    print("lidarshard report AWARE's re-plan --timings (the recorder's steps; data loading not in them):")
    print("\n".join("  " + line for line in r["report"]))
    for e, (p, m) in enumerate(zip(r["predicted_s"], r["measured_s"], strict=False)):
        print(f"run B epoch {e}: predicted {p:.3f} s, measured {m:.3f} s ({100 * (p - m) / m:+.1f}%; train_ddp's epoch "
              "wall, data loading included)")  # fmt: skip
    speeds, steps = learned["speed"], learned["steps"]
    in_range = all(0 < s <= 1 for s in speeds) and len(speeds) in (0, 2)
    print(f"check: learned speeds in (0, 1] with the fastest at 1: {'ok' if in_range else 'FAILED'}")
    print(f"check: every rank recorded its steps: {'ok' if len(steps) == 2 and min(steps) > 0 else 'FAILED'}")
    print(
        f"check: one prediction per trained epoch: {'ok' if len(r['predicted_s']) == len(r['measured_s']) else 'FAILED'}"
    )
    if burner and learned["distinguished"]:
        print(f"slower rank found: rank {int(np.argmin(speeds))} (the burner shares rank 1's core)")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    burner = None if args.no_burner else _burner(args.cores[1])
    try:
        with tempfile.TemporaryDirectory(prefix="speeds_bench-") as tmp:
            work = (args.workdir or Path(tmp)).resolve()
            work.mkdir(parents=True, exist_ok=True)
            result = _run(args, work)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    _print(result, burner is not None)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
