"""The one stable seed hash: every seeded generator of the planner and of the elastic re-plan.

A seed is a tuple of parts: ints >= 0 (the manifest's seed, an epoch, a switch history) and names
(a strategy, a purpose such as ``"pool"``) that enter as the CRC-32 of their UTF-8 (never Python's
``hash()``, which is salted per process). numpy's ``SeedSequence`` mixes the parts: ``rng`` gives
the generator, ``derive`` a 63-bit int seed to hand on to another seeded step. Same parts, same
numbers, on every rank, process and platform.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["salt", "entropy", "rng", "derive"]

Part = int | str


def salt(name: str) -> int:
    """The stable int a name enters a seed as: CRC-32 of its UTF-8 (0 .. 2**32-1)."""
    return zlib.crc32(name.encode("utf-8"))


def entropy(*parts: Part) -> list[int]:
    """The ``SeedSequence`` entropy of ``parts``: ints as they are (>= 0), names as ``salt``."""
    out = [salt(p) if isinstance(p, str) else int(p) for p in parts]
    if any(v < 0 for v in out):
        raise ValueError(f"seed parts must be >= 0, got {out}")
    return out


def rng(*parts: Part) -> np.random.Generator:
    """The generator of ``parts``: ``np.random.default_rng(entropy(*parts))``."""
    return np.random.default_rng(entropy(*parts))


def derive(*parts: Part) -> int:
    """A 63-bit int seed from ``parts`` (the first 64-bit word ``SeedSequence`` makes of them, halved)."""
    word = np.random.SeedSequence(entropy(*parts)).generate_state(1, np.uint64)[0]
    return int(word) >> 1
