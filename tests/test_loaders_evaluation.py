"""lidarshard.loaders.evaluation: a partition of the validation set (no repeat, none missing, counts within
one), cost-balanced by LPT, from a manifest's costs; DistributedSampler as the contrast."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from lidarshard.loaders import read_samples  # noqa: E402
from lidarshard.loaders.evaluation import EvalSampler, eval_costs, eval_shards  # noqa: E402
from tests.manifest_fixture import make_fixture  # noqa: E402

SIZES = [40 + 97 * ((7 * i) % 23) for i in range(23)]  # 23 samples of uneven size


def _check_partition(shards: list[np.ndarray], n: int) -> None:
    every = np.concatenate(shards)
    assert np.array_equal(np.sort(every), np.arange(n))  # each sample exactly once over all ranks
    counts = [s.size for s in shards]
    assert max(counts) - min(counts) <= 1
    assert all(np.array_equal(s, np.unique(s)) for s in shards)  # ascending, no repeat within a rank


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), max_size=200),
    st.integers(1, 16),
)
def test_shards_partition_with_counts_within_one_and_balanced_load(costs: list[float], w: int) -> None:
    c = np.asarray(costs, dtype=np.float64)
    shards = eval_shards(c, w)
    assert len(shards) == w
    _check_partition(shards, c.size)
    loads = np.array([c[s].sum() for s in shards])
    if c.size:
        assert loads.max() - loads.min() <= c.max() * (1 + 1e-9) + 1e-9
    assert all(np.array_equal(a, b) for a, b in zip(shards, eval_shards(c.copy(), w), strict=True))


def test_lpt_beats_round_robin_on_skewed_costs() -> None:
    rng = np.random.default_rng(0)
    costs = rng.lognormal(0, 1, 1001)
    shards = eval_shards(costs, 8)
    lpt = max(costs[s].sum() for s in shards) / (costs.sum() / 8)
    strided = max(costs[r::8].sum() for r in range(8)) / (costs.sum() / 8)
    assert lpt < 1.01 < strided  # slowest rank vs the mean: LPT within 1 %, round robin not


def test_bad_costs_and_world_size_are_refused() -> None:
    for bad in ([1.0, np.nan], [-1.0], [[1.0]]):
        with pytest.raises(ValueError, match="finite values >= 0"):
            eval_shards(bad, 2)
    with pytest.raises(TypeError, match="world_size must be an int"):
        eval_shards([1.0], 2.0)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        eval_shards([1.0], 0)


def test_sampler_from_manifest_covers_the_validation_set_once(tmp_path: Path) -> None:
    out = make_fixture(tmp_path, SIZES, world_size=3, batch_size=2, epochs=1)
    costs = read_samples(out, ["cost"])["cost"].to_numpy()
    seen = []
    for rank in range(3):
        sampler = EvalSampler.from_manifest(out, rank, 3)
        loader = DataLoader(list(range(len(SIZES))), sampler=sampler, batch_size=2, num_workers=0)
        got = [i for b in loader for i in b.tolist()]
        assert len(sampler) == len(got) in (7, 8)
        seen.append(np.asarray(got))
    _check_partition(seen, len(SIZES))
    assert max(costs[s].sum() for s in seen) - min(costs[s].sum() for s in seen) <= costs.max()
    # DistributedSampler, the contrast: pads 23 -> 24 by repeating a sample
    dist = [list(DistributedSampler(range(23), num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    assert sum(map(len, dist)) == 24 and len(set().union(*dist)) == 23


def test_eval_costs_follow_index_of_and_refuse_a_missing_item(tmp_path: Path) -> None:
    out = make_fixture(tmp_path, SIZES, world_size=3, batch_size=2, epochs=1)
    table = read_samples(out, ["sample_id", "cost"])
    ids, cost = table["sample_id"].to_pylist(), table["cost"].to_numpy()
    reverse = {s: len(ids) - 1 - i for i, s in enumerate(ids)}
    np.testing.assert_array_equal(eval_costs(out, index_of=reverse), cost[::-1])
    with pytest.raises(ValueError, match=r"1 of 24 dataset items have no cost .* \(first index 23\)"):
        eval_costs(out, size=24)
    with pytest.raises(ValueError, match="outside 0..21"):
        eval_costs(out, size=22)


#: One rank of the evaluation loop docs/GUIDE.md and ``loaders.evaluation`` describe: the plain module
#: under no_grad, no collective per batch, one all_gather_object after the loop on every rank.
_EVAL_RANK = """
import gc, json, sys, warnings
import torch
import torch.distributed as dist
from lidarshard.loaders.evaluation import EvalSampler

rank, store, val, result = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sampler = EvalSampler.from_manifest(val)  # rank and world size from torch.distributed
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))  # a trained DDP model
loader = torch.utils.data.DataLoader(list(range(len(sampler.shards[0]) + len(sampler.shards[1]))),
                                     sampler=sampler, batch_size=1)
results = {}
with torch.no_grad():
    for batch in loader:  # rank 1 has no batch: nothing in here may wait for the other rank
        results.update(zip(batch.tolist(), model.module(batch.float()[:, None]).squeeze(1).tolist()))
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, results)  # every rank calls it, with or without samples
del model, loader  # DDP's reducer must go before its process group (else gloo aborts at exit, ~1 in 3)
gc.collect()
dist.destroy_process_group()
with open(result, "w") as f:
    json.dump({"len": len(sampler), "warned": [str(w.message) for w in caught],
               "every": sorted(int(k) for part in gathered for k in part)}, f)
"""


@pytest.mark.slow  # two gloo ranks in subprocesses
@pytest.mark.timeout(180)
def test_more_ranks_than_samples_two_gloo_ranks_finish_the_documented_loop(tmp_path: Path) -> None:
    """1 validation sample on 2 gloo ranks: rank 1 gets none and says so; the documented loop (no
    collective per batch, one gather after it) ends on both ranks with the sample exactly once."""
    val = make_fixture(tmp_path, [70], world_size=1, batch_size=1, epochs=1)
    store = (tmp_path / "store").as_uri()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _EVAL_RANK, str(r), store, str(val), str(tmp_path / f"r{r}.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        logs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], logs
    got = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert [g["len"] for g in got] == [1, 0]
    assert got[0]["warned"] == []
    (warning,) = got[1]["warned"]
    assert "rank 1 of 2 gets no samples (1 for all ranks): run no collective per batch" in warning
    assert got[0]["every"] == got[1]["every"] == [0]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(costs=st.lists(st.integers(0, 4), max_size=30), w=st.integers(1, 6))
def test_eval_shards_are_the_rule_with_counts_within_one(costs: list[int], w: int) -> None:
    c = np.asarray(costs, dtype=np.float64)
    order = np.lexsort((np.arange(c.size), -c))
    base, extra = divmod(c.size, w)
    to, key, count = [], [0.0] * w, [0] * w
    for i in order.tolist():  # the rule with the extras going to the first bins to reach base + 1
        b = min((r for r in range(w) if count[r] < base + (extra > 0)), key=lambda r: (key[r], r))
        key[b] += c[i]
        count[b] += 1
        extra -= count[b] == base + 1
        to.append(b)
    want = [sorted(order[np.asarray(to, dtype=np.int64) == r].tolist()) for r in range(w)]
    assert [s.tolist() for s in eval_shards(c, w)] == want
