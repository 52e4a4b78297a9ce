"""Issue #25's hostile cases for publish, paths and the readers, generated here; each ends in a published,
valid output or in one line naming what is wrong, and never deletes what lidarshard did not write.

Families (``CASES`` counts the generated cases of each; ``-s`` prints the table):

* **unlisted**: an OUT holding anything its metadata does not list (a user's ``raw/``, a stray file, a link,
  a FIFO, a copy of a plan epoch) is refused before Beam, naming the first such entry, and left as it was.
* **metadata**: a malformed, oversized or path-escaping old ``_manifest.json``/``_scan.json`` refuses the
  replace in one line and deletes nothing (not even what ``..`` points at).
* **races**: what appears in OUT during a run refuses the commit or is kept whole (``OUT.kept-*``).
* **read-only**: a previous tree that is read-only is deleted when this user may make it writable, else named
  on stderr at every later run, never left silently.
* **names**: a legal 255-byte OUT name gets a staging directory and a rejects file; INPUT as one file and
  ``file://`` paths are handled before Beam.
* **readers**: forged ``steps_per_epoch``/``world_size``/``batch_size``, unlisted plan copies, rewritten
  samples parts and escaping ``files`` keys cost one line and bounded memory.
* **plan size**: a plan the flags ask for that cannot fit is refused before Beam.
* **remote**: an unreachable or silent store fails within the deadline with one line naming the path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.loaders.reader import ManifestReader, load_manifest, plan_dataset, read_samples
from lidarshard.pipelines import build as build_cli
from lidarshard.pipelines import checks, publish
from lidarshard.pipelines import preflight as settings
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.tools.validate import validate
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.io import storage
from lidarshard.transforms.value_checks import UsageError
from tests.helpers import BEAM_TEST_FLAGS, make_bins, slow_after
from tests.object_store import Handler, MemoryObjectStore

pytestmark = pytest.mark.hostile("publishing")

PLAN = ["--world-size", "2", "--batch-size", "2", "--epochs", "2", "--max-reject-fraction", "0.5"]
CASES: Counter[str] = Counter()  # family -> generated cases run


@pytest.fixture(scope="module")
def bins(tmp_path_factory) -> Path:
    return make_bins(tmp_path_factory.mktemp("bins") / "in", n=12)


@pytest.fixture(scope="module")
def built(bins: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("built") / "out"
    assert cli_main(["build", str(bins), str(out), *PLAN, *BEAM_TEST_FLAGS]) == 0
    return out


@pytest.fixture(scope="module")
def scanned(bins: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scanned") / "out"
    assert cli_main(["scan", str(bins), str(out), "--max-reject-fraction", "0.5", *BEAM_TEST_FLAGS]) == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst, symlinks=True))


def _snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root``: file bytes, link targets, 'dir' or 'other' (a FIFO)."""
    found: dict[str, object] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                found[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                found[rel] = "dir"
            elif p.is_file():
                found[rel] = p.read_bytes()
            else:
                found[rel] = "other"
    return found


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error:" in line]


def _refused(argv: list[str], capsys, *names: str) -> str:
    """Runs the CLI, which must exit 2 with one error line naming each of ``names``; returns that line."""
    assert cli_main([*argv, *BEAM_TEST_FLAGS]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    for name in names:
        assert name in line, (name, line)
    return line


def _leftovers(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if ".staging-" in n or ".old-" in n or ".kept-" in n)


# --------------------------------------------------------------------- unlisted entries in an old OUT


def _fifo(p: Path) -> None:
    os.mkfifo(p)


UNLISTED: dict[str, tuple[str, Callable[[Path, Path], None]]] = {
    # case: (the entry the refusal names, how it is made in OUT given INPUT)
    "raw_dir_of_inputs": ("raw", lambda o, i: shutil.copytree(i, o / "raw")),
    "empty_user_dir": ("raw", lambda o, i: (o / "raw").mkdir()),
    "stray_file": ("notes.txt", lambda o, i: (o / "notes.txt").write_text("mine")),
    "hidden_file": (".DS_Store", lambda o, i: (o / ".DS_Store").write_bytes(b"\0")),
    "file_beside_the_parts": ("samples/mine.parquet", lambda o, i: (o / "samples/mine.parquet").write_bytes(b"x")),
    "dir_among_the_parts": ("samples/mine", lambda o, i: (o / "samples/mine").mkdir()),
    "report_lookalike": ("reports", lambda o, i: (o / "reports").mkdir()),
    "report_as_a_file": ("report", lambda o, i: (o / "report").write_text("not a directory")),
    "symlink_to_input_dir": ("link", lambda o, i: os.symlink(i, o / "link")),
    "symlink_to_input_file": ("alias.bin", lambda o, i: os.symlink(i / "0000.bin", o / "alias.bin")),
    "dangling_symlink": ("gone", lambda o, i: os.symlink(o / "nowhere", o / "gone")),
    "fifo": ("pipe", lambda o, i: _fifo(o / "pipe")),
    "unicode_name": ("données.txt", lambda o, i: (o / "données.txt").write_text("x")),
    "tmp_lookalike": ("_manifest.json.tmp-0123abcd", lambda o, i: (o / "_manifest.json.tmp-0123abcd").write_text("{}")),
    "nested_in_samples": ("samples/sub", lambda o, i: (o / "samples/sub").mkdir() or (o / "samples/sub/x").write_text("")),
}  # fmt: skip
BUILD_ONLY: dict[str, tuple[str, Callable[[Path, Path], None]]] = {
    "file_in_plan_root": ("plan/README.md", lambda o, i: (o / "plan/README.md").write_text("x")),
    "file_in_rank_dir": ("plan/epoch-0/rank-0/notes.txt", lambda o, i: (o / "plan/epoch-0/rank-0/notes.txt").write_text("x")),
    "plan_epoch_copy": ("plan/epoch-00", lambda o, i: shutil.copytree(o / "plan/epoch-0", o / "plan/epoch-00")),
    "unplanned_epoch_copy": ("plan/epoch-2", lambda o, i: shutil.copytree(o / "plan/epoch-1", o / "plan/epoch-2")),
    "unlisted_part": ("samples/part-00009.parquet", lambda o, i: shutil.copy(o / schemas.samples_part(0), o / "samples/part-00009.parquet")),
    "stale_plan_dir": ("plan/epoch-0/rank-7", lambda o, i: (o / "plan/epoch-0/rank-7").mkdir()),
}  # fmt: skip


@pytest.mark.parametrize("command", ["build", "scan"])
@pytest.mark.parametrize("case", [*UNLISTED, *BUILD_ONLY])
def test_an_out_holding_unlisted_entries_is_refused_before_beam(
    bins: Path, built: Path, scanned: Path, tmp_path: Path, capsys, command: str, case: str
) -> None:
    if command == "scan" and case in BUILD_ONLY:
        pytest.skip("a scan directory has no plan")
    CASES["unlisted"] += 1
    out = _copy(built if command == "build" else scanned, tmp_path / "out")
    name, make = (UNLISTED | BUILD_ONLY)[case]
    make(out, bins)
    before, inputs = _snapshot(out), _snapshot(bins)
    flags = PLAN if command == "build" else ["--max-reject-fraction", "0.5"]
    line = _refused(
        [command, str(bins), str(out), *flags], capsys, str(out / name), "lidarshard did not write"
    )
    assert "\n" not in line
    assert _snapshot(out) == before and _snapshot(bins) == inputs  # nothing touched, the input least of all
    assert _leftovers(tmp_path) == []
    with pytest.raises(FileExistsError, match="lidarshard did not write"):
        publish.check_replaceable(str(out))


def test_a_name_with_a_newline_is_named_on_one_line(built: Path, tmp_path: Path) -> None:
    CASES["unlisted"] += 1
    out = _copy(built, tmp_path / "out")
    (out / "a\nb").write_text("x")
    with pytest.raises(FileExistsError) as info:
        publish.check_replaceable(str(out))
    assert "\n" not in str(info.value) and "a\\nb" in str(info.value)


ALLOWED: dict[str, Callable[[Path], None]] = {
    "report_files": lambda o: [
        (o / "report").mkdir(),
        (o / "report/report.html").write_text("<html>"),
        (o / "report/cost_model.json").write_text("{}"),
    ],
    "nested_report": lambda o: (o / "report/figs").mkdir(parents=True) or (o / "report/figs/a.png").write_bytes(b"p"),
    "a_listed_file_deleted": lambda o: (o / schemas.plan_file(1, 1)).unlink(),
    "an_empty_rank_dir_left": lambda o: (o / schemas.plan_file(1, 0)).unlink(),
}  # fmt: skip


@pytest.mark.parametrize("case", slow_after(2, ALLOWED))
def test_what_lidarshard_wrote_is_replaced(bins: Path, built: Path, tmp_path: Path, case: str) -> None:
    CASES["unlisted"] += 1
    out = _copy(built, tmp_path / "out")
    ALLOWED[case](out)
    publish.check_replaceable(str(out))
    assert cli_main(["build", str(bins), str(out), *PLAN, "--seed", "3", *BEAM_TEST_FLAGS]) == 0
    assert validate(str(out))[0] == [] and not (out / "report").exists()
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_the_issue_case_the_input_copied_into_out_survives(
    bins: Path, built: Path, tmp_path: Path, capsys
) -> None:
    """build IN out; mkdir out/raw; cp IN/*.bin out/raw; build out/raw out -- and build IN out again."""
    CASES["unlisted"] += 1
    out = _copy(built, tmp_path / "out")
    shutil.copytree(bins, out / "raw")
    raw = _snapshot(out / "raw")
    _refused(["build", str(out / "raw"), str(out), *PLAN], capsys, "inside OUT")
    _refused(["scan", str(out / "raw"), str(out)], capsys, "inside OUT")
    _refused(["build", str(bins), str(out), *PLAN], capsys, str(out / "raw"))
    _refused(["scan", str(bins), str(out)], capsys, str(out / "raw"))
    assert _snapshot(out / "raw") == raw


# ---------------------------------------------------------------------- malformed old metadata


def _files_key(key: str) -> Callable[[Path], None]:
    def edit(out: Path) -> None:
        m = json.loads((out / schemas.MANIFEST_FILE).read_text())
        m["files"][key] = {"bytes": 1, "sha256": ""}
        (out / schemas.MANIFEST_FILE).write_text(json.dumps(m))

    return edit


def _raw_manifest(data: bytes) -> Callable[[Path], None]:
    return lambda out: (out / schemas.MANIFEST_FILE).write_bytes(data)


def _huge_manifest(out: Path) -> None:
    with open(out / schemas.MANIFEST_FILE, "r+b") as f:
        f.truncate(publish.META_MAX_BYTES + 1)  # sparse: costs no disk


ESCAPING_KEYS = {
    "dotdot": "../victim.txt",
    "dotdot_inside": "plan/../../victim.txt",
    "absolute": "/VICTIM",  # replaced by the victim's absolute path
    "file_uri": "file:///VICTIM",
    "s3_uri": "s3://bucket/victim.txt",
    "drive": "C:/victim.txt",
    "backslash": "..\\victim.txt",
    "empty_segment": "plan//x.parquet",
    "dot_segment": "./_SUCCESS",
    "empty": "",
    "nul": "plan/\0x",
    "trailing_slash": "plan/",
}
METADATA: dict[str, tuple[Callable[[Path], None], str]] = {
    "not_json": (_raw_manifest(b"{"), "cannot be read"),
    "deeply_nested": (_raw_manifest(b'{"files": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "nested too deeply"),
    "huge_integer": (_raw_manifest(b'{"files": {"x": {"bytes": 1' + b"0" * 5000 + b"}}}"), "did not write"),
    "array": (_raw_manifest(b"[]"), "not a JSON object"),
    "files_as_list": (_raw_manifest(b'{"files": ["raw"]}'), "'files' is not an object"),
    "larger_than_the_cap": (_huge_manifest, "is larger than"),
    "metadata_deleted": (lambda o: (o / schemas.MANIFEST_FILE).unlink(), "no _manifest.json or _scan.json"),
    **{f"key_{k}": (_files_key(v), "which") for k, v in ESCAPING_KEYS.items()},
}  # fmt: skip


@pytest.mark.parametrize("case", METADATA)
def test_untrustworthy_old_metadata_refuses_the_replace(built: Path, tmp_path: Path, case: str) -> None:
    CASES["metadata"] += 1
    out = _copy(built, tmp_path / "out")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    edit, why = METADATA[case]
    if case.startswith("key_"):
        key = ESCAPING_KEYS[case[4:]].replace("/VICTIM", str(victim))
        edit = _files_key(key)
    edit(out)
    before = _snapshot(out)
    with pytest.raises(FileExistsError) as info:
        publish.check_replaceable(str(out))
    assert why in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(FileExistsError):  # so does every run, before any work
        publish.new_staging(str(out))
    assert _snapshot(out) == before and victim.read_text() == "precious"


@pytest.mark.parametrize("case", ["not_json", "array", "deeply_nested"])
def test_a_malformed_scan_json_refuses_the_replace(
    bins: Path, scanned: Path, tmp_path: Path, capsys, case: str
) -> None:
    CASES["metadata"] += 1
    out = _copy(scanned, tmp_path / "out")
    data = {"not_json": b"{", "array": b"[]", "deeply_nested": b"[" * 100_000 + b"]" * 100_000}[case]
    (out / schemas.SCAN_FILE).write_bytes(data)
    _refused(["scan", str(bins), str(out)], capsys, str(out), "_scan.json")


@pytest.mark.parametrize("key", sorted(ESCAPING_KEYS))
def test_readers_refuse_files_keys_outside_the_manifest_directory(
    built: Path, tmp_path: Path, key: str
) -> None:
    CASES["metadata"] += 1
    out = _copy(built, tmp_path / "out")
    _files_key(ESCAPING_KEYS[key].replace("/VICTIM", str(tmp_path / "victim.txt")))(out)
    with pytest.raises(ValueError, match="files key") as info:
        load_manifest(out)
    assert "\n" not in str(info.value)
    problems, _ = validate(str(out))
    assert any("files key" in p for p in problems), problems


# ----------------------------------------------------------------------------------------- races


def _stage(out: str, files: dict[str, bytes]) -> str:
    staging = publish.new_staging(out)
    listed = {rel: {"bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for rel, d in files.items()}
    for rel, data in files.items():
        storage.write_bytes(storage.join(staging, rel), data)
    storage.write_bytes(storage.join(staging, schemas.MANIFEST_FILE), json.dumps({"files": listed}).encode())
    storage.write_bytes(storage.join(staging, schemas.SUCCESS_FILE), b"")
    return staging


OLD = {"plan/epoch-0/rank-0/part-00000.parquet": b"old0", "plan/epoch-0/rank-1/part-00000.parquet": b"old1"}
NEW = {"plan/epoch-0/rank-0/part-00000.parquet": b"new0"}


@pytest.mark.parametrize("exchange", [True, False])
def test_an_entry_added_during_the_run_refuses_the_commit(
    tmp_path: Path, monkeypatch, exchange: bool
) -> None:
    CASES["races"] += 1
    monkeypatch.setattr(publish, "_check_staged", lambda staging: None)  # these staged trees are stand-ins
    out = str(tmp_path / "out")
    publish.commit(_stage(out, OLD), out)
    if not exchange:
        monkeypatch.setattr(storage, "exchange", lambda a, b: False)
    staging = _stage(out, NEW)
    (tmp_path / "out" / "raw").mkdir()
    (tmp_path / "out" / "raw" / "x.bin").write_bytes(b"user")
    before = _snapshot(tmp_path / "out")

    def run() -> None:
        pass

    with pytest.raises(FileExistsError, match="raw, which lidarshard did not write.*nothing was published"):
        publish.run_and_publish(run, staging, out)
    assert _snapshot(tmp_path / "out") == before and _leftovers(tmp_path) == []


@pytest.mark.parametrize("exchange", [True, False])
def test_an_entry_added_after_the_last_check_is_kept_whole(
    tmp_path: Path, monkeypatch, capsys, exchange: bool
) -> None:
    """Between the last check and the swap (microseconds) a user adds raw/: the previous tree is kept
    whole as OUT.kept-<tag>, which no later run deletes, and one line says so."""
    CASES["races"] += 1
    out = str(tmp_path / "out")
    publish.commit(_stage(out, OLD), out)
    if not exchange:
        monkeypatch.setattr(storage, "exchange", lambda a, b: False)
    staging = _stage(out, NEW)
    owned = publish.check_replaceable(out)
    (tmp_path / "out" / "raw").mkdir()
    (tmp_path / "out" / "raw" / "x.bin").write_bytes(b"user")
    monkeypatch.setattr(publish, "check_replaceable", lambda o: owned)
    publish.commit(staging, out)
    (line,) = capsys.readouterr().err.splitlines()
    (kept,) = [n for n in os.listdir(tmp_path) if ".kept-" in n]
    assert kept in line and "raw" in line
    assert (tmp_path / kept / "raw" / "x.bin").read_bytes() == b"user"
    assert (tmp_path / "out" / NEW_REL).read_bytes() == b"new0"
    assert publish.recover(out) == [] and (tmp_path / kept).exists()


NEW_REL = "plan/epoch-0/rank-0/part-00000.parquet"


def _mem_tree(root: str) -> dict[str, bytes]:
    return {
        p[len(root) + 1 :]: d for p, (d, _) in MemoryObjectStore.objects.items() if p.startswith(root + "/")
    }


@pytest.mark.parametrize(
    "user_key", ["raw/x.bin", "notes.txt", "plan/epoch-0/mine.txt", "samples/part-00003.parquet"]
)
def test_object_store_outs_refuse_and_never_delete_unlisted_objects(monkeypatch, user_key: str) -> None:
    CASES["races"] += 1
    monkeypatch.setattr(MemoryObjectStore, "objects", {})
    out = "memobj://bucket/out"
    publish.commit(_stage(out, OLD), out)
    storage.write_bytes(f"{out}/{user_key}", b"user")
    with pytest.raises(FileExistsError, match=f"{out}/{user_key}, which lidarshard did not write"):
        publish.check_replaceable(out)
    staging = _stage_remote_unchecked(out, NEW)
    owned = publish.owned_files(out)  # as checked before the user's object appeared
    publish._commit_remote(staging, out, owned)
    tree = _mem_tree(out)
    assert tree[user_key] == b"user" and tree[NEW_REL] == b"new0"
    assert "plan/epoch-0/rank-1/part-00000.parquet" not in tree  # the old listed file went


def _stage_remote_unchecked(out: str, files: dict[str, bytes]) -> str:
    staging = f"{out}.staging-{publish._new_tag()}"
    listed = {rel: {"bytes": len(d), "sha256": ""} for rel, d in files.items()}
    for rel, data in files.items():
        storage.write_bytes(f"{staging}/{rel}", data)
    storage.write_bytes(f"{staging}/{schemas.MANIFEST_FILE}", json.dumps({"files": listed}).encode())
    storage.write_bytes(f"{staging}/{schemas.SUCCESS_FILE}", b"")
    return staging


# -------------------------------------------------------------------------------------- read-only


def _honour_write_bits(monkeypatch) -> None:
    """Make os.unlink/os.rmdir refuse, as for a non-root user, in a directory without its write bit
    (the tests run as root, whom the kernel lets through)."""
    real_unlink, real_rmdir = os.unlink, os.rmdir

    def guarded(real):
        def call(path, *a, **k):
            parent = os.path.dirname(os.fspath(path))
            if not os.stat(parent).st_mode & 0o200:
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real(path, *a, **k)

        return call

    monkeypatch.setattr(os, "unlink", guarded(real_unlink))
    monkeypatch.setattr(os, "rmdir", guarded(real_rmdir))


READ_ONLY = {
    "every_dir": lambda root: [p for p in root.rglob("*") if p.is_dir()] + [root],
    "plan_dirs": lambda root: [p for p in (root / "plan").rglob("*") if p.is_dir()] + [root / "plan"],
    "top_only": lambda root: [root],
    "files_too": lambda root: list(root.rglob("*")) + [root],
}


@pytest.mark.parametrize("exchange", [True, False])
@pytest.mark.parametrize("case", READ_ONLY)
def test_a_read_only_previous_tree_of_this_user_is_deleted(
    tmp_path: Path, monkeypatch, capsys, case: str, exchange: bool
) -> None:
    CASES["read-only"] += 1
    out = str(tmp_path / "out")
    publish.commit(_stage(out, OLD), out)
    staging = _stage(out, NEW)
    for p in sorted(READ_ONLY[case](tmp_path / "out"), key=lambda p: -len(p.parts)):
        p.chmod(0o555 if p.is_dir() else 0o444)
    _honour_write_bits(monkeypatch)
    if not exchange:
        monkeypatch.setattr(storage, "exchange", lambda a, b: False)
    publish.commit(staging, out)
    assert capsys.readouterr().err == ""
    assert sorted(os.listdir(tmp_path)) == ["out"] and (tmp_path / "out" / NEW_REL).read_bytes() == b"new0"


def test_an_undeletable_previous_tree_is_named_at_every_later_run(
    tmp_path: Path, monkeypatch, capsys, dead_owner
) -> None:
    CASES["read-only"] += 1
    out = str(tmp_path / "out")
    publish.commit(_stage(out, OLD), out)
    real_unlink = os.unlink
    stuck = "rank-1"

    def unlink(path, *a, **k):
        if stuck in os.fspath(path):
            raise PermissionError(1, "Operation not permitted", os.fspath(path))
        return real_unlink(path, *a, **k)

    monkeypatch.setattr(os, "unlink", unlink)
    publish.commit(_stage(out, NEW), out)
    (line,) = capsys.readouterr().err.splitlines()
    (left,) = _leftovers(tmp_path)
    assert left in line and "could not delete" in line and "delete it by hand" in line
    for _ in range(2):  # every later run says so again, in one line
        publish.recover(out)
        (again,) = capsys.readouterr().err.splitlines()
        assert left in again and "could not delete" in again
    monkeypatch.setattr(os, "unlink", real_unlink)  # the user fixed the permissions
    assert publish.recover(out) == [f"deleted {tmp_path / left} (left by a dead run)"]
    assert _leftovers(tmp_path) == []


def test_an_immutable_previous_tree_is_named(tmp_path: Path, capsys) -> None:
    """A real kernel refusal, even for root: ``chattr +i`` on a directory of the previous tree."""
    CASES["read-only"] += 1
    out = str(tmp_path / "out")
    publish.commit(_stage(out, OLD), out)
    locked = tmp_path / "out" / "plan" / "epoch-0"
    if (
        shutil.which("chattr") is None
        or subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode
    ):
        pytest.skip("chattr +i is not available on this filesystem")
    try:
        publish.commit(_stage(out, NEW), out)
        (line,) = capsys.readouterr().err.splitlines()
        (left,) = _leftovers(tmp_path)
        assert left in line and "could not delete" in line
    finally:
        for p in tmp_path.rglob("epoch-0"):
            subprocess.run(["chattr", "-i", str(p)], capture_output=True)


# -------------------------------------------------------------------------------------------- names

LONG_NAMES = [
    *(("a" * n) for n in (1, 100, 200, 219, 220, 221, 238, 239, 240, 250, 254, 255)),
    *(("é" * n) for n in (100, 110, 120, 127)),  # 2 bytes each
    *(("名" * n) for n in (70, 80, 85)),  # 3 bytes each
    "x" * 230 + "é" * 12,  # a cut that would fall inside a character
]
SUFFIXES = [".staging-", ".old-", ".kept-"]


def test_sibling_names_fit_name_max_are_stable_and_distinct() -> None:
    tag = f"{publish._HOST}-4294967295-0123abcd"  # the longest tag
    stems = set()
    for name in LONG_NAMES:
        for kind in SUFFIXES:
            CASES["names"] += 1
            path = publish._tagged(f"/d/{name}", kind, tag)
            base = path.rsplit("/", 1)[1]
            assert len(base.encode()) <= publish.NAME_MAX and base.endswith(kind + tag)
            assert publish._tagged(f"/d/{name}", kind, tag) == path  # the same name every run
        rejects = settings.rejects_path(f"/d/{name}").rsplit("/", 1)[1]
        assert len(rejects.encode()) + len(".tmp-0123abcd") <= publish.NAME_MAX and rejects.endswith(
            ".rejects.parquet"
        )
        stems.add(publish._tagged(f"/d/{name}", "", ""))
    assert len(stems) == len(LONG_NAMES)  # a hashed stem never collides with another name's


@pytest.mark.parametrize("name", slow_after(1, ["名" * 85, "a" * 240, "b" * 255, "é" * 127]))
def test_a_long_out_name_builds_publishes_and_rebuilds(bins: Path, tmp_path: Path, name: str) -> None:
    CASES["names"] += 1
    out = tmp_path / name
    for seed in ("0", "1"):
        assert cli_main(["build", str(bins), str(out), *PLAN, "--seed", seed, *BEAM_TEST_FLAGS]) == 0
        assert validate(str(out))[0] == []
    assert sorted(os.listdir(tmp_path)) == [name]
    staging = publish.new_staging(str(out))
    os.makedirs(staging)
    assert list(publish.leftovers(str(out))) == [staging]  # found again under its fitted name
    os.rmdir(staging)


def test_a_long_out_name_keeps_its_rejects_beside_it(bins: Path, tmp_path: Path) -> None:
    CASES["names"] += 1
    out = tmp_path / ("r" * 250)
    with pytest.raises(Exception, match="inputs rejected"):
        build_cli.run([str(bins), str(out), *PLAN[:6], "--max-reject-fraction", "0.01", *BEAM_TEST_FLAGS])
    (rejects,) = os.listdir(tmp_path)
    assert rejects.endswith(".rejects.parquet") and pq.read_table(tmp_path / rejects).num_rows == 1


def test_an_out_name_longer_than_name_max_is_refused(bins: Path, tmp_path: Path, capsys) -> None:
    CASES["names"] += 1
    _refused(["build", str(bins), str(tmp_path / ("z" * 256)), *PLAN], capsys, "256 bytes")


SINGLE_FILES = {
    "file": lambda i, t: i / "0001.bin",
    "link_to_file": lambda i, t: (os.symlink(i / "0001.bin", t / "l.bin"), t / "l.bin")[1],
    "file_uri": lambda i, t: f"file://{i / '0001.bin'}",
}


@pytest.mark.parametrize("command", ["scan", "build"])
@pytest.mark.parametrize("case", SINGLE_FILES)
def test_input_as_one_file_is_refused_before_beam(
    bins: Path, tmp_path: Path, capsys, command: str, case: str
) -> None:
    CASES["names"] += 1
    inp = SINGLE_FILES[case](bins, tmp_path)
    flags = PLAN if command == "build" else []
    _refused([command, str(inp), str(tmp_path / "out"), *flags], capsys, "is a file", "pass the directory")
    assert sorted(os.listdir(tmp_path)) == (["l.bin"] if case == "link_to_file" else [])


def test_file_uris_are_local_paths(bins: Path, scanned: Path, tmp_path: Path) -> None:
    CASES["names"] += 3
    out = tmp_path / "scan"
    assert (
        cli_main(
            ["scan", f"file://{bins}", f"file://{out}", "--max-reject-fraction", "0.5", *BEAM_TEST_FLAGS]
        )
        == 0
    )
    assert validate(str(out))[0] == []
    assert json.loads((out / schemas.SCAN_FILE).read_text())["input"] == str(bins)
    built = tmp_path / "built"
    argv = ["build", f"file://{bins}", f"file://{built}", *PLAN, "--relative-to", f"file://{bins}"]
    assert cli_main([*argv, *BEAM_TEST_FLAGS]) == 0
    assert load_manifest(built).path_root == str(bins) and validate(str(built))[0] == []
    again = tmp_path / "again"
    samples = f"file://{scanned / schemas.SAMPLES_DIR}"
    assert cli_main(["build", str(again), "--from-samples", samples, *PLAN, *BEAM_TEST_FLAGS]) == 0
    assert validate(str(again))[0] == []


# ------------------------------------------------------------------------------------------ readers


def _edit(out: Path, fn: Callable[[dict], None]) -> None:
    m = json.loads((out / schemas.MANIFEST_FILE).read_text())
    fn(m)
    (out / schemas.MANIFEST_FILE).write_text(json.dumps(m))


_MEASURE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
def kb(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])
from lidarshard.loaders.reader import ManifestReader
before = kb("VmRSS:")
try:
    ManifestReader({out!r}, 0, {ws}, 0, verify={verify})
    outcome = "ok"
except Exception as e:
    outcome = f"{{type(e).__name__}}: {{e}}"
print(json.dumps({{"grew_mb": (kb("VmHWM:") - before) / 1024, "outcome": outcome}}))
"""


def _reader_in_a_box(out: Path, ws: int = 2, verify: bool = True) -> tuple[float, str]:
    """(MB the peak RSS grew, outcome) of ``ManifestReader(out, 0, ws, 0)`` under a 2 GiB address space."""
    code = _MEASURE.format(cap=2 << 30, out=str(out), ws=ws, verify=verify)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["grew_mb"], result["outcome"]


STEPS = [7, 3 * 10**8, 10**12, 2**40, 2**62]


@pytest.mark.parametrize("consistent", [False, True])
@pytest.mark.parametrize("steps", STEPS)
def test_a_forged_steps_per_epoch_costs_one_line_not_an_allocation(
    built: Path, tmp_path: Path, steps: int, consistent: bool
) -> None:
    """Alone, or with counts a careful forger made agree (planned = steps x W x B, accepted to match)."""
    CASES["readers"] += 1
    out = _copy(built, tmp_path / "out")

    def forge(m: dict) -> None:
        m["steps_per_epoch"][0] = steps
        if consistent:
            m["counts"]["planned"][0] = steps * 4
            m["counts"]["accepted"] = m["counts"]["scanned"] = steps * 4
            m["counts"]["rejected"] = 0

    _edit(out, forge)
    with pytest.raises(ValueError) as info:
        ManifestReader(out, 0, 2, 0)
    assert "\n" not in str(info.value)
    assert any(w in str(info.value) for w in ("steps_per_epoch", "malformed", "counts.planned")), info.value
    if steps >= 10**12:
        grew, outcome = _reader_in_a_box(out)
        assert outcome.startswith("ValueError") and grew < 64, (grew, outcome)


def test_a_forged_plan_step_costs_one_line_not_an_allocation(built: Path, tmp_path: Path) -> None:
    CASES["readers"] += 1
    out = _copy(built, tmp_path / "out")
    rel = schemas.plan_file(0, 0)
    t = pq.read_table(out / rel)
    step = np.full(t.num_rows, 2**31 - 1, dtype=np.int32)
    pq.write_table(t.set_column(t.schema.get_field_index("step"), "step", pa.array(step)), out / rel)
    grew, outcome = _reader_in_a_box(out, verify=False)
    assert "malformed" in outcome and grew < 64, (grew, outcome)


@pytest.mark.parametrize(("key", "value"), [("world_size", 1), ("world_size", 3), ("world_size", 4), ("world_size", 8),
                                            ("batch_size", 1), ("batch_size", 3), ("batch_size", 4)])  # fmt: skip
def test_forged_plan_shapes_are_refused_by_the_rows(
    built: Path, tmp_path: Path, key: str, value: int
) -> None:
    CASES["readers"] += 1
    out = _copy(built, tmp_path / "out")
    _edit(out, lambda m: m.update({key: value}))
    ws = value if key == "world_size" else 2
    with pytest.raises(ValueError) as info:
        ManifestReader(out, 0, ws, 0)
    assert "\n" not in str(info.value)
    if (key, value) == ("world_size", 1):  # the issue's case: every row says 4 samples a step
        assert "global_count 4" in str(info.value) and "world_size 1" in str(info.value)


@pytest.fixture(scope="module")
def budget(bins: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("budget") / "out"
    assert cli_main(["build", str(bins), str(out), *PLAN, "--strategy", "budget", *BEAM_TEST_FLAGS]) == 0
    return out


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_forged_world_size_of_a_budget_plan_is_refused(
    budget: Path, tmp_path: Path, world_size: int
) -> None:
    CASES["readers"] += 1
    out = _copy(budget, tmp_path / "out")
    assert len(ManifestReader(out, 0, 2, 0)) > 0
    _edit(out, lambda m: m.update(world_size=world_size))
    with pytest.raises(ValueError, match="global_count|rank-steps|malformed"):
        ManifestReader(out, 0, world_size, 0)


PLAN_COPIES: dict[str, tuple[Callable[[Path], None], str, type]] = {
    "epoch_00_copy": (lambda o: shutil.copytree(o / "plan/epoch-0", o / "plan/epoch-00"), "plan/epoch-00/rank-0", ValueError),
    "rank_00_copy": (lambda o: shutil.copytree(o / "plan/epoch-0/rank-0", o / "plan/epoch-0/rank-00"), "rank-00", ValueError),
    "second_part": (lambda o: shutil.copy(o / schemas.plan_file(0, 0), o / "plan/epoch-0/rank-0/part-00001.parquet"), "part-00001", ValueError),
    "unplanned_epoch": (lambda o: shutil.copytree(o / "plan/epoch-1", o / "plan/epoch-7"), "plan/epoch-7", ValueError),
    "truncated": (lambda o: (o / schemas.plan_file(1, 1)).write_bytes((o / schemas.plan_file(1, 1)).read_bytes()[:-9]), "rank-1", ValueError),
    "grown": (lambda o: (o / schemas.plan_file(0, 1)).write_bytes((o / schemas.plan_file(0, 1)).read_bytes() + b"\0"), "rank-1", ValueError),
    "deleted": (lambda o: (o / schemas.plan_file(1, 0)).unlink(), "epoch-1/rank-0", FileNotFoundError),
}  # fmt: skip


@pytest.mark.parametrize("case", PLAN_COPIES)
def test_plan_dataset_reads_only_what_the_manifest_lists(built: Path, tmp_path: Path, case: str) -> None:
    CASES["readers"] += 1
    out = _copy(built, tmp_path / "out")
    want = sum(load_manifest(out).counts.planned)
    assert plan_dataset(out).count_rows() == want
    make, named, error = PLAN_COPIES[case]
    make(out)
    with pytest.raises(error, match=named):
        plan_dataset(out).count_rows()


def _forge_part(out: Path, column: str, value: object, rehash: bool) -> None:
    rel = schemas.samples_part(0)
    t = pq.read_table(out / rel)
    values = t.column(column).to_pylist()
    values[0] = value
    pq.write_table(
        t.set_column(t.schema.get_field_index(column), column, pa.array(values, t.schema.field(column).type)),
        out / rel,
    )
    if rehash:
        data = (out / rel).read_bytes()
        _edit(
            out,
            lambda m: m["files"].update(
                {rel: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
            ),
        )


FORGED_PATHS = [
    "../../secret/secret.bin",
    "/etc/shadow",
    "samples/../../x.bin",
    "..",
    "a/../../b",
    "s3://bucket/x.bin",
]


@pytest.mark.parametrize("columns", [None, ["path"], ["sample_id", "path"]])
@pytest.mark.parametrize("rehash", [False, True])
@pytest.mark.parametrize("forged", FORGED_PATHS)
def test_read_samples_refuses_rewritten_paths(
    built: Path, tmp_path: Path, forged: str, rehash: bool, columns: list[str] | None
) -> None:
    CASES["readers"] += 1
    out = _copy(built, tmp_path / "out")
    _forge_part(out, "path", forged, rehash)
    with pytest.raises(ValueError) as info:
        read_samples(out, columns)
    message = str(info.value)
    assert "\n" not in message
    assert ("not relative to path_root" in message) if rehash else ("modified after the build" in message)
    with pytest.raises(ValueError, match="not relative to path_root"):
        read_samples(out, columns, verify=False)  # the path rules hold whatever the user waives


@pytest.mark.parametrize("forged", [["../../x.bin"], ["/abs/x.bin"]])
def test_read_samples_refuses_rewritten_sweep_paths(built: Path, tmp_path: Path, forged: list[str]) -> None:
    CASES["readers"] += 1
    out = _copy(built, tmp_path / "out")
    _forge_part(out, "sweep_paths", forged, rehash=True)
    with pytest.raises(ValueError, match="sweep_paths .* not relative to path_root"):
        read_samples(out, ["sweep_paths"])


def test_read_samples_checks_sizes_even_for_one_column(built: Path, tmp_path: Path) -> None:
    CASES["readers"] += 1
    out = _copy(built, tmp_path / "out")
    part = out / schemas.samples_part(0)
    part.write_bytes(part.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="not the .* recorded in _manifest.json"):
        read_samples(out, ["sample_id"])
    part.unlink()
    with pytest.raises(FileNotFoundError, match="listed in _manifest.json but missing"):
        read_samples(out, ["sample_id"])


def test_the_trainer_dataset_refuses_a_rewritten_samples_part(built: Path, tmp_path: Path) -> None:
    """The issue's case: PointCloudDataset(OUT)[0] followed a rewritten '../../secret/secret.bin'."""
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset

    CASES["readers"] += 1
    out = _copy(built, tmp_path / "out")
    _forge_part(out, "path", "../../secret/secret.bin", rehash=False)
    with pytest.raises(ValueError, match="modified after the build"):
        PointCloudDataset(out)[0]
    _forge_part(out, "path", "../../secret/secret.bin", rehash=True)
    with pytest.raises(ValueError, match="not relative to path_root"):
        PointCloudDataset(out)[0]


# ---------------------------------------------------------------------------------------- plan size

GRID = [
    (rows, mean, factor)
    for rows in (10, 10**3, 10**6, 10**8)
    for mean in (1.0, 10.0, 1000.0)
    for factor in (100.0, 1000.0)
]


@pytest.mark.parametrize("memory_gib", [1, 128])
def test_check_plan_size_refuses_exactly_what_cannot_fit(monkeypatch, memory_gib: int) -> None:
    monkeypatch.setattr(settings, "memory_bytes", lambda: memory_gib << 30)
    for rows, mean, factor in GRID:
        CASES["plan size"] += 1
        cfg = PlanConfig(world_size=2, batch_size=2, weights=(mean, mean), max_plan_factor=factor)
        entries = rows * min(mean, factor) + 4
        fits = entries * settings.PLAN_ENTRY_BYTES <= memory_gib << 30
        try:
            settings.check_plan_size(cfg, rows, "--from-samples S")
            refused = None
        except UsageError as e:
            refused = str(e)
        assert (refused is None) == fits, (rows, mean, factor, refused)
        assert refused is None or ("--from-samples S holds" in refused and "\n" not in refused)


@pytest.mark.parametrize(("epochs", "world_size", "ok"), [(1, 1 << 20, False), (10_000, 64, False), (10_000, 4096, False),
                                                        (1000, 64, True), (100, 1024, True), (1, 1 << 16, True)])  # fmt: skip
def test_a_manifest_too_large_to_read_is_refused(epochs: int, world_size: int, ok: bool) -> None:
    CASES["plan size"] += 1
    cfg = PlanConfig(world_size=world_size, batch_size=1, epochs=epochs)
    if ok:
        settings.check_plan_size(cfg)
    else:
        with pytest.raises(UsageError, match="plan files; _manifest.json would list them"):
            settings.check_plan_size(cfg)


def test_the_issue_case_a_billion_row_plan_is_refused_before_beam(
    scanned: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """--bucket-weights 1000 --max-plan-factor 1000: 1000 entries a sample; here the machine is made small
    instead of the samples large (12 samples, 64 KiB), which is the same arithmetic."""
    CASES["plan size"] += 2
    monkeypatch.setattr(settings, "memory_bytes", lambda: 64 << 10)
    samples = str(scanned / schemas.SAMPLES_DIR)
    flags = [
        "--bucket-weights",
        "1000",
        "--max-plan-factor",
        "1000",
        "--world-size",
        "2",
        "--batch-size",
        "2",
    ]
    _refused(
        ["build", str(tmp_path / "out"), "--from-samples", samples, *flags], capsys, "GiB to plan", "samples"
    )
    _refused(["build", str(tmp_path / "out"), "--from-samples", samples, "--world-size", "1024", "--batch-size", "1",
              "--epochs", "10000"], capsys, "plan files")  # fmt: skip
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------------------------- remote


_RELEASE = threading.Event()


def _wait(*_: object) -> None:
    """A store that never answers (a black-hole endpoint): every call waits until the test ends."""
    _RELEASE.wait(60)
    raise OSError("released")


def _refuse(*_: object) -> None:
    """A store whose endpoint refuses connections."""
    raise ConnectionRefusedError(111, "Connection refused")


@pytest.fixture
def stores(monkeypatch):
    for scheme, call in (("stallobj", _wait), ("refuseobj", _refuse)):
        monkeypatch.setitem(storage._REGISTERED, scheme, pafs.PyFileSystem(Handler.every_call(call)()))
    monkeypatch.setattr(checks, "REMOTE_TIMEOUT_S", 0.5)
    _RELEASE.clear()
    yield
    _RELEASE.set()


REMOTE_CALLS: dict[str, Callable[[str, Path], None]] = {
    "input": lambda uri, t: checks.check_input(uri),
    "out": lambda uri, t: checks.check_output(uri, [str(t / "in")]),
    "from_samples": lambda uri, t: checks.check_from_samples(uri),
    "temp_location": lambda uri, t: checks.check_locations([f"--temp_location={uri}"]),
    "staging_location": lambda uri, t: checks.check_locations([f"--staging_location={uri}"]),
}


@pytest.mark.parametrize("scheme", ["stallobj", "refuseobj", "nosuchfs"])
@pytest.mark.parametrize("call", REMOTE_CALLS)
def test_an_unreachable_store_fails_fast_in_one_line(stores, tmp_path: Path, call: str, scheme: str) -> None:
    CASES["remote"] += 1
    uri = f"{scheme}://bucket/data"
    with pytest.raises(UsageError) as info:  # a stalled store holds a call 60 s: its message shows the
        REMOTE_CALLS[call](uri, tmp_path)  # 0.5 s deadline answered instead (no wall-clock assertion)
    message = str(info.value)
    assert uri in message and "\n" not in message
    want = {
        "stallobj": "did not answer within 0.5 s",
        "refuseobj": "cannot be reached (ConnectionRefusedError",
    }
    assert want.get(scheme, "bucket/data") in message


def test_an_unreachable_store_through_the_cli(stores, bins: Path, tmp_path: Path, capsys) -> None:
    CASES["remote"] += 2
    _refused(["build", "stallobj://bucket/in", str(tmp_path / "out"), *PLAN], capsys, "did not answer")
    _refused(["scan", str(bins), "stallobj://bucket/out"], capsys, "stallobj://bucket/out", "did not answer")


@pytest.mark.timeout(60)  # a hang guard, not a measurement
def test_a_real_gs_bucket_answers_or_fails_within_the_deadline(monkeypatch) -> None:
    """No network here: Beam's GCS client would retry for 120 s; with one, the answer is a 404/403 line."""
    CASES["remote"] += 1
    monkeypatch.setattr(checks, "REMOTE_TIMEOUT_S", 1.0)  # either outcome is one line naming the URI
    with pytest.raises(UsageError) as info:
        checks.check_input("gs://lidarshard-no-such-bucket-for-tests/in")
    assert "\n" not in str(info.value)
    assert "gs://lidarshard-no-such-bucket-for-tests/in" in str(info.value)


def test_a_reachable_store_passes(monkeypatch, bins: Path) -> None:
    CASES["remote"] += 1
    monkeypatch.setattr(MemoryObjectStore, "objects", {})
    for f in sorted(bins.iterdir())[:3]:
        storage.write_bytes(f"memobj://bucket/in/{f.name}", f.read_bytes())
    checks.check_input("memobj://bucket/in")
    checks.check_output("memobj://bucket/out", ["memobj://bucket/in"])
    with pytest.raises(UsageError, match="is a file"):
        checks.check_input("memobj://bucket/in/0000.bin")
    with pytest.raises(UsageError, match="does not exist"):
        checks.check_input("memobj://bucket/nothing")


def test_zz_case_counts() -> None:
    """Prints the generated cases per family (run with -s); every one above passed to get here."""
    print("\nhostile publish cases:", dict(sorted(CASES.items())), "total", sum(CASES.values()))
