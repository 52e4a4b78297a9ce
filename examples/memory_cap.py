"""Check ``--max-step-memory`` on a GPU (or NPU): record, calibrate, cap, train again, compare.

One process on one device replays every rank's batches of a manifest in turn (a rank-step's peak memory is a
property of its batch: the model, its gradients and optimizer state are the same on every rank) through the
recorder (``StepTimer``: ``peak_bytes`` per step from ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``), then:

1. the memory model is fitted to them (``lidarshard.tools.memory_fit``, what ``lidarshard calibrate OUT
   --timings WORK/timings`` writes as its JSON's ``memory_model``: called directly here, so that a step time
   too short to fit the cost model does not stop the check) into ``WORK/fit.json``;
2. ``lidarshard build WORK/capped --from-samples OUT/samples --strategy budget --max-step-memory CAP
   --memory-model WORK/fit.json --heaviest-first memory`` plans within CAP (default: 90% of the largest
   peak measured, so the cap bites) and ``lidarshard validate`` re-checks it;
3. the capped plan is trained the same way and every measured peak is compared with CAP and with its
   prediction. Exit 0 when no measured peak is above CAP by more than 3 rmse of the fit, 1 otherwise, 2
   when the device reports no memory (a CPU run stops after step 1, saying so).

    python examples/memory_cap.py --manifest OUT --work WORK [--cap 20GiB] [--width 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch

from lidarshard.loaders import load_manifest, read_samples
from lidarshard.loaders.step_timer import StepTimer, read_timing_files
from lidarshard.loaders.torch import BalancedBatchSampler, PlanLoader, PointCloudDataset, collate
from lidarshard.pipelines.cli import main as cli
from lidarshard.tools.memory_fit import memory_line, memory_model
from lidarshard.tools.timings import read_timings_at
from lidarshard.transforms.plan.memory import MemoryModel, format_bytes


def _train_ddp():
    """``examples/train_ddp.py`` as a module (its ``SegNet`` and targets)."""
    spec = importlib.util.spec_from_file_location("train_ddp", Path(__file__).with_name("train_ddp.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(out: str, directory: Path, width: int) -> str:
    """Train epoch 0 of every rank of ``out`` on this process's device, recording into ``directory``;
    the device the recorder timed on (``cpu`` or e.g. ``cuda:0``)."""
    td = _train_ddp()
    m = load_manifest(out)
    dataset = PointCloudDataset(out)
    torch.manual_seed(0)
    probe = dataset[0]["points"]
    model, device = None, "cpu"
    for rank in range(m.world_size):
        with StepTimer(str(directory), rank=rank, world_size=m.world_size) as timer:
            device = timer.device
            if model is None:
                model = td.SegNet(probe.shape[1], width, 4, 0.05).to(device)
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
            sampler = BalancedBatchSampler(out, rank, m.world_size)
            sampler.set_epoch(0)
            for batch in timer.steps(PlanLoader(dataset, sampler, collate_fn=collate)):
                points, index = batch["points"].to(device), batch["batch"].to(device)
                loss = td._loss(model(points, index), td.height_labels(batch["points"], 4).to(device))
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=False)
    return device


def compare(out: str, directory: Path, cap: int, model: MemoryModel) -> tuple[float, float]:
    """(largest measured peak / cap, median |measured - predicted| / measured) of the recorded steps."""
    rows = read_timing_files(str(directory)).to_pylist()
    samples = read_samples(out)
    ids = samples.column("sample_id").to_pylist()
    per = dict(zip(ids, model.sample_bytes(samples), strict=True))
    measured = np.array([r["peak_bytes"] for r in rows], dtype=np.float64)
    predicted = np.array([model.base + sum(per[i] for i in r["sample_ids"]) for r in rows])
    return float(measured.max() / cap), float(np.median(np.abs(measured - predicted) / measured))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--manifest", required=True)
    p.add_argument(
        "--work", type=Path, required=True, help="a new directory for timings, fit and capped plan"
    )
    p.add_argument("--cap", default=None, help="SIZE (e.g. 20GiB); default 90%% of the largest measured peak")
    p.add_argument("--width", type=int, default=64, help="SegNet width (more: more activation memory)")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=False)
    device = record(args.manifest, args.work / "timings", args.width)
    fit = args.work / "fit.json"
    timings = read_timings_at(str(args.work / "timings"))
    body = memory_model(timings, read_samples(args.manifest))
    fit.write_text(json.dumps(body, indent=2) + "\n")
    print(memory_line(body))
    if body["memory_model"] is None:
        print(f"memory_cap: recorded on {device}: {body['memory_note']}", file=sys.stderr)
        return 2
    peaks = timings.rows.column("peak_bytes").to_numpy()
    cap = args.cap or f"{int(0.9 * peaks.max())}B"
    m = load_manifest(args.manifest)
    capped = str(args.work / "capped")
    build = ["build", capped, "--from-samples", f"{args.manifest}/samples", "--world-size", str(m.world_size)]
    build += [
        "--batch-size",
        str(m.batch_size),
        "--epochs",
        "1",
        "--strategy",
        "budget",
        "--max-step-memory",
        cap,
    ]
    build += ["--memory-model", str(fit), "--heaviest-first", "memory", "--max-reject-fraction", "0.5"]
    if cli(build) != 0 or cli(["validate", capped]) != 0:
        return 1
    record(capped, args.work / "timings-capped", args.width)
    cap_bytes = load_manifest(capped).memory_cap.max_step_bytes  # type: ignore[union-attr]
    model = MemoryModel(
        *(body["memory_model"][k] for k in ("base_bytes", "bytes_per_point", "bytes_per_voxel"))
    )
    top, err = compare(capped, args.work / "timings-capped", cap_bytes, model)
    rmse = body["memory_model"]["rmse_bytes"]
    print(
        f"memory_cap on {device}: fit R^2 {body['memory_model']['r2']:.4f}, rmse {format_bytes(rmse)}; cap "
        f"{format_bytes(cap_bytes)}; capped plan's largest measured peak {top:.3f}x the cap; median "
        f"|measured - predicted| {100 * err:.2f}% of measured"
    )
    return 0 if top * cap_bytes <= cap_bytes + 3 * rmse else 1


__all__ = ["main", "record", "compare"]

if __name__ == "__main__":
    sys.exit(main())
