"""``lidarshard build`` end to end through the CLI: the manifest contract, determinism, re-planning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines import build as build_cli
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.transforms.plan import DEFAULT_STRATEGY
from tests.helpers import BEAM_TEST_FLAGS, make_bins, slow_after, write_samples


def _build(inp: Path, out: Path, *flags: str) -> dict:
    assert build_cli.run([str(inp), str(out), "--max-reject-fraction", "0.1", *flags, *BEAM_TEST_FLAGS]) == 0
    return json.loads((out / schemas.MANIFEST_FILE).read_text())


def _plan_rows(out: Path, epoch: int, rank: int) -> list[dict]:
    return pq.read_table(out / schemas.plan_file(epoch, rank)).to_pylist()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("build")
    inp = make_bins(tmp / "in")
    out = tmp / "out"
    return (
        inp,
        out,
        _build(inp, out, "--world-size", "4", "--batch-size", "2", "--epochs", "3", "--cost-model", "points"),
    )


def test_manifest_contract(built) -> None:
    _, out, m = built
    assert (out / schemas.SUCCESS_FILE).exists()
    assert m["schema_version"] == schemas.SCHEMA_VERSION
    assert (m["world_size"], m["batch_size"], m["epochs"], m["policy"]) == (4, 2, 3, "drop_last")
    c = m["counts"]
    assert (c["scanned"], c["accepted"], c["rejected"]) == (62, 61, 1)
    assert c["planned"] == [56, 56, 56] and c["dropped"] == [5, 5, 5]
    assert m["steps_per_epoch"] == [7, 7, 7]
    samples = pq.read_table(out / schemas.SAMPLES_DIR)
    assert samples.schema.names == [n for n, _, _ in schemas.SCORED_FIELDS]
    assert samples.column("sample_id").to_pylist() == sorted(samples.column("sample_id").to_pylist())
    for epoch in range(3):
        seen = []
        for rank in range(4):
            rows = _plan_rows(out, epoch, rank)
            assert [(r["step"], r["slot"]) for r in rows] == [(s, b) for s in range(7) for b in range(2)]
            assert {(r["epoch"], r["rank"]) for r in rows} == {(epoch, rank)}  # as its directories say
            seen += [r["sample_id"] for r in rows]
        assert len(seen) == len(set(seen)) == 56
    for rel, info in m["files"].items():
        assert (out / rel).stat().st_size == info["bytes"]


def test_balance_is_recorded_and_beats_random(built) -> None:
    _, _, m = built
    for b in m["balance"]:
        assert (
            b["linearity"] >= b["greedy_reference"] - 0.02
        )  # the sort-cut-partition reference, not a ceiling
        assert b["linearity"] > b["random_linearity"]
    assert set(m["pair_repeat_rate"]) == {DEFAULT_STRATEGY, "random"}


def _plan_keys(out: Path) -> list[tuple[int, int, int, int, str]]:
    """(epoch, rank, step, slot, sample_id) of every plan row, from the files one by one."""
    rows = []
    for f in sorted((out / schemas.PLAN_DIR).glob("epoch-*/rank-*/*.parquet")):
        e, r = int(f.parent.parent.name.split("-")[1]), int(f.parent.name.split("-")[1])
        rows += [(e, r, x["step"], x["slot"], x["sample_id"]) for x in pq.read_table(f).to_pylist()]
    return sorted(rows)


def _keys(epoch, rank, step, slot, sample_id) -> list[tuple[int, int, int, int, str]]:
    for col in (epoch, rank):
        assert all(type(v) is int for v in col), type(col[0])
    return sorted(zip(epoch, rank, step, slot, sample_id, strict=True))


def test_plan_directory_is_read_whole_by_five_readers(built) -> None:
    """pandas, pyarrow.parquet, pyarrow.dataset, DuckDB and polars read OUT/plan with no glob and no
    option, with plain int32 epoch/rank (arithmetic and reductions work), and return exactly the rows
    of the plan files."""
    _, out, _ = built
    plan = str(out / schemas.PLAN_DIR)
    want = _plan_keys(out)
    assert len(want) == 3 * 56
    cols = ["epoch", "rank", "step", "slot", "sample_id"]
    for t in (pq.read_table(plan), ds.dataset(plan).to_table()):
        assert t.schema.field("epoch").type == t.schema.field("rank").type == pa.int32()
        assert pc.sum(t["epoch"]).as_py() == 56 * (0 + 1 + 2) and pc.max(t["rank"]).as_py() == 3
        assert _keys(*(t[c].to_pylist() for c in cols)) == want
    duckdb = pytest.importorskip("duckdb")
    rel = duckdb.connect().execute(f"select {', '.join(cols)} from read_parquet('{plan}')")
    assert _keys(*zip(*rel.fetchall(), strict=True)) == want
    assert duckdb.connect().execute(f"select max(epoch) + 1 from read_parquet('{plan}')").fetchone() == (3,)
    pl = pytest.importorskip("polars")
    frame = pl.read_parquet(plan)
    assert frame.schema["epoch"].is_integer() and frame.schema["rank"].is_integer()
    assert _keys(*(frame[c].to_list() for c in cols)) == want
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(plan)
    assert all(pd.api.types.is_integer_dtype(df[c]) for c in ("epoch", "rank"))
    assert df.epoch.max() == 2 and (df["rank"] + 1).max() == 4  # what categoricals refused
    assert _keys(*(df[c].tolist() for c in cols)) == want


def _tree_bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.slow  # every local runner, worker processes included
def test_byte_identical_reruns_and_runners(built, tmp_path: Path) -> None:
    inp, out, _ = built
    flags = ["--world-size", "4", "--batch-size", "2", "--epochs", "3", "--cost-model", "points"]
    again = tmp_path / "again"
    assert (
        build_cli.run(
            [
                str(inp),
                str(again),
                *flags,
                "--max-reject-fraction",
                "0.1",
                "--runner=DirectRunner",
                "--direct_running_mode=multi_processing",
                "--direct_num_workers=2",
            ]
        )
        == 0
    )
    assert _tree_bytes(again) == _tree_bytes(out)


def test_replan_from_samples_without_rescanning(built, tmp_path: Path) -> None:
    _, out, first = built
    re = tmp_path / "re"
    m = json.loads("{}")
    assert (
        cli_main(
            [
                "build",
                str(re),
                "--from-samples",
                str(out / "samples"),
                "--world-size",
                "2",
                "--batch-size",
                "1",
                "--seed",
                "7",
                "--pad",
                "--max-reject-fraction",
                "0.1",
                *BEAM_TEST_FLAGS,
            ]
        )
        == 0
    )
    m = json.loads((re / schemas.MANIFEST_FILE).read_text())
    assert m["counts"]["scanned"] == first["counts"]["scanned"] and m["counts"]["rejected"] == 1
    assert m["counts"]["padded"] == [1] and m["steps_per_epoch"] == [31]
    assert m["inputs_fingerprint"] == first["inputs_fingerprint"]


def test_seed_changes_the_plan_and_weights_change_the_epoch_length(built, tmp_path: Path) -> None:
    inp, out, _ = built
    other = _build(
        inp,
        tmp_path / "seed",
        "--world-size",
        "4",
        "--batch-size",
        "2",
        "--epochs",
        "3",
        "--cost-model",
        "points",
        "--seed",
        "1",
    )
    assert _plan_rows(tmp_path / "seed", 0, 0) != _plan_rows(out, 0, 0)
    assert (
        other["inputs_fingerprint"] == json.loads((out / "_manifest.json").read_text())["inputs_fingerprint"]
    )
    heavy = _build(
        inp,
        tmp_path / "w",
        "--world-size",
        "2",
        "--batch-size",
        "1",
        "--buckets",
        "2",
        "--bucket-weights",
        "1,3",
        "--cost-model",
        "points",
    )
    assert heavy["buckets"]["weights"] == [1.0, 3.0]
    assert heavy["counts"]["planned"][0] > 61 + 25


def test_too_few_samples_fail_with_a_clear_message(tmp_path: Path) -> None:
    inp = make_bins(tmp_path / "in", n=3)
    with pytest.raises(Exception, match="do not fill one step"):
        build_cli.run(
            [
                str(inp),
                str(tmp_path / "out"),
                "--world-size",
                "4",
                "--batch-size",
                "1",
                "--max-reject-fraction",
                "1",
                *BEAM_TEST_FLAGS,
            ]
        )
    assert not (tmp_path / "out").exists()


def test_budget_with_a_points_cap_end_to_end(built, tmp_path: Path) -> None:
    from lidarshard.loaders.reader import ManifestReader
    from lidarshard.tools.validate import validate

    inp, out, _ = built
    points = pq.read_table(out / schemas.SAMPLES_DIR).column("num_points").to_numpy()
    cap = int(np.sort(points)[-2])  # the largest sample alone is over it
    flags = ["--world-size", "4", "--batch-size", "2", "--epochs", "2", "--cost-model", "points"]
    m = _build(inp, tmp_path / "b", *flags, "--strategy", "budget", "--max-points-per-rank-step", str(cap))
    assert m["caps"] == {
        "max_points_per_rank_step": cap,
        "max_cost_per_rank_step": None,
        "max_samples_per_rank_step": None,
    }
    c = m["counts"]
    assert c["rejected_by_reason"]["over_cap"] == int((points > cap).sum()) == 1
    assert c["planned"] == [c["accepted"]] * 2 and c["dropped"] == [0, 0] and c["padded"] == [0, 0]
    assert validate(str(tmp_path / "b"))[0] == []
    plan = ds.dataset(tmp_path / "b" / schemas.PLAN_DIR, format="parquet", partitioning="hive").to_table(
        filter=ds.field("epoch") == 0
    )
    by_id = dict(
        zip(
            *pq.read_table(tmp_path / "b" / schemas.SAMPLES_DIR, columns=["sample_id", "num_points"])
            .to_pydict()
            .values(),
            strict=True,
        )
    )
    rows = plan.to_pylist()
    assert sorted(r["sample_id"] for r in rows) == sorted(by_id)  # every accepted sample exactly once
    steps = m["steps_per_epoch"][0]
    for rank in range(4):
        reader = ManifestReader(tmp_path / "b", rank, 4, 0)
        assert len(reader) == steps  # every rank the same number of steps
        for batch in reader:
            assert 1 <= len(batch.sample_ids) and sum(by_id[s] for s in batch.sample_ids) <= cap
            assert batch.scale == pytest.approx(4 / batch.global_count)
    assert m["balance"][0]["mean_count"] == pytest.approx(c["accepted"] / (4 * steps), abs=1e-6)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    """A tiny synthetic nuScenes dataroot with lidarseg labels (8 keyframes)."""
    from lidarshard.pipelines.synth import run

    root = tmp_path_factory.mktemp("labelled") / "data"
    assert run([str(root), "--scenes", "4", "--keyframes-per-scene", "2", "--seed", "3", "--labels",
                *BEAM_TEST_FLAGS]) == 0  # fmt: skip
    return root


LABELLED = ["--nuscenes-version", "v1.0-synth", "--world-size", "2", "--batch-size", "1", "--epochs", "3"]


@pytest.mark.parametrize(
    "strategy", slow_after(1, [DEFAULT_STRATEGY, *sorted({"balanced", "budget"} - {DEFAULT_STRATEGY})])
)
def test_repeat_factors_from_lidarseg_labels(labelled: Path, tmp_path: Path, strategy: str) -> None:
    from lidarshard.tools.validate import validate
    from lidarshard.transforms.features.repeat import label_presence, lvis_factors

    out = tmp_path / "r"
    m = _build(
        labelled, out, *LABELLED, "--strategy", strategy, "--repeat-factors", "lidarseg:t=1.0", "--pad"
    )
    rep = m["repeat"]
    assert rep["mode"] == "lidarseg:t=1" and len(rep["realized"]) == 3
    samples = pq.read_table(out / schemas.SAMPLES_DIR)
    weights = samples.column("weight").to_numpy()
    labels = [(labelled / p).read_bytes() for p in samples.column("label_path").to_pylist()]
    np.testing.assert_allclose(weights, lvis_factors(*label_presence(labels), 1.0))
    assert weights.max() > 1  # some class is in fewer than all samples
    assert set(rep["realized"][0]) == set(rep["expected"])
    assert validate(str(out))[0] == []
    assert cli_main(["report", str(out)]) == 0  # plots variable counts and the repeat counts
    assert (out / "report" / "repeat.png").read_bytes()[:4] == b"\x89PNG"
    c = m["counts"]
    for e in range(3):
        drawn = c["planned"][e] - c["padded"][e] + c["dropped"][e]
        assert np.floor(weights).sum() <= drawn <= np.ceil(weights).sum()


def test_sample_weights_from_a_column(built, tmp_path: Path) -> None:
    from lidarshard.tools.validate import validate

    _, out, _ = built
    table = pq.read_table(out / schemas.SAMPLES_DIR)
    w = np.where(np.arange(table.num_rows) % 2 == 0, 2.0, 0.5)
    prev = shutil.copytree(out, tmp_path / "prev")  # beside its manifest: relative paths resolve
    write_samples(prev / "samples", table.append_column("cbgs", pa.array(w)))
    flags = ["--world-size", "2", "--batch-size", "2", "--max-reject-fraction", "0.1", *BEAM_TEST_FLAGS]
    for strategy in ("budget", DEFAULT_STRATEGY):
        o = tmp_path / strategy
        assert build_cli.run([str(o), "--from-samples", str(prev / "samples"),
                              "--sample-weights", "cbgs", "--strategy", strategy, *flags]) == 0  # fmt: skip
        m = json.loads((o / schemas.MANIFEST_FILE).read_text())
        assert m["repeat"]["mode"] == "column:cbgs" and m["repeat"]["expected"] == {"all": float(w.sum())}
        assert m["counts"]["planned"] == [int(m["repeat"]["realized"][0]["all"])]
        assert pq.read_table(o / schemas.SAMPLES_DIR).column("weight").to_numpy().tolist() == w.tolist()
        assert validate(str(o))[0] == []
    assert np.floor(w).sum() <= m["counts"]["planned"][0] + m["counts"]["dropped"][0] <= np.ceil(w).sum()


def test_weight_flags_fail_before_beam_with_one_line(labelled: Path, built, tmp_path: Path, capsys) -> None:
    inp, out, _ = built
    table = pq.read_table(out / schemas.SAMPLES_DIR)
    n = table.num_rows
    bad = {"neg": [-1.0] + [1.0] * (n - 1), "nan": [float("nan")] * n, "name": ["x"] * n}
    prev = shutil.copytree(out, tmp_path / "prev")
    write_samples(prev / "samples", table.append_column("neg", pa.array(bad["neg"]))
                  .append_column("nan", pa.array(bad["nan"])).append_column("name", pa.array(bad["name"])))  # fmt: skip
    plan = ["--world-size", "2", "--batch-size", "1"]
    prev_s = ["--from-samples", str(prev / "samples")]
    cases = [
        ([str(tmp_path / "o"), *prev_s, "--sample-weights", "nope"], "--sample-weights nope: no such column"),
        ([str(tmp_path / "o"), *prev_s, "--sample-weights", "neg"], "--sample-weights neg: weights must be finite"),
        ([str(tmp_path / "o"), *prev_s, "--sample-weights", "nan"], "--sample-weights nan: weights must be finite"),
        ([str(tmp_path / "o"), *prev_s, "--sample-weights", "name"], "needs a numeric column"),
        ([str(inp), str(tmp_path / "o"), "--sample-weights", "w"], "reads a column of a --from-samples table"),
        ([str(inp), str(tmp_path / "o"), "--repeat-factors", "lidarseg:t=0.1"], "has no lidarseg.json"),
        ([str(tmp_path / "o"), *prev_s, "--repeat-factors", "lidarseg:t=0.1"], "has lidarseg labels"),
        ([str(labelled), str(tmp_path / "o"), "--repeat-factors", "lidarseg:t=0"], "0 < T <= 1"),
        ([str(tmp_path / "o"), *prev_s, "--repeat-factors", "lidarseg:t=0.1", "--sample-weights", "neg"],
         "not allowed with argument"),
    ]  # fmt: skip
    for argv, message in cases:
        with pytest.raises(SystemExit) as exc:
            build_cli.run([*argv, *plan, *BEAM_TEST_FLAGS])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[-1], (argv, err)
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("part_rows", slow_after(1, ["7", "16"]))
def test_parts_and_plan_shards_that_cross_them_give_the_same_plan(
    built, tmp_path: Path, monkeypatch, part_rows
) -> None:
    """61 samples in parts of ``part_rows`` rows, planned in shards of 10 rows (so a shard's rows span
    two parts): the same samples and plan files as one part and one shard."""
    inp, out, _ = built
    from lidarshard.transforms.core import plan_writer as sharded

    bounds = sharded.shard_bounds
    monkeypatch.setattr(sharded, "shard_bounds", lambda n: bounds(n, 10))
    flags = ["--world-size", "4", "--batch-size", "2", "--epochs", "3", "--cost-model", "points"]
    parted = tmp_path / "parted"
    m = _build(inp, parted, *flags, "--part-rows", part_rows)
    k = -(-61 // int(part_rows))
    assert [f for f in sorted(m["files"]) if f.startswith("samples/")] == [
        schemas.samples_part(i) for i in range(k)
    ]
    assert pq.read_table(parted / schemas.SAMPLES_DIR).equals(pq.read_table(out / schemas.SAMPLES_DIR))
    for epoch in range(3):
        for rank in range(4):
            rel = schemas.plan_file(epoch, rank)
            assert (parted / rel).read_bytes() == (out / rel).read_bytes(), rel


def test_samples_moved_away_from_their_manifest_are_refused_before_beam(
    built, tmp_path: Path, capsys
) -> None:
    """Relative paths resolve against the root their run recorded beside them: without it, one line."""
    _, out, m = built
    assert m["path_root"] is not None
    lone = shutil.copytree(out / schemas.SAMPLES_DIR, tmp_path / "lone" / schemas.SAMPLES_DIR)
    with pytest.raises(SystemExit) as exc:
        build_cli.run(
            [str(tmp_path / "o"), "--from-samples", str(lone), "--world-size", "2", "--batch-size", "2"]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        "stores relative paths ('0000.bin') but no _manifest.json or _scan.json beside it records" in err
    ), err
    assert not (tmp_path / "o").exists()
