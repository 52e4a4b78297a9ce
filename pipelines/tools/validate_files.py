"""The list of data files in ``_manifest.json`` for ``lidarshard validate``: exactly the samples
parts (numbered from 0), rejects.parquet and one plan file per (epoch, rank). Works from the listed
names only, so a forged ``world_size`` costs one problem line, not a loop over it."""

from __future__ import annotations

import re
from collections.abc import Callable

from lidarshard import schemas
from lidarshard.transforms.parts import listed_parts

__all__ = ["plan_key", "samples_parts", "check_listed"]

#: ``problem(where, what)``: report one problem.
Problem = Callable[[str, str], None]


def plan_key(rel: str) -> tuple[int, int] | None:
    """(epoch, rank) when ``rel`` is exactly ``schemas.plan_file(epoch, rank)``, else None."""
    nums = re.findall(r"[0-9]{1,18}", rel)[:2]
    if len(nums) != 2:
        return None
    e, r = int(nums[0]), int(nums[1])
    return (e, r) if schemas.plan_file(e, r) == rel else None


def samples_parts(problem: Problem, rels: list[str]) -> list[str] | None:
    """The samples parts among ``rels`` in order (``parts.listed_parts``), or None and a problem."""
    try:
        return listed_parts(rels)
    except ValueError as e:
        problem(schemas.SAMPLES_DIR, str(e))
        return None


def check_listed(
    problem: Problem, files: dict, w: int, epochs: int, enumerate_up_to: int
) -> tuple[bool, list[str] | None]:
    """The files ``_manifest.json`` lists are exactly the samples parts, rejects and one plan file
    per (epoch, rank); missing plan files are named one by one when at most ``enumerate_up_to``.
    Returns (whether the list is complete, the samples parts in order or None: ``samples_parts``).
    """
    plans: set[tuple[int, int]] = set()
    for rel in sorted(files):
        key = plan_key(rel)
        if key is not None and key[0] < epochs and key[1] < w:
            plans.add(key)
        elif rel != schemas.REJECTS_FILE and not rel.startswith(schemas.SAMPLES_DIR + "/"):
            problem(rel, f"recorded in 'files' but not part of a world_size {w}, {epochs}-epoch plan")
    missing = [rel for rel in (schemas.REJECTS_FILE,) if rel not in files]
    parts = samples_parts(problem, list(files))
    gap = w * epochs - len(plans)
    if 0 < gap <= enumerate_up_to:  # then w * epochs <= len(files) + enumerate_up_to: cheap to enumerate
        missing += [schemas.plan_file(e, r) for e in range(epochs) for r in range(w) if (e, r) not in plans]
    elif gap:
        problem(
            "_manifest.json",
            f"world_size {w} x epochs {epochs} need {w * epochs} plan files, 'files' lists {len(plans)}",
        )
    for rel in missing:
        problem(rel, f"not recorded in _manifest.json 'files' (world_size {w}, epochs {epochs} need it)")
    return not missing and gap == 0 and parts is not None, parts
