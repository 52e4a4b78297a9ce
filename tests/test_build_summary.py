"""What ``lidarshard build`` prints after a build: the balance table (``greedy_reference``, once ``bound``),
what the plan buys in plain words, where the manifest is; ``--help`` explains every column; manifests
written with ``bound`` still validate and print."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lidarshard import schemas
from lidarshard.pipelines import build as build_cli
from lidarshard.pipelines.cli import main
from lidarshard.schemas.balance_entry import BalanceEntry
from lidarshard.transforms.plan.explain import COLUMNS, plan_buys
from lidarshard.transforms.plan.metrics import REFERENCE_KEY
from tests.helpers import build_bins_manifest


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_bins_manifest(tmp_path_factory.mktemp("summary"), 40, world_size=3, batch_size=2)


def test_the_summary_ends_with_what_the_plan_buys_and_where_it_is(built: Path, capsys) -> None:
    build_cli.print_summary(str(built))
    lines = capsys.readouterr().out.splitlines()
    balance = json.loads((built / schemas.MANIFEST_FILE).read_text())["balance"]
    header = lines.index(
        "epoch  steps  linearity  random  greedy_reference  spearman  samples/rank-step mean max"
    )
    assert "bound" not in "\n".join(lines) and "(columns: lidarshard build --help)" in lines[header - 1]
    for b, row in zip(balance, lines[header + 1 : header + 3], strict=True):
        assert row.split()[:5] == [str(b["epoch"]), str(b["steps"]), f"{b['linearity']:.4f}",
                                   f"{b['random_linearity']:.4f}", f"{b[REFERENCE_KEY]:.4f}"]  # fmt: skip
    entries = [BalanceEntry.parse(b, "balance") for b in balance]
    assert lines[-3:] == [plan_buys(entries[0]), plan_buys(entries[1]), f"wrote {built}"]
    assert lines[-3].startswith("epoch 0: predicted time 0.") and "less time): ranks wait" in lines[-3]


def test_help_explains_every_printed_column(capsys) -> None:
    with pytest.raises(SystemExit):
        build_cli.parser().parse(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in (
        "linearity",
        "random",
        "greedy_reference",
        "spearman",
        "samples/rank-step",
        "pair repeat rate",
    ):
        assert f" {name}: " in text and name in COLUMNS
    assert "not a bound" in text and "1.0 = no rank ever waits" in text


def test_a_manifest_written_with_bound_is_refused_in_one_line(built: Path, tmp_path: Path, capsys) -> None:
    """3.x manifests named greedy_reference ``bound``; only 4.x is read now (typed balance entries)."""
    old = tmp_path / "old"
    shutil.copytree(built, old)
    path = old / schemas.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    for b in manifest["balance"]:  # what a 3.x build wrote before the rename
        b["bound"] = b.pop(REFERENCE_KEY)
    path.write_text(json.dumps(manifest, indent=1))
    assert main(["validate", str(old)]) == 1
    err = capsys.readouterr().err
    assert "balance[0]" in err and "greedy_reference" in err
    manifest["balance"][1]["linearity"] = "high"  # a malformed number is refused by name too
    path.write_text(json.dumps(manifest, indent=1))
    assert main(["validate", str(old)]) == 1


def test_the_cli_reference_explains_the_summary_columns() -> None:
    """docs/CLI.md's glossary of the build's summary is ``explain.COLUMNS`` (one source, like the flag tables)."""
    rows = ["| column | meaning |", "|---|---|", *(f"| `{k}` | {v} |" for k, v in COLUMNS.items())]
    table = "\n".join(rows)
    reference = (Path(__file__).resolve().parents[1] / "docs" / "CLI.md").read_text()
    assert table in reference, f"docs/CLI.md's table of the build summary's columns differs; paste:\n{table}"


def test_the_summary_names_each_input_and_what_was_dropped(built: Path, capsys) -> None:
    """Each INPUT with its layout; the samples left out to fill whole steps beside accepted/rejected."""
    build_cli.print_summary(str(built))
    lines = capsys.readouterr().out.splitlines()
    m = json.loads((built / schemas.MANIFEST_FILE).read_text())
    (d,) = m["datasets"]
    assert (
        lines[0]
        == f"INPUT {d['name']}: point-cloud files, one sample each ({d['root']}): 40 samples accepted"
    )
    dropped = m["counts"]["dropped"]
    assert set(dropped) == {40 - 6 * 6}  # 40 samples, 6 a step (W=3 x B=2): 6 steps, 4 left out
    c = m["counts"]
    assert lines[1] == (
        f"scanned {c['scanned']}: accepted 40, rejected {c['rejected']}; 4 dropped to fill whole steps "
        "(--pad keeps them)"
    )


def test_input_lines_say_layout_tables_sweeps_and_weight() -> None:
    from lidarshard.pipelines.understood import counts_line, input_lines
    from lidarshard.transforms.formats.labels import SEMANTICKITTI_LEARNING_MAP

    meta = {
        "nuscenes_version": "v1.0-mini",
        "sweeps": {"nusc": 9, "kitti": 0},
        "datasets": [
            {"name": "nusc", "root": "/d/nusc", "layout": "nuscenes", "weight": 1.0},
            {"name": "kitti", "root": "/d/kitti", "layout": "semantickitti", "weight": 2.0},
        ],
    }
    assert input_lines(meta) == [
        "INPUT nusc: nuScenes dataroot, tables v1.0-mini, keyframe + 9 previous sweeps (/d/nusc)",
        "INPUT kitti: SemanticKITTI sequences, no sweeps, weight 2 (/d/kitti)",
    ]
    assert input_lines(meta, {"nusc": 404})[0].endswith("(/d/nusc): 404 samples accepted")
    assert input_lines(meta, {"nusc": 404})[1].endswith("(/d/kitti): 0 samples accepted")
    standard = {str(k): v for k, v in SEMANTICKITTI_LEARNING_MAP.items()}
    meta["datasets"][1]["label_map"] = standard
    assert input_lines(meta)[1] == (
        "INPUT kitti: SemanticKITTI sequences, no sweeps, labels mapped by the standard SemanticKITTI "
        "learning_map (20 classes), weight 2 (/d/kitti)"
    )
    meta["datasets"][1]["label_map"] = standard | {"52": 20}  # a config of the user's own
    assert "labels mapped by the learning_map of its semantic-kitti.yaml (21 classes)" in input_lines(meta)[1]
    assert counts_line(5, 4, 1, (0, 0), (2, 3)) == (
        "scanned 5: accepted 4, rejected 1; 2-3 per epoch repeated to fill the last step (--pad)"
    )


def test_a_live_out_is_named_before_it_is_replaced(built: Path, tmp_path: Path, capsys) -> None:
    from lidarshard.pipelines.understood import live_output, warn_live

    assert live_output(str(tmp_path)) is None and live_output(str(tmp_path / "new")) is None
    warn_live(str(built), "build")
    err = capsys.readouterr().err
    assert err.startswith(f"lidarshard build: warning: OUT {built} holds a published manifest: ")
    assert "replaces it atomically" in err and "never a mix" in err and len(err.splitlines()) == 1


def test_a_batch_larger_than_a_known_pool_is_refused_before_beam(built: Path, tmp_path: Path, capsys) -> None:
    """``--from-samples`` and a table know their row count: 40 samples, W*B = 200, one line, no Beam."""
    import numpy as np
    import pyarrow as pa

    import lidarshard
    from lidarshard.pipelines.options import BuildOptions
    from lidarshard.pipelines.preflight import check_plan_size
    from lidarshard.transforms.declare import from_keywords
    from lidarshard.transforms.value_checks import UsageError

    out = tmp_path / "again"
    argv = ["build", str(out), "--from-samples", str(built / schemas.SAMPLES_DIR), "--world-size", "1"]
    assert main([*argv, "--batch-size", "200"]) == 2
    (line,) = [e for e in capsys.readouterr().err.splitlines() if "error:" in e]
    assert line.endswith(
        f"--world-size 1 x --batch-size 200 = 200 samples per step, but --from-samples {built / 'samples'} holds "
        "40: every sample would be dropped; use --pad or a smaller --world-size/--batch-size"
    )
    table = pa.table(
        {
            "sample_id": [f"s{i}" for i in range(40)],
            "path": [f"/d/{i}.bin" for i in range(40)],
            "cost": np.ones(40),
        }
    )
    with pytest.raises(UsageError, match="but the table holds 40: every sample would be dropped"):
        lidarshard.write_manifest(table, str(out), 4, 50)
    assert not out.exists()
    for flags in (
        {"pad": True},
        {"strategy": "budget"},
        {"bucket_weights": (1.0, 3.0)},
    ):  # the planner's call
        check_plan_size(
            from_keywords(BuildOptions, {"out": "o", "world_size": 1, "batch_size": 200} | flags).plan, 40
        )
