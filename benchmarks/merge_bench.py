"""The scan's last step at scale: its rows gathered in one process vs merged from hash shards.

    python benchmarks/merge_bench.py [--sizes 250000,1000000] [--sweeps 9]

``lidarshard scan`` (and ``build`` from INPUT) used to gather every feature row into one task
(``ConcatRows``), sort it and write samples.parquet from that table: memory grew with N times the
row width (paths, 9 sweep paths and transforms: ~2 KB a sample). It now writes each of
``SCAN_SHARDS`` hash shards of sample_id as a sorted scratch file and streams them through one
k-way merge (``transforms.features.shards.write_merged``).

For each N this writes the shard files of ``plan_bench.synth_samples`` rows (in a child process,
1M rows at a time), then runs, each in a fresh child process:

- gather (the old way, as a lower bound: Arrow tables, not the Python rows ``ConcatRows`` held):
  read every shard file into one table, sort by sample_id, write samples.parquet;
- merge: ``write_merged`` of the same shard files.

Prints wall time and peak RSS (``wait4``) of each, their ratios, whether both wrote the same bytes,
and the log-log slope of the merge's time and memory against N (0 = flat, 1 = linear).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lidarshard import schemas
from lidarshard.transforms.arrow import parquet_bytes
from lidarshard.transforms.features import shards

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_bench import GIB, measure, slope, synth_samples  # noqa: E402

HERE = str(Path(__file__).resolve().parent)


def write_shards(where: Path, n: int, sweeps: int, chunk: int = 1_000_000) -> list[str]:
    """``synth_samples`` of ``n`` rows dealt to their ``shard_of`` files (each sorted by id, row groups
    of ``SHARD_GROUP_ROWS``); the shard file paths, by shard number."""
    where.mkdir(parents=True, exist_ok=True)
    writers: dict[int, pq.ParquetWriter] = {}
    for start in range(0, n, chunk):
        table = synth_samples(min(chunk, n - start), sweeps, start=start)
        shard = pa.array([shards.shard_of(s) for s in table.column("sample_id").to_pylist()], pa.int32())
        for s in pc.unique(shard).to_pylist():
            if s not in writers:
                writers[s] = pq.ParquetWriter(where / f"{s:04d}.parquet", table.schema, compression="none")
            writers[s].write_table(table.filter(pc.equal(shard, s)), row_group_size=shards.SHARD_GROUP_ROWS)
    for w in writers.values():
        w.close()
    return [str(where / f"{s:04d}.parquet") for s in sorted(writers)]


def gather(paths: list[str], out: str) -> None:
    """The old way: one table of every row, sorted, written at once."""
    table = pa.concat_tables(pq.read_table(p) for p in paths).sort_by("sample_id")
    Path(out).write_bytes(parquet_bytes(table.cast(schemas.sample_schema())))


def merge(paths: list[str], out: str) -> None:
    """The scan's way now: a streaming k-way merge."""
    with open(out, "wb") as sink:
        shards.write_merged(paths, lambda p: open(p, "rb"), sink)


def _child(step: str, listing: str, out: str) -> list[str]:
    code = f"import sys; sys.path.insert(0, {HERE!r}); import merge_bench as m; " + (
        f"m.{step}(open(sys.argv[1]).read().split(), sys.argv[2])"
    )
    return [sys.executable, "-c", code, listing, out]


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            h.update(block)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="250000,1000000", help="comma-separated row counts")
    ap.add_argument("--sweeps", type=int, default=9, help="sweep paths per row")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    print(f"{'N':>9}  {'gather s':>8} {'GiB':>5}  {'merge s':>7} {'GiB':>5}  time x  mem x  same bytes")
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="merge-bench-") as tmp:
            code = (
                f"import sys; sys.path.insert(0, {HERE!r}); import merge_bench as m; "
                "print(' '.join(m.write_shards(m.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))))"
            )
            listing = Path(tmp, "shards.txt")
            found = subprocess.run(
                [sys.executable, "-c", code, f"{tmp}/shards", str(n), str(args.sweeps)],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            listing.write_text(found)
            old = measure(_child("gather", str(listing), f"{tmp}/gather.parquet"), args.timeout)
            new = measure(_child("merge", str(listing), f"{tmp}/merge.parquet"), args.timeout)
            same = _digest(f"{tmp}/gather.parquet") == _digest(f"{tmp}/merge.parquet")
        rows.append((n, new))
        print(
            f"{n:>9}  {old['wall_s']:>8.1f} {old['max_rss'] / GIB:>5.2f}  {new['wall_s']:>7.1f} "
            f"{new['max_rss'] / GIB:>5.2f}  {new['wall_s'] / old['wall_s']:>6.2f} "
            f"{new['max_rss'] / old['max_rss']:>6.2f}  {same}"
        )
    if len(sizes) > 1:
        ns = [n for n, _ in rows]
        print(
            f"merge slopes over N: time {slope(ns, [m['wall_s'] for _, m in rows]):.2f}, "
            f"memory {slope(ns, [m['max_rss'] for _, m in rows]):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
