"""Load a dataroot with the real nuscenes-devkit and report what it sees, as JSON on stdout.

Run inside the devkit's own virtual environment (it pins numpy 1.26), never imported by pytest:

    .venv-devkit/bin/python tests/devkit_check.py DATAROOT VERSION [NSWEEPS]
"""

from __future__ import annotations

import json
import os.path as osp
import sys


def main(dataroot: str, version: str, nsweeps: int) -> dict:
    import numpy as np
    from nuscenes.nuscenes import NuScenes
    from nuscenes.utils.data_classes import LidarPointCloud

    nusc = NuScenes(version=version, dataroot=dataroot, verbose=False)
    samples = []
    for sample in sorted(nusc.sample, key=lambda s: s["timestamp"]):
        pc, times = LidarPointCloud.from_file_multisweep(
            nusc, sample, "LIDAR_TOP", "LIDAR_TOP", nsweeps=nsweeps
        )
        sd_token = sample["data"]["LIDAR_TOP"]
        row = {
            "token": sample["token"],
            "num_points": int(pc.nbr_points()),
            "num_sweeps": int(len(np.unique(times))),
            "xyz_sum": [float(v) for v in pc.points[:3].astype(np.float64).sum(axis=1)],
            "max_time_lag": float(times.max()),
        }
        if hasattr(nusc, "lidarseg"):
            labels = np.fromfile(
                osp.join(dataroot, nusc.get("lidarseg", sd_token)["filename"]), dtype=np.uint8
            )
            keyframe = LidarPointCloud.from_file(nusc.get_sample_data_path(sd_token))
            row["labels_match"] = bool(len(labels) == keyframe.nbr_points())
            row["label_names"] = sorted({nusc.lidarseg_idx2name_mapping[int(i)] for i in np.unique(labels)})
        samples.append(row)
    return {
        "tables": {t: len(getattr(nusc, t)) for t in nusc.table_names},
        "channels": sorted({sd["channel"] for sd in nusc.sample_data}),
        "samples": samples,
    }


if __name__ == "__main__":
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    json.dump(main(sys.argv[1], sys.argv[2], n), sys.stdout)
