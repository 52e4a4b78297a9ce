"""Write what nuscenes-devkit reads for every sample of a dataroot: its points, time lags and lidarseg labels.

Run inside the devkit's own virtual environment (it pins numpy 1.26), never imported by pytest:

    .venv-devkit/bin/python tests/devkit_points.py DATAROOT VERSION NSWEEPS OUT.npz

``OUT.npz`` holds, per sample token T: ``T/keyframe`` (4, N) float32 x, y, z, intensity of its LIDAR_TOP
keyframe as ``LidarPointCloud.from_file`` reads it (every point); with NSWEEPS > 0 ``T/points`` (4, N)
and ``T/times`` (1, N) float64 time lags (s) of ``from_file_multisweep(nsweeps=NSWEEPS, min_distance=1.0)``
(the devkit's default); and ``T/lidarseg`` (N,) uint8, its ``load_bin_file`` of the keyframe's
lidarseg.json record, when the dataroot has one.
"""

from __future__ import annotations

import os.path as osp
import sys


def main(dataroot: str, version: str, nsweeps: int, out: str) -> None:
    import numpy as np
    from nuscenes.nuscenes import NuScenes
    from nuscenes.utils.data_classes import LidarPointCloud
    from nuscenes.utils.data_io import load_bin_file

    nusc = NuScenes(version=version, dataroot=dataroot, verbose=False)
    labelled = {r["sample_data_token"]: r["filename"] for r in getattr(nusc, "lidarseg", [])}
    arrays = {}
    for sample in nusc.sample:
        token, sd = sample["token"], sample["data"]["LIDAR_TOP"]
        keyframe = LidarPointCloud.from_file(osp.join(nusc.dataroot, nusc.get("sample_data", sd)["filename"]))
        arrays[f"{token}/keyframe"] = keyframe.points
        if nsweeps:
            pc, times = LidarPointCloud.from_file_multisweep(
                nusc, sample, "LIDAR_TOP", "LIDAR_TOP", nsweeps=nsweeps, min_distance=1.0
            )
            arrays[f"{token}/points"] = pc.points
            arrays[f"{token}/times"] = times
        if sd in labelled:
            arrays[f"{token}/lidarseg"] = load_bin_file(osp.join(nusc.dataroot, labelled[sd]), "lidarseg")
    np.savez(out, **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
