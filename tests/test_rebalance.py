"""``--strategy rebalance`` (transforms/plan/rebalance.py): random's steps split by cost; the same gradient."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lidarshard.transforms.plan import SEEDED_AS, VARIABLE_COUNT, plan_epoch
from lidarshard.transforms.plan.caps import Caps, PoolLimits, rank_step_sums
from lidarshard.transforms.plan.metrics import linearity, pair_repeat_rate, rank_costs


def _members(plan: np.ndarray) -> list[list[int]]:
    """Each step's entries, sorted."""
    return [sorted(int(v) for v in step.ravel() if v >= 0) for step in plan]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    w=st.integers(1, 16),
    b=st.integers(1, 4),
    steps=st.integers(1, 12),
    sigma=st.sampled_from([0.0, 0.5, 1.5]),
    seed=st.integers(0, 2**31 - 1),
)
def test_each_step_holds_randoms_samples_and_every_rank_one(
    w: int, b: int, steps: int, sigma: float, seed: int
) -> None:
    costs = np.random.default_rng(seed).lognormal(0.0, sigma, steps * w * b)
    for epoch in (0, 1):
        mine = plan_epoch("rebalance", costs, w, b, seed=seed, epoch=epoch)
        rnd = plan_epoch("random", costs, w, b, seed=seed, epoch=epoch)
        assert _members(mine) == _members(rnd)
        counts = (mine >= 0).sum(axis=-1)
        assert (counts >= 1).all() and (counts.sum(axis=1) == w * b).all()
        # the split is LPT's: never worse than random's at any step where random's is not already one per rank
        assert (
            rank_costs(mine, costs).max(axis=1) <= rank_costs(rnd, costs).max(axis=1) + 1e-9
        ).all() or b == 1
    assert "rebalance" in VARIABLE_COUNT and SEEDED_AS["rebalance"] == "random"


def test_at_one_sample_a_rank_it_is_random_and_above_it_balances() -> None:
    costs = np.random.default_rng(0).lognormal(0.0, 0.6, 16 * 4 * 64)
    one = plan_epoch("rebalance", costs, 16, 1, seed=3, epoch=0)
    assert linearity(one, costs) == pytest.approx(
        linearity(plan_epoch("random", costs, 16, 1, seed=3, epoch=0), costs)
    )
    four = [plan_epoch(s, costs, 16, 4, seed=3, epoch=e) for s in ("rebalance", "random") for e in (0, 1)]
    assert linearity(four[0], costs) > linearity(four[2], costs) + 0.2  # 0.93 against random's 0.66
    assert pair_repeat_rate(four[0], four[1]) == pair_repeat_rate(four[2], four[3])  # the same steps


def test_rank_speeds_and_caps_are_respected() -> None:
    rng = np.random.default_rng(5)
    costs = rng.lognormal(0.0, 0.5, 8 * 4 * 32)
    speeds = np.tile([1.5, 1.5, 0.5, 0.5], 2)
    plan = plan_epoch("rebalance", costs, 8, 4, seed=1, epoch=0, speeds=speeds)
    loads = rank_costs(plan, costs)
    assert loads[:, speeds > 1].sum() > 2.0 * loads[:, speeds < 1].sum()  # fast ranks carry about 3x
    times = loads / speeds
    blind = rank_costs(plan_epoch("random", costs, 8, 4, seed=1, epoch=0), costs) / speeds
    assert times.mean(1).sum() / times.max(1).sum() > blind.mean(1).sum() / blind.max(1).sum() + 0.2
    points = rng.integers(1_000, 5_000, costs.size)
    cap = Caps(max_samples=5, max_points=int(np.sort(points)[-4:].sum()) + 1)
    capped = plan_epoch("rebalance", costs, 8, 4, seed=1, epoch=0, limits=PoolLimits(cap, points))
    assert ((capped >= 0).sum(axis=-1) <= 5).all() and (
        rank_step_sums(capped, points) <= cap.max_points
    ).all()
    with pytest.raises(ValueError, match="multiple of W"):
        plan_epoch("rebalance", costs[:-1], 8, 4, seed=1, epoch=0)


def _rank_batches(out: Path, world: int) -> list[list[tuple[list[int], float]]]:
    """Per epoch-0 step, each rank's (dataset indices, loss_scale) as the loader's sampler replays them."""
    from lidarshard.loaders.torch import BalancedBatchSampler

    per_rank = []
    for rank in range(world):
        sampler = BalancedBatchSampler(str(out), rank, world)
        sampler.set_epoch(0)
        per_rank.append([(batch, sampler.loss_scale(step)) for step, batch in enumerate(sampler)])
    return [list(step) for step in zip(*per_rank, strict=True)]


def _train(steps: list[list[tuple[list[int], float]]], x, y, scaled: bool = True):
    """A small MLP (no BatchNorm) trained by SGD on ``steps`` as DDP would: each rank's gradient of
    ``loss_scale * sum(per-sample losses)`` (``scaled``; else its batch mean), averaged over ranks."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in steps:
        grads = []
        for batch, scale in step:
            model.zero_grad()
            losses = (model(x[batch]).squeeze(1) - y[batch]) ** 2
            (scale * losses.sum() if scaled else losses.mean()).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads, strict=True):
            p.grad = sum(gs) / len(gs)  # DDP's all-reduce mean over ranks
        opt.step()
    return torch.cat([p.detach().ravel() for p in model.parameters()])


def test_ddp_gradient_is_distributed_samplers_step_for_step(tmp_path: Path) -> None:
    """Two simulated ranks train a few steps on a random plan and on its rebalance (read back through the
    loaders): with loss_scale the parameters agree to float precision; without it they do not."""
    torch = pytest.importorskip("torch")
    import lidarshard

    n, world, batch = 48, 2, 3
    rng = np.random.default_rng(11)
    points = np.round(np.exp(rng.uniform(np.log(1_000), np.log(60_000), n))).astype(np.int64)
    rows = {"sample_id": [f"s{i:03d}" for i in range(n)], "path": [], "num_points": points.tolist()}
    for i in range(n):
        f = tmp_path / "data" / f"s{i:03d}.bin"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(np.zeros((4, 4), np.float32).tobytes())
        rows["path"].append(str(f))
    x = torch.tensor(rng.normal(size=(n, 3)))
    y = torch.tensor(rng.normal(size=n))
    runs = {}
    for strategy in ("random", "rebalance"):
        out = tmp_path / strategy
        lidarshard.write_manifest(
            pa.table(rows), str(out), world, batch, cost_model="points", strategy=strategy, seed=7
        )
        runs[strategy] = _rank_batches(out, world)
    same = [[sorted(i for b, _ in step for i in b)] for step in runs["random"]]
    assert same == [[sorted(i for b, _ in step for i in b)] for step in runs["rebalance"]]
    assert any(len(b) != batch for step in runs["rebalance"] for b, _ in step)  # counts really differ
    base, mine = _train(runs["random"], x, y), _train(runs["rebalance"], x, y)
    torch.testing.assert_close(mine, base, rtol=1e-9, atol=1e-12)
    unscaled = _train(runs["rebalance"], x, y, scaled=False)  # per-rank batch means weight ranks wrongly
    assert (unscaled - base).abs().max() > 1e-4
