"""The one stable seed hash (transforms/plan/seeds.py)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from lidarshard.transforms.plan import seeds


def test_names_enter_as_crc32_and_ints_as_they_are() -> None:
    assert seeds.salt("pool") == zlib.crc32(b"pool") == 2945558918
    assert seeds.entropy(3, "balanced", np.int64(5)) == [3, 3262407112, 5]
    a = seeds.rng(3, 1, "random").random(4)
    np.testing.assert_array_equal(a, np.random.default_rng([3, 1, zlib.crc32(b"random")]).random(4))


def test_derive_is_a_stable_63_bit_seed() -> None:
    assert seeds.derive(7, 0, 1, 5, 4, 4) == 4399136905952860665  # stable across processes and versions
    assert seeds.derive(7, 0, 1, 5, 4, 4) != seeds.derive(7, 0, 1, 5, 4, 2)
    assert all(0 <= seeds.derive(s, "x") < 2**63 for s in range(50))


def test_negative_parts_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        seeds.rng(-1, 0)


def test_each_purpose_has_one_hash_of_pinned_values() -> None:
    """The sample-id hashes decide plans (``sample_keys``), spread the scan (``scan_shard``) and split the
    calibration folds (``folds``): their values are pinned, whatever module calls them."""
    import hashlib

    import pyarrow as pa

    ids = ["a", "scene-00001", "é/x.bin"]
    want = [zlib.crc32(i.encode()) for i in ids]
    assert seeds.sample_keys(ids).tolist() == want == seeds.sample_keys(pa.array(ids)).tolist()
    assert seeds.sample_keys(ids).dtype == np.uint64
    blake = [int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "little") for i in ids]
    assert [seeds.scan_shard(i, 256) for i in ids] == [b % 256 for b in blake]
    assert seeds.folds(["0:1", "0:2", "1:1"], 5).tolist() == [
        zlib.crc32(k.encode()) % 5 for k in ("0:1", "0:2", "1:1")
    ]
