"""``lidarshard.build`` and ``lidarshard.write_manifest``: same checks, same plan, same bytes as the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lidarshard
from lidarshard import schemas
from lidarshard.pipelines.cli import main
from lidarshard.tools.validate import validate
from lidarshard.transforms.value_checks import UsageError
from tests.helpers import BEAM_TEST_FLAGS, make_bins, write_samples

#: _manifest.json keys that record where the samples came from (a scan vs a table).
PROVENANCE = {
    "created_by",
    "input",
    "datasets",
    "from_samples",
    "nuscenes_version",
    "sweeps",
    "scan_config",
    "sample_schema",
}


def _tree(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def scanned(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("api")
    inp = make_bins(tmp / "in", n=40)
    assert main(["scan", str(inp), str(tmp / "scan"), "--max-reject-fraction", "0.1", *BEAM_TEST_FLAGS]) == 0
    return tmp / "scan"


def test_write_manifest_gives_the_bytes_of_build_from_samples(scanned: Path, tmp_path: Path) -> None:
    flags = {
        "epochs": 2,
        "seed": 3,
        "bucket_weights": (1, 2, 1, 0.5),
        "cost_model": "points",
        "max_reject_fraction": 0.1,
    }
    by_build = lidarshard.build(
        None, str(tmp_path / "b"), world_size=2, batch_size=3, from_samples=str(scanned / schemas.SAMPLES_DIR),
        runner="FnApiRunner", **flags,
    )  # fmt: skip
    samples = pq.read_table(scanned / schemas.SAMPLES_DIR)
    rejects = pq.read_table(scanned / schemas.REJECTS_FILE)
    by_table = lidarshard.write_manifest(samples, str(tmp_path / "t"), 2, 3, rejects=rejects, **flags)
    a, b = _tree(tmp_path / "b"), _tree(tmp_path / "t")
    assert a.keys() == b.keys()
    assert {k for k in a if a[k] != b[k]} == {schemas.MANIFEST_FILE}
    ma, mb = (json.loads(t[schemas.MANIFEST_FILE]) for t in (a, b))
    assert {k: v for k, v in ma.items() if k not in PROVENANCE} == {
        k: v for k, v in mb.items() if k not in PROVENANCE
    }
    assert by_build["balance"] == by_table["balance"] and by_build["counts"] == by_table["counts"]
    assert by_table["counts"]["rejected"] == 1 and len(by_table["balance"]) == 2
    assert validate(str(tmp_path / "t"))[0] == []


def test_write_manifest_from_given_costs(tmp_path: Path) -> None:
    table = pa.table({"sample_id": [f"s{i:03d}" for i in range(50)], "path": [f"/d/{i}.bin" for i in range(50)],
                      "cost": [float(1 + (i * 37) % 11) for i in range(50)]})  # fmt: skip
    s = lidarshard.write_manifest(table, str(tmp_path / "m"), 4, 2, epochs=1)
    assert s["counts"]["accepted"] == 50 and s["steps_per_epoch"] == [6]
    plan = pq.read_table(tmp_path / "m" / schemas.plan_file(0, 0))
    costs = dict(zip(table["sample_id"].to_pylist(), table["cost"].to_pylist(), strict=True))
    assert all(
        costs[sid] == c
        for sid, c in zip(plan["sample_id"].to_pylist(), plan["cost"].to_pylist(), strict=True)
    )
    m = json.loads((tmp_path / "m" / schemas.MANIFEST_FILE).read_text())
    assert m["cost_model"]["name"] == "given"
    assert validate(str(tmp_path / "m"))[0] == []


def test_write_manifest_takes_a_dataframe(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(
        {"sample_id": ["b", "a", "c", "d"], "path": ["/b", "/a", "/c", "/d"], "cost": [2.0, 1, 3, 4]}
    )
    s = lidarshard.write_manifest(df, str(tmp_path / "m"), 2, 1)
    assert s["counts"]["accepted"] == 4 and s["steps_per_epoch"] == [2]


def test_api_refuses_what_the_cli_refuses(scanned: Path, tmp_path: Path) -> None:
    table = pa.table({"sample_id": ["a", "b"], "path": ["/a", "/b"], "cost": [1.0, 2.0]})
    with pytest.raises(UsageError, match="--bucket-weights 0,0"):
        lidarshard.write_manifest(table, str(tmp_path / "x"), 1, 1, bucket_weights=(0, 0))
    tied = pa.table({"sample_id": ["a", "b", "c", "d"], "path": ["/a", "/b", "/c", "/d"], "cost": [1.0] * 4})
    with pytest.raises(ValueError, match="2 weights but the costs make only 1 distinct buckets"):
        lidarshard.write_manifest(tied, str(tmp_path / "x"), 1, 1, bucket_weights=(1, 2))
    with pytest.raises(UsageError, match="not voxel_size"):
        lidarshard.write_manifest(table, str(tmp_path / "x"), 1, 1, voxel_size=0.1)
    with pytest.raises(UsageError, match="missing column"):
        lidarshard.write_manifest(pa.table({"sample_id": ["a"]}), str(tmp_path / "x"), 1, 1)
    with pytest.raises(UsageError, match="does not exist"):
        lidarshard.build(str(tmp_path / "nope"), str(tmp_path / "x"), world_size=1, batch_size=1)
    with pytest.raises(UsageError, match="unknown argument sweps; did you mean sweeps"):
        lidarshard.build(str(scanned), str(tmp_path / "x"), world_size=1, batch_size=1, sweps=9)
    assert not (tmp_path / "x").exists()


def test_write_manifest_takes_sample_weights_with_the_bytes_of_build(scanned: Path, tmp_path: Path) -> None:
    prev = Path(shutil.copytree(scanned, tmp_path / "prev"))
    samples = pq.read_table(prev / schemas.SAMPLES_DIR)
    samples = samples.append_column("cbgs", pa.array([0.5 + (i % 4) * 0.6 for i in range(samples.num_rows)]))
    write_samples(prev / schemas.SAMPLES_DIR, samples)
    flags = {
        "epochs": 2,
        "seed": 1,
        "strategy": "budget",
        "max_reject_fraction": 0.1,
        "sample_weights": "cbgs",
    }
    lidarshard.build(None, str(tmp_path / "b"), world_size=2, batch_size=2, runner="FnApiRunner",
                     from_samples=str(prev / schemas.SAMPLES_DIR), **flags)  # fmt: skip
    rejects = pq.read_table(prev / schemas.REJECTS_FILE)
    lidarshard.write_manifest(
        samples, str(tmp_path / "t"), 2, 2, rejects=rejects, cost_model="voxels", **flags
    )
    a, b = _tree(tmp_path / "b"), _tree(tmp_path / "t")
    assert {k for k in a if a[k] != b[k]} == {schemas.MANIFEST_FILE} and a.keys() == b.keys()
    m = json.loads(b[schemas.MANIFEST_FILE])
    assert m["repeat"] == json.loads(a[schemas.MANIFEST_FILE])["repeat"]
    assert m["repeat"]["mode"] == "column:cbgs" and validate(str(tmp_path / "t"))[0] == []
    with pytest.raises(UsageError, match="sample_weights nope: no such column"):
        lidarshard.write_manifest(samples, str(tmp_path / "x"), 2, 2, sample_weights="nope")
    with pytest.raises(UsageError, match="repeat_factors: no sample has a label_path"):
        lidarshard.write_manifest(samples, str(tmp_path / "x"), 2, 2, repeat_factors="lidarseg:t=0.1")
    with pytest.raises(UsageError, match="not allowed with"):
        lidarshard.write_manifest(samples, str(tmp_path / "x"), 2, 2, repeat_factors="lidarseg:t=0.1",
                                  sample_weights="cbgs")  # fmt: skip


def test_keyword_arguments_give_the_options_of_the_command_line() -> None:
    """One list of flags: the API's keyword arguments are checked by the validators the CLI parses
    with, as typed values, and give the same options."""
    from lidarshard.pipelines import build as build_cmd
    from lidarshard.pipelines.options import BuildOptions
    from lidarshard.transforms.declare import from_flags, from_keywords

    argv = ["in", "out", "--world-size", "4", "--batch-size", "2", "--epochs", "3", "--pad",
            "--bucket-weights", "1,2.5", "--max-points-per-rank-step", "9000", "--strategy", "budget"]  # fmt: skip
    parsed, _ = build_cmd.parser().parse(argv)
    kw = {"input": "in", "out": "out", "world_size": 4, "batch_size": 2, "epochs": 3, "pad": True,
          "bucket_weights": (1, 2.5), "max_points_per_rank_step": 9000, "strategy": "budget"}  # fmt: skip
    assert from_keywords(BuildOptions, kw) == from_flags(BuildOptions, parsed)
    with pytest.raises(UsageError, match="--world-size: True is not a valid value"):
        from_keywords(BuildOptions, {"out": "o", "world_size": True, "batch_size": 1})
    with pytest.raises(UsageError, match="'2.5' is not an integer"):
        from_keywords(BuildOptions, {"out": "o", "world_size": 2.5, "batch_size": 1})
    with pytest.raises(UsageError, match="invalid choice: 'balancd'"):
        from_keywords(BuildOptions, {"strategy": "balancd"})


# ------------------------------------------------------------------- what a new user runs into first


def test_a_core_install_names_the_extra_in_one_line() -> None:
    """Without Beam, ``lidarshard.build`` / ``write_manifest`` name ``lidarshard[pipeline]``; the
    trainer side still imports."""
    code = (
        "import sys; sys.modules['apache_beam'] = None\n"  # as on `pip install lidarshard` (no extras)
        "import lidarshard\n"
        "assert lidarshard.ManifestReader\n"
        "for name in ('build', 'write_manifest'):\n"
        "    try:\n"
        "        getattr(lidarshard, name)\n"
        "    except ModuleNotFoundError as e:\n"
        "        print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    extra = 'needs Apache Beam, which is an optional extra: pip install "lidarshard[pipeline]"'
    assert r.stdout.splitlines() == [f"lidarshard.build {extra}", f"lidarshard.write_manifest {extra}"]


def test_write_manifest_takes_a_list_of_dicts(tmp_path: Path) -> None:
    rows = [{"sample_id": f"{i:04d}", "path": f"/d/{i}.bin", "cost": 1.0 + i % 5} for i in range(12)]
    rows[3]["note"] = "a key only one row has"  # the union of the keys; other rows get null
    as_list = lidarshard.write_manifest(rows, str(tmp_path / "l"), 2, 2)
    as_table = lidarshard.write_manifest(
        pa.Table.from_pylist(rows[:3] + rows[4:] + [rows[3]]), str(tmp_path / "t"), 2, 2
    )
    assert as_list["counts"]["accepted"] == 12 and as_list["balance"] == as_table["balance"]
    assert _tree(tmp_path / "l").keys() == _tree(tmp_path / "t").keys()
    pl = pytest.importorskip("polars")  # any frame with the Arrow stream interface (string_view columns)
    assert (
        lidarshard.write_manifest(pl.DataFrame(rows), str(tmp_path / "p"), 2, 2)["balance"]
        == as_list["balance"]
    )
    for bad, match in [
        ([("0001", "/d/1.bin")], "a list of samples must hold dicts"),
        ({"sample_id": ["a"]}, "must be a pyarrow Table, a pandas DataFrame or a list of dicts, not dict"),
        ([{"sample_id": "a", "path": "/a", "cost": 1.0}, {"sample_id": "b", "path": "/b", "cost": "x"}],
         "key 'cost' holds values of mixed types"),
    ]:  # fmt: skip
        with pytest.raises(UsageError, match=match):
            lidarshard.write_manifest(bad, str(tmp_path / "x"), 1, 1)
    assert not (tmp_path / "x").exists()


def test_integer_sample_ids_and_relative_paths_are_refused_saying_what_to_do(tmp_path: Path) -> None:
    """Integer ids would be sorted as text (2 after 12); write_manifest records no path_root."""
    ints = [{"sample_id": i, "path": f"/d/{i}.bin", "cost": 1.0} for i in range(20)]
    with pytest.raises(
        UsageError, match=r'sample_id must be strings, not int64 .*2 would come after 12.*"\{i:08d\}"'
    ):
        lidarshard.write_manifest(ints, str(tmp_path / "x"), 2, 2)
    pd = pytest.importorskip("pandas")
    with pytest.raises(UsageError, match="sample_id must be strings, not int64"):
        lidarshard.write_manifest(pd.DataFrame(ints), str(tmp_path / "x"), 2, 2)
    df = pd.DataFrame(ints).assign(sample_id=lambda d: d["sample_id"].map("{:08d}".format))  # the advice
    assert lidarshard.write_manifest(df, str(tmp_path / "ok"), 2, 2)["counts"]["accepted"] == 20
    relative = [{"sample_id": f"{i:02d}", "path": f"data/{i}.bin", "cost": 1.0} for i in range(4)]
    with pytest.raises(UsageError, match=r"path 'data/0.bin' is not a full path .*: pass full paths or URIs"):
        lidarshard.write_manifest(relative, str(tmp_path / "x"), 2, 2)
    assert not (tmp_path / "x").exists()


def test_a_moved_dataset_is_named_with_its_path_root_and_root_moves_it(tmp_path: Path) -> None:
    """A relative manifest whose data moved: "not found: PATH (the manifest's path_root is X; pass
    root= ...)" when the dataset is made, not in a worker; ``root=`` reads it from the new place."""
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset

    inp = make_bins(tmp_path / "in", n=8)
    out = str(tmp_path / "m")
    lidarshard.build(str(inp), out, world_size=1, batch_size=2, runner="FnApiRunner", max_reject_fraction=0.2)
    moved = inp.rename(tmp_path / "moved")
    with pytest.raises(FileNotFoundError) as e:
        PointCloudDataset(out)
    assert str(e.value) == (
        f"not found: {inp / '0000.bin'} (the manifest's path_root is {inp}; pass root= if the dataset moved)"
    )
    dataset = PointCloudDataset(out, root=str(moved), point_dims=4)
    assert dataset[len(dataset) - 1]["points"].shape[1] == 4
    (moved / "0003.bin").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=rf"^not found: {moved / '0003.bin'} \(looked under root={moved}; the manifest's path_root is {inp}\)$",
    ):
        dataset[3]


def test_root_on_a_manifest_of_full_paths_names_path_map(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset

    inp = make_bins(tmp_path / "in", n=4)
    rows = [{"sample_id": p.stem, "path": str(p), "cost": 1.0} for p in sorted(inp.glob("0*.bin"))]
    out = str(tmp_path / "m")
    lidarshard.write_manifest(rows, out, 1, 2)
    with pytest.raises(ValueError, match=r"this manifest stores full paths \(no path_root\): pass path_map="):
        PointCloudDataset(out, root=str(tmp_path / "elsewhere"))
    moved = inp.rename(tmp_path / "moved")
    with pytest.raises(
        FileNotFoundError, match=r"\(the manifest stores full paths; pass path_map=.* if the dataset moved\)$"
    ):
        PointCloudDataset(out)
    assert len(PointCloudDataset(out, path_map={str(inp): str(moved)})) == 4
