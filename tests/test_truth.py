"""Every sentence that ``build``, ``validate`` and ``report`` print is held against what the manifest and its
files say: a fresh build, a ``--from-samples`` re-plan and a ``--replan-from`` re-plan of it.

Each printed line must match one of the templates below, and every number in it must equal the value
computed here from ``_manifest.json``, the samples and the plan files (never from the printing code).
A line no template knows fails the test: a new sentence needs its truth stated here.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines.cli import main
from tests.helpers import BEAM_TEST_FLAGS

PLAN = ["--world-size", "2", "--batch-size", "2", "--epochs", "2", "--seed", "3", *BEAM_TEST_FLAGS]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    """{kind: (OUT, the build's printed lines)} for a fresh build and its two re-plans."""
    tmp = tmp_path_factory.mktemp("truth")
    root, fresh = tmp / "dataroot", tmp / "fresh"
    assert main(["synth", str(root), "--scenes", "3", "--keyframes-per-scene", "5", "--seed", "1"]) == 0
    builds = {
        "fresh": [str(root), str(fresh), "--nuscenes-version", "v1.0-synth", "--sweeps", "2"],
        "from_samples": [str(tmp / "again"), "--from-samples", str(fresh / "samples")],
        "replan_from": [str(tmp / "replan"), "--from-samples", str(fresh / "samples"), "--replan-from", "1"],
    }
    out = {}
    for kind, args in builds.items():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["build", *args, *PLAN]) == 0
        out[kind] = (Path(args[0] if kind != "fresh" else args[1]), buf.getvalue().splitlines())
    return out


def _manifest(out: Path) -> dict:
    return json.loads((out / schemas.MANIFEST_FILE).read_text())


def _plan_rows(out: Path) -> int:
    return sum(pq.read_metadata(p).num_rows for p in (out / schemas.PLAN_DIR).rglob("*.parquet"))


def _plan_loads(out: Path, epoch: int, world: int) -> np.ndarray:
    """(steps, W) summed cost of each rank-step of ``epoch``, from the plan files."""
    t = pq.read_table(
        out / schemas.PLAN_DIR, filters=[("epoch", "=", epoch)], columns=["step", "rank", "cost"]
    )
    steps = pc.max(t["step"]).as_py() + 1
    loads = np.zeros((steps, world))
    np.add.at(loads, (t["step"].to_numpy(), t["rank"].to_numpy()), t["cost"].to_numpy())
    return loads


def _lin(loads: np.ndarray) -> float:
    return float(loads.mean(axis=1).sum() / loads.max(axis=1).sum())


#: (pattern, check(match, manifest, OUT)): the check asserts the line's numbers are the manifest's truth.
Template = tuple[str, Callable[[re.Match, dict, Path], None]]

_TITLES = {"nuscenes": "nuScenes dataroot"}


def _input(g: re.Match, m: dict, out: Path) -> None:
    (d,) = [d for d in m["datasets"] if d["name"] == g["name"]]
    assert _TITLES[d["layout"]] == g["title"] and d["root"] == g["root"]
    assert g["version"] == m["nuscenes_version"]
    assert int(g["sweeps"]) == m["sweeps"] > 0  # the samples' sweeps, in a re-plan too
    names = pq.read_table(out / schemas.SAMPLES_DIR, columns=["dataset", "num_sweeps"])
    assert int(g["accepted"]) == pc.sum(pc.equal(names["dataset"], g["name"])).as_py()
    assert pc.max(names["num_sweeps"]).as_py() == m["sweeps"]
    fewer = pc.sum(pc.less(names["num_sweeps"], m["sweeps"])).as_py()
    assert int(g["short"] or 0) == fewer > 0  # each scene's first keyframe: synth's chains start there
    assert g["unit"] in (None, "scene")


def _points(g: re.Match, m: dict, out: Path) -> None:
    """No row the samples count is a non-finite one: num_points counts only finite points."""
    counted = pq.read_table(out / schemas.SAMPLES_DIR, columns=["num_points", "num_finite"])
    assert pc.all(pc.equal(counted["num_points"], counted["num_finite"])).as_py()


def _counts(g: re.Match, m: dict, out: Path) -> None:
    k = m["counts"]
    assert (int(g["scanned"]), int(g["accepted"]), int(g["rejected"])) == (
        k["scanned"], k["accepted"], k["rejected"]
    )  # fmt: skip
    assert int(g["dropped"] or 0) == max(k["dropped"]) and min(k["dropped"]) == max(k["dropped"])


def _plan(g: re.Match, m: dict, out: Path) -> None:
    assert (g["strategy"], int(g["world"]), int(g["batch"])) == (
        m["strategy"],
        m["world_size"],
        m["batch_size"],
    )
    assert int(g["buckets"]) == len(m["buckets"]["counts"]) and g["model"] == m["cost_model"]["name"]


def _row(g: re.Match, m: dict, out: Path) -> None:
    b = m["balance"][int(g["epoch"])]
    assert int(g["steps"]) == b["steps"] == m["steps_per_epoch"][b["epoch"]]
    for key in ("linearity", "random_linearity", "greedy_reference"):
        assert float(g[key]) == round(b[key], 4)
    assert float(g["spearman_step_cost"]) == round(b["spearman_step_cost"], 3)
    assert float(g["mean"]) == round(b["mean_count"], 3) and int(g["max"]) == b["max_count"]
    assert abs(_lin(_plan_loads(out, b["epoch"], m["world_size"])) - b["linearity"]) < 1e-6


def _pairs(g: re.Match, m: dict, out: Path) -> None:
    assert float(g["rate"]) == round(m["pair_repeat_rate"][g["strategy"]], 4)
    assert float(g["random"]) == round(m["pair_repeat_rate"]["random"], 4)


def _buys(g: re.Match, m: dict, out: Path) -> None:
    b = m["balance"][int(g["epoch"])]
    ratio = b["random_linearity"] / b["linearity"]
    assert float(g["ratio"]) == round(ratio, 2) and int(g["less"]) == round(100 * (1 - ratio))
    assert float(g["wait"]) == round(100 * (1 - b["linearity"]), 1)
    assert float(g["rwait"]) == round(100 * (1 - b["random_linearity"]), 1)


def _wrote(g: re.Match, m: dict, out: Path) -> None:
    assert Path(g["out"]) == out and (out / schemas.SUCCESS_FILE).is_file()


def _ok(g: re.Match, m: dict, out: Path) -> None:
    k = m["counts"]
    assert (int(g["scanned"]), int(g["accepted"]), int(g["rejected"])) == (
        k["scanned"], k["accepted"], k["rejected"]
    )  # fmt: skip
    assert (int(g["world"]), int(g["batch"]), int(g["epochs"])) == (
        m["world_size"],
        m["batch_size"],
        m["epochs"],
    )
    assert int(g["rows"]) == _plan_rows(out)
    assert int(g["files"]) == len(list((out / schemas.PLAN_DIR).rglob("*.parquet")))


def _report_counts(g: re.Match, m: dict, out: Path) -> None:
    assert (int(g["accepted"]), int(g["rejected"])) == (m["counts"]["accepted"], m["counts"]["rejected"])
    assert int(g["buckets"]) == len(m["buckets"]["counts"]) and g["model"] == m["cost_model"]["name"]


def _report_plan(g: re.Match, m: dict, out: Path) -> None:
    assert (g["strategy"], int(g["world"]), int(g["batch"])) == (
        m["strategy"],
        m["world_size"],
        m["batch_size"],
    )
    assert int(g["epochs"]) == m["epochs"] and json.loads(g["steps"]) == m["steps_per_epoch"]


def _report_epoch(g: re.Match, m: dict, out: Path) -> None:
    b = m["balance"][int(g["epoch"])]
    loads = _plan_loads(out, b["epoch"], m["world_size"])
    assert float(g["lin"]) == round(b["linearity"], 3) == round(_lin(loads), 3)
    assert float(g["random"]) == round(b["random_linearity"], 3)
    assert float(g["worst"]) == round(1 / b["worst_step_linearity"], 2)
    totals = loads.sum(axis=0)
    assert float(g["spread"]) == round(100 * float(np.abs(totals / totals.mean() - 1).max()), 1)


_F = r"[-+]?[0-9.]+"
TEMPLATES: list[Template] = [
    (r"INPUT (?P<name>\S+): (?P<title>[^,]+), tables (?P<version>\S+), keyframe \+ (?P<sweeps>\d+) previous "
     r"sweeps \((?P<root>[^)]+)\): (?P<accepted>\d+) samples accepted"
     r"(, (?P<short>\d+) with fewer sweeps: their (?P<unit>\w+) starts sooner)?", _input),
    (r"points: a row with a NaN or infinite x, y or z is no point: not counted, not costed, not served to "
     r"training", _points),
    (r"scanned (?P<scanned>\d+): accepted (?P<accepted>\d+), rejected (?P<rejected>\d+)"
     r"(; (?P<dropped>\d+) dropped to fill whole steps \(--pad keeps them\))?", _counts),
    (r"plan: (?P<strategy>\w+), world size (?P<world>\d+), batch (?P<batch>\d+), (?P<buckets>\d+) buckets, "
     r"cost model (?P<model>\w+) \(columns: lidarshard build --help\)", _plan),
    (r"epoch\s+steps\s+linearity\s+random\s+greedy_reference\s+spearman\s+samples/rank-step mean max",
     lambda g, m, out: None),  # the table's header: its rows are held below
    (rf"\s*(?P<epoch>\d+)\s+(?P<steps>\d+)\s+(?P<linearity>{_F})\s+(?P<random_linearity>{_F})\s+"
     rf"(?P<greedy_reference>{_F})\s+(?P<spearman_step_cost>{_F})\s+(?P<mean>{_F})\s+(?P<max>\d+)", _row),
    (rf"pair repeat rate epoch 0->1: (?P<strategy>\w+) (?P<rate>{_F}), random (?P<random>{_F})", _pairs),
    (rf"epoch (?P<epoch>\d+): predicted time (?P<ratio>{_F})x a random plan's \((?P<less>\d+)% less time\): "
     rf"ranks wait (?P<wait>{_F})% of it instead of (?P<rwait>{_F})%", _buys),
    (r"wrote \S+/report/report.html", lambda g, m, out: None),
    (r"wrote (?P<out>.+)", _wrote),
    (r"OK (?P<out>\S+): (?P<scanned>\d+) scanned, (?P<accepted>\d+) accepted, (?P<rejected>\d+) rejected; "
     r"world size (?P<world>\d+), batch (?P<batch>\d+), (?P<epochs>\d+) epochs?, (?P<rows>\d+) plan rows in "
     r"(?P<files>\d+) plan files", _ok),
    (r"(?P<accepted>\d+) samples accepted, (?P<rejected>\d+) rejected; (?P<buckets>\d+) buckets over cost "
     r"model (?P<model>\w+)", _report_counts),
    (r"plan (?P<strategy>\w+): world size (?P<world>\d+), batch (?P<batch>\d+), (?P<epochs>\d+) epoch\(s\) of "
     r"(?P<steps>\[[0-9, ]+\]) steps", _report_plan),
    (rf"epoch (?P<epoch>\d+): linearity (?P<lin>{_F}) \(random (?P<random>{_F})\); worst step max/mean (?P<worst>{_F}) "
     rf"\(random {_F}\); rank totals within (?P<spread>{_F})% \(random {_F}%\)", _report_epoch),
]  # fmt: skip


def _hold(lines: list[str], out: Path) -> None:
    m = _manifest(out)
    for line in lines:
        hits = [(p, check) for p, check in TEMPLATES if re.fullmatch(p, line)]
        assert hits, f"a printed line no template holds: {line!r}"
        pattern, check = hits[0]
        check(re.fullmatch(pattern, line), m, out)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["fresh", "from_samples", "replan_from"])
def test_every_printed_sentence_is_the_manifests(runs, kind: str, capsys) -> None:
    out, printed = runs[kind]
    assert printed and printed[0].startswith("INPUT ")
    _hold(printed, out)
    assert main(["validate", str(out)]) == 0
    _hold(capsys.readouterr().out.splitlines(), out)
    assert main(["report", str(out)]) == 0
    _hold(capsys.readouterr().out.splitlines(), out)
