"""Planning at scale: ``lidarshard build --from-samples`` on N synthetic feature rows.

    python benchmarks/plan_bench.py [--sizes 250000,1000000,5000000] [--sweeps 0] [--workers 2]
        [--runners direct,dask] [--plan-groups 1,4]

For each N, writes a ``samples.parquet`` of N rows (``lidarshard.schemas.sample_schema()``, nuScenes-like
paths, voxel counts drawn like ``balance_bench``'s 10-sweep costs; ``--sweeps`` sweep paths and
transforms per row; the writer settings of ``lidarshard scan``), then runs

    lidarshard build OUT --from-samples samples.parquet --world-size 64 --batch-size 2 --epochs 1
        --runner=DirectRunner --direct_running_mode=multi_processing --direct_num_workers=2

in a child process and measures wall time and peak memory: the largest single-process RSS
(``wait4``) and the peak of the summed RSS of the whole process tree (launcher + Beam workers,
sampled every 0.1 s; the largest process as sampled is printed too). ``--runners direct,dask`` runs each build on the DirectRunner and with
``--runner=dask`` (Beam's DaskRunner on a LocalCluster the launcher starts: its worker processes
are in the tree), prints their ratios and checks that both wrote the same bytes. ``--plan-groups 1,4``
builds each N with each ``--plan-groups`` (hierarchical planning, issue 38) on every runner and prints
each G's ratios to the first G's (largest process, tree); only builds of one G are compared byte for byte. A first run on ``--baseline`` rows shows the fixed cost (interpreters,
Beam start-up). Prints a table, the log-log slopes of time and memory against N over all sizes
and between consecutive sizes (1.0 = linear; the fixed cost pulls slopes below 1 at small N),
and the issue #4 target: 1M rows in <= 60 s and <= 2 GiB on 2 cores; with ``--plan-groups auto``, issue 38's:
the largest process grows <= 15% from 1M to 4M and <= 5% from 4M to 10M.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lidarshard import schemas
from lidarshard.transforms.io.arrow import ParquetStream

TARGET_N, TARGET_S, TARGET_GIB = 1_000_000, 60.0, 2.0
#: Issue #16: at 1M rows every process <= 1 GiB and the tree <= 2 GiB; at 10M every process
#: <= 2.5 GiB within 15 min, with log-log slopes of time and memory from 1M to 10M <= 1.1.
SCALE = {1_000_000: (1.0, 2.0, None), 10_000_000: (2.5, None, 900.0)}
SCALE_SLOPE = 1.1
#: Issue 38 (planning in step groups, ``--plan-groups auto``): the largest process grows <= 15% from 1M to
#: 4M and stays flat (<= 5% more) from 4M to 10M.
FLAT = ((1_000_000, 4_000_000, 0.15), (4_000_000, 10_000_000, 0.05))
GIB = 1 << 30
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _strings(prefix: str, ids: pa.Array, suffix: str) -> pa.Array:
    """``prefix + zero-padded id + suffix`` for every id, vectorized (no Python loop over rows)."""
    text = pc.utf8_lpad(pc.cast(ids, pa.string()), 10, "0")
    return pc.binary_join_element_wise(pa.scalar(prefix), text, pa.scalar(suffix), "")


def synth_samples(n: int, sweeps: int, seed: int = 0, start: int = 0, integrity: bool = True) -> pa.Table:
    """(n rows) of ``lidarshard.schemas.sample_schema()`` sorted by sample_id, with realistic sizes;
    ids ``start .. start + n - 1`` (consecutive chunks make one sorted table).

    occupied_voxels: 2.5% single-frame (~25k), the rest 4x-7x that by scene type with ~10%
    spread (``balance_bench.synth_costs``); num_points ~ 34,688 per frame times (1 + sweeps).
    Every row is of one INPUT (``dataset`` "nuscenes") and one frame per file; ``integrity``: each
    file's size and a CRC-32 recorded as the scan records them, else those columns null (rows as
    schema 3.0 had them, to compare with figures measured before 3.1).
    """
    rng = np.random.default_rng([seed, start])
    idx = pa.array(np.arange(start, start + n, dtype=np.int64))
    single = rng.random(n) < 0.025
    mult = np.linspace(4.0, 7.0, 8)[rng.choice(8, n, p=rng.dirichlet(np.full(8, 2.0)))]
    voxels = (25_000.0 * np.where(single, 1.0, mult) * rng.lognormal(0.0, 0.1, n)).astype(np.int64)
    points = (34_688 * (1 + sweeps) * rng.uniform(0.9, 1.0, n)).astype(np.int64)
    root = "/data/nuscenes/"
    flat = _strings(
        root + "sweeps/LIDAR_TOP/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__",
        pa.array(np.arange(start * sweeps, (start + n) * sweeps, dtype=np.int64)),
        ".pcd.bin",
    )
    offsets = pa.array(
        np.arange(0, n * sweeps + 1, max(sweeps, 1))[: n + 1] if sweeps else np.zeros(n + 1, np.int32),
        pa.int32(),
    )
    eye = np.tile(np.eye(4).ravel(), n * sweeps)
    per_file = points // (1 + sweeps) * 20  # nuScenes .pcd.bin: 5 float32 a point
    cols = {
        "sample_id": _strings("sample-", idx, ""),
        "path": _strings(
            root + "samples/LIDAR_TOP/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__", idx, ".pcd.bin"
        ),
        "sweep_paths": pa.ListArray.from_arrays(offsets, flat),
        "sweep_transforms": pa.ListArray.from_arrays(
            pa.array(np.asarray(offsets) * 16, pa.int32()), pa.array(eye)
        ),
        "label_path": pa.nulls(n, pa.string()),
        "format": pa.array(np.full(n, "nuscenes_bin", dtype=object), pa.string()),
        "file_bytes": pa.array(per_file * (1 + sweeps)),
        "num_points": pa.array(points),
        "num_finite": pa.array(points),
        "num_in_range": pa.array((points * 0.93).astype(np.int64)),
        "occupied_voxels": pa.array(voxels),
        "num_sweeps": pa.array(np.full(n, sweeps, dtype=np.int32)),
        "has_labels": pa.array(np.zeros(n, dtype=bool)),
    }
    for axis, half in (("x", 50.0), ("y", 50.0), ("z", 3.0)):
        lo, hi = -half * rng.uniform(0.8, 1.0, n), half * rng.uniform(0.8, 1.0, n)
        cols |= {f"{axis}_min": lo, f"{axis}_max": hi, f"{axis}_p01": lo * 0.9, f"{axis}_p99": hi * 0.9}
    cols |= _recorded(rng, per_file, offsets, integrity) | {
        "dataset": pa.array(["nuscenes"] * n, pa.string())
    }
    schema = schemas.sample_schema()
    return pa.Table.from_arrays(
        [pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema],
        schema=schema,
    )


def _recorded(
    rng: np.random.Generator, per_file: np.ndarray, offsets: pa.Array, integrity: bool
) -> dict[str, pa.Array]:
    """The integrity columns of rows whose files (keyframe and each sweep) hold ``per_file`` bytes
    (shape (n,)): sizes and random CRC-32s, or nothing (the caller fills nulls) without ``integrity``.
    No label files: ``label_bytes`` / ``label_crc32`` stay null, as the scan leaves them."""
    if not integrity:
        return {}
    n, flat = len(per_file), np.repeat(per_file, np.diff(np.asarray(offsets)))
    crc = rng.integers(0, 1 << 32, n + len(flat), dtype=np.int64)
    return {
        "path_bytes": pa.array(per_file),
        "path_crc32": pa.array(crc[:n]),
        "sweep_bytes": pa.ListArray.from_arrays(offsets, pa.array(flat)),
        "sweep_crc32": pa.ListArray.from_arrays(offsets, pa.array(crc[n:])),
    }


def write_samples(path: Path, n: int, sweeps: int, chunk: int = 1_000_000, integrity: bool = True) -> None:
    """``synth_samples`` of ``n`` rows written to ``path`` ``chunk`` rows at a time (10M rows with 9
    sweeps would not fit in memory at once), in a child process: ``wait4``'s peak RSS of a child
    counts the parent's at fork, so the benchmark process itself must stay small."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from plan_bench import _write_chunks; "
        "_write_chunks(sys.argv[2], *map(int, sys.argv[3:]))"
    )
    here = str(Path(__file__).resolve().parent)
    args = [str(path), str(n), str(sweeps), str(chunk), str(int(integrity))]
    subprocess.run([sys.executable, "-c", code, here, *args], check=True)


def _write_chunks(path: str, n: int, sweeps: int, chunk: int, integrity: int = 1) -> None:
    with open(path, "wb") as sink, ParquetStream(sink, schemas.sample_schema()) as out:
        for start in range(0, n, chunk):
            out.write(synth_samples(min(chunk, n - start), sweeps, start=start, integrity=bool(integrity)))


def _tree_rss(root: int) -> dict[int, int]:
    """{pid: RSS bytes} of ``root`` and all its descendants, from /proc."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        rss[int(entry)] = int(fields[21]) * _PAGE
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        tree[pid] = rss.get(pid, 0)
        todo += [c for c, p in parent.items() if p == pid]
    return tree


def measure(cmd: list[str], timeout: float) -> dict[str, float]:
    """Run ``cmd``; wall s, peak single-process RSS (``wait4``; and as sampled), peak process-tree
    RSS (bytes) and the number of processes seen in the tree."""
    log = tempfile.TemporaryFile()  # not a pipe: a full pipe would block the child
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    peak_tree = peak_proc = 0
    seen: set[int] = set()
    status, usage = 0, None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        tree = _tree_rss(proc.pid)
        peak_tree, peak_proc = max(peak_tree, sum(tree.values())), max(peak_proc, *tree.values())
        seen |= set(tree)
        if time.perf_counter() - t0 > timeout:
            os.killpg(proc.pid, 9)
            os.wait4(proc.pid, 0)
            raise TimeoutError(f"{cmd[:4]} ran past {timeout} s")
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    log.seek(0)
    out = log.read().decode(errors="replace")
    log.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}):\n{out[-4000:]}")
    return {
        "wall_s": wall,
        "max_rss": usage.ru_maxrss * 1024,
        "proc_rss": peak_proc,
        "tree_rss": peak_tree,
        "procs": len(seen),
    }


def slope(ns: list[int], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(N)."""
    return float(np.polyfit(np.log(ns), np.log(ys), 1)[0]) if len(ns) > 1 else float("nan")


def _runner_flags(name: str, workers: int) -> list[str]:
    if name == "direct":
        return [
            "--runner=DirectRunner",
            "--direct_running_mode=multi_processing",
            f"--direct_num_workers={workers}",
        ]
    if name == "dask":
        return ["--runner=dask"]  # a LocalCluster of this machine's default size
    if name == "fnapi":
        return ["--runner=FnApiRunner"]  # in the launcher's process: the quickest start (smoke runs)
    raise ValueError(f"unknown runner {name!r}: direct, dask or fnapi")


def _tree_digest(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``root``."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h = hashlib.sha256()
            with open(p, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
            out[str(p.relative_to(root))] = h.hexdigest()
    return out


def _samples_rows(out: Path) -> int:
    """Rows of the samples parts a build wrote into ``out`` (from their Parquet footers)."""
    parts = sorted((out / schemas.SAMPLES_DIR).glob("*.parquet"))
    return sum(pq.read_metadata(p).num_rows for p in parts)


def _build(out: Path, samples: Path, flags: list[str], timeout: float) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-m",
        "lidarshard.pipelines.cli",
        "build",
        str(out),
        "--from-samples",
        str(samples),
    ]
    return measure([*cmd, "--world-size", "64", "--batch-size", "2", "--epochs", "1", *flags], timeout)


def _print_slopes(rows: list[tuple[int, dict]], label: str) -> None:
    if len(rows) < 2:
        return
    keys = (("time", "wall_s"), ("max RSS", "max_rss"), ("tree RSS", "tree_rss"))
    print(
        f"{label}: log-log slope vs N, least squares over the sizes: "
        + ", ".join(f"{name} {slope([n for n, _ in rows], [m[k] for _, m in rows]):.2f}" for name, k in keys)
    )
    for (n0, m0), (n1, m1) in zip(rows, rows[1:], strict=False):  # the fixed cost weighs less as N grows
        print(
            f"{label}: log-log slope {n0} -> {n1}: "
            + ", ".join(f"{name} {slope([n0, n1], [m0[k], m1[k]]):.2f}" for name, k in keys)
        )


def _print_scale_targets(rows: list[tuple[int, dict]], label: str) -> None:
    """Issue #16's targets for the sizes that were run."""
    got = dict(rows)
    for n, (proc, tree, secs) in SCALE.items():
        if n not in got:
            continue
        m = got[n]
        biggest = max(m["max_rss"], m["proc_rss"])
        checks = [
            f"every process {biggest / GIB:.2f} <= {proc} GiB: {'MET' if biggest <= proc * GIB else 'MISSED'}"
        ]
        if tree is not None:
            ok = m["tree_rss"] <= tree * GIB
            checks.append(f"tree {m['tree_rss'] / GIB:.2f} <= {tree} GiB: {'MET' if ok else 'MISSED'}")
        if secs is not None:
            checks.append(f"{m['wall_s']:.0f} <= {secs:.0f} s: {'MET' if m['wall_s'] <= secs else 'MISSED'}")
        print(f"{label} target at {n}: " + "; ".join(checks))
    if all(n in got for n in SCALE):
        (a, ma), (b, mb) = ((n, got[n]) for n in SCALE)
        for name, key in (("time", "wall_s"), ("max RSS", "max_rss"), ("tree RSS", "tree_rss")):
            k = slope([a, b], [ma[key], mb[key]])
            print(
                f"{label} target slope {name} {a} -> {b}: {k:.2f} <= {SCALE_SLOPE}: {'MET' if k <= SCALE_SLOPE else 'MISSED'}"
            )


def _print_flat_targets(rows: list[tuple[int, dict]], label: str) -> None:
    """Issue 38's targets for the pairs of sizes that were run (the largest process: ``wait4``'s or the
    sampled one, whichever is larger)."""
    got = {n: max(m["max_rss"], m["proc_rss"]) for n, m in rows}
    for a, b, limit in FLAT:
        if a in got and b in got:
            grew = got[b] / got[a] - 1
            print(
                f"{label} target largest process {a} -> {b}: {got[a] / GIB:.2f} -> {got[b] / GIB:.2f} GiB, "
                f"{grew:+.1%} <= {limit:+.0%}: {'MET' if grew <= limit else 'MISSED'}"
            )


def _print_target(n: int, m: dict) -> None:
    if n == TARGET_N:
        ok = m["wall_s"] <= TARGET_S and m["tree_rss"] <= TARGET_GIB * GIB
        print(
            f"target 1M rows <= {TARGET_S:.0f} s and <= {TARGET_GIB:.0f} GiB: {m['wall_s']:.1f} s, "
            f"{m['tree_rss'] / GIB:.2f} GiB (whole tree) -> {'MET' if ok else 'MISSED'}"
        )


def _same_g(name: str, runners: dict[str, list[str]]) -> str:
    """The first runner label of ``name``'s G (labels ``runner`` or ``runner/gG``)."""
    g = name.partition("/")[2]
    return next(r for r in runners if r.partition("/")[2] == g)


def _one_size(
    n: int, work: Path, runners: dict[str, list[str]], args: argparse.Namespace, rows: dict[str, list]
) -> bool:
    """Write ``n`` sample rows, build them on every runner (appending each one's measures to ``rows``)
    and print a line per build; whether every build kept all ``n`` samples and all wrote the same bytes."""
    t = time.perf_counter()
    path = work / f"samples-{n}.parquet"
    write_samples(path, n, args.sweeps, integrity=not args.no_integrity)  # as scan/build write it
    wrote = time.perf_counter() - t
    outputs, ok = {}, True
    for name, flags in runners.items():
        out = work / f"out-{n}-{name}"
        m = _build(out, path, flags, args.timeout)
        rows[name].append((n, m))
        print(
            f"{n:>9} {name:>6} {wrote:>8.1f} {path.stat().st_size / 1e6:>8.1f} {m['wall_s']:>8.1f} "
            f"{n / m['wall_s']:>9.0f} {m['max_rss'] / GIB:>11.2f} {m['proc_rss'] / GIB:>7.2f} "
            f"{m['tree_rss'] / GIB:>12.2f} {m['procs']:>5}",
            flush=True,
        )
        outputs[name] = _tree_digest(out)
        kept = _samples_rows(out)
        ok &= kept == n
        print(f"{n:>9} {name:>6} samples written {kept} of {n}: {kept == n}", flush=True)
        if not args.workdir:  # --workdir keeps them (e.g. to time `lidarshard validate` alone)
            shutil.rmtree(out, ignore_errors=True)
    if not args.workdir:
        path.unlink()
    if len(outputs) < 2:
        return ok
    same = all(outputs[o] == outputs[_same_g(o, runners)] for o in outputs)  # one G's builds: same bytes
    ms = {name: rows[name][-1][1] for name in runners}
    first, *rest = runners
    for other in rest:
        print(
            f"{n:>9} {other}/{first}: time {ms[other]['wall_s'] / ms[first]['wall_s']:.2f}x, "
            f"largest process {ms[other]['max_rss'] / ms[first]['max_rss']:.2f}x, "
            f"tree {ms[other]['tree_rss'] / ms[first]['tree_rss']:.2f}x; "
            "output "
            + (
                ("byte-identical" if same else "DIFFERS")
                if _same_g(other, runners) == first
                else "of another G"
            ),
            flush=True,
        )
    return ok and same


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="250000,1000000,5000000", help="comma-separated N")
    ap.add_argument("--baseline", type=int, default=4096, help="rows of the fixed-cost run (0: none)")
    ap.add_argument("--sweeps", type=int, default=0, help="sweep paths per row (0: single-frame files)")
    ap.add_argument("--workers", type=int, default=2, help="--direct_num_workers")
    ap.add_argument(
        "--runners", default="direct", help="comma-separated: direct, dask, fnapi (default direct)"
    )
    ap.add_argument(
        "--plan-groups", default="", help="comma-separated --plan-groups values (default: the build's)"
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per build before it is killed")
    ap.add_argument("--workdir", help="keep inputs/outputs here (default: a temp dir, removed)")
    ap.add_argument(
        "--no-integrity",
        action="store_true",
        help="rows without file sizes and CRC-32s (as schema 3.0 rows: to compare with figures measured before 3.1)",
    )
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    sizes = ([args.baseline] if args.baseline else []) + sizes
    runners = {name: _runner_flags(name, args.workers) for name in args.runners.split(",")}
    if args.plan_groups:  # one label per runner and G: "direct/g4"
        gs = args.plan_groups.split(",")
        runners = {f"{r}/g{g}": [*flags, "--plan-groups", g] for g in gs for r, flags in runners.items()}
    work = Path(args.workdir or tempfile.mkdtemp(prefix="plan_bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"plan_bench: W=64 B=2 epochs=1, sweeps/row {args.sweeps}; direct = DirectRunner multi_processing x{args.workers}"
    )
    print(
        f"{'N':>9} {'runner':>6} {'write s':>8} {'file MB':>8} {'build s':>8} {'rows/s':>9} "
        f"{'max RSS GiB':>11} {'sampled':>7} {'tree RSS GiB':>12} {'procs':>5}"
    )
    rows: dict[str, list[tuple[int, dict]]] = {name: [] for name in runners}
    ok = True
    try:
        for n in sizes:
            ok &= _one_size(n, work, runners, args, rows)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    for name, got in rows.items():
        _print_slopes(got[1:] if args.baseline else got, name)
        for n, m in got:
            _print_target(n, m)
        _print_scale_targets(got, name)
        if name.endswith("/gauto"):
            _print_flat_targets(got, name)
    print("(1.0 = linear; N log N from 1M to 5M is 1.07)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
