"""The stable hashes: every seeded generator of the planner and of the elastic re-plan, and every hash of
a sample id or key, one per purpose (never Python's ``hash()``, which is salted per process).

A seed is a tuple of parts: ints >= 0 (the manifest's seed, an epoch, a switch history) and names
(a strategy, a purpose such as ``"pool"``) that enter as ``salt``, the CRC-32 of their UTF-8. numpy's
``SeedSequence`` mixes the parts: ``rng`` gives the generator, ``derive`` a 63-bit int seed to hand on
to another seeded step, ``spread`` a stable hash of many keys at once (splitmix64 keyed by ``derive``).
Same parts, same numbers, on every rank, process and platform. The hashes by purpose:

- ``sample_keys``: a sample's key in the plan, CRC-32 of its sample_id; ``spread`` of it under (seed,
  epoch, ``"groups"``) deals the samples of a hierarchical plan into its step groups (decides plans);
- ``scan_shard``: the scan's hash shard of a sample id, 64-bit BLAKE2b (spreads work only: the scan's
  output does not depend on it);
- ``folds``: the calibration fold of a timing's key (``"epoch:step"``), ``salt`` mod the folds.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["salt", "entropy", "rng", "derive", "spread", "sample_keys", "scan_shard", "folds"]

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


def _salts(names: Iterable[str]) -> NDArray[np.uint64]:
    """(n,) ``salt`` of each name, as uint64."""
    return np.fromiter((zlib.crc32(n.encode("utf-8")) for n in names), dtype=np.uint64)


def sample_keys(sample_ids: Any) -> NDArray[np.uint64]:
    """(N,) the stable key of each sample_id (a pyarrow array or a sequence of str): CRC-32 of its UTF-8."""
    return _salts(sample_ids.to_pylist() if hasattr(sample_ids, "to_pylist") else sample_ids)


def scan_shard(sample_id: str, shards: int) -> int:
    """The shard (0 .. shards-1) of ``sample_id`` in the scan: 64-bit BLAKE2b of it, mod ``shards``."""
    digest = hashlib.blake2b(sample_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % shards


def folds(keys: Sequence[str], count: int) -> NDArray[np.int64]:
    """(n,) the fold (0 .. count-1) of each key: ``salt(key) % count``, a split that does not depend on
    which other keys exist."""
    return (_salts(keys) % np.uint64(count)).astype(np.int64)


_GAMMA, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def spread(keys: NDArray[np.uint64], *parts: Part) -> NDArray[np.uint64]:
    """(n,) uint64 hashes of ``keys`` (n,) under ``parts``: splitmix64's finalizer of ``key + derive(*parts)``.
    Uniform over 64 bits; ``spread(k, *parts) % G`` deals keys into G groups, the same on every platform."""
    with np.errstate(over="ignore"):
        z = np.asarray(keys, dtype=np.uint64) + np.uint64(derive(*parts)) + _GAMMA
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))
