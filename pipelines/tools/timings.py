"""Timings of a training run joined to a manifest's samples: the one reading ``lidarshard calibrate`` and
``lidarshard report --timings`` share. The timings are the recorder's Parquet files
(``lidarshard.loaders.timing.StepTimer``: a directory, or one ``.parquet`` file) or a CSV of ms per
sample or per rank-step (``transforms.report.calibrate.read_timings``). No Beam.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import pyarrow as pa

from lidarshard.loaders.timing import read_timing_files
from lidarshard.transforms import storage
from lidarshard.transforms.report import calibrate as cal

__all__ = ["Timed", "is_recorded", "read_observations"]


def is_recorded(timings_path: str) -> bool:
    """Whether ``timings_path`` is the recorder's Parquet (a directory, or a ``.parquet`` file), not a CSV."""
    return timings_path.endswith(".parquet") or storage.is_dir(timings_path)


class Timed(NamedTuple):
    """Timings joined to a manifest's samples (``read_observations``)."""

    obs: pa.Table  # cal.observations columns; + epoch, step, rank, world_size for recorder files
    timed: str  # what one row timed: "sample", "rank-step" or "recorded rank-step"
    raw: pa.Table  # the rows read: the CSV's (cal.read_timings) or the recorder's (TIMING_FIELDS)
    keys: list[str]  # one per observation, for cal.held_out_fit (recorder: "epoch:step")


def read_observations(
    timings_path: str, samples: pa.Table, plan: Callable[[], pa.Table], epoch: int = 0
) -> Timed:
    """The timings at ``timings_path`` joined to ``samples``: the one reading calibrate and report share.

    Args:
        plan: gives the manifest's plan rows; called only for a CSV of step/rank rows without sample ids.
        epoch: the epoch of CSV step/rank rows without an epoch column.
    """
    if is_recorded(timings_path):
        steps = read_timing_files(timings_path)
        obs = cal.step_observations(steps, samples)
        keys = [
            f"{e}:{s}"
            for e, s in zip(obs.column("epoch").to_pylist(), obs.column("step").to_pylist(), strict=True)
        ]
        return Timed(obs, "recorded rank-step", steps, keys)
    timings = cal.read_timings(storage.read_bytes(timings_path))
    per_sample = "sample_id" in timings.column_names
    obs = cal.observations(timings, samples, None if per_sample else plan(), epoch)
    return Timed(obs, "sample" if per_sample else "rank-step", timings, [str(i) for i in range(obs.num_rows)])
