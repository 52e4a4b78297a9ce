"""The scan's last step at scale: its rows gathered in one process vs merged from hash shards.

    python benchmarks/merge_bench.py [--sizes 250000,1000000] [--sweeps 9] [--part-rows 262144]

``lidarshard scan`` (and ``build`` from INPUT) used to gather every feature row into one task
(``ConcatRows``), sort it and write samples.parquet from that table: memory grew with N times the
row width (paths, 9 sweep paths and transforms: ~2 KB a sample). It now writes each of
``SCAN_SHARDS`` hash shards of sample_id as a sorted scratch file, samples every ``key_stride``-th
id of each, cuts the id space into the samples parts' ranges (``split_keys``, ``key_ranges``) and
writes each part in its own task: a k-way merge of that range of every shard file
(``transforms.features.shards.write_range``).

For each N this writes the shard files of ``plan_bench.synth_samples`` rows (in a child process,
1M rows at a time), then runs, each in a fresh child process:

- merge: the sampled ids of every shard file (the scan keeps them from writing the shards; here
  they are read back, one column), the ranges, then ``write_range`` of each range into its part,
  one after another (the scan runs them in parallel tasks; the peak RSS here is that of the
  largest part's task, the time the sum of the tasks');
- gather (the old way, as a lower bound: Arrow tables, not the Python rows ``ConcatRows`` held):
  read every shard file into one table, sort by sample_id, write it as parts of the row counts the
  merge wrote (one file's bytes, cut the same way, so the parts can be compared byte for byte).

Prints wall time and peak RSS (``wait4``) of each, their ratios, the part count, whether both wrote
the same bytes (exit status 1 when they differ), and the log-log slope of the merge's time and memory
against N (0 = flat, 1 = linear).
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
from lidarshard.transforms.features import shards
from lidarshard.transforms.io.arrow import parquet_bytes
from lidarshard.transforms.io.parts import PART_ROWS
from lidarshard.transforms.plan import seeds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_bench import GIB, measure, slope, synth_samples  # noqa: E402

HERE = str(Path(__file__).resolve().parent)


def write_shards(where: Path, n: int, sweeps: int, chunk: int = 1_000_000) -> list[str]:
    """``synth_samples`` of ``n`` rows dealt to their ``seeds.scan_shard`` files (each sorted by id, row groups
    of ``SHARD_GROUP_ROWS``); the shard file paths, by shard number."""
    where.mkdir(parents=True, exist_ok=True)
    writers: dict[int, pq.ParquetWriter] = {}
    for start in range(0, n, chunk):
        table = synth_samples(min(chunk, n - start), sweeps, start=start)
        shard = pa.array(
            [seeds.scan_shard(s, shards.SCAN_SHARDS) for s in table.column("sample_id").to_pylist()],
            pa.int32(),
        )
        for s in pc.unique(shard).to_pylist():
            if s not in writers:
                writers[s] = pq.ParquetWriter(where / f"{s:04d}.parquet", table.schema, compression="none")
            writers[s].write_table(table.filter(pc.equal(shard, s)), row_group_size=shards.SHARD_GROUP_ROWS)
    for w in writers.values():
        w.close()
    return [str(where / f"{s:04d}.parquet") for s in sorted(writers)]


def _part(out: Path, k: int) -> Path:
    return out / schemas.part_name(k)


def gather(paths: list[str], out: str) -> None:
    """The old way: one table of every row, sorted, written at once (cut into parts of the row
    counts in ``out/rows.txt``, written by ``merge``)."""
    table = pa.concat_tables(pq.read_table(p) for p in paths).sort_by("sample_id")
    table = table.cast(schemas.sample_schema())
    first = 0
    for k, n in enumerate(int(r) for r in Path(out, "rows.txt").read_text().split()):
        _part(Path(out), k).write_bytes(parquet_bytes(table.slice(first, n)))
        first += n


def merge(paths: list[str], out: str, part_rows: int) -> None:
    """The scan's way now: sampled ids cut the id space into ranges, one streamed k-way merge a part.
    Writes each part's row count to ``out/rows.txt``."""
    stride = shards.key_stride(part_rows)
    keys = [
        k
        for p in paths  # a shard file is named by its shard number (``write_shards``)
        for k in shards.sampled_keys(pq.read_table(p, columns=["sample_id"]), stride, int(Path(p).stem))
    ]
    rows = []
    for k, (lo, hi) in enumerate(shards.key_ranges(shards.split_keys(keys, part_rows, stride))):
        with open(_part(Path(out), k), "wb") as sink:
            rows.append(shards.write_range(paths, lo, hi, lambda p: open(p, "rb"), sink)[0])
    Path(out, "rows.txt").write_text(" ".join(map(str, rows)))


def _child(step: str, listing: str, out: str, *extra: int) -> list[str]:
    """The command running ``step(shard paths in listing, out, *extra)`` in a fresh process."""
    code = f"import sys; sys.path.insert(0, {HERE!r}); import merge_bench as m; " + (
        f"m.{step}(open(sys.argv[1]).read().split(), sys.argv[2], *map(int, sys.argv[3:]))"
    )
    return [sys.executable, "-c", code, listing, out, *map(str, extra)]


def _digests(out: str) -> list[str]:
    """SHA-256 of each part file in ``out``, in part order."""
    found = []
    for path in sorted(Path(out).glob("part-*.parquet")):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 23):
                h.update(block)
        found.append(h.hexdigest())
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="250000,1000000", help="comma-separated row counts")
    ap.add_argument("--sweeps", type=int, default=9, help="sweep paths per row")
    ap.add_argument("--part-rows", type=int, default=PART_ROWS, help="rows a samples part aims at")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows, all_same = [], True
    print(
        f"{'N':>9}  {'gather s':>8} {'GiB':>5}  {'merge s':>7} {'GiB':>5}  time x  mem x  parts  same bytes"
    )
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
            for step in ("merge", "gather"):
                Path(tmp, step).mkdir()
            new = measure(_child("merge", str(listing), f"{tmp}/merge", args.part_rows), args.timeout)
            Path(tmp, "gather", "rows.txt").write_text(Path(tmp, "merge", "rows.txt").read_text())
            old = measure(_child("gather", str(listing), f"{tmp}/gather"), args.timeout)
            parts = _digests(f"{tmp}/merge")
            same = parts == _digests(f"{tmp}/gather") and len(parts) > 0
            all_same &= same
        rows.append((n, new))
        print(
            f"{n:>9}  {old['wall_s']:>8.1f} {old['max_rss'] / GIB:>5.2f}  {new['wall_s']:>7.1f} "
            f"{new['max_rss'] / GIB:>5.2f}  {new['wall_s'] / old['wall_s']:>6.2f} "
            f"{new['max_rss'] / old['max_rss']:>6.2f}  {len(parts):>5}  {same}"
        )
    if len(sizes) > 1:
        ns = [n for n, _ in rows]
        print(
            f"merge slopes over N: time {slope(ns, [m['wall_s'] for _, m in rows]):.2f}, "
            f"memory {slope(ns, [m['max_rss'] for _, m in rows]):.2f}"
        )
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
