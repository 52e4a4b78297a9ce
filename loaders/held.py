"""A manifest held across a rebuild: every read of its files keeps to the plan that was opened.

A reader or sampler reads ``_manifest.json`` once, when it is made, and reads an epoch's plan files (and the
samples) later, epoch by epoch. A rebuild may publish another plan into the same OUT in between (another
seed, another world size): its files are then what OUT holds. :func:`same_plan` wraps each such read and
refuses, in one line, what OUT holds when the files it relies on (the epoch's plan files, or the samples
parts) are no longer those of the manifest that was opened; every reader of the plan files passes through it
(``ManifestReader``, ``read_epoch_plan``, ``read_samples``), so every sampler built on them does too
(``BalancedBatchSampler``, ``ElasticBatchSampler``, the torch, mmengine and Pointcept adapters).

A read that checked every byte it used against the sha256 ``opened`` records (``verify``, the default of the
plan readers) is the opened plan's by construction: OUT's ``_manifest.json`` is read again only when such a
read fails (a file that differs from its recorded sha256, or vanished, is then named as a rebuild, not as an
edit). Any other read (``verify=False``, or some columns of the samples parts, whose sizes alone are checked)
is followed by one read of ``_manifest.json``. Pure Python; imports neither Beam nor torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from lidarshard.schemas.manifest import FileEntry, Manifest
from lidarshard.transforms.io.metadata import load_manifest
from lidarshard.transforms.io.parts import listed_parts

__all__ = ["RebuiltError", "same_plan"]


class RebuiltError(ValueError):
    """OUT no longer holds the plan a reader or sampler opened (a rebuild published into it)."""


def _relied_on(m: Manifest, epoch: int | None) -> str | list[tuple[str, FileEntry]]:
    """What a read of ``m``'s epoch ``epoch`` relies on (its plan fingerprint: W, B, seed, strategy and the
    epoch's files), or of its samples when ``epoch`` is None (the parts and their recorded hashes)."""
    if epoch is None:
        return [(rel, m.files[rel]) for rel in listed_parts(m.files)]
    return m.plan_fingerprint(epoch)


def _plan_words(m: Manifest) -> str:
    return f"seed {m.seed}, world_size {m.world_size}, batch_size {m.batch_size}, strategy {m.strategy}"


def check_same_plan(out: str, opened: Manifest, epoch: int | None) -> None:
    """Raise :class:`RebuiltError` unless the manifest now at ``out`` records, for epoch ``epoch``'s plan
    (or for the samples when None), exactly what ``opened`` records."""
    what = "the samples" if epoch is None else f"epoch {epoch}'s plan"
    fix = "restart training on the new manifest, and build into another OUT while a job trains on this one"
    try:
        now = load_manifest(out)
        changed = _relied_on(now, epoch) != _relied_on(opened, epoch)
    except (OSError, ValueError) as e:
        raise RebuiltError(
            f"{out}: no longer the manifest this reader opened ({str(e).splitlines()[0]}), so {what} cannot "
            f"be read as opened ({_plan_words(opened)}); {fix}"
        ) from None
    if changed:
        now_words = "other samples" if epoch is None else _plan_words(now)
        raise RebuiltError(
            f"{out}: rebuilt after this reader opened it: {what} is now that of another build ({now_words}), "
            f"not the one opened ({_plan_words(opened)}); {fix}"
        )


@contextmanager
def same_plan(
    out: str | os.PathLike[str], opened: Manifest, epoch: int | None, verified: bool
) -> Iterator[None]:
    """Around a read of ``opened``'s epoch ``epoch`` (None: its samples) from ``out``: when it fails, and
    after it unless ``verified`` (every byte read was checked against ``opened``'s sha256), refuse it if
    OUT no longer holds what ``opened`` records for it.

    Raises:
        RebuiltError: OUT was rebuilt or removed since ``opened`` was read (one line, naming the fix).
    """
    base = os.fspath(out)
    try:
        yield
    except (OSError, ValueError):
        check_same_plan(base, opened, epoch)  # a rebuild explains a changed or vanished file
        raise
    if not verified:
        check_same_plan(base, opened, epoch)
