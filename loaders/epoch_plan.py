"""One epoch's whole plan, read from its files: the one reader the elastic re-plan and the report use.

Each rank's plan files are read through ``planfiles.read_rank_plan`` (listed, bounded, with ``verify``
their recorded size and sha256), their ``sample_id`` looked up in the samples, and the rows scattered
into the dense ``(S, W, M)`` array the planners produce (``lidarshard.transforms.plan.dense``). The
rows must be exactly the plan ``_manifest.json`` records for the epoch. ``lidarshard validate`` reads
the same files its own way, problem by problem and string by string, into the same ``dense_plan``.

Pure numpy/pyarrow; imports neither Beam nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from lidarshard.loaders.held import same_plan
from lidarshard.loaders.planfiles import read_rank_plan
from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.plan.dense import dense_plan

__all__ = ["EpochRows", "read_epoch_plan"]


@dataclass(frozen=True)
class EpochRows:
    """Epoch ``epoch``'s plan: ``plan`` (S, W, M) int64 samples rows (``-1`` an empty slot), ``table``
    the n plan rows (``step, slot, rank, sample_id`` and the columns asked for; rank-major, each rank
    by step and slot) and ``at`` (n,) int64 the samples row of each."""

    epoch: int
    plan: NDArray[np.int64]
    table: pa.Table
    at: NDArray[np.int64]


def read_epoch_plan(
    out: str,
    m: Manifest,
    epoch: int,
    sample_ids: pa.Array | pa.ChunkedArray,
    columns: Sequence[str] = (),
    *,
    verify: bool = True,
) -> EpochRows:
    """Read planned epoch ``epoch`` of the manifest ``m`` at ``out``.

    Args:
        sample_ids: (N,) the samples' ``sample_id`` in samples row order (``read_samples``).
        columns: plan columns wanted besides ``step, slot, sample_id`` (e.g. ``cost``, ``bucket_id``).
        verify: check each plan file against its recorded size and sha256 first.

    Raises:
        ValueError: the epoch is not planned, or its files do not hold exactly the plan the manifest
            records (``steps_per_epoch``, ``counts.planned``, every slot filled once, every rank-step
            holding a sample, every sample_id in the samples; one line).
    """
    w, b = m.world_size, m.batch_size
    if not 0 <= epoch < m.epochs:
        raise ValueError(f"epoch {epoch} was not planned: the manifest holds epochs 0..{m.epochs - 1}")
    s, variable = m.steps(epoch), m.variable_count
    cols = ["step", "slot", "sample_id", *(c for c in columns if c not in ("step", "slot", "sample_id"))]
    parts = []
    with same_plan(out, m, epoch, verify):  # OUT still holds the plan ``m`` records (not a rebuild since)
        for r in range(w):
            try:
                t = read_rank_plan(out, m, epoch, r, cols, verify)[0]
            except FileNotFoundError as e:
                raise ValueError(f"epoch {epoch}: {e}; rebuild the manifest") from None
            parts.append(t.append_column("rank", pa.array(np.full(t.num_rows, r, np.int64))))
    table = pa.concat_tables(parts)
    planned = m.counts.planned[epoch]
    if table.num_rows != planned or (not variable and planned != s * w * b):
        raise ValueError(
            f"epoch {epoch}: {table.num_rows} plan rows, but the manifest records "
            f"{planned} planned ({s} steps x {w} x {b}); rebuild the manifest"
        )
    found = pc.index_in(table["sample_id"], value_set=sample_ids)
    if found.null_count:
        raise ValueError(f"epoch {epoch}: {found.null_count} planned sample_ids are not in the samples")
    at = found.to_numpy().astype(np.int64)
    step, rank, slot = (table[c].to_numpy().astype(np.int64) for c in ("step", "rank", "slot"))
    plan = dense_plan(step, rank, slot, at, s, w, None if variable else b)
    if plan.size and not (plan >= 0)[..., 0].all():
        raise ValueError(f"epoch {epoch}: a rank-step of the plan holds no sample; rebuild the manifest")
    return EpochRows(epoch, plan, table, at)
