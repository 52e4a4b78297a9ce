"""Write what nuscenes-devkit's ``LidarPointCloud.from_file_multisweep`` gives for every sample of a dataroot.

Run inside the devkit's own virtual environment (it pins numpy 1.26), never imported by pytest:

    .venv-devkit/bin/python tests/devkit_points.py DATAROOT VERSION NSWEEPS OUT.npz

``OUT.npz`` holds, per sample token T, ``T/points`` (4, N) float32 x, y, z, intensity and ``T/times``
(1, N) float64 time lags (s), with ``min_distance=1.0`` (the devkit's default).
"""

from __future__ import annotations

import sys


def main(dataroot: str, version: str, nsweeps: int, out: str) -> None:
    import numpy as np
    from nuscenes.nuscenes import NuScenes
    from nuscenes.utils.data_classes import LidarPointCloud

    nusc = NuScenes(version=version, dataroot=dataroot, verbose=False)
    arrays = {}
    for sample in nusc.sample:
        pc, times = LidarPointCloud.from_file_multisweep(
            nusc, sample, "LIDAR_TOP", "LIDAR_TOP", nsweeps=nsweeps, min_distance=1.0
        )
        arrays[f"{sample['token']}/points"] = pc.points
        arrays[f"{sample['token']}/times"] = times
    np.savez(out, **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
