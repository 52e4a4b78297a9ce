"""Hostile inputs of ``lidarshard validate`` itself (issue 50, family "validate scratch"): its scratch space full
or unusable, signals mid-run, OUT changed under it, forged settings it must refuse, huge problem counts. The
promise: an I/O failure of validate's own is one line naming its scratch directory and the errno (exit 1,
never a verdict on the data); a manifest that changed while it was read is said to have changed; every other
problem is one line naming the file and the fix."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.tools import validate as validate_cli
from lidarshard.transforms.io.arrow import sha256_hex
from tests.helpers import build_bins_manifest

pytestmark = pytest.mark.hostile("validate scratch")
PLAN = schemas.plan_file(1, 1)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_bins_manifest(tmp_path_factory.mktemp("hostile_validate"), 24, world_size=2, batch_size=2)


@pytest.fixture
def copy(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "out"))


@contextlib.contextmanager
def _small_fs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (root only: skips elsewhere)."""
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a {size} tmpfs here (needs root): {done.stderr.decode()[:80]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _cli(out: Path, tmpdir: Path | str, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    cmd = [sys.executable, "-m", "lidarshard.tools.validate", str(out), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("size", ["4k", "16k", "1m"])
def test_a_full_scratch_is_one_line_naming_it_never_a_verdict(built: Path, tmp_path: Path, size: str) -> None:
    """TMPDIR on a small filesystem: validate either fits (OK) or says its scratch failed, in one line naming
    the directory and the errno; never INVALID. 4 KiB cannot hold its database."""
    with _small_fs(tmp_path / "small", size) as small:
        done = _cli(built, small)
    assert "INVALID" not in done.stderr, done.stderr
    if done.returncode == 0 and size != "4k":
        assert done.stdout.startswith(f"OK {built}: ")
        return
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"scratch directory {small}" in lines[0], done.stderr
    assert "ENOSPC" in lines[0] or "EFBIG" in lines[0], lines[0]


def test_the_pre_publish_check_says_the_same_when_its_scratch_is_full(
    built: Path, tmp_path: Path, monkeypatch
) -> None:
    """The build's pre-publish validate of a good plan, its scratch full: the scratch failure, not "the output
    fails validation"."""
    from lidarshard.pipelines.publish import _check_staged

    with _small_fs(tmp_path / "small", "4k") as small:
        monkeypatch.setattr(tempfile, "tempdir", str(small))
        with pytest.raises(validate_cli.ScratchError, match=f"scratch directory {small}.*ENOSPC"):
            _check_staged(str(built))


def test_a_tmpdir_that_is_not_a_directory_falls_back_and_validates(built: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    done = _cli(built, tmp_path / "file")
    assert done.returncode == 0 and done.stdout.startswith(f"OK {built}: "), done.stderr


def test_a_read_only_out_is_read_and_never_written(copy: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*")}
    os.chmod(copy, 0o555)
    try:
        assert validate_cli.validate(str(copy))[0] == []
    finally:
        os.chmod(copy, 0o755)
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*")} == before


def _mid_run(monkeypatch, change) -> None:
    """``change()`` runs once validate has read the samples, before it reads the plan files."""
    real = validate_cli.check_epoch_files

    def hooked(*args, **kwargs):
        if not hooked.done:
            hooked.done = True
            change()
        return real(*args, **kwargs)

    hooked.done = False
    monkeypatch.setattr(validate_cli, "check_epoch_files", hooked)


def test_a_rebuild_published_mid_validate_is_named_not_judged(
    copy: Path, tmp_path: Path, tmp_path_factory, monkeypatch
) -> None:
    """Another build (W=4, another seed) published into OUT while validate reads it: one line saying OUT
    changed, not INVALID plan counts."""
    other = build_bins_manifest(tmp_path_factory.mktemp("other"), 24, world_size=4, batch_size=2)

    def rebuild() -> None:
        shutil.rmtree(copy / "plan")
        for p in other.rglob("*"):
            if p.is_file():
                (copy / p.relative_to(other)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(p, copy / p.relative_to(other))

    _mid_run(monkeypatch, rebuild)
    problems, summary = validate_cli.validate(str(copy))
    assert summary == "" and len(problems) == 1, problems
    assert problems[0].startswith(f"{copy}: changed while validate read it (_manifest.json was rewritten)")


def test_a_listed_file_replaced_mid_validate_is_named(copy: Path, monkeypatch) -> None:
    """A plan file rewritten (same bytes, a new file) while validate runs: OUT changed under it, said so."""

    def replace() -> None:
        data = (copy / PLAN).read_bytes()
        (copy / PLAN).unlink()
        (copy / PLAN).write_bytes(data + b"")
        os.utime(copy / PLAN, ns=(1, 1))

    _mid_run(monkeypatch, replace)
    problems, _ = validate_cli.validate(str(copy))
    assert problems == [
        f"{copy}: changed while validate read it ({PLAN} changed): another run published into it, so nothing "
        "was judged; run validate again once that run is done"
    ]


def test_data_with_every_file_missing_prints_the_true_total(
    built: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """``--data`` when none of the files the samples name is there: the true count, the first few lines."""
    out = Path(shutil.copytree(built, tmp_path / "out"))
    monkeypatch.setattr(validate_cli, "MAX_PROBLEMS", 5)
    assert validate_cli.run([str(out), "--data", "--root", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err.splitlines()
    accepted = json.loads((out / schemas.MANIFEST_FILE).read_text())["counts"]["accepted"]
    assert err[0] == f"INVALID {out}: {accepted} problem(s)", err[:3]
    assert len(err) == 1 + 5 + 1 and err[-1] == f"  ... and {accepted - 5} more problems", err


def _edit_manifest(out: Path, change) -> None:
    m = json.loads((out / schemas.MANIFEST_FILE).read_text())
    change(m)
    (out / schemas.MANIFEST_FILE).write_text(json.dumps(m))


@pytest.mark.parametrize(
    "groups",
    [
        {"groups": 2, "rule": "auto: G = max(1, N // 1048576)"},  # the auto rule gives 1 for 24 samples
        {"groups": 1, "rule": "whatever I like"},
    ],
)
def test_a_plan_groups_rule_that_contradicts_its_groups_is_refused(copy: Path, groups: dict) -> None:
    _edit_manifest(copy, lambda m: m.update(plan_groups=groups))
    problems, _ = validate_cli.validate(str(copy))
    assert any(p.startswith("_manifest.json: plan_groups ") and "contradicts" in p for p in problems), (
        problems
    )


@pytest.mark.parametrize("name", ["voxels", "points"])
def test_milliseconds_on_a_proxy_cost_model_are_refused(copy: Path, name: str) -> None:
    _edit_manifest(copy, lambda m: m["cost_model"].update(name=name, units="ms"))
    problems, _ = validate_cli.validate(str(copy))
    assert any("cost_model" in p and "units" in p and "cannot be applied" in p for p in problems), problems


def _rewrite(out: Path, rel: str, data: bytes) -> None:
    """``rel`` replaced by ``data``, its size and sha256 recorded as a careful forger would."""
    (out / rel).write_bytes(data)
    _edit_manifest(out, lambda m: m["files"].update({rel: {"bytes": len(data), "sha256": sha256_hex(data)}}))


def test_a_truncated_footer_with_its_hash_fixed_is_one_line(copy: Path) -> None:
    _rewrite(copy, PLAN, (copy / PLAN).read_bytes()[:-9])
    problems, _ = validate_cli.validate(str(copy))
    assert [p for p in problems if p.startswith(PLAN)] == [
        p for p in problems if p.startswith(f"{PLAN}: not a readable Parquet file")
    ] and any(p.startswith(PLAN) for p in problems), problems


def test_a_plan_file_of_one_row_per_row_group_is_valid(copy: Path) -> None:
    table = pq.read_table(copy / PLAN)
    sink = pa.BufferOutputStream()
    pq.write_table(
        table.replace_schema_metadata(pq.read_schema(copy / PLAN).metadata), sink, row_group_size=1
    )
    _rewrite(copy, PLAN, sink.getvalue().to_pybytes())
    assert pq.ParquetFile(copy / PLAN).metadata.num_row_groups == table.num_rows
    assert validate_cli.validate(str(copy))[0] == []
