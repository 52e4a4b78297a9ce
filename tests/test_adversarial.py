"""Issue #7's adversarial corpus through the real CLI: every hostile input is rejected with its reason,
nothing hangs, nothing is lost (scanned = accepted + rejected), and no pickle anywhere in the project."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines import build as build_cli
from lidarshard.pipelines import publish as _output
from lidarshard.pipelines import scan as scan_cli
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.tools.validate import validate
from tests.adversarial import FILE_FLAGS, TABLES_VERSION, Corpus, write_file_corpus, write_tables_corpus
from tests.helpers import BEAM_TEST_FLAGS, REPO

pytestmark = pytest.mark.hostile("files and cli")


def _outputs(out: Path) -> tuple[dict, list[dict], list[dict]]:
    meta = json.loads(
        (
            out / (schemas.MANIFEST_FILE if (out / schemas.MANIFEST_FILE).exists() else schemas.SCAN_FILE)
        ).read_text()
    )
    return (
        meta,
        pq.read_table(out / schemas.SAMPLES_DIR).to_pylist(),
        pq.read_table(out / schemas.REJECTS_FILE).to_pylist(),
    )


def _check(corpus: Corpus, out: Path) -> None:
    meta, samples, rejects = _outputs(out)
    got = {r["path"]: r["reason"] for r in rejects}
    assert got == corpus.rejects
    assert sorted(s["sample_id"] for s in samples) == sorted(corpus.good)
    assert all(r["reason"] in schemas.REJECT_REASONS and r["detail"] for r in rejects)
    c = meta["counts"]
    assert (c["scanned"], c["accepted"], c["rejected"]) == (
        corpus.scanned,
        len(corpus.good),
        len(corpus.rejects),
    )
    assert validate(str(out))[0] == []


@pytest.fixture(scope="module")
def file_corpus(tmp_path_factory) -> Corpus:
    return write_file_corpus(tmp_path_factory.mktemp("adversarial") / "in")


def test_file_corpus_through_build(file_corpus: Corpus, tmp_path: Path) -> None:
    out = tmp_path / "out"
    flags = ["--world-size", "2", "--batch-size", "2", "--max-reject-fraction", "1", *FILE_FLAGS]
    assert cli_main(["build", str(file_corpus.root), str(out), *flags, *BEAM_TEST_FLAGS]) == 0
    _check(file_corpus, out)
    assert len(file_corpus.rejects) >= 30


def test_tables_corpus_through_scan(tmp_path: Path) -> None:
    corpus = write_tables_corpus(tmp_path / "root")
    out = tmp_path / "out"
    flags = ["--nuscenes-version", TABLES_VERSION, "--sweeps", "1", "--max-reject-fraction", "1"]
    assert cli_main(["scan", str(corpus.root), str(out), *flags, *BEAM_TEST_FLAGS]) == 0
    _check(corpus, out)
    assert sorted(set(corpus.rejects.values())) == [
        "absurd_coordinates", "bad_table", "duplicate_id", "label_mismatch", "missing_file",
        "missing_sweep", "outside_root",
    ]  # fmt: skip
    _, samples, _ = _outputs(out)
    assert all(p.startswith(f"{corpus.root}/") for s in samples for p in [s["path"], *s["sweep_paths"]])


def test_a_lone_surrogate_in_a_table_fails_with_a_clear_message(tmp_path: Path) -> None:
    corpus = write_tables_corpus(tmp_path / "root", good=2)
    table = corpus.root / TABLES_VERSION / "sample_data.json"
    table.write_text(table.read_text().replace('good00.pcd.bin"', 'good00\\udcff.pcd.bin"', 1))
    flags = ["--nuscenes-version", TABLES_VERSION, "--max-reject-fraction", "1"]
    with pytest.raises(Exception, match="holds a lone UTF-16 surrogate escape"):
        scan_cli.run([str(corpus.root), str(tmp_path / "out"), *flags, *BEAM_TEST_FLAGS])
    assert not (tmp_path / "out").exists()


def test_too_many_rejects_fail_the_build_and_keep_the_previous_output(
    file_corpus: Corpus, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / schemas.MANIFEST_FILE).write_text('{"previous": true}')
    (out / schemas.SUCCESS_FILE).write_bytes(b"")
    n, bad = file_corpus.scanned, len(file_corpus.rejects)
    flags = ["--world-size", "2", "--batch-size", "2", *FILE_FLAGS]  # default --max-reject-fraction 0.01
    with pytest.raises(
        Exception, match=rf"{bad} of {n} inputs rejected \(> --max-reject-fraction 0.01\): .*bad_header: 19"
    ):
        build_cli.run([str(file_corpus.root), str(out), *flags, *BEAM_TEST_FLAGS])
    assert sorted(os.listdir(out)) == [schemas.SUCCESS_FILE, schemas.MANIFEST_FILE]
    assert (out / schemas.MANIFEST_FILE).read_text() == '{"previous": true}'
    assert sorted(os.listdir(tmp_path)) == ["out", "out.rejects.parquet"]  # the rejects, beside OUT


def _symlink_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(6):
        (root / f"ok{i}.bin").write_bytes(rng.normal(size=(100, 4)).astype(np.float32).tobytes())
    os.symlink("b.bin", root / "a.bin")  # a -> b -> a
    os.symlink("a.bin", root / "b.bin")
    os.symlink("self.bin", root / "self.bin")
    os.symlink("nowhere.bin", root / "dangling.bin")
    os.symlink("ok0.bin", root / "alias.bin")  # a healthy link is read like a file
    (root / "sub").mkdir()
    os.symlink("..", root / "sub" / "up")  # a directory loop: never followed
    return root


@pytest.mark.timeout(120)
def test_symlink_loops_never_hang_and_accounting_holds(tmp_path: Path) -> None:
    inp = _symlink_dir(tmp_path / "in")
    out = tmp_path / "out"
    assert cli_main(["scan", str(inp), str(out), "--max-reject-fraction", "1", *BEAM_TEST_FLAGS]) == 0
    meta, samples, rejects = _outputs(out)
    assert sorted(s["sample_id"] for s in samples) == ["alias.bin"] + [f"ok{i}.bin" for i in range(6)]
    c = meta["counts"]
    assert c["scanned"] == c["accepted"] + c["rejected"] == len(samples) + len(rejects)


def test_symlink_loops_are_rejected_with_a_reason(tmp_path: Path) -> None:
    inp = _symlink_dir(tmp_path / "in")
    out = tmp_path / "out"
    assert cli_main(["scan", str(inp), str(out), "--max-reject-fraction", "1", *BEAM_TEST_FLAGS]) == 0
    _, _, rejects = _outputs(out)
    got = {os.path.basename(r["path"]): r["reason"] for r in rejects}
    assert got == {
        "a.bin": "unreadable",
        "b.bin": "unreadable",
        "self.bin": "unreadable",
        "dangling.bin": "unreadable",
    }


_PICKLE = re.compile(
    r"^\s*(import|from)\s+(c?pickle|dill|cloudpickle|joblib)\b|\b(c?pickle|dill|cloudpickle)\.\w|allow_pickle\s*=\s*True|read_pickle",
    re.M,
)


def test_no_pickle_anywhere_in_the_project() -> None:
    hits = []
    for package in ("pipelines", "transforms", "schemas", "loaders", "tools"):
        for path in sorted((REPO / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            hits += [
                f"{path.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0).strip()}"
                for m in _PICKLE.finditer(text)
            ]
    assert hits == [], "pickle is not allowed (metadata is JSON, schemas are data):\n" + "\n".join(hits)
    assert (
        _PICKLE.search("import pickle\n")
        and _PICKLE.search("x = pickle.loads(b)")
        and _PICKLE.search("np.load(f, allow_pickle=True)")
    )


def test_output_module_leaves_no_trace_after_a_failed_run(file_corpus: Corpus, tmp_path: Path) -> None:
    """A run that fails before commit discards its staging directory (nothing to recover later)."""
    out = tmp_path / "never"
    with pytest.raises(Exception, match="inputs rejected"):
        scan_cli.run([str(file_corpus.root), str(out), *FILE_FLAGS, *BEAM_TEST_FLAGS])
    assert not out.exists() and not _output.leftovers(str(out))
    assert os.listdir(tmp_path) == ["never.rejects.parquet"]
