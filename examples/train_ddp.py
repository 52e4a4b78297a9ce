"""Train a small point-cloud segmentation model with torch.distributed (gloo, CPU) on a lidarshard manifest.

Each rank runs one thread (``torch.set_num_threads(1)``; ``--pin-cores``: each rank on its own core) and
reads the manifest directly: ``BalancedBatchSampler`` + ``PointCloudDataset`` (``--sampler lidarshard``,
default) or, as baselines over the same samples, PyTorch's ``DistributedSampler`` (``--sampler
distributed``) or DrivingSDK's load balancing as shipped (``--sampler drivingsdk``,
``examples/drivingsdk_sampler.py``). The model (``--backbone mlp``, default) is a small point-voxel net:
per-point MLP, voxel max-pooling (``torch.scatter_reduce``), voxel MLP, per-point head, so its cost grows
with points and occupied voxels like a real sparse backbone; ``--backbone spconv`` trains a real one, the
SubM/SparseConv UNet of ``examples/sparse_unet.py`` on the voxelized keyframe + sweeps (needs ``pip
install spconv``; each point gets its voxel's logits). Targets are synthesized
height classes (the default: the run measures compute, not accuracy) or, with ``--targets lidarseg``, the
samples' lidarseg labels (keyframe points; aggregated sweep points are inputs only). ``--val-manifest V``
evaluates on V's samples after every epoch (split across ranks, outside the timed epoch): loss and mIoU
over the classes present in V.

Loss: each rank's batch-mean loss, times ``W n_r / N`` (``_rank_weight``, from the sampler's
``loss_scale``) so that averaging gradients over ranks weights each rank by its share of the step's
samples: manifests of ``--strategy budget`` give ranks different counts; with equal counts the factor
is exactly 1.

Timing: every step, each rank times forward + backward with ``time.perf_counter`` and only then
all-reduces the gradients itself (one flat ``all_reduce``, what DDP does inside ``backward``). The
timed span therefore holds this rank's own compute only: no data loading, no waiting for the slowest
rank. The wait shows up in the wall time per epoch. Rank 0 gathers the per-step times and reports

    measured linearity = sum_steps mean_rank(compute) / sum_steps max_rank(compute)

(1.0 = no rank ever waits), plus the same ratio over thread CPU time (robust to a busy host), over
point counts and over the manifest's predicted costs. ``--timings DIR`` records every rank's steps with
``lidarshard.loaders.step_timer.StepTimer`` (compute until the all-reduce, and the whole step), written at the
end of every epoch, the last included: what ``lidarshard calibrate`` and ``lidarshard report --timings``
read. ``--replan-after E`` also closes the loop in the run: before epoch E rank 0 calibrates on DIR and
re-plans epochs E.. into DIR/replan, and every rank's sampler switches to it (epochs E.. are recorded into
DIR/after-replan). ``--emit-timings t.csv``
instead times each sample's forward + backward alone (gradient accumulation over the batch) and writes
``sample_id, step, rank, ms, num_points``.

Progress: on a terminal rank 0 keeps one line on stderr up to date (epoch, steps done of the epoch's,
rate, ETA; ``lidarshard.transforms.progress``, the line ``lidarshard build`` draws); ``--progress`` also
writes it when stderr is not a terminal (a line every 10 s and at the end of each epoch).

    python examples/train_ddp.py --manifest OUT [--sampler distributed] [--epochs 1] [--json-out r.json]
        [--backbone spconv] [--pin-cores] [--targets lidarseg --val-manifest VAL] [--progress]
        [--timings DIR [--replan-after E]]
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import sys
import tempfile
import time
import traceback
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

import lidarshard
from lidarshard.loaders import load_manifest, read_samples
from lidarshard.loaders.step_timer import StepTimer
from lidarshard.loaders.torch import (
    IGNORE_LABEL,
    BalancedBatchSampler,
    PlanLoader,
    PointCloudDataset,
    collate,
)
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.transforms import progress
from lidarshard.transforms.plan.metrics import load_linearity

__all__ = ["SegNet", "height_labels", "linearity", "miou", "main"]

#: Output classes with ``--targets lidarseg``: nuScenes-lidarseg class indices are 0..31.
LIDARSEG_CLASSES = 32
#: Subdirectory of ``--timings DIR`` that records the epochs after ``--replan-after``'s switch.
AFTER_REPLAN = "after-replan"


class SegNet(nn.Module):
    """Point-voxel segmentation net: (N, C) points -> (N, classes) logits.

    A light per-point MLP (C -> 16), max-pooling of the points of each occupied voxel
    (``torch.scatter_reduce``), a heavier voxel MLP (16 -> width -> width -> width) and a per-point head
    on [point feature, its voxel's feature]. Cost ~ a * points + b * occupied voxels, like the sparse
    voxel backbones it stands in for.
    """

    def __init__(self, in_dims: int, width: int, classes: int, voxel_size: float) -> None:
        super().__init__()
        self.voxel_size = voxel_size
        self.point = nn.Sequential(nn.Linear(in_dims, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.voxel = nn.Sequential(
            nn.Linear(16, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
        )
        self.head = nn.Linear(16 + width, classes)

    def _voxels(self, xyz: torch.Tensor, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(N,) voxel id of each point, unique per (sample, voxel); and the voxel count V."""
        c = torch.floor(xyz / self.voxel_size).long()
        c = c - c.min(0).values
        d = c.max(0).values + 1
        key = ((batch * d[0] + c[:, 0]) * d[1] + c[:, 1]) * d[2] + c[:, 2]
        uniq, inverse = torch.unique(key, return_inverse=True)
        return inverse, int(uniq.numel())

    def forward(self, points: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """points (N, C) float32 (x, y, z in m first), batch (N,) int64 sample index -> (N, classes)."""
        points = torch.nan_to_num(points)
        feats = self.point(points / 50.0)
        vox, nvox = self._voxels(points[:, :3], batch)
        index = vox[:, None].expand_as(feats)
        pooled = feats.new_zeros(nvox, feats.shape[1])
        pooled = pooled.scatter_reduce(0, index, feats, reduce="amax", include_self=False)
        return self.head(torch.cat([feats, self.voxel(pooled)[vox]], dim=1))


def height_labels(points: torch.Tensor, classes: int) -> torch.Tensor:
    """(N,) int64 targets: z (m) binned into ``classes`` bands between -2 m and 4 m."""
    edges = torch.linspace(-2.0, 4.0, classes - 1)
    return torch.bucketize(torch.nan_to_num(points[:, 2]).contiguous(), edges)


def linearity(per_rank: torch.Tensor) -> float:
    """sum_steps mean_rank / sum_steps max_rank of a (W, steps) tensor (``load_linearity``)."""
    return load_linearity(per_rank.T.double().numpy())


def miou(confusion: torch.Tensor) -> tuple[float, dict[int, float]]:
    """Mean IoU over the classes present in the ground truth of a (K, K) [truth, prediction] matrix.

    Returns:
        (mean IoU in [0, 1], {class: IoU}); (0.0, {}) when no class is present.
    """
    conf = confusion.double()
    tp = conf.diagonal()
    union = conf.sum(0) + conf.sum(1) - tp
    present = (conf.sum(1) > 0).nonzero().flatten().tolist()
    ious = {k: float(tp[k] / union[k]) for k in present}
    return (sum(ious.values()) / len(ious) if ious else 0.0), ious


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--manifest", required=True, help="committed lidarshard manifest directory")
    p.add_argument("--sampler", choices=["lidarshard", "distributed", "drivingsdk"], default="lidarshard")
    p.add_argument("--backbone", choices=["mlp", "spconv"], default="mlp", help="spconv: the sparse UNet")
    p.add_argument("--pin-cores", action="store_true", help="pin rank r to the r-th allowed core (mod count)")
    p.add_argument("--epochs", type=int, default=None, help="default: the epochs the manifest planned")
    p.add_argument("--max-steps", type=int, default=None, help="cap steps per epoch (quick runs)")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--width", type=int, default=32, help="voxel MLP width (--backbone mlp)")
    p.add_argument("--classes", type=int, default=4, help="height bands (--targets height)")
    p.add_argument("--targets", choices=["height", "lidarseg"], default="height")
    p.add_argument("--val-manifest", type=Path, default=None, help="evaluate on its samples every epoch")
    p.add_argument(
        "--voxel-size",
        type=float,
        default=None,
        help="m; default 0.05 (mlp: build's occupied_voxels), 0.1 (spconv)",
    )
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd", help="sgd: momentum 0.9")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-sweeps", action="store_true", help="keyframes only")
    p.add_argument("--emit-timings", type=Path, default=None, help="CSV of per-sample measured ms")
    p.add_argument("--json-out", type=Path, default=None, help="write the summary as JSON")
    p.add_argument(
        "--progress", action="store_true", help="the progress line also when stderr is no terminal"
    )
    p.add_argument(
        "--timings",
        type=Path,
        default=None,
        metavar="DIR",
        help="record every rank's step times (StepTimer) into DIR, written at the end of every epoch: what "
        "lidarshard calibrate and lidarshard report --timings read",
    )
    p.add_argument(
        "--replan-after",
        type=int,
        default=None,
        metavar="E",
        help="close the loop in one run: after epoch E-1, rank 0 calibrates on --timings and re-plans epochs "
        f"E.. (lidarshard.replan, into DIR/replan) and every rank's sampler switches to it; epochs E.. are "
        f"recorded into DIR/{AFTER_REPLAN} (lidarshard report DIR/replan --timings DIR/{AFTER_REPLAN})",
    )
    p.add_argument(
        "--identical",
        action="store_true",
        help="every rank trains rank 0's planned batches: the same work, so the measured linearity is this "
        "machine's noise floor (what no plan can beat here)",
    )
    args = p.parse_args(argv)
    if args.replan_after is not None and (args.timings is None or args.sampler != "lidarshard"):
        p.error("--replan-after needs --timings DIR and --sampler lidarshard")
    if args.timings is not None and args.emit_timings is not None:
        p.error("--timings records whole steps, --emit-timings each sample alone: pass one")
    if args.voxel_size is None:
        args.voxel_size = 0.1 if args.backbone == "spconv" else 0.05
    if args.backbone == "spconv":
        try:
            _sibling("sparse_unet").require_spconv()
        except ImportError as e:
            sys.exit(f"train_ddp.py: error: {e}")  # one line, before any rank starts
    return args


def _sibling(name: str) -> Any:
    """The module ``name`` of this script's folder (``sparse_unet``: the spconv UNet's one home,
    ``drivingsdk_sampler``), imported however this script was loaded."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def _model(args: argparse.Namespace, in_dims: int, classes: int) -> nn.Module:
    """The ``--backbone``: (N, C) points, (N,) sample index -> (N, classes) per-point logits."""
    if args.backbone == "spconv":
        return _sibling("sparse_unet").SparseSegNet(classes, args.voxel_size)
    return SegNet(in_dims, args.width, classes, args.voxel_size)


def _loader(
    args: argparse.Namespace, dataset: PointCloudDataset, rank: int, world: int, batch: int
) -> tuple[DataLoader, Any]:
    """(DataLoader, object with set_epoch) for the chosen sampler."""
    opts = {"collate_fn": collate, "num_workers": args.num_workers, "pin_memory": torch.cuda.is_available()}
    if args.sampler == "lidarshard":
        # rank and world size from torch.distributed; --identical: every rank replays rank 0's batches
        sampler: Any = BalancedBatchSampler(args.manifest, 0 if args.identical else rank, world)
        return PlanLoader(dataset, sampler, **opts), sampler  # state_dict() counts trained batches
    if args.sampler == "drivingsdk":
        sampler = _drivingsdk(args, dataset, rank, world, batch)
        return DataLoader(dataset, batch_sampler=sampler, **opts), sampler
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=args.seed, drop_last=True)
    return DataLoader(dataset, batch_sampler=BatchSampler(sampler, batch, drop_last=True), **opts), sampler


def _drivingsdk(
    args: argparse.Namespace, dataset: PointCloudDataset, rank: int, world: int, batch: int
) -> Any:
    """DrivingSDK as shipped (``examples/drivingsdk_sampler.py``): mx_driving's voxel key of every sample's
    keyframe + sweeps (its sweep points within 1 m dropped where the manifest records time lags), its sorted
    buckets of W and its replica sampler. mx_driving computes the keys when the info files are made: before
    training, as here."""
    peer = _sibling("drivingsdk_sampler")
    try:  # the time-lag channel tells sweep points from the keyframe's (4.3 scans record the lags)
        lagged = PointCloudDataset(args.manifest, sweeps=True, time_lag=True) if not args.no_sweeps else None
    except ValueError:
        lagged = None
    keys = []
    for i in range(len(dataset)):
        points = (lagged or dataset)[i]["points"].numpy()
        keys.append(peer.voxel_key(points, points[:, -1] != 0 if lagged is not None else None))
    return peer.BucketBatchSampler(keys, rank, world, batch)


def _replan(args: argparse.Namespace, rank: int) -> str:
    """The re-plan of ``args.manifest`` from epoch ``args.replan_after`` on the cost model fitted to the
    timings recorded so far (every rank's are on disk): rank 0 calibrates and builds it, the others wait;
    its directory."""
    dist.barrier()  # every rank flushed its timings at the end of the last epoch
    out = str(args.timings / "replan")
    if rank == 0:
        fit = str(args.timings / "cost_model.json")
        if cli_main(["calibrate", str(args.manifest), "--timings", str(args.timings), "-o", fit]) != 0:
            raise RuntimeError("calibrate failed on the recorded timings")
        lidarshard.replan(str(args.manifest), out, args.replan_after, f"@{fit}", runner="FnApiRunner")
    dist.barrier()
    return out


def _allreduce_grads(params: list[nn.Parameter], world: int) -> None:
    """Average gradients across ranks in one flat all_reduce (the step's only synchronization)."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p))
        offset += n


def _targets(batch: dict[str, Any], classes: int) -> torch.Tensor:
    """(N,) int64 targets: the batch's lidarseg labels when it carries them, else height bands."""
    return batch["labels"] if "labels" in batch else height_labels(batch["points"], classes)


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_LABEL)


def _rank_weight(sampler: Any, step: int, n: int, world: int) -> float:
    """Multiplier of this rank's batch-mean loss at ``step`` (``n`` samples here): ``W n / N`` with N
    the step's samples over all ranks, so that DDP's average over ranks weights each rank by its share
    of the step's samples (``--strategy budget`` plans vary n per rank). 1 with equal counts and for
    torch's DistributedSampler. ``loss_scale(step)`` is ``W / N`` (``loaders.reader.Batch.scale``)."""
    if not hasattr(sampler, "loss_scale"):
        return 1.0
    total = round(world / sampler.loss_scale(step))
    return world * n / total


def _compute(
    model: nn.Module, batch: dict[str, Any], classes: int, per_sample: bool, weight: float = 1.0
) -> tuple[float, float, float, list[tuple[str, float, int]]]:
    """Forward + backward of one batch, the loss times ``weight`` (``_rank_weight``): (wall s, thread
    CPU s, loss (unweighted), per-sample [(sample_id, ms, points)])."""
    points, index, counts = batch["points"], batch["batch"], batch["num_points"].tolist()
    labels = _targets(batch, classes)
    if not per_sample:
        w0, c0 = time.perf_counter(), time.thread_time()
        loss = _loss(model(points, index), labels)
        (loss * weight if weight != 1.0 else loss).backward()
        return time.perf_counter() - w0, time.thread_time() - c0, float(loss.detach()), []
    wall = cpu = total = 0.0
    rows, lo = [], 0
    for sid, n in zip(batch["sample_id"], counts, strict=True):
        pts, lab = points[lo : lo + n], labels[lo : lo + n]
        lo += n
        w0, c0 = time.perf_counter(), time.thread_time()
        loss = _loss(model(pts, torch.zeros(n, dtype=torch.int64)), lab) / len(counts)
        (loss * weight if weight != 1.0 else loss).backward()
        dw = time.perf_counter() - w0
        wall, cpu, total = wall + dw, cpu + time.thread_time() - c0, total + float(loss.detach())
        rows.append((sid, dw * 1e3, n))
    return wall, cpu, total, rows


@torch.no_grad()
def _evaluate(
    model: nn.Module, val: PointCloudDataset, classes: int, rank: int, world: int
) -> dict[str, Any]:
    """Loss and mIoU on ``val``: rank r takes samples r, r+W, ...; results summed over ranks."""
    conf = torch.zeros(classes, classes, dtype=torch.float64)
    loss_sum = torch.zeros(2, dtype=torch.float64)  # (sum of point losses, labelled points)
    for i in range(rank, len(val), world):
        batch = collate([val[i]])
        labels = _targets(batch, classes)
        logits = model(batch["points"], batch["batch"])
        keep = labels != IGNORE_LABEL
        loss_sum += torch.tensor(
            [float(F.cross_entropy(logits[keep], labels[keep], reduction="sum")), keep.sum()]
        )
        pairs = labels[keep] * classes + logits[keep].argmax(1)
        conf += torch.bincount(pairs, minlength=classes * classes).view(classes, classes)
    dist.all_reduce(conf)
    dist.all_reduce(loss_sum)
    value, ious = miou(conf)
    points = {k: int(n) for k, n in enumerate(conf.sum(1).tolist()) if n > 0}
    loss = float(loss_sum[0] / loss_sum[1].clamp_min(1))
    return {"val_loss": loss, "val_miou": value, "val_iou": ious, "val_class_points": points}


def _train(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any] | None:
    manifest = load_manifest(args.manifest)
    epochs = args.epochs if args.epochs is not None else manifest.epochs
    labels = args.targets == "lidarseg"
    classes = LIDARSEG_CLASSES if labels else args.classes
    dataset = PointCloudDataset(args.manifest, sweeps=not args.no_sweeps, labels=labels)
    val = (
        PointCloudDataset(args.val_manifest, sweeps=not args.no_sweeps, labels=labels)
        if args.val_manifest
        else None
    )
    predicted = torch.tensor(read_samples(args.manifest, ["cost"])["cost"].to_numpy())  # cost model units
    loader, sampler = _loader(args, dataset, rank, world, manifest.batch_size)
    timer = StepTimer(args.timings, rank=rank, world_size=world) if args.timings is not None else None
    torch.manual_seed(args.seed)
    probe = dataset[0]["points"]
    model = _model(args, probe.shape[1], classes)
    params = list(model.parameters())
    for p in params:
        dist.broadcast(p.data, src=0)
    if args.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=args.lr)
    else:
        opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    model(probe, torch.zeros(len(probe), dtype=torch.int64)).sum().backward()  # warm-up, untimed
    per_epoch, timings = [], []
    initial = _evaluate(model, val, classes, rank, world) if val is not None else None
    shown = progress.Ticker("steps", shown=rank == 0 and (args.progress or sys.stderr.isatty()))
    for epoch in range(epochs):
        if epoch == args.replan_after and timer is not None:
            replanned = _replan(args, rank)  # every rank moves to the re-plan, no restart
            sampler.switch_plan(replanned)
            predicted = torch.tensor(read_samples(replanned, ["cost"])["cost"].to_numpy())
            timer.close()  # the re-plan's epochs go beside it: DIR holds what it was calibrated on
            timer = StepTimer(args.timings / AFTER_REPLAN, rank=rank, world_size=world)
        sampler.set_epoch(epoch)
        steps = min(len(loader), args.max_steps if args.max_steps is not None else len(loader))
        shown.start(f"train_ddp epoch {epoch + 1} of {epochs}", steps)
        wall_c, cpu_c, pts_c, cost_c, loss_c, drawn = [], [], [], [], [], []
        dist.barrier()
        t0 = time.perf_counter()
        batches = loader if timer is None else timer.steps(loader, epoch=epoch)
        for step, batch in enumerate(islice(batches, steps)):  # --max-steps: no batch beyond is taken
            opt.zero_grad(set_to_none=False)
            weight = _rank_weight(sampler, step, len(batch["sample_id"]), world)
            w, c, loss, rows = _compute(model, batch, classes, args.emit_timings is not None, weight)
            if timer is not None:
                timer.mark_compute_done()  # the rank's own compute ends before the all-reduce
            _allreduce_grads(params, world)
            opt.step()
            wall_c.append(w)
            cpu_c.append(c)
            loss_c.append(loss)
            pts_c.append(float(batch["num_points"].sum()))
            cost_c.append(float(predicted[batch["index"]].sum()))
            drawn.append(batch["index"].tolist())
            timings += [(sid, step, rank, f"{ms:.4f}", n) for sid, ms, n in rows]
            shown.update(step + 1)
        if timer is not None:
            batches.close()  # type: ignore[attr-defined]  # ends the last step taken (islice asks no more)
        shown.end(len(wall_c))
        dist.barrier()
        epoch_wall = time.perf_counter() - t0
        if timer is not None:
            timer.flush()  # this epoch's steps on disk, the last epoch's too
        local = torch.tensor([wall_c, cpu_c, pts_c, cost_c, loss_c], dtype=torch.float64)  # (5, steps)
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        g = torch.stack(gathered, 1)  # (5, W, steps)
        samples: list[Any] = [None] * world
        dist.all_gather_object(samples, drawn)
        per_epoch.append(
            {
                "epoch": epoch,
                "steps": int(local.shape[1]),
                "wall_s": epoch_wall,
                "linearity": linearity(g[0]),
                "cpu_linearity": linearity(g[1]),
                "points_linearity": linearity(g[2]),
                "cost_linearity": linearity(g[3]),
                "compute_mean_s": float(g[0].mean(0).sum()),
                "compute_max_s": float(g[0].max(0).values.sum()),
                "compute_s": g[0].tolist(),
                "cpu_s": g[1].tolist(),
                "points": g[2].tolist(),  # (W, steps)
                "costs": g[3].tolist(),  # (W, steps) predicted cost of each rank-step's batch
                "samples": samples,  # (W, steps, n) dataset indices each rank trained
                "train_loss": float(g[4].mean()) if g[4].numel() else float("nan"),
                "_g": g[:4],
            }
            | (_evaluate(model, val, classes, rank, world) if val is not None else {})
        )
    if timer is not None:
        timer.close()
    gathered_rows: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(timings, gathered_rows if rank == 0 else None, dst=0)
    if rank != 0:
        return None
    if args.emit_timings is not None:
        _write_timings(args.emit_timings, [r for part in gathered_rows for r in part])
    allg = torch.cat([e.pop("_g") for e in per_epoch], dim=2)
    return {
        "sampler": args.sampler,
        "backbone": args.backbone,
        "manifest": str(args.manifest),
        "world_size": world,
        "batch_size": manifest.batch_size,
        "epochs": per_epoch,
        "linearity": linearity(allg[0]),
        "cpu_linearity": linearity(allg[1]),
        "points_linearity": linearity(allg[2]),
        "cost_linearity": linearity(allg[3]),
        "wall_s_per_epoch": sum(e["wall_s"] for e in per_epoch) / max(len(per_epoch), 1),
        "planned_linearity": [b.linearity for b in manifest.balance],
        "val_initial": initial,
    }


def _write_timings(path: Path, rows: list[tuple]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sample_id", "step", "rank", "ms", "num_points"])
        w.writerows(rows)


def _worker(rank: int, world: int, store: str, args: argparse.Namespace, result: str) -> None:
    torch.set_num_threads(1)
    if args.pin_cores:  # one core per rank: the other rank's work no longer shares its core
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    # A FileStore rendezvous: no TCP port to pick, so no race with other jobs on the host.
    dist.init_process_group("gloo", init_method=Path(store).as_uri(), rank=rank, world_size=world)
    code = 0
    try:
        out = _train(rank, world, args)
        if out is not None:
            Path(result).write_text(json.dumps(out))
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        code = 1
    # Leave without running gloo's teardown: a DDP reducer that outlives its process group aborts the
    # rank at exit ("terminate called without an active exception"; tests/test_loaders_evaluation.py
    # frees the model with gc.collect() before destroy_process_group instead). Every rank waits until
    # all are done, then exits at once; a failed rank exits at once (mp.spawn then stops the others).
    if code == 0:
        _wait_for_all(f"{store}.done", rank, world)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _wait_for_all(prefix: str, rank: int, world: int, timeout_s: float = 120.0) -> None:
    """File-based rendezvous after the last collective: returns once every rank has arrived."""
    Path(f"{prefix}{rank}").touch()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(Path(f"{prefix}{r}").exists() for r in range(world)):
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Spawn ``world_size`` (from the manifest) gloo ranks, train, print and return rank 0's summary."""
    args = _parse(argv)
    world = load_manifest(args.manifest).world_size
    with tempfile.TemporaryDirectory() as tmp:
        result, store = os.path.join(tmp, "result.json"), os.path.join(tmp, "store")
        mp.spawn(_worker, args=(world, store, args, result), nprocs=world, join=True)
        summary = json.loads(Path(result).read_text())
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(summary, indent=1))
    print(
        f"sampler={summary['sampler']} world_size={world} epochs={len(summary['epochs'])} "
        f"wall_s/epoch={summary['wall_s_per_epoch']:.3f} linearity={summary['linearity']:.4f} "
        f"cpu_linearity={summary['cpu_linearity']:.4f} points_linearity={summary['points_linearity']:.4f} "
        f"cost_linearity={summary['cost_linearity']:.4f} backbone={summary['backbone']}"
    )
    return summary


if __name__ == "__main__":
    main()
