"""transforms/beam/scan_transform.py: the ``ScanSamples`` composite on Beam's TestPipeline, dead letters included."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from lidarshard import schemas
from lidarshard.transforms.beam.scan_transform import ConcatRows, ScanSamples
from lidarshard.transforms.features.sample import ScanConfig
from lidarshard.transforms.features.shards import SCAN_SHARDS
from lidarshard.transforms.layouts import FILES, Dataset
from lidarshard.transforms.layouts.task import LayoutOptions
from lidarshard.transforms.plan.seeds import scan_shard
from tests.helpers import BEAM_TEST_FLAGS, make_bins


def _reasons(table: pa.Table) -> list[tuple[str, str]]:
    return list(zip(table.column("path").to_pylist(), table.column("reason").to_pylist(), strict=True))


def _scan(
    input_path: str, tmp: Path, want_ids: list[str], want_rejects: list[tuple[str, str]], part_rows: int = 2
) -> None:
    """Scan ``input_path`` with parts of ``part_rows`` rows: the parts hold ``want_ids`` in order."""
    work, parts = tmp / "work", tmp / schemas.SAMPLES_DIR
    n_parts = max(1, -(-len(want_ids) // part_rows))  # part_rows < 64: every id is sampled, the cut is exact
    sizes = [min(part_rows, len(want_ids) - k * part_rows) for k in range(n_parts)]
    with test_pipeline.TestPipeline(options=PipelineOptions(BEAM_TEST_FLAGS)) as p:
        dataset = Dataset("in", input_path, FILES)
        result = p | "Scan" >> ScanSamples(
            [dataset], LayoutOptions(), ScanConfig(), str(work), str(parts), part_rows
        )
        written = result.parts | "KRows" >> beam.Map(lambda part: part[:2])
        assert_that(written, equal_to(list(enumerate(sizes))), label="Parts")
        assert_that(result.rejects | "Why" >> beam.Map(_reasons), equal_to([want_rejects]), label="Rejects")
        assert_that(result.scanned, equal_to([len(want_ids) + len(want_rejects)]), label="Scanned")
    want_shards = {scan_shard(i, SCAN_SHARDS) for i in want_ids}
    assert len(list(work.glob("scan/shard=*.parquet"))) == len(want_shards)  # the scratch the caller removes
    assert sorted(p.name for p in parts.iterdir()) == [schemas.part_name(k) for k in range(n_parts)]
    ids = [
        pq.read_table(parts / schemas.part_name(k)).column("sample_id").to_pylist() for k in range(n_parts)
    ]
    assert [len(i) for i in ids] == sizes and sum(ids, []) == want_ids


def test_directory_scan_sends_a_bad_file_to_the_dead_letter_output(tmp_path: Path) -> None:
    root = make_bins(tmp_path / "in", n=4)
    (root / "empty.bin").write_bytes(b"")
    ids = [f"{i:04d}.bin" for i in range(4)]
    _scan(
        str(root),
        tmp_path,
        ids,
        [(str(root / "bad.bin"), "truncated"), (str(root / "empty.bin"), "empty")],
    )


def test_glob_scan_matches_files_and_rejects_through_the_same_output(tmp_path: Path) -> None:
    root = make_bins(tmp_path / "in", n=3)
    (root / "notes.txt").write_text("not a cloud")
    _scan(
        f"{root}/*.bin",
        tmp_path,
        [f"{i:04d}.bin" for i in range(3)],
        [(str(root / "bad.bin"), "truncated")],
        part_rows=1,
    )


def test_concat_rows_is_sorted_whatever_the_bundling() -> None:
    schema = pa.schema([("k", pa.string())])
    rows = [{"k": k} for k in "dcab"]
    with test_pipeline.TestPipeline(options=PipelineOptions(BEAM_TEST_FLAGS)) as p:
        out = p | beam.Create(rows, reshuffle=False) | beam.CombineGlobally(ConcatRows(schema, ("k",)))
        assert_that(out | beam.Map(lambda t: t.column("k").to_pylist()), equal_to([["a", "b", "c", "d"]]))
