"""``lidarshard report``: files produced, the recomputed random baseline, timings, optional matplotlib."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.tools import plots as report_plots
from lidarshard.tools import report
from tests.helpers import build_bins_manifest

PNG = b"\x89PNG\r\n\x1a\n"
FIGURES = ["sizes.png", "step_balance.png", "rank_totals.png", "buckets.png", "rejects.png"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_bins_manifest(tmp_path_factory.mktemp("report"), 60, world_size=3, batch_size=2)


def test_report_writes_html_and_pngs_outside_the_contract(built: Path, capsys) -> None:
    before = {p: p.read_bytes() for p in built.rglob("*") if p.is_file()}
    assert cli_main(["report", str(built)]) == 0
    printed = capsys.readouterr().out
    assert "epoch 0: linearity" in printed and "(random " in printed and "truncated 1" in printed
    folder = built / report.REPORT_DIR
    page = (folder / "report.html").read_text()
    for name in FIGURES:
        assert (folder / name).read_bytes()[:8] == PNG
        assert f'src="{name}"' in page
    assert "predicted_vs_measured" not in page
    assert {p: p.read_bytes() for p in before} == before  # nothing of the manifest changed
    files = json.loads((built / schemas.MANIFEST_FILE).read_text())["files"]
    assert not any(rel.startswith(report.REPORT_DIR + "/") for rel in files)
    assert cli_main(["validate", str(built)]) == 0  # a report beside the manifest is not tampering


def test_recomputed_random_baseline_matches_the_manifest(built: Path) -> None:
    data = report.load(str(built))
    m = data.manifest
    for e, bal in enumerate(m.balance):
        assert data.chosen[e].shape == data.baseline[e].shape == (bal.steps, m.world_size)
        for loads, key in ((data.chosen[e], "linearity"), (data.baseline[e], "random_linearity")):
            lin = loads.mean(axis=1).sum() / loads.max(axis=1).sum()
            assert lin == pytest.approx(bal.value(key), abs=1e-6)
        assert data.chosen[e].sum() == pytest.approx(data.baseline[e].sum())  # same pool
    assert data.reasons == {"truncated": 1}


def _step_timings(out: Path, path: Path) -> None:
    """Per-rank per-step ms of epoch 1 (no epoch column: --epoch picks it), 2 ms per predicted unit."""
    rows = []
    for rank in range(3):
        t = pq.read_table(out / schemas.plan_file(1, rank)).to_pydict()
        for step in sorted(set(t["step"])):
            cost = sum(c for c, s in zip(t["cost"], t["step"], strict=True) if s == step)
            rows.append([step, rank, 0.5 + 2e-3 * cost])
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([["step", "rank", "ms"], *rows])


def test_report_with_timings_shows_predicted_vs_measured(built: Path, tmp_path: Path, capsys) -> None:
    _step_timings(built, tmp_path / "t.csv")
    dest = tmp_path / "rep"
    args = ["report", str(built), "--timings", str(tmp_path / "t.csv"), "--epoch", "1"]
    assert cli_main([*args, "--output-dir", str(dest)]) == 0
    printed = capsys.readouterr().out
    assert "rows matched (rank-step); predicted vs measured r^2 1.000" in printed
    lin = json.loads((built / schemas.MANIFEST_FILE).read_text())["balance"][1]["linearity"]
    assert "epoch 1: measured linearity 0.9" in printed and f"(predicted {lin:.3f})" in printed
    assert (dest / "predicted_vs_measured.png").read_bytes()[:8] == PNG
    assert 'src="predicted_vs_measured.png"' in (dest / "report.html").read_text()


def test_report_refuses_a_directory_that_is_not_a_manifest(tmp_path: Path, capsys) -> None:
    assert cli_main(["report", str(tmp_path)]) == 1
    assert "_SUCCESS" in capsys.readouterr().err


def test_plots_need_matplotlib_and_say_which_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "lidarshard\[report\]"'):
        report_plots.rejects_by_reason({})


def test_plots_handle_edge_cases() -> None:
    counts = np.random.default_rng(0).integers(0, 3, size=(400, 20))  # many steps, many buckets
    assert report_plots.bucket_composition(counts, 0)[:8] == PNG
    assert report_plots.rejects_by_reason({})[:8] == PNG
    one = np.full(5, 7.0)  # every sample the same cost: one bucket, no edges
    assert report_plots.size_histogram(one, np.zeros(5, np.int32), np.empty(0), "points")[:8] == PNG


def test_report_with_recorder_files_shows_measured_idle_and_max_mean(
    built: Path, tmp_path: Path, capsys
) -> None:
    from lidarshard.loaders.step_timer import StepTimer

    for rank in range(3):
        t = pq.read_table(built / schemas.plan_file(1, rank)).to_pydict()
        with StepTimer(str(tmp_path / "timings"), rank=rank, world_size=3, device="cpu") as timer:
            for step in sorted(set(t["step"])):
                ids = [i for i, s in zip(t["sample_id"], t["step"], strict=True) if s == step]
                cost = sum(c for c, s in zip(t["cost"], t["step"], strict=True) if s == step)
                timer.record(1, step, ids, (0.5 + 2e-3 * cost) / 1000)
    dest = tmp_path / "rep"
    args = ["report", str(built), "--timings", str(tmp_path / "timings"), "--output-dir", str(dest)]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "rows matched (recorded rank-step); predicted vs measured r^2 1.000" in printed
    lin = json.loads((built / schemas.MANIFEST_FILE).read_text())["balance"][1]["linearity"]
    assert "epoch 1: measured linearity 0.9" in printed and f"(predicted {lin:.3f})" in printed
    assert "% idle; step max/mean measured 1.0" in printed
    assert (dest / "predicted_vs_measured.png").read_bytes()[:8] == PNG
    (line,) = [x for x in printed.splitlines() if "on the measured model" in x]
    found = re.search(r"this plan ([0-9.]+)% idle, a random plan ([0-9.]+)%", line)
    assert found and float(found[1]) < float(found[2]), line  # balance bought time on the measured model too
    assert (dest / "idle.png").read_bytes()[:8] == PNG


def test_every_epoch_is_plotted_and_no_empty_rejects_panel(tmp_path: Path, capsys) -> None:
    """Issue 39: the per-step figures of every epoch (or of --epoch alone), each captioned with its
    epoch; a manifest without rejects gets no rejects figure."""
    import pyarrow as pa

    import lidarshard

    n = 48
    ids = [f"s{i:02d}" for i in range(n)]
    costs = np.random.default_rng(3).lognormal(0.0, 0.6, n)
    table = pa.table({"sample_id": ids, "path": [f"/d/{i}.bin" for i in ids], "cost": costs})
    out = tmp_path / "m"
    lidarshard.write_manifest(table, str(out), 2, 2, epochs=3)
    assert cli_main(["report", str(out)]) == 0
    folder = out / report.REPORT_DIR
    names = {p.name for p in folder.iterdir()}
    per_epoch = {
        f"{stem}{tail}.png" for stem in ("step_balance", "buckets") for tail in ("", "-epoch-1", "-epoch-2")
    }
    assert per_epoch <= names and "rejects.png" not in names
    page = (folder / "report.html").read_text()
    assert all(f'src="{name}"' in page for name in per_epoch) and 'src="rejects.png"' not in page
    assert "<figcaption>Epoch 2: Slowest and mean rank load" in page
    assert cli_main(["report", str(out), "--epoch", "1", "--output-dir", str(tmp_path / "one")]) == 0
    one = {p.name for p in (tmp_path / "one").iterdir()}
    assert {"step_balance.png", "buckets.png"} <= one and not any("-epoch-" in name for name in one)
    capsys.readouterr()
