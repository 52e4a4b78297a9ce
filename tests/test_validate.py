"""``lidarshard validate``: a built manifest passes, and every kind of tampering is caught precisely."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines import build as build_cli
from lidarshard.pipelines import scan as scan_cli
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.tools import validate as validate_cli
from lidarshard.transforms.io.arrow import parquet_bytes, sha256_hex
from tests.helpers import BEAM_TEST_FLAGS, make_bins, write_samples
from tests.object_store import MemoryObjectStore

FLAGS = ["--world-size", "4", "--batch-size", "2", "--epochs", "2", "--max-reject-fraction", "0.1"]
PLAN = schemas.plan_file(1, 2)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("validate")
    out = tmp / "out"
    assert build_cli.run([str(make_bins(tmp / "in", n=30)), str(out), *FLAGS, *BEAM_TEST_FLAGS]) == 0
    return out


@pytest.fixture
def copy(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "out"))


def _manifest(out: Path) -> dict:
    return json.loads((out / schemas.MANIFEST_FILE).read_text())


def _save_manifest(out: Path, m: dict) -> None:
    (out / schemas.MANIFEST_FILE).write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def _rewrite(out: Path, rel: str, change: Callable[[pa.Table], pa.Table], record: bool) -> None:
    """Rewrite a Parquet file; with ``record`` also fix its size and sha256 in the manifest, as a
    careful forger would, so that only the content checks can catch it."""
    table = change(pq.read_table(out / rel))
    data = parquet_bytes(table.replace_schema_metadata(pq.read_schema(out / rel).metadata))
    (out / rel).write_bytes(data)
    if record:
        m = _manifest(out)
        m["files"][rel] = {"bytes": len(data), "sha256": sha256_hex(data)}
        _save_manifest(out, m)


def _set(table: pa.Table, name: str, values: list) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


def _copy_row(table: pa.Table, src: int, dst: int) -> pa.Table:
    """Row ``dst`` takes the sample of row ``src`` (every copied column), keeping its step/slot."""
    for name in ("sample_id", "path", "sweep_paths", "cost", "bucket_id"):
        col = table.column(name).to_pylist()
        col[dst] = col[src]
        table = _set(table, name, col)
    return table


def test_a_fresh_build_is_valid(built: Path, capsys) -> None:
    assert cli_main(["validate", str(built)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"OK {built}: 31 scanned, 30 accepted, 1 rejected; world size 4")


def test_a_scan_directory_is_valid_and_checked(tmp_path: Path) -> None:
    inp = make_bins(tmp_path / "in", n=5)
    out = tmp_path / "scan"
    assert scan_cli.run([str(inp), str(out), "--max-reject-fraction", "1", *BEAM_TEST_FLAGS]) == 0
    assert validate_cli.validate(str(out)) == ([], "scan: 6 scanned, 5 accepted, 1 rejected")
    meta = json.loads((out / schemas.SCAN_FILE).read_text())
    meta["counts"]["accepted"] = 6
    (out / schemas.SCAN_FILE).write_text(json.dumps(meta))
    problems, _ = validate_cli.validate(str(out))
    assert "samples: 5 rows, counts.accepted is 6" in problems


def _delete_rank(out: Path) -> None:
    (out / PLAN).unlink()


def _truncate(out: Path) -> None:
    data = (out / PLAN).read_bytes()
    (out / PLAN).write_bytes(data[: len(data) // 2])


def _edit_row(out: Path) -> None:
    _rewrite(out, PLAN, lambda t: _copy_row(t, 0, 1), record=False)


def _flip_byte(out: Path) -> None:
    data = bytearray((out / PLAN).read_bytes())
    data[len(data) // 3] ^= 0x01
    (out / PLAN).write_bytes(bytes(data))


def _duplicate_sample(out: Path) -> None:
    _rewrite(out, PLAN, lambda t: _copy_row(t, 0, 1), record=True)


def _unknown_sample(out: Path) -> None:
    _rewrite(
        out,
        PLAN,
        lambda t: _set(t, "sample_id", ["forged.bin", *t.column("sample_id").to_pylist()[1:]]),
        True,
    )


def _swap_steps(out: Path) -> None:
    _rewrite(out, PLAN, lambda t: t.take(pa.array([2, 3, 0, 1] + list(range(4, t.num_rows)))), record=True)


def _short_step(out: Path) -> None:
    _rewrite(out, PLAN, lambda t: t.slice(1), record=True)


def _uneven_steps(out: Path) -> None:
    _rewrite(out, PLAN, lambda t: _set(t, "step", [0, 1, *t.column("step").to_pylist()[2:]]), record=True)


def _rank_column(out: Path) -> None:
    _rewrite(
        out, PLAN, lambda t: t.append_column("rank", pa.array([2] * t.num_rows, pa.int32())), record=True
    )


def _other_place(out: Path) -> None:
    """Rank 0's file of epoch 1 copied to rank 2's place (listed with its new size and sha256)."""
    _rewrite(out, PLAN, lambda t: pq.read_table(out / schemas.plan_file(1, 0)), record=True)


def _other_schema(out: Path) -> None:
    _rewrite(out, PLAN, lambda t: t.drop_columns(["bucket_id"]), record=True)


def _wrong_cost(out: Path) -> None:
    _rewrite(out, PLAN, lambda t: _set(t, "cost", pc.multiply(t.column("cost"), 2).to_pylist()), record=True)


def _counts(name: str, value: int) -> Callable[[Path], None]:
    def edit(out: Path) -> None:
        _rewrite(out, PLAN, lambda t: _set(t, name, [value, *t.column(name).to_pylist()[1:]]), record=True)

    return edit


def _samples_cost(out: Path) -> None:
    rel = schemas.samples_part(0)
    _rewrite(
        out, rel, lambda t: _set(t, "cost", [c + 1.0 for c in t.column("cost").to_pylist()]), record=True
    )


def _samples_null_bucket(out: Path) -> None:
    rel = schemas.samples_part(0)
    _rewrite(
        out, rel, lambda t: _set(t, "bucket_id", [None, *t.column("bucket_id").to_pylist()[1:]]), record=True
    )


def _extra_file(out: Path) -> None:
    (out / schemas.plan_file(0, 9)).parent.mkdir()
    (out / schemas.plan_file(0, 9)).write_bytes((out / PLAN).read_bytes())


def _no_success(out: Path) -> None:
    (out / schemas.SUCCESS_FILE).unlink()


def _manifest_edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(out: Path) -> None:
        m = _manifest(out)
        change(m)
        _save_manifest(out, m)

    return edit


TAMPERING: dict[str, tuple[Callable[[Path], None], str]] = {
    "deleted rank file": (_delete_rank, f"{PLAN}: missing (recorded"),
    "truncated parquet": (_truncate, f"{PLAN}: "),
    "edited row": (_edit_row, " at commit (truncated or rewritten)"),
    "flipped byte": (_flip_byte, f"{PLAN}: sha256 differs from the one recorded at commit"),
    "duplicated sample, sha fixed": (_duplicate_sample, "planned 2 times under drop_last"),
    "unknown sample id, sha fixed": (_unknown_sample, "sample_id forged.bin is not in the samples"),
    "rows out of order, sha fixed": (_swap_steps, "rows must be sorted by (step, slot)"),
    "short step, sha fixed": (_short_step, "5 rows, but steps_per_epoch[1] = 3 steps x batch_size 2 = 6"),
    "uneven steps, sha fixed": (_uneven_steps, "epoch 1 rank 2 step 0: 1 rows, expected batch_size 2"),
    "rank column twice, sha fixed": (
        _rank_column,
        "schema differs from the contract: column 'rank' appears more than once",
    ),
    "another rank's file in its place, sha fixed": (
        _other_place,
        f"{PLAN}: column rank is not 2 on every row (a plan file of another place)",
    ),
    "schema change, sha fixed": (_other_schema, "schema differs from the contract: missing ['bucket_id']"),
    "plan cost, sha fixed": (_wrong_cost, "cost of "),
    "samples cost, sha fixed": (_samples_cost, "costs differ from cost_model"),
    "samples null bucket_id, sha fixed": (_samples_null_bucket, "samples: 1 rows have a null bucket_id"),
    "rank count, sha fixed": (
        _counts("rank_count", 5),
        f"{PLAN}: epoch 1 rank 2 step 0: rank_count 5, the plan holds 2",
    ),
    "global count, sha fixed": (_counts("global_count", 7), "step 0: global_count 7, the plan holds 8"),
    "unlisted rank file": (_extra_file, f"{schemas.plan_file(0, 9)}: file is not listed"),
    "no _SUCCESS": (_no_success, "no _SUCCESS, so it is not a committed lidarshard output"),
    "world size edited": (
        _manifest_edit(lambda m: m.update(world_size=2)),
        "recorded in 'files' but not part of a world_size 2",
    ),
    "schema version": (
        _manifest_edit(lambda m: m.update(schema_version="1.0")),
        f"written with manifest schema 1.0; this lidarshard reads 4.x (writes {schemas.SCHEMA_VERSION}): "
        "rebuild it "
        "without rescanning with `lidarshard build NEW_OUT --from-samples",
    ),
    "scanned count": (
        _manifest_edit(lambda m: m["counts"].update(scanned=99)),
        "counts: scanned 99 != accepted 30 + rejected 1",
    ),
    "planned count": (
        _manifest_edit(lambda m: m["counts"]["planned"].__setitem__(1, 16)),
        "counts.planned 16 != 24",
    ),
    "steps per epoch": (
        _manifest_edit(lambda m: m["steps_per_epoch"].__setitem__(0, 4)),
        "epoch 0 rank 0: 6 rows, but steps_per_epoch[0] = 4 steps",
    ),
    "balance linearity": (
        _manifest_edit(lambda m: m["balance"][0].update(linearity=0.99)),
        "epoch 0: balance.linearity recorded 0.99, recomputed",
    ),
    "bucket counts": (
        _manifest_edit(lambda m: m["buckets"]["counts"].reverse()),
        "buckets.counts differ",
    ),
    "fingerprint": (_manifest_edit(lambda m: m.update(inputs_fingerprint="0" * 64)), "inputs_fingerprint"),
    "dropped count": (
        _manifest_edit(lambda m: m["counts"]["dropped"].__setitem__(0, 0)),
        "planned 24 != accepted 30",
    ),
    "unknown strategy": (
        _manifest_edit(lambda m: m.update(strategy="fancy")),
        "_manifest.json: the plan settings (strategy 'fancy', caps {}) cannot be used (unknown --strategy",
    ),
    "caps not a number": (
        _manifest_edit(lambda m: m["caps"].update(max_samples_per_rank_step="x")),
        "_manifest.json: caps: max_samples_per_rank_step must be an int >= 1, got 'x'",  # typed at the read
    ),
    "pair repeat rate": (
        _manifest_edit(lambda m: m["pair_repeat_rate"].update(random=0.5)),
        "_manifest.json: pair_repeat_rate recorded {",
    ),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_tampering_is_caught(copy: Path, case: str, capsys) -> None:
    tamper, needle = TAMPERING[case]
    tamper(copy)
    assert validate_cli.run([str(copy)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"INVALID {copy}:")
    assert needle in err, err


def test_a_path_changed_at_any_row_is_named(copy: Path) -> None:
    """A plan row whose path was changed (size and sha256 fixed), at the file's first, a middle and its last
    row, is named by file, epoch, rank, step and slot; the file put back is valid again."""
    table = pq.read_table(copy / PLAN)
    ids = table.column("sample_id").to_pylist()
    for i in (0, table.num_rows // 2, table.num_rows - 1):
        _rewrite(
            copy, PLAN, lambda t, i=i: _set(t, "path", _shifted(t.column("path").to_pylist(), i)), record=True
        )
        problems = validate_cli.validate(str(copy))[0]
        step, slot = table.column("step")[i].as_py(), table.column("slot")[i].as_py()
        want = f"{PLAN}: epoch 1 rank 2 step {step} slot {slot}: path or sweep_paths of {ids[i]} differs"
        assert any(q.startswith(want) for q in problems), problems
        _rewrite(copy, PLAN, lambda t: table, record=True)
        assert validate_cli.validate(str(copy))[0] == []


def _shifted(paths: list, i: int) -> list:
    """``paths`` with row ``i``'s path changed (another character appended)."""
    return [*paths[:i], paths[i] + "x", *paths[i + 1 :]]


def test_missing_directory_and_leftover_hint(tmp_path: Path) -> None:
    problems, _ = validate_cli.validate(str(tmp_path / "nope"))
    assert problems == [f"{tmp_path / 'nope'}: no such directory"]
    (tmp_path / "out.old-abcdef-1-0123abcd").mkdir()
    problems, _ = validate_cli.validate(str(tmp_path / "out"))
    assert "leftovers of an interrupted run" in problems[0]


def test_a_forged_value_of_the_wrong_type_is_a_problem_not_a_crash(copy: Path) -> None:
    balance = _manifest(copy)["balance"]
    _manifest_edit(lambda m: m.update(batch_size="two"))(copy)
    problems, _ = validate_cli.validate(str(copy))
    assert problems == ["_manifest.json: batch_size must be an int >= 1, got 'two'"]
    _manifest_edit(lambda m: m.update(batch_size=2, balance="high"))(copy)
    problems, _ = validate_cli.validate(str(copy))
    assert problems == ["_manifest.json: balance must be a list of 2 objects, got 'high'"]
    balance[1]["linearity"] = "high"  # inside an entry: typed, one line naming it, not a crash
    _manifest_edit(lambda m: m.update(balance=balance))(copy)
    problems, _ = validate_cli.validate(str(copy))
    assert problems == ["_manifest.json: balance[1]: linearity must be a finite number, got 'high'"]


def test_object_store_uri(built: Path, monkeypatch) -> None:
    root = "memobj://bucket/out"
    files = {f"{root}/{p.relative_to(built)}": (p.read_bytes(), 0.0) for p in built.rglob("*") if p.is_file()}
    monkeypatch.setattr(MemoryObjectStore, "objects", files)
    assert validate_cli.validate(root)[0] == []
    del files[f"{root}/{PLAN}"]
    problems = validate_cli.validate(root)[0]
    assert len(problems) == 1 and problems[0].startswith(f"{PLAN}: missing (recorded ")


def test_a_plan_file_is_streamed_a_row_group_at_a_time(copy: Path) -> None:
    """A rank file of one-step row groups (size and sha256 fixed) is valid; a path changed in its last
    row group is named by file, epoch, rank, step and slot."""

    def write(table: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(
            table.replace_schema_metadata(pq.read_schema(copy / PLAN).metadata), sink, row_group_size=2
        )
        data = sink.getvalue().to_pybytes()
        (copy / PLAN).write_bytes(data)
        m = _manifest(copy)
        m["files"][PLAN] = {"bytes": len(data), "sha256": sha256_hex(data)}
        _save_manifest(copy, m)

    table = pq.read_table(copy / PLAN)
    write(table)
    assert pq.ParquetFile(copy / PLAN).metadata.num_row_groups == 3
    assert validate_cli.validate(str(copy))[0] == []
    paths = table.column("path").to_pylist()
    write(_set(table, "path", [*paths[:-1], paths[0]]))
    problems = validate_cli.validate(str(copy))[0]
    assert any(
        p.startswith(f"{PLAN}: epoch 1 rank 2 step 2 slot 1: path or sweep_paths of ") for p in problems
    )


def test_pad_policy_coverage(built: Path, tmp_path: Path) -> None:
    out = tmp_path / "pad"
    flags = ["--world-size", "4", "--batch-size", "2", "--pad", "--max-reject-fraction", "0.1"]
    flags += ["--from-samples", str(built / "samples")]
    assert build_cli.run([str(out), *flags, *BEAM_TEST_FLAGS]) == 0
    assert validate_cli.validate(str(out))[0] == []
    m = _manifest(out)
    assert m["counts"]["padded"] == [2] and m["pair_repeat_rate"] is None  # one epoch: no pair to compare
    m["counts"]["padded"] = [1]
    m["pair_repeat_rate"] = {"mixed": 0.0, "random": 0.0}
    _save_manifest(out, m)
    problems = validate_cli.validate(str(out))[0]
    assert "epoch 0: planned 32 != accepted 30 + padded 1 (dropped 0)" in problems
    assert "epoch 0: counts.padded recorded 1, re-derived 2" in problems
    assert (
        "_manifest.json: pair_repeat_rate recorded {'mixed': 0.0, 'random': 0.0}, expected null (1 epoch)"
        in problems
    )


@pytest.fixture(scope="module")
def weighted(built: Path, tmp_path_factory) -> Path:
    """A re-plan of ``built`` with --sample-weights (2, 0.5, 2, ...) from a column of its samples."""
    tmp = tmp_path_factory.mktemp("weighted")
    prev = Path(shutil.copytree(built, tmp / "prev"))
    table = pq.read_table(prev / schemas.SAMPLES_DIR)
    w = [2.0 if i % 2 == 0 else 0.5 for i in range(table.num_rows)]
    write_samples(prev / schemas.SAMPLES_DIR, table.append_column("cbgs", pa.array(w)))
    argv = [str(tmp / "out"), "--from-samples", str(prev / schemas.SAMPLES_DIR), "--sample-weights", "cbgs"]
    assert build_cli.run([*argv, *FLAGS, *BEAM_TEST_FLAGS]) == 0
    assert validate_cli.validate(str(tmp / "out"))[0] == []
    return tmp / "out"


def _weights_edit(change: Callable[[list], list]) -> Callable[[Path], None]:
    def edit(out: Path) -> None:
        _rewrite(
            out,
            schemas.samples_part(0),
            lambda t: _set(t, "weight", change(t.column("weight").to_pylist())),
            True,
        )

    return edit


def _zero_a_planned_weight(weights: list) -> list:
    return [0.0 if i == 0 else v for i, v in enumerate(weights)]  # sample 0 (weight 2) is planned


WEIGHT_TAMPERING = {
    "a zeroed weight": (
        _weights_edit(_zero_a_planned_weight),
        [
            "more than bucket weight x sample weight 0 allows",
            "repeat.expected recorded",
            "differs from the plan",
        ],
    ),
    "a negative weight": (
        _weights_edit(lambda w: [-1.0, *w[1:]]),
        ["weight holds values that are not finite"],
    ),
    "a forged dropped count": (
        _manifest_edit(lambda m: m["counts"]["dropped"].__setitem__(1, m["counts"]["dropped"][1] + 2)),
        ["epoch 1: counts.dropped recorded "],
    ),
    "a forged realized count": (
        _manifest_edit(lambda m: m["repeat"]["realized"][1].update(all=1.0)),
        ["epoch 1: repeat.realized recorded {'all': 1.0}"],
    ),
    "weights the manifest does not record": (
        _manifest_edit(lambda m: m.update(repeat=None)),
        ["has weight 2 but the manifest records no repeat factors"],
    ),
    "a forged lidarseg mode": (
        _manifest_edit(lambda m: m["repeat"].update(mode="lidarseg:t=0.5")),
        ["has weight 2, its labels give repeat factor 1 (30 samples differ)"],
    ),
}


@pytest.mark.parametrize("case", sorted(WEIGHT_TAMPERING))
def test_tampered_weights_are_caught(weighted: Path, tmp_path: Path, case: str) -> None:
    out = Path(shutil.copytree(weighted, tmp_path / "out"))
    tamper, needles = WEIGHT_TAMPERING[case]
    tamper(out)
    problems = "\n".join(validate_cli.validate(str(out))[0])
    for needle in needles:
        assert needle in problems, problems


_HELD = """
import sys
from lidarshard.tools import validate
def hold(*args, **kwargs):  # the samples are in validate's database: say so, then wait for the signal
    print("ready", flush=True)
    sys.stdin.read()
validate.check_epoch_files = hold
if sys.argv[2] == "cli":
    sys.exit(validate.run([sys.argv[1]]))
from lidarshard.pipelines._lifeline import interruptible
with interruptible(lambda: None, "nothing was published"):  # as the build's pre-publish validate
    validate.validate(sys.argv[1])
"""


_SCRATCH_FAMILY = pytest.mark.hostile("validate scratch")


@pytest.mark.parametrize("how", ["cli", "build"])
@pytest.mark.parametrize(
    "sig",
    [
        "SIGTERM",
        pytest.param("SIGHUP", marks=_SCRATCH_FAMILY),
        pytest.param("SIGQUIT", marks=_SCRATCH_FAMILY),
    ],
)
def test_a_signal_mid_validate_leaves_no_temporary_directory(
    built: Path, tmp_path: Path, how: str, sig: str
) -> None:
    """``lidarshard validate`` and a build's pre-publish validate, stopped by SIGTERM, SIGHUP or SIGQUIT while
    their samples are in its database: exit 128 + the signal (143 for SIGTERM) and their temporary directory
    is gone (the child's TMPDIR is the test's)."""
    import os
    import signal
    import subprocess
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _HELD, str(built), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp)},
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.stderr
        assert [p.name for p in tmp.iterdir() if p.name.startswith("lidarshard-validate-")]
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(timeout=60) == 128 + getattr(signal, sig)
    finally:
        proc.kill()
        proc.wait()
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("lidarshard-validate-")]
