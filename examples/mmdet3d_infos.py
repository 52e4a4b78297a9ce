"""From an mmdet3d-style nuScenes infos file to a balanced manifest, then an mmengine run on it.

mmdet3d (>= 1.1) keeps its sample list in an infos ``.pkl``: ``{"metainfo": ..., "data_list": [{"token",
"lidar_points": {"lidar_path", "num_pts_feats"}, ...}]}``. Users already have that list, so no scan
is needed: this example sizes each sample from its file's byte count (``num_points = bytes /
(4 * num_pts_feats)``, what ``--features stat`` does), hands the table to
``lidarshard.write_manifest`` (no Beam pipeline) and trains with mmengine's ``Runner`` using
``LidarshardSampler(manifest, id_key="token")``, which maps each planned sample_id back to the
dataset index whose info has that token.

    python examples/mmdet3d_infos.py WORKDIR [--samples 24] [--world-size 1] [--batch-size 2]

WORKDIR gets ``data/`` (clouds and ``nuscenes_infos_train.pkl``, made here), ``manifest/`` and
``work_dir/`` (mmengine's; ``work_dir/rankR.json`` lists the batches rank R trained). With
``--world-size W`` the manifest is planned for W ranks and the example trains it on W CPU processes
(``torch.distributed`` with gloo, initialized before the ``Runner``), each replaying its rank's plan.
On CPU each rank trains its own copy of the toy model: mmengine's DDP wrapper and ``launcher="pytorch"``
pin a CUDA device. On GPUs, launch your config with ``torchrun --nproc-per-node W`` and
``launcher="pytorch"``; the sampler is the same. Needs ``pip install "lidarshard[mmengine]"`` for the
training part.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import multiprocessing
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

import lidarshard

__all__ = ["make_infos", "infos_to_samples", "train", "main"]

PTS_PREFIX = "samples/LIDAR_TOP"
FEATS = 5  # nuScenes .pcd.bin: x, y, z, intensity, ring


def make_infos(data_root: Path, n: int, seed: int = 0) -> Path:
    """Write ``n`` nuScenes-style clouds (lognormal point counts) and an mmdet3d infos pkl naming them."""
    rng = np.random.default_rng(seed)
    (data_root / PTS_PREFIX).mkdir(parents=True, exist_ok=True)
    data_list = []
    for i, count in enumerate(np.exp(rng.normal(7.0, 0.7, size=n)).astype(int) + 16):
        name = f"n008-2018-08-01__LIDAR_TOP__{1533151603547590 + 50_000 * i}.pcd.bin"
        rng.normal(scale=15.0, size=(count, FEATS)).astype(np.float32).tofile(data_root / PTS_PREFIX / name)
        token = f"{i:032x}"
        data_list.append(
            {"sample_idx": i, "token": token, "lidar_points": {"num_pts_feats": FEATS, "lidar_path": name}}
        )
    infos = data_root / "nuscenes_infos_train.pkl"
    meta = {"dataset": "nuscenes", "version": "v1.0-trainval", "info_version": "1.1"}
    with open(infos, "wb") as f:
        pickle.dump({"metainfo": meta, "data_list": data_list}, f)
    return infos


def infos_to_samples(infos: Path, data_root: Path, pts_prefix: str = PTS_PREFIX) -> pa.Table:
    """The infos' samples as a table for ``write_manifest``: sample_id (token), path (full), sizes."""
    with open(infos, "rb") as f:
        data_list = pickle.load(f)["data_list"]  # noqa: S301 - our own file
    ids, paths, sizes, points = [], [], [], []
    for info in data_list:
        pts = info["lidar_points"]
        path = os.path.join(os.path.abspath(data_root), pts_prefix, pts["lidar_path"])
        size = os.path.getsize(path)
        ids.append(info["token"])
        paths.append(path)
        sizes.append(size)
        points.append(size // (4 * int(pts.get("num_pts_feats", FEATS))))
    return pa.table({"sample_id": ids, "path": paths, "file_bytes": sizes, "num_points": points,
                     "num_in_range": points})  # fmt: skip


def train(manifest: Path, infos: Path, data_root: Path, work_dir: Path, epochs: int) -> list[list[str]]:
    """Train ``epochs`` epochs with mmengine's Runner on this process's rank of the manifest (the rank
    and world size of ``torch.distributed`` when it is initialized, else 0 of 1); returns the tokens of
    every batch."""
    import torch
    from mmengine.dataset import BaseDataset
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    import lidarshard.loaders.mmengine  # noqa: F401  registers LidarshardSampler

    class Infos(BaseDataset):
        """The infos file as mmengine loads it: one dict per sample, points read on access."""

        def load_data_list(self) -> list[dict]:
            with open(self.ann_file, "rb") as f:
                return pickle.load(f)["data_list"]  # noqa: S301 - our own file

        def prepare_data(self, idx: int) -> dict:
            info = self.get_data_info(idx)
            path = os.path.join(data_root, PTS_PREFIX, info["lidar_points"]["lidar_path"])
            pts = np.fromfile(path, dtype=np.float32).reshape(-1, FEATS)
            return {"points": torch.from_numpy(pts[:, :3]), "token": info["token"]}

    class Mean(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.zeros(1))
            self.seen: list[list[str]] = []

        def forward(self, points, token, mode="tensor", **_):  # noqa: ANN001, ANN201 - mmengine's signature
            self.seen.append(list(token))
            return {"loss": sum((self.scale - p.abs().mean()) ** 2 for p in points)}

    def collate(batch: list[dict]) -> dict:
        return {"points": [b["points"] for b in batch], "token": [b["token"] for b in batch]}

    model = Mean()
    batch = lidarshard.load_manifest(str(manifest)).batch_size
    runner = Runner(
        model=model,
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=Infos(ann_file=str(infos), serialize_data=False),
            batch_size=batch,
            num_workers=0,
            sampler=dict(type="LidarshardSampler", manifest=str(manifest), id_key="token"),
            batch_sampler=dict(type="LidarshardBatchSampler"),
            collate_fn=collate,
        ),
        train_cfg=dict(by_epoch=True, max_epochs=epochs),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=epochs)),
        # keep the start method a spawned rank already has (mmengine would force "fork", warning)
        env_cfg=dict(
            mp_cfg=dict(mp_start_method=multiprocessing.get_start_method(allow_none=True) or "fork")
        ),
        log_level=logging.WARNING,
    )
    runner.train()
    return model.seen


def train_ranks(
    manifest: Path, infos: Path, data_root: Path, work_dir: Path, epochs: int
) -> list[list[list[str]]]:
    """:func:`train` on every rank the manifest plans: in this process for one rank, else in W
    processes joined by a gloo process group (CPU). Returns each rank's batches (tokens)."""
    world = lidarshard.load_manifest(str(manifest)).world_size
    if world == 1:
        return [train(manifest, infos, data_root, work_dir, epochs)]
    import torch.multiprocessing as mp

    work_dir.mkdir(parents=True, exist_ok=True)
    store = (work_dir / "dist_store").resolve().as_uri()
    mp.spawn(
        _rank, args=(world, store, manifest, infos, data_root, work_dir, epochs), nprocs=world, join=True
    )
    return [json.loads((work_dir / f"rank{r}.json").read_text()) for r in range(world)]


def _rank(rank: int, world: int, store: str, manifest: Path, infos: Path, data_root: Path, work_dir: Path,
          epochs: int) -> None:  # fmt: skip
    """One rank of :func:`train_ranks`: its batches go to ``work_dir/rankR.json``."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    try:
        seen = train(manifest, infos, data_root, work_dir / f"rank{rank}", epochs)
    finally:  # the runner's DDP model (cycles: gc) goes first: gloo aborts when it outlives the group
        gc.collect()
        dist.destroy_process_group()
    (work_dir / f"rank{rank}.json").write_text(json.dumps(seen))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workdir", type=Path)
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--no-train", action="store_true", help="only write the manifest")
    args = p.parse_args(argv)
    data = args.workdir / "data"
    infos = make_infos(data, args.samples)
    table = infos_to_samples(infos, data)
    out = args.workdir / "manifest"
    summary = lidarshard.write_manifest(table, str(out), args.world_size, args.batch_size, epochs=args.epochs,
                                        cost_model="points")  # fmt: skip
    print(
        f"wrote {out}: {summary['counts']['accepted']} samples, steps per epoch {summary['steps_per_epoch']}"
    )
    for b in summary["balance"]:
        print(
            f"  epoch {b['epoch']}: predicted linearity {b['linearity']:.4f} (random {b['random_linearity']:.4f})"
        )
    if not args.no_train:
        for rank, seen in enumerate(train_ranks(out, infos, data, args.workdir / "work_dir", args.epochs)):
            print(f"rank {rank}: mmengine trained {len(seen)} planned batches, first {seen[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
