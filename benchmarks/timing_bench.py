"""Overhead of the step recorder (``lidarshard.loaders.step_timer.StepTimer``) on a realistic training step.

The same training loop (a small 1-D conv + MLP on point batches, forward + backward + SGD, one CPU
thread, a step of ~20-50 ms) runs with and without the recorder, in alternating rounds in one process;
by default under a 1-rank gloo ``DistributedDataParallel`` with the recorder's comm hook attached
(``--no-ddp``: a plain loop; the hook stays registered in the rounds without the recorder, where it
finds no open step and only all-reduces). Prints the median step time of each (median of the rounds' medians), their ratio, the ratio of
the quietest rounds, and the recorder's
own cost per step measured on an empty body (start + stop + its share of the Parquet flushes), which is
the number to hold against the target: recorder overhead <= 1% of step time. On a shared machine the
end-to-end ratio moves by several percent between runs (noise, either way); the own cost does not.

    python benchmarks/timing_bench.py [--steps 100] [--rounds 6] [--points 4096] [--no-ddp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

__all__ = ["main"]


def _model(torch: Any, channels: int) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv1d(4, channels, 1),
        nn.ReLU(),
        nn.Conv1d(channels, channels, 1),
        nn.ReLU(),
        nn.Conv1d(channels, channels, 1),
        nn.AdaptiveMaxPool1d(1),
        nn.Flatten(),
        nn.Linear(channels, 10),
    )


def _round(torch: Any, model: Any, opt: Any, batches: list, timer: Any, epoch: int) -> list[float]:
    """One pass over ``batches``: per-step wall seconds (host clock, the loop's own view)."""
    out: list[float] = []
    for step, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        if timer is None:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        else:
            with timer.step(epoch, step, [f"s{step}-{i}" for i in range(len(y))]):
                torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        out.append(time.perf_counter() - t0)
    return out


def _bare_cost(timer_type: Any, directory: str, steps: int, batch: int) -> float:
    """Seconds per step the recorder itself costs: start/stop around nothing, flushes included."""
    timer = timer_type(directory, rank=0, world_size=1, flush_every=100, device="cpu")
    ids = [f"s-{i}" for i in range(batch)]
    t0 = time.perf_counter()
    for step in range(steps):
        with timer.step(999, step, ids):
            pass
    timer.close()
    return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="steps per round")
    p.add_argument("--rounds", type=int, default=6, help="rounds of each variant, alternating")
    p.add_argument("--points", type=int, default=4096, help="points per sample")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--channels", type=int, default=96)
    p.add_argument("--no-ddp", action="store_true", help="a plain loop (no DDP, no comm hook)")
    args = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    from lidarshard.loaders.step_timer import StepTimer, read_timing_files

    torch.set_num_threads(1)
    torch.manual_seed(0)
    work = tempfile.mkdtemp(prefix="timing_bench-")
    model = _model(torch, args.channels)
    if not args.no_ddp:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo", init_method=f"file://{work}/rdv", rank=0, world_size=1)
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = [
        (torch.randn(args.batch, 4, args.points), torch.randint(0, 10, (args.batch,)))
        for _ in range(args.steps)
    ]
    timer = StepTimer(os.path.join(work, "timings"), rank=0, world_size=1, flush_every=100, device="cpu")
    if not args.no_ddp:
        timer.attach_ddp(model)
    _round(torch, model, opt, batches[:10], None, 0)  # warm up
    plain: list[float] = []  # median step of each round
    timed: list[float] = []
    for r in range(args.rounds):  # alternate A B B A ..., so drift of the machine hits both alike
        for with_timer in (r % 2 == 1, r % 2 == 0):
            times = _round(torch, model, opt, batches, timer if with_timer else None, r)
            (timed if with_timer else plain).append(statistics.median(times))
    timer.close()
    rows = read_timing_files(os.path.join(work, "timings"))
    bare = _bare_cost(StepTimer, os.path.join(work, "bare"), 2000, args.batch)
    if not args.no_ddp:
        dist.destroy_process_group()
    shutil.rmtree(work, ignore_errors=True)  # the recorder's files are read
    p_med, t_med = statistics.median(plain), statistics.median(timed)
    method = rows.column("method")[0].as_py()
    compute = statistics.median(rows.column("compute_s").to_pylist())
    wall = statistics.median(rows.column("wall_s").to_pylist())
    print(
        f"{'ddp (1 rank, gloo) + comm hook' if not args.no_ddp else 'plain loop'}: {args.rounds} x {args.steps} steps"
    )
    print(f"median step  without recorder {1e3 * p_med:.2f} ms   with recorder {1e3 * t_med:.2f} ms")
    print(f"ratio with/without            {t_med / p_med:.4f}  (machine noise included)")
    print(f"ratio of the quietest rounds  {min(timed) / min(plain):.4f}")
    print(
        f"recorder's own cost per step  {1e6 * bare:.1f} us = {100 * bare / p_med:.3f}% of the step (target <= 1%)"
    )
    print(
        f"recorded {rows.num_rows} rows: method {method}, median compute_s {1e3 * compute:.2f} ms, wall_s {1e3 * wall:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
