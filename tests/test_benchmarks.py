"""Every benchmark in ``benchmarks/`` at its smallest configuration, as a subprocess: it runs to the
end (exit 0) and its own consistency checks hold (the "same ..." / "identical" lines, counts that must
match). No timing is asserted: the figures a smoke run prints mean little at these sizes.

All are in the slow lane (``make test-slow``, and ``make bench`` first); one that needs an optional
package that is absent (torch, dask) is skipped, naming it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def bench(name: str, *args: str, cwd: Path, timeout: float = 240.0) -> str:
    """stdout of ``benchmarks/NAME.py ARGS`` run in ``cwd``; fails, showing the output, unless it exits 0."""
    cmd = [sys.executable, str(REPO / "benchmarks" / f"{name}.py"), *args]
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{name} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def floats(pattern: str, text: str) -> list[float]:
    """Every number the regex group of ``pattern`` matches in ``text`` (at least one)."""
    found = [float(v) for v in re.findall(pattern, text)]
    assert found, f"no {pattern!r} in:\n{text[-2000:]}"
    return found


#: Modules of ``benchmarks/`` that are not benchmarks: what the scripts share.
HELPERS = {"synthetic"}


def test_every_benchmark_has_a_smoke_test() -> None:
    source = Path(__file__).read_text()
    scripts = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if p.stem not in HELPERS)
    missing = [s for s in scripts if f'"{s}"' not in source and f"{s}.py" not in source]
    assert not missing, f"benchmarks without a smoke test here: {missing}"


# ------------------------------------------------------------------ planning (numpy only, seconds)


def test_balance_bench(tmp_path: Path) -> None:
    out = bench("balance_bench", "--smoke", cwd=tmp_path)
    assert "target balanced within 0.005 of the reference" in out
    assert "budget with speeds: min" in out and "budget / balanced:" in out
    # Every linearity in the main table (reference and the seven strategies) is a share of the ideal.
    table = re.findall(r"^(?:logn\S+|synth)\s+\d+\s+\d+\s+\d+((?:\s+[\d.]+){8})\s", out, re.M)
    assert table and all(0.0 < float(v) <= 1.0 for row in table for v in row.split())


def test_peer_bench(tmp_path: Path) -> None:
    """Every sampler of the peer table on tiny pools: each figure a share, both verdict counts printed."""
    out = bench("peer_bench", "--smoke", "--json-out", str(tmp_path / "p.json"), cwd=tmp_path)
    rows = json.loads((tmp_path / "p.json").read_text())
    assert rows and {r["n"] for r in rows} == {1250, 1248}
    for r in rows:
        for name in ("drivingsdk", "verl", "fairseq", "megabatch", "random", "mixed", "auto", "rebalance"):
            assert 0.0 < r[name][0] <= 1.0
        assert r["rebalance"][1] == pytest.approx(1.0)  # random's steps: random's pair repeat
    assert len(floats(r"Pareto-ahead of the best peer .*: (\d+) of \d+ cells", out)) == 2


def test_elastic_bench(tmp_path: Path) -> None:
    out = bench("elastic_bench", "--samples", "4096", cwd=tmp_path)
    lin = floats(r"linearity ([\d.]+), greedy reference", out)
    assert len(lin) == 2 and all(0.0 < v <= 1.0 for v in lin)


def test_randomness_bench(tmp_path: Path) -> None:
    out = bench("randomness_bench", "--quick", "--seeds", "1", cwd=tmp_path)
    lin = floats(r"\w+: linearity ([\d.]+) at [\d.]+x random's pair repeat", out)
    assert all(0.0 < v <= 1.0 for v in lin)
    assert re.search(r"random: linearity [\d.]+ at 1\.00x random's pair repeat", out)


def test_tables_bench(tmp_path: Path) -> None:
    out = bench("tables_bench", "--keyframes", "200", cwd=tmp_path)
    assert floats(r"ratio for 4x the records: ([\d.]+)", out)[0] > 0


def test_calibration_bench(tmp_path: Path) -> None:
    out = bench("calibration_bench", "--samples", "400", "--world-size", "4", cwd=tmp_path)
    for workload in ("point-based", "attention-like"):
        row = re.search(rf"^{workload}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", out, re.M)
        assert row, out
        assert all(0.0 < float(v) <= 1.0 for v in row.groups())


# ------------------------------------------------------------------ the scan and the build


def test_scan_bench_rows_match_the_plain_script(tmp_path: Path) -> None:
    args = ("--files", "6", "--points", "2000", "--repeat", "1", "--runner", "fnapi")
    assert "same feature rows: True" in bench("scan_bench", *args, cwd=tmp_path)


def test_merge_bench_writes_the_bytes_of_the_gather(tmp_path: Path) -> None:
    out = bench("merge_bench", "--sizes", "2000", "--sweeps", "2", "--part-rows", "1024", cwd=tmp_path)
    row = re.search(r"^\s+2000\s.*\s(\d+)\s+(True|False)\s*$", out, re.M)
    assert row, out
    assert int(row.group(1)) >= 2 and row.group(2) == "True"  # several parts, each byte-identical


def test_plan_bench_keeps_every_sample(tmp_path: Path) -> None:
    args = ("--sizes", "2000", "--baseline", "0", "--sweeps", "2", "--runners", "fnapi")
    out = bench("plan_bench", *args, cwd=tmp_path)
    assert "samples written 2000 of 2000: True" in out


def test_integrity_bench(tmp_path: Path) -> None:
    args = ("--scenes", "1", "--keyframes", "2", "--sweeps", "1", "--repeat", "1")
    out = bench("integrity_bench", *args, cwd=tmp_path)
    assert floats(r"scan time ratio hashed / not hashed: ([\d.]+)", out)[0] > 0
    assert re.search(r"validate --data: [\d.]+ s", out)


def test_layout_bench(tmp_path: Path) -> None:
    out = bench("layout_bench", "--frames", "2", "--repeat", "1", cwd=tmp_path)  # asserts equal totals
    for layout in ("av2", "semantickitti", "waymo_v2", "nuscenes"):
        assert re.search(rf"^{layout}\s+2\s", out, re.M), out


# ------------------------------------------------------------------ the trainer's data path


def test_loader_bench_points_are_bit_identical(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ("--scenes", "1", "--keyframes", "4", "--repeat", "1", "--no-cold")  # one step: W=2 x B=2
    out = bench("loader_bench", *args, cwd=tmp_path)
    assert "numpy arrays bit-identical to lidarshard's: True" in out


def test_remote_bench_delivers_every_sample(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = bench("remote_bench", "--scenes", "1", "--keyframes", "2", "--delay-ms", "2", cwd=tmp_path)
    assert "every run delivered the same 2 samples: True" in out


def test_worker_memory_bench(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = bench("worker_memory_bench", "--samples", "2000", cwd=tmp_path)
    assert len(re.findall(r"^worker \d+: steps \d+\.\.\d+: USS", out, re.M)) == 2, out


def test_timing_bench_records_every_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ("--steps", "5", "--rounds", "1", "--points", "256", "--channels", "8")
    out = bench("timing_bench", *args, cwd=tmp_path)
    assert re.search(r"^recorded 5 rows", out, re.M), out


# ------------------------------------------------------------------ training and Dask


def test_ddp_bench(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = bench("ddp_bench", "--fixture", "--fixture-samples", "16", "--epochs", "1", cwd=tmp_path)
    for sampler in ("distributed", "lidarshard"):
        lin = floats(rf"sampler={sampler} world_size=2 epochs=1 \S+ linearity=([\d.]+)", out)
        assert all(0.0 < v <= 1.0 for v in lin)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("batch", ["1", "2"])
def test_ddp_bench_closed_loop(tmp_path: Path, batch: str) -> None:
    """The six samplers of ``--closed-loop`` on 8 samples (B=1: spconv's UNet at 1 m voxels when it is
    installed, else the example's MLP; B=2: the MLP): the JSON holds them all, each figure is a share,
    DrivingSDK's fixed buckets repeat every pair (B=1: P - 1 times random's rate), rebalance holds random's
    steps (B=1: it is random), identical work predicts 1.0."""
    pytest.importorskip("torch")
    spconv = batch == "1" and importlib.util.find_spec("spconv") is not None
    backbone = ["--backbone", "spconv", "--train-args", "--voxel-size 1.0"] if spconv else []
    args = ("--fixture", "--fixture-samples", "8", "--closed-loop", "--batch-size", batch, *backbone)
    out = bench("ddp_bench", *args, "--json-out", str(tmp_path / "r.json"), cwd=tmp_path, timeout=880)
    result = json.loads((tmp_path / "r.json").read_text())
    assert list(result) == ["distributed", "drivingsdk", "default", "calibrated", "rebalance", "identical"]
    for r in result.values():
        assert 0.0 < r["measured_linearity"] <= 1.0 and 0.0 < r["predicted_linearity"] <= 1.0
        assert r["epoch_s"] > 0 and r["steps_per_epoch"] == 8 // (2 * int(batch))
    assert result["identical"]["pair_repeat"] is None
    assert result["identical"]["predicted_linearity"] == pytest.approx(1.0)
    if batch == "1":  # a step holds one bucket, and buckets never change: every pair repeats
        assert result["drivingsdk"]["pair_repeat"] == pytest.approx(8 - 1)
    assert len(re.findall(r"^(?:PASS|MISS) ", out, re.M)) == 5, out


def test_gpu_cost_scatter_backbone(tmp_path: Path) -> None:
    """The plain-torch backbone (spconv is not a dependency: ``--backbone spconv`` is not run here)."""
    pytest.importorskip("torch")
    args = ("--scenes", "1", "--sweeps", "1", "--repeats", "1", "--backbone", "scatter")
    out = bench("gpu_cost", *args, "--json-out", str(tmp_path / "r.json"), cwd=tmp_path)
    assert re.search(r"R\^2", out), out


@pytest.mark.timeout(1800)
def test_gpu_check_smoke(tmp_path: Path) -> None:
    """The GPU check at smoke size on the CPU: both backbone sizes, every plan, the floor; no memory on a CPU."""
    pytest.importorskip("torch")
    out = bench("gpu_check", "--smoke", "--json-out", str(tmp_path / "g.json"), cwd=tmp_path, timeout=1780)
    result = json.loads((tmp_path / "g.json").read_text())
    assert [r["size"] for r in result["results"]] == ["small", "mink"]
    for res in result["results"]:
        assert {(r["B"], r["plan"]) for r in res["rows"]} >= {(1, "random"), (2, "rebalance"), (2, "auto")}
        for r in res["rows"]:
            assert 0.0 < r["measured"] <= 1.0 and 0.0 < r["floor"] <= 1.0 and r["batch_ms"] > 0
    assert "no peak bytes on this device" in out or result["device"] != "cpu"


def test_dask_multi_output_repro(tmp_path: Path) -> None:
    """The reference runner gets both outputs and both sinks right; the verdict matches the exit code
    (1 while apache-beam's DaskRunner still has the bugs lidarshard works around)."""
    pytest.importorskip("distributed")
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "dask_multi_output_repro.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    want = "FnApiRunner: multi-output ParDo: even [0, 2, 4, 6, 8]  odd [1, 3, 5, 7, 9];  sinks that ran: first second"
    assert want in r.stdout, r.stdout + r.stderr[-3000:]
    agrees = "DaskRunner agrees with FnApiRunner" in r.stdout
    assert agrees or "BUG: DaskRunner differs from FnApiRunner" in r.stdout
    assert r.returncode == (0 if agrees else 1)


@pytest.mark.timeout(900)
def test_accuracy_bench(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ("--scenes", "4", "--val-scenes", "2", "--keyframes", "2", "--sweeps", "1", "--epochs", "1")
    args += ("--seeds", "0", "--strategies", "mixed", "--plot", str(tmp_path / "a.png"))
    out = bench("accuracy_bench", *args, "--workdir", str(tmp_path / "w"), cwd=tmp_path, timeout=600)
    final = dict(re.findall(r"^(distributed|mixed)\s+([\d.]+) ± [\d.]+\s", out, re.M))
    assert set(final) == {"distributed", "mixed"}, out  # a final mIoU for each sampler run
    assert all(0.0 <= float(v) <= 1.0 for v in final.values())


def test_plan_bench_compares_step_groups(tmp_path: Path) -> None:
    args = ("--sizes", "2000", "--baseline", "0", "--runners", "fnapi", "--plan-groups", "1,3")
    out = bench("plan_bench", *args, cwd=tmp_path)
    assert (
        "fnapi/g1 samples written 2000 of 2000: True" in out
        and "fnapi/g3 samples written 2000 of 2000: True" in out
    )
    assert re.search(
        r"fnapi/g3/fnapi/g1: time [\d.]+x, largest process [\d.]+x, tree [\d.]+x; output of another G", out
    )


def test_groups_bench(tmp_path: Path) -> None:
    args = (
        "--n",
        "20000",
        "--groups",
        "1,4",
        "--strategies",
        "mixed",
        "--world-size",
        "8",
        "--batch-size",
        "2",
    )
    out = bench("groups_bench", *args, "--group-size", "4096", cwd=tmp_path)
    assert out.count(": True") == 4 and ": False" not in out  # every plan holds its pools' samples once
    assert re.search(r"^\s+mixed\s+1\s.*\+0\.0000 \+0\.00000\s+0$", out, re.M)  # G=1 is its own reference
    assert floats(r"target .* worst ([\d.]+) (?:MET|MISSED)", out)[0] >= 0
    assert floats(r"one group of 4,096 samples \(mixed\): ([\d.]+) s", out)[0] > 0


@pytest.mark.timeout(900)
def test_speeds_bench(tmp_path: Path) -> None:
    """Equal ranks (no burner: the suite's other tests share the cores), the smallest plan: the learned
    speeds, the three linearities and run B's predicted against measured seconds are printed and consistent."""
    pytest.importorskip("torch")
    args = ("--samples", "24", "--batch-size", "1", "--no-burner", "--train-args", "--width 32")
    out = bench("speeds_bench", *args, "--json-out", str(tmp_path / "r.json"), cwd=tmp_path, timeout=600)
    checks = re.findall(r"^check: (.*): (\S+)$", out, re.M)
    assert len(checks) == 3 and all(v == "ok" for _, v in checks), out
    linearities = [float(v) for v in re.findall(r"^  run [AB] epoch \d, .*: +([\d.]+)$", out, re.M)]
    assert len(linearities) == 4 and all(0.0 < v <= 1.0 for v in linearities), out  # A: 0, 1; B: 0, 1
    assert re.search(r"^run B epoch 0: predicted [\d.]+ s, measured [\d.]+ s", out, re.M), out


def test_validate_bench(tmp_path: Path) -> None:
    """plan_bench's build of 20,000 rows, validated: its row of figures and the cores line are printed."""
    out = bench("validate_bench", "--smoke", cwd=tmp_path, timeout=600.0)
    assert re.search(r"^\s+20000\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d+\s+[\d.]+$", out, re.M), out
    assert "cores used at 20000:" in out
