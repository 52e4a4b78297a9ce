"""One build core: the same samples through ``lidarshard build --from-samples``, ``lidarshard.build()``
and ``lidarshard.write_manifest()`` give byte-identical plan files (property test over strategies,
weights, caps, policies and world sizes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lidarshard
from lidarshard import schemas
from lidarshard.pipelines.cli import main
from lidarshard.transforms.plan import STRATEGIES
from lidarshard.transforms.value_checks import UsageError
from tests.helpers import BEAM_TEST_FLAGS, samples_table

pytestmark = pytest.mark.slow  # three full builds, one per entry point, compared byte for byte


def _samples(n: int, seed: int) -> pa.Table:
    """``n`` samples with full paths and sizes spread over two orders of magnitude."""
    points = np.random.default_rng(seed).integers(100, 20_000, n)
    return samples_table([f"s{i:04d}" for i in range(n)], points, [f"/data/{i:04d}.bin" for i in range(n)])


def _plans(out: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(out)): p.read_bytes() for p in sorted((out / schemas.PLAN_DIR).rglob("*.parquet"))
    }


def _flags(kw: dict) -> list[str]:
    argv = []
    for key, value in kw.items():
        name = "--" + key.replace("_", "-")
        argv += (
            [name]
            if value is True
            else [f"{name}={','.join(map(str, value)) if isinstance(value, tuple) else value}"]
        )
    return argv


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(24, 70),
    seed=st.integers(0, 5),
    strategy=st.sampled_from(sorted(STRATEGIES)),
    w=st.integers(1, 4),
    b=st.integers(1, 3),
    pad=st.booleans(),
    weights=st.sampled_from([None, (1.0, 2.0, 0.5), (0.5,)]),
    cap=st.sampled_from([None, 15_000]),
)
def test_three_entry_points_write_the_same_plan_files(
    tmp_path: Path, n, seed, strategy, w, b, pad, weights, cap
) -> None:
    run = tmp_path / f"{n}-{seed}-{strategy}-{w}-{b}-{pad}-{weights}-{cap}"
    shutil.rmtree(run, ignore_errors=True)
    table = _samples(n, seed)
    prev = run / "prev" / schemas.SAMPLES_DIR
    prev.mkdir(parents=True)
    pq.write_table(table, prev / schemas.part_name(0))
    kw: dict = {"epochs": 2, "seed": seed, "strategy": strategy, "max_reject_fraction": 1.0}
    kw |= {"pad": True} if pad else {}
    kw |= {"bucket_weights": weights} if weights else {}
    kw |= {"max_points_per_rank_step": cap} if cap else {}
    size = ["--world-size", str(w), "--batch-size", str(b)]
    cli_rc = main(
        ["build", str(run / "cli"), "--from-samples", str(prev), *size, *_flags(kw), *BEAM_TEST_FLAGS]
    )
    if cli_rc != 0:  # a plan the flags cannot make: every entry point refuses it
        with pytest.raises((UsageError, ValueError, RuntimeError)):
            lidarshard.write_manifest(table, str(run / "table"), w, b, **kw)
        return
    lidarshard.build(
        None, str(run / "api"), world_size=w, batch_size=b, from_samples=str(prev), runner="FnApiRunner", **kw
    )
    lidarshard.write_manifest(table, str(run / "table"), w, b, **kw)
    want = _plans(run / "cli")
    assert want and _plans(run / "api") == want and _plans(run / "table") == want
    samples = [pq.read_table(run / d / schemas.SAMPLES_DIR) for d in ("cli", "api", "table")]
    assert samples[0].equals(samples[1]) and samples[0].equals(samples[2])
