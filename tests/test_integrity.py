"""Data integrity from scan to training (schema 3.1): the scan records each file's size and CRC-32,
``lidarshard validate OUT --data`` checks every file, the loaders refuse a changed file or a path that
leaves ``path_root``; a schema 3.0 output is refused in one line and rebuilds from its samples."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.loaders import load_manifest
from lidarshard.loaders.points import FileChangedError, Recorded, load_points, read_recorded
from lidarshard.pipelines import build as build_cli
from lidarshard.pipelines import scan as scan_cli
from lidarshard.tools import validate as validate_cli
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.features.sample import ScanConfig, featurize
from lidarshard.transforms.layouts.task import ScanTask, SweepRef
from tests.helpers import BEAM_TEST_FLAGS, mem_io
from tests.legacy import as_written_by

pytestmark = pytest.mark.hostile("integrity")

VERSION = "v1.0-synth"
PLAN = ["--world-size", "2", "--batch-size", "2"]
IDENTITY = tuple(float(v) for v in np.eye(4).ravel())


@pytest.fixture(scope="module")
def dataroot(tmp_path_factory) -> Path:
    """A synth nuScenes dataroot: 4 keyframes, previous sweeps, lidarseg labels."""
    synth = pytest.importorskip("lidarshard.pipelines.synth")
    root = tmp_path_factory.mktemp("synth") / "nuscenes"
    argv = [
        str(root),
        "--scenes",
        "1",
        "--keyframes-per-scene",
        "4",
        "--sweeps-per-keyframe",
        "2",
        "--labels",
    ]
    assert synth.run([*argv, *BEAM_TEST_FLAGS]) in (0, None)
    return root


@pytest.fixture(scope="module")
def built(dataroot: Path, tmp_path_factory) -> Path:
    """``build`` of ``dataroot`` with 2 sweeps a keyframe, paths relative to it."""
    out = tmp_path_factory.mktemp("built") / "out"
    flags = ["--nuscenes-version", VERSION, "--sweeps", "2", *PLAN, "--relative-to", str(dataroot)]
    assert build_cli.run([str(dataroot), str(out), *flags, *BEAM_TEST_FLAGS]) == 0
    return out


@pytest.fixture
def moved(dataroot: Path, tmp_path: Path) -> Path:
    """A copy of the dataroot a test may damage (the manifest reads it with ``root=``/``--root``)."""
    return Path(shutil.copytree(dataroot, tmp_path / "data"))


def _rows(out: Path) -> list[dict]:
    return pq.read_table(out / schemas.SAMPLES_DIR).to_pylist()


def _swept(out: Path) -> list[tuple[int, dict]]:
    """(index, row) of the samples with sweeps."""
    return [(i, r) for i, r in enumerate(_rows(out)) if r["sweep_paths"]]


def _validate(capsys, *argv: object) -> tuple[int, str]:
    try:
        rc = validate_cli.run([*map(str, argv)])
    except SystemExit as e:  # a usage error (argparse): exit status 2
        rc = int(e.code or 0)
    got = capsys.readouterr()
    return rc, got.out + got.err


def _rewrite(out: Path, rel: str, table: pa.Table, *, reseal: bool = True) -> None:
    """Replace the Parquet file ``out/rel`` with ``table``; ``reseal``: also its size and sha256 in
    ``_manifest.json`` (a consistent forgery, which only the content checks catch)."""
    pq.write_table(table, out / rel)
    if reseal:
        meta = json.loads((out / schemas.MANIFEST_FILE).read_text())
        data = (out / rel).read_bytes()
        meta["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (out / schemas.MANIFEST_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def _flip(path: Path, at: int = 100) -> None:
    """Change one byte of ``path`` in place (same size, other contents)."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------------- scan


def test_the_scan_records_every_files_size_and_crc32(built: Path, dataroot: Path) -> None:
    rows = _rows(built)
    assert sum(bool(r["sweep_paths"]) for r in rows) == len(rows) - 1  # a scene's first keyframe has none
    for r in rows:
        files = [
            (r["path"], r["path_bytes"], r["path_crc32"]),
            (r["label_path"], r["label_bytes"], r["label_crc32"]),
        ]
        files += list(zip(r["sweep_paths"], r["sweep_bytes"], r["sweep_crc32"], strict=True))
        for rel, size, crc in files:
            data = (dataroot / rel).read_bytes()
            assert (size, crc) == (len(data), zlib.crc32(data)), rel
        assert r["file_bytes"] == r["path_bytes"] + sum(r["sweep_bytes"])
    m = json.loads((built / schemas.MANIFEST_FILE).read_text())
    assert m["schema_version"] == schemas.SCHEMA_VERSION == "4.5"
    assert m["scan_config"]["content_hash"] == schemas.CONTENT_HASH == "crc32"
    assert set(schemas.INTEGRITY_FIELDS) <= {f["name"] for f in m["sample_schema"]}
    assert pq.read_schema(built / schemas.samples_part(0)).names == schemas.scored_schema().names


def test_a_stat_scan_records_sizes_only_and_says_the_hash_is_absent(
    dataroot: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "scan"
    flags = ["--nuscenes-version", VERSION, "--sweeps", "2", "--features", "stat"]
    assert scan_cli.run([str(dataroot), str(out), *flags, *BEAM_TEST_FLAGS]) == 0
    assert json.loads((out / schemas.SCAN_FILE).read_text())["scan_config"]["content_hash"] is None
    rows = _rows(out)
    for r in rows:
        assert r["path_crc32"] is None and r["label_crc32"] is None and r["sweep_crc32"] is None
        assert r["path_bytes"] == os.path.getsize(r["path"]) and r["label_bytes"] == os.path.getsize(
            r["label_path"]
        )
        assert r["sweep_bytes"] == [os.path.getsize(p) for p in r["sweep_paths"]]
    rc, text = _validate(capsys, out, "--data")
    assert rc == 0 and "of them by size only (no crc32 recorded: --features stat)" in text, text


def test_featurize_hashes_the_bytes_it_read_and_stat_checks_the_label_size() -> None:
    key, sweep = np.ones((50, 5), np.float32), np.full((30, 5), 2.0, np.float32)
    files = {"k.bin": key.tobytes(), "s.bin": sweep.tobytes(), "l.bin": bytes(50)}
    task = ScanTask("tok", "k.bin", (SweepRef("s.bin", IDENTITY, 0.05),), "l.bin")
    row = featurize(task, *mem_io(files), ScanConfig(format="nuscenes_bin"))
    assert (row["path_bytes"], row["path_crc32"]) == (1000, zlib.crc32(files["k.bin"]))
    assert (row["sweep_bytes"], row["sweep_crc32"]) == ([600], [zlib.crc32(files["s.bin"])])
    assert (row["label_bytes"], row["label_crc32"]) == (50, zlib.crc32(bytes(50)))
    stat = ScanConfig(format="nuscenes_bin", features="stat")
    row = featurize(task, *mem_io(files), stat)
    assert (row["path_bytes"], row["sweep_bytes"], row["label_bytes"]) == (1000, [600], 50)
    assert "path_crc32" not in row and stat.content_hash is None and ScanConfig().content_hash == "crc32"
    with pytest.raises(RejectError, match="label_mismatch"):
        featurize(task, *mem_io(files | {"l.bin": bytes(49)}), stat)
    with pytest.raises(RejectError, match="label_mismatch"):
        featurize(task, *mem_io({k: v for k, v in files.items() if k != "l.bin"}), stat)


# ------------------------------------------------------------------------------- validate --data


def test_validate_data_passes_and_without_data_reads_no_data_file(built: Path, moved: Path, capsys) -> None:
    rc, text = _validate(capsys, built, "--data", "--root", moved)
    files = sum(2 + len(r["sweep_paths"]) for r in _rows(built))
    assert rc == 0 and f"data: {files} files as recorded" in text, text
    shutil.rmtree(moved)  # without --data nothing outside OUT is read
    assert _validate(capsys, built, "--root", moved)[0] == 2  # --root needs --data
    assert _validate(capsys, built)[0] == 0
    rc, text = _validate(capsys, built, "--data", "--root", moved)
    assert rc == 1 and text.count(": missing") == files


def test_validate_data_lists_each_changed_file_in_sample_order(built: Path, moved: Path, capsys) -> None:
    (_, a), (_, b) = _swept(built)[:2]
    _flip(moved / a["path"])  # same size, other contents
    (moved / a["sweep_paths"][0]).write_bytes((moved / a["sweep_paths"][0]).read_bytes()[:-20])  # truncated
    (moved / b["label_path"]).unlink()  # missing
    big = moved / b["sweep_paths"][-1]
    with open(big, "r+b") as f:  # a sparse 3 GiB replacement: only the recorded size + 1 bytes are read
        f.truncate(3 << 30)
    rc, text = _validate(capsys, built, "--data", "--root", moved, "--workers", "3")
    lines = [line.strip() for line in text.splitlines()[1:]]
    crc = f"{zlib.crc32((moved / a['path']).read_bytes()):08x}"
    assert rc == 1 and len(lines) == 4, text
    assert lines == [
        f"{moved / a['path']}: keyframe of sample {a['sample_id']!r}: crc32 {crc}, the scan recorded "
        f"{a['path_crc32']:08x} (same size, other contents)",
        f"{moved / a['sweep_paths'][0]}: sweep 0 of sample {a['sample_id']!r}: {a['sweep_bytes'][0] - 20} bytes, "
        f"the scan recorded {a['sweep_bytes'][0]}",
        f"{big}: sweep {len(b['sweep_paths']) - 1} of sample {b['sample_id']!r}: {3 << 30} bytes, the scan "
        f"recorded {b['sweep_bytes'][-1]}",
        f"{moved / b['label_path']}: labels of sample {b['sample_id']!r}: missing",
    ]


def test_validate_data_caps_its_lines_and_refuses_bad_workers(
    built: Path, moved: Path, capsys, monkeypatch
) -> None:
    for p in (moved / "lidarseg").rglob("*.bin"):
        p.write_bytes(b"")
    monkeypatch.setattr(validate_cli, "MAX_PROBLEMS", 2)
    rc, text = _validate(capsys, built, "--data", "--root", moved)
    assert (
        rc == 1
        and text.count("labels of sample") == 2
        and f"... and {len(_rows(built)) - 2} more problems" in text
    )
    for bad in ("0", "x", "100000"):
        assert _validate(capsys, built, "--data", "--workers", bad)[0] == 2


def test_validate_data_of_a_scan_directory(dataroot: Path, tmp_path: Path, capsys) -> None:
    data = Path(shutil.copytree(dataroot, tmp_path / "data"))
    out = tmp_path / "scan"
    assert scan_cli.run([str(data), str(out), "--nuscenes-version", VERSION, *BEAM_TEST_FLAGS]) == 0
    assert _validate(capsys, out, "--data")[0] == 0
    first = _rows(out)[0]["path"]
    _flip(Path(first))
    rc, text = _validate(capsys, out, "--data")
    assert rc == 1 and f"{first}: keyframe of sample" in text and "(same size, other contents)" in text


def test_a_forged_samples_part_is_not_data_checked(built: Path, tmp_path: Path, capsys) -> None:
    out = Path(shutil.copytree(built, tmp_path / "out"))
    t = pq.read_table(out / schemas.samples_part(0))
    _rewrite(
        out, schemas.samples_part(0), t.set_column(1, "path", pa.array(["x"] * t.num_rows)), reseal=False
    )
    rc, text = _validate(capsys, out, "--data")
    assert rc == 1 and "--data: files not checked (the problems above come first)" in text


# --------------------------------------------------------------------------------- the loaders


def test_read_recorded_never_reads_more_than_the_recorded_size(tmp_path: Path, monkeypatch) -> None:
    from lidarshard.transforms.io import safeio

    path = tmp_path / "a.bin"
    path.write_bytes(bytes(range(200)))
    crc = zlib.crc32(path.read_bytes())
    assert read_recorded(str(path), Recorded(200, crc)) == bytes(range(200))
    assert read_recorded(str(path), None) == read_recorded(str(path), Recorded(None))
    seen: list[int] = []
    real = safeio.read_local
    monkeypatch.setattr(
        safeio, "read_local", lambda p, limit=None: seen.append(len(d := real(p, limit))) or d
    )
    with open(path, "r+b") as f:
        f.truncate(3 << 30)  # sparse: a 3 GiB replacement
    with pytest.raises(
        FileChangedError,
        match=rf"{path} is not the file the manifest was built from \({3 << 30} bytes, the scan recorded 200\)",
    ):
        read_recorded(str(path), Recorded(200, crc))
    assert seen == []  # its size says so before a byte is read
    path.write_bytes(bytes(range(7)))
    with pytest.raises(FileChangedError, match=r"\(7 bytes, the scan recorded 200\)"):
        read_recorded(str(path), Recorded(200))
    path.write_bytes(bytes(200))
    with pytest.raises(FileChangedError, match=r"same size, other contents"):
        read_recorded(str(path), Recorded(200, crc))
    assert read_recorded(str(path), Recorded(200)) == bytes(200)  # size only: not hashed


def test_load_points_checks_keyframe_and_sweeps(tmp_path: Path) -> None:
    key, sweep = tmp_path / "k.bin", tmp_path / "s.bin"
    np.full((10, 4), 5.0, np.float32).tofile(key)
    np.full((6, 4), 5.0, np.float32).tofile(sweep)
    ok = [Recorded(160), Recorded(96)]
    pts = load_points(str(key), "kitti_bin", [str(sweep)], IDENTITY, recorded=ok)
    assert pts.shape == (16, 4)
    with pytest.raises(
        FileChangedError, match=rf"{sweep} is not the file .* \(96 bytes, the scan recorded 80\)"
    ):
        load_points(str(key), "kitti_bin", [str(sweep)], IDENTITY, recorded=[Recorded(160), Recorded(80)])
    with pytest.raises(ValueError, match="2 recorded files for a keyframe and 0 sweeps"):
        load_points(str(key), "kitti_bin", recorded=ok)
    sweep.unlink()
    with pytest.raises(FileNotFoundError):
        load_points(str(key), "kitti_bin", [str(sweep)], IDENTITY, recorded=ok)


@pytest.fixture(scope="module")
def bins(tmp_path_factory) -> tuple[Path, Path]:
    """(input, OUT): 8 KITTI .bin clouds, ``a.bin`` of 491 points, built with paths relative to the input."""
    tmp = tmp_path_factory.mktemp("bins")
    inp = tmp / "in"
    inp.mkdir()
    rng = np.random.default_rng(0)
    for i, n in enumerate([491, 300, 280, 350, 420, 510, 390, 330]):
        rng.normal(scale=20.0, size=(n, 4)).astype(np.float32).tofile(inp / f"{'abcdefgh'[i]}.bin")
    out = tmp / "out"
    assert build_cli.run([str(inp), str(out), *PLAN, "--relative-to", str(inp), *BEAM_TEST_FLAGS]) == 0
    return inp, out


def test_a_swapped_point_file_is_refused_naming_it(bins: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset

    inp, out = bins
    data = Path(shutil.copytree(inp, tmp_path / "data"))
    dataset = PointCloudDataset(out, root=str(data))
    assert dataset.sample_ids[0] == "a.bin" and dataset[0]["points"].shape == (491, 4)
    np.zeros((7, 4), np.float32).tofile(data / "a.bin")  # 491 -> 7 points after the build
    with pytest.raises(
        FileChangedError, match=rf"{data / 'a.bin'} is not the file .* \(112 bytes, the scan recorded 7856\)"
    ):
        dataset[0]
    assert dataset[1]["points"].shape == (300, 4)  # the others still load
    with open(data / "b.bin", "r+b") as f:  # same size, other contents: only verify="hash" sees it
        f.write(b"\x01\x02\x03\x04")
    assert PointCloudDataset(out, root=str(data))[1]["points"].shape == (300, 4)
    with pytest.raises(
        FileChangedError, match=r"crc32 [0-9a-f]{8}, the scan recorded [0-9a-f]{8} \(same size"
    ):
        PointCloudDataset(out, root=str(data), verify="hash")[1]
    with pytest.raises(ValueError, match=r"verify must be one of \('size', 'hash'\)"):
        PointCloudDataset(out, verify="sha")


def test_a_huge_replacement_is_refused_before_it_is_read(
    bins: tuple[Path, Path], tmp_path: Path, monkeypatch
) -> None:
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset
    from lidarshard.transforms.io import safeio

    inp, out = bins
    data = Path(shutil.copytree(inp, tmp_path / "data"))
    with open(data / "a.bin", "r+b") as f:
        f.truncate(3 << 30)  # sparse 3 GiB
    seen: list[tuple[str, int]] = []
    real = safeio.read_local
    monkeypatch.setattr(
        safeio, "read_local", lambda p, limit=None: seen.append((p, len(d := real(p, limit)))) or d
    )
    with pytest.raises(FileChangedError, match=rf"\({3 << 30} bytes, the scan recorded 7856\)"):
        PointCloudDataset(out, root=str(data))[0]
    assert [n for p, n in seen if p == str(data / "a.bin")] == []  # refused on its size, unread


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("path", "../../secret/secret.bin"),
        ("path", "/etc/passwd"),
        ("sweep_paths", ["samples/../../x.bin"]),
        ("label_path", "../labels.bin"),
    ],
)
def test_a_samples_part_pointing_outside_path_root_is_refused(
    built: Path, tmp_path: Path, column: str, value: object
) -> None:
    """The hostile case of issue 25: a samples part rewritten to point outside the dataset is refused,
    whether ``_manifest.json`` was left as it was (sha256) or rewritten to match (path rules)."""
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset

    for reseal in (False, True):
        out = Path(shutil.copytree(built, tmp_path / f"out{reseal}"))
        t = pq.read_table(out / schemas.samples_part(0))
        i = t.schema.get_field_index(column)
        values = t.column(column).to_pylist()
        values[0] = value + values[0][1:] if column == "sweep_paths" and values[0] else value
        forged = t.set_column(i, t.field(column), pa.array(values, t.field(column).type))
        _rewrite(out, schemas.samples_part(0), forged, reseal=reseal)
        why = (
            f"{column} .* is not relative to path_root .* and inside it"
            if reseal
            else "modified after the build"
        )
        with pytest.raises(ValueError, match=rf"{out}/samples.*{why}"):
            PointCloudDataset(out)


def test_misaligned_sweep_records_and_changed_sweeps_and_labels_are_refused(
    built: Path, moved: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset

    dataset = PointCloudDataset(built, root=str(moved), labels=True, verify="hash")
    rows = _rows(built)
    assert len(dataset) == len(rows) and all(dataset[i]["labels"].shape[0] > 0 for i in range(len(rows)))
    k, a = _swept(built)[0]
    _flip(moved / a["label_path"], at=3)
    with pytest.raises(FileChangedError, match=re.escape(f"{moved / a['label_path']} is not the file")):
        dataset[k]
    assert PointCloudDataset(built, root=str(moved))[k]["points"].shape[0] > 0  # labels not read
    (moved / a["sweep_paths"][0]).unlink()  # a missing sweep
    with pytest.raises(FileNotFoundError, match=re.escape(a["sweep_paths"][0])):
        PointCloudDataset(built, root=str(moved))[k]
    assert PointCloudDataset(built, root=str(moved), sweeps=False)[k]["points"].shape[0] > 0
    out = Path(shutil.copytree(built, tmp_path / "out"))
    t = pq.read_table(out / schemas.samples_part(0))
    sizes = t.column("sweep_bytes").to_pylist()
    sizes[k] = sizes[k][:-1]
    i = t.schema.get_field_index("sweep_bytes")
    _rewrite(out, schemas.samples_part(0), t.set_column(i, t.field(i), pa.array(sizes, t.field(i).type)))
    with pytest.raises(
        ValueError, match=f"sample {a['sample_id']!r}: sweep_bytes does not hold one value per sweep"
    ):
        PointCloudDataset(out)


def test_verify_hash_needs_recorded_hashes(dataroot: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset

    out = tmp_path / "out"
    flags = ["--nuscenes-version", VERSION, "--features", "stat", "--cost-model", "points", *PLAN]
    assert build_cli.run([str(dataroot), str(out), *flags, *BEAM_TEST_FLAGS]) == 0
    assert PointCloudDataset(out)[0]["points"].shape[0] > 0
    with pytest.raises(
        ValueError, match=r'verify="hash": 4 samples have no recorded crc32 \(first: .*--features stat'
    ):
        PointCloudDataset(out, verify="hash")


def test_real_nuscenes_files_recorded_validated_and_a_truncated_copy_refused(
    realdata: Path, tmp_path: Path, capsys
) -> None:
    src = realdata / "nuscenes" / "samples" / "LIDAR_TOP"
    data = tmp_path / "data"
    shutil.copytree(src, data)
    out = tmp_path / "out"
    flags = ["--world-size", "1", "--batch-size", "1", "--relative-to", str(data)]
    assert build_cli.run([str(data), str(out), *flags, *BEAM_TEST_FLAGS]) == 0
    rows = {r["path"]: r for r in _rows(out)}
    for name in os.listdir(src):
        raw = (src / name).read_bytes()
        assert (rows[name]["path_bytes"], rows[name]["path_crc32"]) == (len(raw), zlib.crc32(raw))
    assert rows[next(n for n in rows if n.startswith("n015-2018-07-24"))]["path_bytes"] == 693760
    assert _validate(capsys, out, "--data")[0] == 0
    big = next(n for n in rows if rows[n]["path_bytes"] == 693760)
    (data / big).write_bytes((src / big).read_bytes()[: 20 * 491])  # 34,688 -> 491 points
    rc, text = _validate(capsys, out, "--data")
    assert (
        rc == 1 and f"{data / big}: keyframe of sample {big!r}: 9820 bytes, the scan recorded 693760" in text
    )
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset

    dataset = PointCloudDataset(out)
    with pytest.raises(
        FileChangedError, match=re.escape(f"{data / big} is not the file the manifest was built")
    ):
        dataset[dataset.sample_ids.index(big)]


# ----------------------------------------------------------------- schema 3.0: refused, rebuilt from samples


def _as_schema_3_0(out: Path) -> Path:
    """A 4.0 output rewritten as lidarshard 3.0 wrote it: no integrity columns, hive plan directories."""
    return as_written_by(out, "3.0")


def test_schema_3_0_outputs_are_refused_in_one_line(built: Path, moved: Path, tmp_path: Path, capsys) -> None:
    old = _as_schema_3_0(Path(shutil.copytree(built, tmp_path / "old")))
    assert pq.read_schema(old / schemas.samples_part(0)).names == schemas.scored_schema("3.0").names
    rc, text = _validate(capsys, old, "--data", "--root", moved)
    problems = text.splitlines()[1:]
    assert rc == 1 and problems[1:] == ["  --data: files not checked (the problems above come first)"], text
    assert (
        "written with manifest schema 3.0" in problems[0] and f"--from-samples {old}/samples" in problems[0]
    )
    with pytest.raises(
        ValueError, match=r"written with manifest schema 3\.0; this lidarshard reads 4\.x"
    ) as info:
        load_manifest(old)
    assert "\n" not in str(info.value)


def test_validate_checks_each_file_against_its_own_versions_contract(
    built: Path, tmp_path: Path, capsys
) -> None:
    out = Path(shutil.copytree(built, tmp_path / "out"))
    t = pq.read_table(out / schemas.samples_part(0))
    for version, needle in (
        ("3.0", "written with schema version '3.0', expected '4.5' (or an earlier minor)"),  # 3.x: not read
        ("3.2", "written with schema version '3.2', expected '4.5' (or an earlier minor)"),  # no 3.2 exists
        ("4.6", "written with schema version '4.6', expected '4.5' (or an earlier minor)"),
        ("2.1", "written with schema version '2.1'"),
    ):
        _rewrite(
            out, schemas.samples_part(0), t.replace_schema_metadata({"lidarshard.schema_version": version})
        )
        rc, text = _validate(capsys, out)
        assert rc == 1 and needle in text, text


def test_from_samples_rebuilds_a_schema_3_0_output(built: Path, tmp_path: Path, capsys) -> None:
    old = _as_schema_3_0(Path(shutil.copytree(built, tmp_path / "old")))
    new = tmp_path / "new"
    assert (
        build_cli.run([str(new), "--from-samples", str(old / schemas.SAMPLES_DIR), *PLAN, *BEAM_TEST_FLAGS])
        == 0
    )
    assert _validate(capsys, new)[0] == 0
    assert all(r["path_bytes"] is None for r in _rows(new))  # not recorded: the loaders read unchecked


def test_schema_versions_and_the_content_hash() -> None:
    assert schemas.sample_schema("3.0").metadata == {b"lidarshard.schema_version": b"3.0"}
    assert not set(schemas.INTEGRITY_FIELDS) & set(schemas.scored_schema("3.0").names)
    integrity = [n for n in schemas.sample_schema().names if schemas.ADDED_IN.get(n) == "3.1"]
    assert integrity == list(schemas.INTEGRITY_FIELDS)
    assert schemas.sample_schema("3.1").names[-len(schemas.INTEGRITY_FIELDS) :] == list(
        schemas.INTEGRITY_FIELDS
    )
    readable = [schemas.is_readable(v) for v in ("3.0", "3.1", "3.2", "2.1", "", "4.0", "4.6", "5.0")]
    assert readable == [0, 0, 0, 0, 0, 1, 0, 0]
    assert schemas.is_before("3.9", "3.10") and not schemas.is_before("3.1", "3.1")
    data = os.urandom(5000)
    assert schemas.content_hash(data[1234:], schemas.content_hash(data[:1234])) == zlib.crc32(data)
