"""Issue #15's hostile inputs, generated here, each ending in a reject with its reason or a one-line error.

Every case is one test id (``HOSTILE_CASES`` counts them). Classes: glob characters in real names, special
files (FIFO, device, symlink to /dev/zero), malformed table rows and numbers, deep JSON, forged
``--from-samples`` input, forged manifests; what a run publishes always passes ``validate``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines import scan as scan_cli
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.tools.validate import validate
from tests.adversarial import TABLES_VERSION, good_cloud, write_tables_corpus
from tests.helpers import BEAM_TEST_FLAGS

pytestmark = pytest.mark.hostile("files and cli")

LOOSE = ["--max-reject-fraction", "1", *BEAM_TEST_FLAGS]
TABLE_FLAGS = ["--nuscenes-version", TABLES_VERSION, *LOOSE]


def _cloud(path: Path, n: int, dims: int = 4, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(good_cloud(np.random.default_rng(seed), n, dims))


def _scan(
    inp: Path | str, out: Path, *flags: str
) -> tuple[dict, dict[str, dict], dict[str, tuple[str, str]]]:
    """Runs ``lidarshard scan``; (counts, {sample_id: row}, {reject path: (reason, detail)}), validated."""
    assert cli_main(["scan", str(inp), str(out), *flags, *LOOSE]) == 0
    assert validate(str(out)) == ([], validate(str(out))[1])
    meta = json.loads((out / schemas.SCAN_FILE).read_text())
    samples = {r["sample_id"]: r for r in pq.read_table(out / schemas.SAMPLES_DIR).to_pylist()}
    rejects = {
        r["path"]: (r["reason"], r["detail"]) for r in pq.read_table(out / schemas.REJECTS_FILE).to_pylist()
    }
    return meta["counts"], samples, rejects


# ------------------------------------------------------------------------------------- file names


def test_backslash_names_are_distinct_ids(tmp_path: Path) -> None:
    inp = tmp_path / "in"
    _cloud(inp / "back\\slash.bin", 100)
    _cloud(inp / "back" / "slash.bin", 300, seed=1)
    _, samples, rejects = _scan(inp, tmp_path / "out")
    assert rejects == {}
    assert {k: v["num_points"] for k, v in samples.items()} == {"back\\slash.bin": 100, "back/slash.bin": 300}


# ---------------------------------------------------------------------------------------- tables


def _tables(root: Path) -> tuple[Path, dict]:
    write_tables_corpus(root, good=2)
    table = root / TABLES_VERSION / "sample_data.json"
    return table, json.loads(table.read_text())


def _rewrite(path: Path, edit) -> None:
    rows = json.loads(path.read_text())
    edit(rows)
    path.write_text(json.dumps(rows))


@pytest.mark.hostile("tables")
def test_a_channel_that_is_not_a_string_is_a_bad_table_reject(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_tables_corpus(root, good=2)
    _rewrite(root / TABLES_VERSION / "sensor.json", lambda rows: rows[0].update(channel=["LIDAR_TOP"]))
    counts, samples, rejects = _scan(root, tmp_path / "out", *TABLE_FLAGS)
    assert samples == {} and counts["scanned"] == counts["rejected"] > 0
    assert {reason for reason, _ in rejects.values()} == {"bad_table"}
    assert any("channel ['LIDAR_TOP'] is not a string" in d for _, d in rejects.values())


@pytest.mark.hostile("tables")
def test_a_table_with_no_lidar_keyframe_is_an_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_tables_corpus(root, good=2)
    _rewrite(root / TABLES_VERSION / "sensor.json", lambda rows: rows[0].update(channel="CAM_FRONT"))
    with pytest.raises(RuntimeError, match="nothing was scanned"):
        scan_cli.run([str(root), str(tmp_path / "out"), *TABLE_FLAGS])
    assert not (tmp_path / "out").exists()


def test_a_pattern_that_matches_nothing_is_an_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "in").mkdir()
    _cloud(tmp_path / "in" / "a.bin", 10)
    assert cli_main(["scan", f"{tmp_path}/in/*.pcd", str(tmp_path / "out"), *LOOSE]) == 2  # before Beam
    assert re.search(r"INPUT .*/in/\*\.pcd: the pattern matches no file", capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


HUGE = "1" + "0" * 400  # 10**400 as a JSON literal


@pytest.mark.hostile("tables")
@pytest.mark.parametrize(
    "table, field, literal",
    [
        ("sample_data", "timestamp", HUGE),
        ("sample_data", "timestamp", "-" + HUGE),
        ("sample_data", "timestamp", "1e400"),
        ("ego_pose", "rotation", f"[{HUGE}, 0, 0, 0]"),
        ("ego_pose", "translation", f"[0, {HUGE}, 0]"),
        ("calibrated_sensor", "rotation", f"[1, 0, 0, {HUGE}]"),
    ],
)
def test_huge_numbers_in_tables_are_bad_table_rejects(
    tmp_path: Path, table: str, field: str, literal: str
) -> None:
    root = tmp_path / "root"
    write_tables_corpus(root, good=2)
    path = root / TABLES_VERSION / f"{table}.json"
    rows = json.loads(path.read_text())
    target = next(i for i, r in enumerate(rows) if table != "sample_data" or r["is_key_frame"])
    rows[target][field] = "@@HUGE@@"
    path.write_text(json.dumps(rows).replace('"@@HUGE@@"', literal))
    counts, samples, rejects = _scan(root, tmp_path / "out", *TABLE_FLAGS, "--sweeps", "1")
    assert counts["scanned"] == len(samples) + counts["rejected"]
    assert any(reason == "bad_table" and "finite number" in detail for reason, detail in rejects.values())


@pytest.mark.hostile("tables")
@pytest.mark.parametrize("table", ["sample_data", "sensor", "ego_pose"])
def test_deeply_nested_table_json_is_a_one_line_error(tmp_path: Path, table: str) -> None:
    root = tmp_path / "root"
    write_tables_corpus(root, good=2)
    (root / TABLES_VERSION / f"{table}.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(Exception, match=f"{table}.json is not usable JSON: nested too deeply") as info:
        scan_cli.run([str(root), str(tmp_path / "out"), *TABLE_FLAGS])
    assert not isinstance(info.value, RecursionError)
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------------- --from-samples


@pytest.fixture(scope="module")
def scanned(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("scanned")
    for i in range(12):
        _cloud(base / "in" / f"c{i:02d}.bin", 100 + 37 * i, seed=i)
    assert cli_main(["scan", str(base / "in"), str(base / "out"), *LOOSE]) == 0
    return base / "out"


PLAN = ["--world-size", "2", "--batch-size", "2", "--max-reject-fraction", "1", *BEAM_TEST_FLAGS]


def _forge_samples(scanned: Path, tmp_path: Path, edit) -> Path:
    table = edit(pq.read_table(scanned / schemas.SAMPLES_DIR))
    (tmp_path / "prev").mkdir()
    pq.write_table(table, tmp_path / "prev" / schemas.SAMPLES_DIR)
    return tmp_path / "prev" / schemas.SAMPLES_DIR


@pytest.mark.parametrize(
    "name, edit, dups",
    [
        ("duplicated_row", lambda t: pa.concat_tables([t, t.slice(3, 1)]), 1),
        ("every_row_twice", lambda t: pa.concat_tables([t, t]), 12),
        ("shuffled", lambda t: t.take(np.random.default_rng(0).permutation(t.num_rows)), 0),
        ("reversed", lambda t: t.take(np.arange(t.num_rows)[::-1]), 0),
    ],
)
def test_from_samples_sorts_and_dedupes(scanned: Path, tmp_path: Path, name: str, edit, dups: int) -> None:
    prev = _forge_samples(scanned, tmp_path, edit)
    out = tmp_path / "out"
    assert cli_main(["build", str(out), "--from-samples", str(prev), *PLAN]) == 0
    assert validate(str(out))[0] == []
    rejects = pq.read_table(out / schemas.REJECTS_FILE).to_pylist()
    assert [r["reason"] for r in rejects] == ["duplicate_id"] * dups
    assert pq.read_table(out / schemas.SAMPLES_DIR).num_rows == 12


def _ids_as(t: pa.Table, values: list) -> pa.Table:
    return t.set_column(t.schema.get_field_index("sample_id"), "sample_id", pa.array(values))


@pytest.mark.parametrize(
    "name, edit, message",
    [
        ("integer_ids", lambda t: _ids_as(t, list(range(t.num_rows))), "sample_id is int64, not strings"),
        ("null_id", lambda t: _ids_as(t, [None, *t.column("sample_id").to_pylist()[1:]]), "1 rows have a null"),
        ("no_path_column", lambda t: t.drop_columns(["path"]), r"lacks columns \['path'\]"),
        ("cost_as_text", lambda t: t.set_column(t.schema.get_field_index("num_points"), "num_points",
                                                pa.array(["x"] * t.num_rows)), "do not match the samples contract"),
    ],
)  # fmt: skip
def test_from_samples_refuses_bad_input_before_beam(
    scanned: Path, tmp_path: Path, capsys, name: str, edit, message: str
) -> None:
    prev = _forge_samples(scanned, tmp_path, edit)
    assert cli_main(["build", str(tmp_path / "out"), "--from-samples", str(prev), *PLAN]) == 2
    assert len(re.findall(message, capsys.readouterr().err)) == 1
    assert not (tmp_path / "out").exists()


def test_from_samples_of_garbage_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "samples").write_bytes(b"not parquet at all")
    assert cli_main(["build", str(tmp_path / "out"), "--from-samples", str(tmp_path / "samples"), *PLAN]) == 2
    assert "is not a readable Parquet file" in capsys.readouterr().err


# ------------------------------------------------------------------------ glob characters in names


GLOB_NAMES = ["a*.bin", "a?.bin", "a[A].bin", "br[1].bin", "x[!y].bin", "a[*].bin"]


@pytest.fixture(scope="module")
def glob_scans(tmp_path_factory) -> Callable[[str], tuple[dict[str, dict], dict]]:
    """features -> (samples, rejects) of one scan (made once a module) of ``in/<i>/<GLOB_NAMES[i]>``,
    each name in its own folder beside the decoys a glob would find instead."""
    made: dict[str, tuple[dict[str, dict], dict]] = {}

    def scan(features: str) -> tuple[dict[str, dict], dict]:
        if features not in made:
            inp = tmp_path_factory.mktemp(f"glob-{features}") / "in"
            for i, name in enumerate(GLOB_NAMES):
                _cloud(inp / str(i) / name, 100)
                _cloud(inp / str(i) / "aA.bin", 5000, seed=1)  # what a glob would find instead
                _cloud(inp / str(i) / "b1.bin", 5000, seed=2)
            _, samples, rejects = _scan(inp, inp.parent / "out", "--features", features)
            made[features] = samples, rejects
        return made[features]

    return scan


@pytest.mark.parametrize("features", ["full", "stat"])
@pytest.mark.parametrize("name", GLOB_NAMES)
def test_glob_characters_in_file_names_are_literal(glob_scans, name: str, features: str) -> None:
    found, rejects = glob_scans(features)
    samples = {
        sid.split("/", 1)[1]: row
        for sid, row in found.items()
        if sid.startswith(f"{GLOB_NAMES.index(name)}/")
    }
    assert rejects == {}
    assert samples[name]["num_points"] == 100 and samples[name]["file_bytes"] == 1600


@pytest.mark.parametrize("dirname", ["in[1]", "in*", "in?"])
def test_an_input_directory_with_glob_characters_is_a_directory(tmp_path: Path, dirname: str) -> None:
    _cloud(tmp_path / dirname / "a.bin", 100)
    _cloud(tmp_path / "in1" / "decoy.bin", 200)
    _, samples, rejects = _scan(tmp_path / dirname, tmp_path / "out")
    assert list(samples) == ["a.bin"] and rejects == {}


def test_a_user_pattern_is_still_a_pattern_and_its_matches_are_literal(tmp_path: Path) -> None:
    _cloud(tmp_path / "in" / "a*.bin", 100)
    _cloud(tmp_path / "in" / "aA.bin", 5000, seed=1)
    _cloud(tmp_path / "in" / "z.npy", 10)
    _, samples, _ = _scan(f"{tmp_path}/in/a*.bin", tmp_path / "out", "--features", "stat")
    assert {k: v["num_points"] for k, v in samples.items()} == {"a*.bin": 100, "aA.bin": 5000}


@pytest.mark.parametrize("features", ["full", "stat"])
def test_a_table_filename_with_a_glob_is_looked_up_literally(tmp_path: Path, features: str) -> None:
    root = tmp_path / "root"
    write_tables_corpus(root, good=2)
    sd = root / TABLES_VERSION / "sample_data.json"
    _rewrite(
        sd,
        lambda rows: next(r for r in rows if r["token"] == "good00").update(
            filename="samples/LIDAR_TOP/*.pcd.bin"
        ),
    )
    _, samples, rejects = _scan(root, tmp_path / "out", *TABLE_FLAGS, "--features", features)
    assert "s_good00" not in samples and "s_good01" in samples
    assert rejects[f"{root}/samples/LIDAR_TOP/*.pcd.bin"][0] == "missing_file"


# -------------------------------------------------------------------------------- special files


def _special(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "dev_null":
        os.symlink("/dev/null", path)
    elif kind == "dev_urandom":
        os.symlink("/dev/urandom", path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "link_to_fifo":
        os.mkfifo(path.with_name("real_fifo"))
        os.symlink("real_fifo", path)


SPECIAL = ["fifo", "dev_zero", "dev_null", "dev_urandom", "dir", "link_to_fifo"]


@pytest.fixture(scope="module")
def special_scans(tmp_path_factory) -> Callable[[str], tuple[Path, dict[str, dict], dict]]:
    """features -> (input folder, samples, rejects) of one scan (made once a module) of ``in/*.bin``:
    ``ok.bin`` and one ``<kind>.bin`` of every special kind."""
    made: dict[str, tuple[Path, dict[str, dict], dict]] = {}

    def scan(features: str) -> tuple[Path, dict[str, dict], dict]:
        if features not in made:
            tmp = tmp_path_factory.mktemp(f"special-{features}")
            _cloud(tmp / "in" / "ok.bin", 100)
            for kind in SPECIAL:
                _special(tmp / "in" / f"{kind}.bin", kind)
            _, samples, rejects = _scan(f"{tmp}/in/*.bin", tmp / "out", "--features", features)
            made[features] = tmp / "in", samples, rejects
        return made[features]

    return scan


@pytest.mark.timeout(120)
@pytest.mark.parametrize("features", ["full", "stat"])
@pytest.mark.parametrize("kind", SPECIAL)
def test_special_files_through_a_glob_are_rejected_unread(special_scans, kind: str, features: str) -> None:
    inp, samples, rejects = special_scans(features)
    assert list(samples) == ["ok.bin"]
    if kind != "dir":  # Beam's match lists no directories
        reason, detail = rejects[f"{inp}/{kind}.bin"]
        assert reason == "unreadable" and "not a regular file" in detail


@pytest.fixture(scope="module")
def special_tables(tmp_path_factory) -> tuple[Path, dict[str, dict], dict]:
    """(root, samples, rejects) of one scan (made once a module) of a tables corpus whose keyframe
    ``good<i>`` is made the special kind ``SPECIAL[i]``; the last keyframe stays a sound file."""
    root = tmp_path_factory.mktemp("special-tables") / "root"
    write_tables_corpus(root, good=len(SPECIAL) + 1)
    for i, kind in enumerate(SPECIAL):
        key = root / f"samples/LIDAR_TOP/good{i:02d}.pcd.bin"
        key.unlink()
        _special(key, kind)
    _, samples, rejects = _scan(root, root.parent / "out", *TABLE_FLAGS)
    return root, samples, rejects


@pytest.mark.hostile("tables")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", SPECIAL)
def test_special_files_named_by_tables_are_rejected_unread(special_tables, kind: str) -> None:
    root, samples, rejects = special_tables
    i = SPECIAL.index(kind)
    key = root / f"samples/LIDAR_TOP/good{i:02d}.pcd.bin"
    assert f"s_good{i:02d}" not in samples and f"s_good{len(SPECIAL):02d}" in samples
    reason, detail = rejects[str(key)]
    assert reason == "unreadable" and "not a regular file" in detail


@pytest.mark.hostile("tables")
@pytest.mark.timeout(120)
def test_a_fifo_table_is_a_one_line_error_not_a_hang(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_tables_corpus(root, good=2)
    (root / TABLES_VERSION / "sensor.json").unlink()
    os.mkfifo(root / TABLES_VERSION / "sensor.json")
    with pytest.raises(Exception, match="sensor.json could not be read: .* a FIFO, not a regular file"):
        scan_cli.run([str(root), str(tmp_path / "out"), *TABLE_FLAGS])


# ------------------------------------------------------------------------------- bounded memory

_MEASURE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
def rss_kb(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])
{setup}
before = rss_kb("VmRSS:")
try:
    {call}
    outcome = "ok"
except Exception as e:
    outcome = f"{{type(e).__name__}}: {{e}}"
print(json.dumps({{"grew_mb": (rss_kb("VmHWM:") - before) / 1024, "outcome": outcome}}))
"""


def _measure(setup: str, call: str, cap_gb: float = 2.0) -> tuple[float, str]:
    """(MB the peak RSS grew during ``call``, outcome) in a subprocess whose address space is capped."""
    import subprocess
    import sys

    code = _MEASURE.format(cap=int(cap_gb * 2**30), setup=setup, call=call)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["grew_mb"], result["outcome"]


def _ascii_pcd(path: Path, points: int, count: int) -> None:
    header = (
        f"VERSION 0.7\nFIELDS x y z w\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 {count}\n"
        f"WIDTH {points}\nHEIGHT 1\nPOINTS {points}\nDATA ascii\n"
    )
    row = ("1.5 -2.25 3 " + "0 " * count).rstrip() + "\n"
    with open(path, "w") as f:
        f.write(header)
        for _ in range(points // 1000):
            f.write(row * 1000)


def _ascii_ply(path: Path, points: int, extra: int) -> None:
    props = "".join(f"property float p{i}\n" for i in range(extra))
    header = f"ply\nformat ascii 1.0\nelement vertex {points}\nproperty float x\nproperty float y\nproperty float z\n{props}end_header\n"
    row = ("1.5 -2.25 3 " + "7 " * extra).rstrip() + "\n"
    with open(path, "w") as f:
        f.write(header)
        for _ in range(points // 1000):
            f.write(row * 1000)


MEMORY_PEAKS: dict[str, float] = {}  # case -> MB; printed by the last memory test (-s)


@pytest.mark.parametrize(
    "case, writer, fmt",
    [("pcd_count_97", lambda p: _ascii_pcd(p, 100_000, 97), "pcd"), ("ply_100_props", lambda p: _ascii_ply(p, 100_000, 97), "ply")],
)  # fmt: skip
def test_ascii_memory_is_bounded_by_the_output(tmp_path: Path, case: str, writer, fmt: str) -> None:
    path = tmp_path / f"cloud.{fmt}"
    writer(path)
    size_mb = path.stat().st_size / 2**20  # ~19 MB: 10 M values
    setup = (
        "from lidarshard.transforms.formats.readers import read_points\n"
        f"data = open({str(path)!r}, 'rb').read()"
    )
    cols = 3 if fmt == "pcd" else 100  # PCD keeps COUNT-1 fields; PLY every scalar property
    grew, outcome = _measure(
        setup, f"pts = read_points(data, {fmt!r}); assert pts.shape == (100_000, {cols})"
    )
    MEMORY_PEAKS[case] = grew
    assert outcome == "ok"
    out_mb = 100_000 * cols * 4 / 2**20  # the float32 output
    assert grew < 2 * out_mb + 20, (
        grew,
        out_mb,
        size_mb,
    )  # output (+ a copy for PCD), scratch of one 1 MB chunk


def test_wide_records_count_against_max_points(tmp_path: Path) -> None:
    from lidarshard.transforms.errors import RejectError
    from lidarshard.transforms.formats.readers import read_points

    _ascii_pcd(tmp_path / "c.pcd", 1000, 97)
    with pytest.raises(
        RejectError, match=r"too_large: PCD: POINTS 1000 x 100 values \(COUNT\) > 16 x max_points 5000"
    ):
        read_points((tmp_path / "c.pcd").read_bytes(), "pcd", max_points=5000)
    _ascii_ply(tmp_path / "c.ply", 1000, 97)
    with pytest.raises(RejectError, match="too_large: PLY: 1000 vertices x 100 properties"):
        read_points((tmp_path / "c.ply").read_bytes(), "ply", max_points=5000)
    assert read_points((tmp_path / "c.pcd").read_bytes(), "pcd", max_points=7000).shape == (1000, 3)


# ------------------------------------------------------------------------------ forged manifests


@pytest.fixture(scope="module")
def built(scanned: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("built") / "out"
    flags = ["--epochs", "2", "--strategy", "balanced"]
    assert (
        cli_main(["build", str(out), "--from-samples", str(scanned / schemas.SAMPLES_DIR), *PLAN, *flags])
        == 0
    )
    return out


def _copy(built: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(built, tmp_path / "out"))


def _manifest(out: Path, edit) -> None:
    m = json.loads((out / schemas.MANIFEST_FILE).read_text())
    edit(m)
    (out / schemas.MANIFEST_FILE).write_text(json.dumps(m))


def _rehash(out: Path, *rels: str) -> None:
    """Update the sizes and sha256 of ``rels`` in _manifest.json, as a careful forger would."""
    import hashlib

    def edit(m: dict) -> None:
        for rel in rels:
            data = (out / rel).read_bytes()
            m["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    _manifest(out, edit)


@pytest.mark.hostile("integrity")
def test_swapped_ranks_fail_validate_even_with_matching_hashes(built: Path, tmp_path: Path) -> None:
    out = _copy(built, tmp_path)
    a, b = (out / schemas.plan_file(0, r) for r in (0, 1))
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    _rehash(out, schemas.plan_file(0, 0), schemas.plan_file(0, 1))
    problems, _ = validate(str(out))
    assert any("column rank is not 0 on every row" in p for p in problems), problems  # 4.0: the key


@pytest.mark.hostile("integrity")
@pytest.mark.parametrize(
    "key, value",
    [("strategy", "random"), ("seed", 7), ("pair_repeat_rate", {"balanced": 0.0, "random": 0.0})],
)
def test_forged_plan_settings_fail_validate(built: Path, tmp_path: Path, key: str, value) -> None:
    out = _copy(built, tmp_path)
    _manifest(out, lambda m: m.update({key: value}))
    problems, _ = validate(str(out))
    assert problems and any(key in p for p in problems), problems


@pytest.mark.hostile("integrity")
@pytest.mark.parametrize("world_size", [10**6, 10**7, 10**12])
def test_a_forged_world_size_costs_one_line_and_bounded_memory(
    built: Path, tmp_path: Path, world_size: int
) -> None:
    out = _copy(built, tmp_path)
    _manifest(out, lambda m: m.update(world_size=world_size))
    setup = "from lidarshard.tools.validate import validate"
    grew, outcome = _measure(
        setup, f"problems, _ = validate({str(out)!r}); assert len(problems) <= 5, problems"
    )
    MEMORY_PEAKS[f"validate_world_size_{world_size}"] = grew
    assert outcome == "ok" and grew < 64
    problems, _ = validate(str(out))
    assert any(f"world_size {world_size} x epochs 2 need" in p for p in problems)


@pytest.mark.hostile("integrity")
def test_validate_caps_the_problems_it_keeps(built: Path, tmp_path: Path) -> None:
    out = _copy(built, tmp_path)
    _manifest(
        out,
        lambda m: m["files"].update({f"junk/{i}.parquet": {"bytes": 1, "sha256": ""} for i in range(5000)}),
    )
    problems, _ = validate(str(out))
    assert len(problems) <= 202 and problems[-1].startswith("... and ") and "more problems" in problems[-1]


@pytest.mark.hostile("integrity")
@pytest.mark.parametrize("where", ["manifest", "scan"])
def test_deeply_nested_metadata_is_one_validate_line(
    built: Path, scanned: Path, tmp_path: Path, where: str
) -> None:
    import shutil

    src, name = (built, schemas.MANIFEST_FILE) if where == "manifest" else (scanned, schemas.SCAN_FILE)
    out = Path(shutil.copytree(src, tmp_path / "out"))
    (out / name).write_text('{"schema_version": ' + "[" * 100_000 + "]" * 100_000 + "}")
    problems, _ = validate(str(out))
    assert problems == [f"{name} is not usable JSON: nested too deeply"]


@pytest.mark.hostile("integrity")
@pytest.mark.parametrize("value", ["[" * 100_000 + "]" * 100_000, f'{{"world_size": {HUGE}}}', "[]", "nul"])
def test_manifest_reader_refuses_hostile_json_in_one_line(built: Path, tmp_path: Path, value: str) -> None:
    from lidarshard.loaders.reader import ManifestReader

    out = _copy(built, tmp_path)
    (out / schemas.MANIFEST_FILE).write_text(value)
    with pytest.raises(ValueError) as info:
        ManifestReader(out, 0, 2, 0)
    assert "\n" not in str(info.value) and str(out) in str(info.value)


@pytest.mark.hostile("integrity")
def test_manifest_reader_checks_each_plan_file_against_the_manifest(built: Path, tmp_path: Path) -> None:
    from lidarshard.loaders.reader import ManifestReader

    out = _copy(built, tmp_path)
    rel = schemas.plan_file(0, 1)
    table = pq.read_table(out / rel)
    forged = table.set_column(
        table.schema.get_field_index("path"), "path", pa.array(["/etc/shadow"] * table.num_rows)
    )
    pq.write_table(forged, out / rel)
    assert next(iter(ManifestReader(out, 0, 2, 0))).paths  # rank 0's file is intact
    with pytest.raises(
        ValueError,
        match=r"not a readable plan file \(size or sha256 differs from _manifest.json.*verify=False",
    ):
        ManifestReader(out, 1, 2, 0)
    assert (
        next(iter(ManifestReader(out, 1, 2, 0, verify=False))).paths[0] == "/etc/shadow"
    )  # the user's choice
    assert any(rel in p and "bytes, recorded" in p or "sha256 differs" in p for p in validate(str(out))[0])


@pytest.mark.hostile("integrity")
@pytest.mark.parametrize("forged", ["../../../etc/shadow", "/etc/shadow", "samples/../../x.bin"])
def test_manifest_reader_refuses_paths_outside_the_recorded_root(
    scanned: Path, tmp_path: Path, forged: str
) -> None:
    from lidarshard.loaders.reader import ManifestReader

    out = tmp_path / "out"
    root = ["--relative-to", str(scanned.parent / "in")]
    assert (
        cli_main(["build", str(out), "--from-samples", str(scanned / schemas.SAMPLES_DIR), *PLAN, *root]) == 0
    )
    assert json.loads((out / schemas.MANIFEST_FILE).read_text())["path_root"]
    rel = schemas.plan_file(0, 1)
    table = pq.read_table(out / rel)
    paths = [forged, *table.column("path").to_pylist()[1:]]
    pq.write_table(table.set_column(table.schema.get_field_index("path"), "path", pa.array(paths)), out / rel)
    _rehash(out, rel)  # a careful forger updates the manifest too
    with pytest.raises(ValueError, match="is not relative to path_root .* refusing to read it"):
        ManifestReader(out, 1, 2, 0)
    assert validate(str(out))[0]
