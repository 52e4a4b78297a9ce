"""``lidarshard validate`` alone on plan_bench's outputs, against reading every Parquet file it checks.

    python benchmarks/validate_bench.py [--sizes 1000000,4000000] [--sweeps 9] [--workdir DIR]

For each N, the manifest of ``plan_bench.py --sizes N --sweeps S --workdir DIR`` (W=64 B=2, built first when
``DIR/out-N-direct`` is absent) is validated in a child process (``lidarshard validate OUT``): wall time, peak
RSS (``wait4``) and the CPU time it used over its wall time (how many cores it kept busy). The baseline, in
the same run and in a child process of its own, reads every Parquet file ``_manifest.json`` lists, whole
(pyarrow, warm: once first to fill the page cache). Prints the ratio of validate's time to the read's, and
issue 51's targets: at 1M, validate <= 4x the read; peak memory flat (<= 15% more) from the smallest N to
the largest; every core used (CPU time / wall >= cores - 0.5). ``--smoke`` builds and validates 20,000 rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from plan_bench import measure  # noqa: E402  (the same child-process measure plan_bench uses)

#: Issue 51: validate <= 4x the time of reading every Parquet file of the manifest at 1M samples, peak
#: memory flat within 15% from 1M to 4M.
TARGET_RATIO, TARGET_N, FLAT = 4.0, 1_000_000, 0.15
_READ = """
import json, sys, pyarrow.parquet as pq
out = sys.argv[1]
for rel in sorted(json.load(open(out + "/_manifest.json"))["files"]):
    pq.read_table(out + "/" + rel)
"""


def _out(work: Path, n: int, sweeps: int) -> Path:
    """plan_bench's manifest of ``n`` rows under ``work``, built when absent."""
    out = work / f"out-{n}-direct"
    if not (out / "_SUCCESS").exists():
        cmd = [sys.executable, str(HERE / "plan_bench.py"), "--sizes", str(n), "--sweeps", str(sweeps)]
        subprocess.run(
            [*cmd, "--baseline", "0", "--workdir", str(work)], check=True, stdout=subprocess.DEVNULL
        )
    return out


def _timed(cmd: list[str], timeout: float) -> dict[str, float]:
    """``measure`` of ``cmd`` plus the CPU seconds its process used (user + system)."""
    before = os.times()
    got = measure(cmd, timeout)
    after = os.times()
    got["cpu_s"] = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000000", help="comma-separated N (plan_bench's --sizes)")
    ap.add_argument("--sweeps", type=int, default=9, help="sweep paths per row (plan_bench's --sweeps)")
    ap.add_argument("--workdir", help="plan_bench's --workdir (default: a temp dir, removed)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per child before it is killed")
    ap.add_argument("--smoke", action="store_true", help="20,000 rows, 1 sweep: the smoke test's size")
    args = ap.parse_args(argv)
    sizes = [20_000] if args.smoke else [int(s) for s in args.sizes.split(",")]
    sweeps = 1 if args.smoke else args.sweeps
    work = Path(args.workdir or tempfile.mkdtemp(prefix="validate_bench-"))
    cores = os.cpu_count() or 1
    print(f"validate_bench: W=64 B=2, sweeps/row {sweeps}, {cores} cores, load {os.getloadavg()[0]:.2f}")
    print(f"{'N':>9} {'read s':>7} {'validate s':>10} {'ratio':>6} {'peak MiB':>9} {'cores used':>10}")
    rows = []
    try:
        for n in sizes:
            out = _out(work, n, sweeps)
            read = [sys.executable, "-c", _READ, str(out)]
            measure(read, args.timeout)  # warm the page cache
            t_read = _timed(read, args.timeout)
            lidarshard = shutil.which("lidarshard", path=os.path.dirname(sys.executable)) or "lidarshard"
            t_val = _timed([lidarshard, "validate", str(out)], args.timeout)
            ratio = t_val["wall_s"] / t_read["wall_s"]
            used = t_val["cpu_s"] / t_val["wall_s"]
            rows.append((n, ratio, t_val["max_rss"], used))
            print(f"{n:>9} {t_read['wall_s']:>7.2f} {t_val['wall_s']:>10.2f} {ratio:>6.2f} "
                  f"{t_val['max_rss'] / 2**20:>9.0f} {used:>10.2f}", flush=True)  # fmt: skip
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"(load {os.getloadavg()[0]:.2f} at the end)")
    for n, ratio, _, used in rows:
        if n == TARGET_N:
            print(f"target at {n}: validate <= {TARGET_RATIO}x the read: {ratio:.2f}x -> "
                  f"{'MET' if ratio <= TARGET_RATIO else 'MISSED'}")  # fmt: skip
        print(f"cores used at {n}: {used:.2f} of {cores} -> {'MET' if used >= cores - 0.5 else 'MISSED'}")
    if len(rows) > 1:
        grew = rows[-1][2] / rows[0][2] - 1
        print(
            f"peak memory {rows[0][0]} -> {rows[-1][0]}: {grew:+.1%} -> {'MET' if grew <= FLAT else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    start = time.perf_counter()
    code = main()
    print(f"validate_bench: {time.perf_counter() - start:.0f} s")
    sys.exit(code)
