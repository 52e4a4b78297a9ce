"""What ``scan`` and ``build`` accept, declared once (name, validator, default, help).

Adding a flag is one :func:`~lidarshard.pipelines.flags.flag` call here, plus a field of the settings it
feeds (``lidarshard.pipelines.settings``) and, for a cross-flag rule, a check there. The Python API takes
the same flags as keyword arguments (``CommandParser.namespace``); ``lidarshard.write_manifest`` takes
those of the ``plan`` and ``output`` groups (``TABLE_GROUPS``) but ``--from-samples`` and ``--relative-to``.
"""

from __future__ import annotations

import argparse

from lidarshard.pipelines.flags import flag, float_in, float_list, int_in
from lidarshard.transforms.core.epochs import MAX_PLAN_FACTOR
from lidarshard.transforms.features.cost import COST_MODEL_HELP
from lidarshard.transforms.features.repeat import parse_repeat_factors
from lidarshard.transforms.features.sample import FEATURE_MODES
from lidarshard.transforms.formats.readers import FORMATS
from lidarshard.transforms.io.parts import PART_ROWS
from lidarshard.transforms.layouts import LAYOUT_NAMES
from lidarshard.transforms.plan import DEFAULT_STRATEGY, STRATEGIES, STRATEGY_HELP
from lidarshard.transforms.plan.order import HEAVIEST_FIRST
from lidarshard.transforms.plan.speeds import parse_rank_speed

__all__ = [
    "DEFAULT_REJECT_FRACTION",
    "VOXEL_RANGE",
    "TABLE_GROUPS",
    "add_scan_arguments",
    "add_output_arguments",
    "add_plan_arguments",
    "table_keys",
]

DEFAULT_REJECT_FRACTION = 0.01
VOXEL_RANGE = (1e-3, 1e3)  # m: below 1 mm the int64 voxel grid of a 100 km cloud overflows
#: The argument groups whose flags ``lidarshard.write_manifest`` takes (a table needs no scan).
TABLE_GROUPS = ("plan", "output")
_NOT_FOR_TABLES = ("from_samples", "replan_from", "relative_to", "world_size", "batch_size")


def add_scan_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags that decide what is read and how features are computed (shared by ``scan`` and ``build``)."""
    g = parser.add_argument_group("scan")
    flag(
        g, "--nuscenes-version", "INPUT is a nuScenes dataroot: read its v1.0-xxx tables", metavar="V1.0-XXX"
    )
    flag(g, "--dataset", "INPUT's layout, recognised from what is there unless given: one of "
         f"{', '.join(LAYOUT_NAMES)} for every INPUT, or NAME=LAYOUT,...", shown="detected",
         metavar="LAYOUT")  # fmt: skip
    flag(g, "--dataset-weights", "NAME=W,...: expected copies per epoch of each sample of INPUT NAME "
         "(x its repeat factor)", shown="1 each", metavar="NAME=W")  # fmt: skip
    flag(g, "--sweeps", "previous sweeps (frames) aggregated into each sample, through the layout's poses",
         type=int_in(0, 1000), default=0, metavar="N")  # fmt: skip
    flag(g, "--format", "override extension-based format detection", choices=FORMATS, shown="by extension")
    flag(g, "--point-dims", "float32 values per point of headerless .bin files", type=int_in(3, 64),
         shown="by format", metavar="N")  # fmt: skip
    flag(g, "--voxel-size", f"occupancy voxel edge, metres, in [{VOXEL_RANGE[0]:g}, {VOXEL_RANGE[1]:g}]",
         type=float_in(*VOXEL_RANGE), default=0.05, metavar="M")  # fmt: skip
    flag(g, "--point-cloud-range", "x0,y0,z0,x1,y1,z1 metres: points outside are ignored",
         type=float_list(6), shown="all points", metavar="X0,Y0,Z0,X1,Y1,Z1")  # fmt: skip
    flag(g, "--features", "'stat' sizes fixed-record files from their byte count, unread",
         choices=FEATURE_MODES, default="full")  # fmt: skip
    flag(g, "--backend", "reader for .pcd/.ply", choices=("numpy", "open3d"), default="numpy")
    flag(g, "--max-file-bytes", "larger files are rejected as too_large before reading", type=int_in(1),
         default=2 << 30, shown="2 GiB", metavar="BYTES")  # fmt: skip
    flag(g, "--max-points", "larger clouds are rejected as too_large before allocation", type=int_in(1),
         default=50_000_000, shown="50M", metavar="N")  # fmt: skip
    add_output_arguments(parser)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of what a run publishes (``scan``, ``build``, ``lidarshard.write_manifest``)."""
    g = parser.add_argument_group("output")
    flag(g, "--max-reject-fraction",
         "fail, publishing nothing, when more than this fraction of inputs is rejected; the rejects "
         "then go to OUT.rejects.parquet", type=float_in(0.0, 1.0),
         shown=f"{DEFAULT_REJECT_FRACTION}; with --from-samples the fraction that run recorded", metavar="F")  # fmt: skip
    flag(g, "--part-rows", "rows of each samples part (OUT/samples/part-NNNNN.parquet, one write task each); --from-samples "
         "cuts at whole 16,384-row groups and at each input file",
         type=int_in(1, 1 << 30), default=PART_ROWS, shown=f"{PART_ROWS:,}", metavar="N")  # fmt: skip


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the plan (``build`` only)."""
    g = parser.add_argument_group("plan")
    flag(g, "--world-size", "data-parallel ranks W", type=int_in(1, 1 << 20), required=True, metavar="W")  # fmt: skip
    flag(g, "--batch-size", "samples per rank per step B", type=int_in(1, 1 << 20), required=True, metavar="B")  # fmt: skip
    flag(g, "--epochs", "epochs to plan", type=int_in(1, 10_000), default=1, metavar="E")
    flag(g, "--seed", "plan seed", type=int_in(0, 2**63 - 1), default=0, metavar="S")
    flag(g, "--strategy", "how each step is filled, one of:\n" + STRATEGY_HELP, choices=sorted(STRATEGIES),
         default=DEFAULT_STRATEGY)  # fmt: skip
    flag(g, "--buckets", "cost buckets K in [1, 4096]", type=int_in(1, 4096), metavar="K",
         shown="clamp(sqrt(N)/4, 4, 64), or the number of --bucket-weights")  # fmt: skip
    flag(g, "--bucket-weights", "w0,w1,..: per-bucket sampling weight, w>1 repeats a bucket, w<1 thins it",
         type=float_list(lo=0.0), shown="all 1", metavar="W0,W1,..")  # fmt: skip
    flag(g, "--max-plan-factor", "refuse a plan with more than this many entries per input sample per epoch",
         type=float_in(1.0, 1e6), default=MAX_PLAN_FACTOR, metavar="X")  # fmt: skip
    flag(g, "--cost-model", COST_MODEL_HELP, default="voxels", metavar="MODEL")
    pol = g.add_mutually_exclusive_group()
    flag(pol, "--drop-last", "drop the samples that do not fill a last step", dest="policy", action="store_const",
         const="drop_last", shown="on")  # fmt: skip
    flag(pol, "--pad", "repeat random samples to fill the last step", dest="policy", action="store_const",
         const="pad", shown="off (--drop-last)")  # fmt: skip
    flag(g, "--from-samples", "re-plan from a previous run's samples, OUT/samples (or a 2.x samples.parquet); "
         "no rescan", metavar="SAMPLES")  # fmt: skip
    flag(g, "--replan-from", "with --from-samples PREV/samples of a manifest PREV: keep PREV's plan of the epochs "
         "before E (byte for byte, with the cost model that planned them) and plan epochs E.. with --cost-model; "
         "the other plan flags must be PREV's; a running trainer moves to OUT with sampler.switch_plan(OUT)",
         type=int_in(1, 10_000), metavar="E")  # fmt: skip
    flag(g, "--relative-to", "store sample paths relative to ROOT and record it, so the data can move; 'none' "
         "stores full paths", metavar="ROOT", shown="a dataset layout's root, INPUT for a directory, "
         "the part before the first wildcard for a glob, the INPUTs' common parent for several; with --from-samples "
         "the previous run's root")  # fmt: skip
    caps = (
        "; a sample above it is rejected as over_cap, budget plans within it, other strategies fail over it"
    )
    flag(g, "--max-points-per-rank-step", "hard cap on points (num_points) one rank gets at one step" + caps,
         type=int_in(1), metavar="N")  # fmt: skip
    flag(g, "--max-cost-per-rank-step", "hard cap on predicted cost one rank gets at one step" + caps,
         type=float_in(0.0, above=True), metavar="C")  # fmt: skip
    flag(g, "--max-samples-per-rank-step", "hard cap on samples one rank gets at one step", type=int_in(1),
         metavar="N")  # fmt: skip
    flag(g, "--heaviest-first", "off | points | cost: fail fast on memory: each epoch's step 0 is the step "
         "holding its heaviest rank-step by points (num_points) or predicted cost, the sums the caps bound; "
         "only the order of the steps changes", choices=HEAVIEST_FIRST, default="off")  # fmt: skip
    flag(g, "--rank-speed", "S0,S1,.. or @file.json: each rank's relative speed (mixed hardware, e.g. 1,1,0.6,0.6): "
         "budget gives each rank work in proportion at every step; other strategies hand each step's heaviest "
         "batch to the fastest rank", type=_rank_speed, shown="all equal", metavar="S0,S1,..")  # fmt: skip
    rep = g.add_mutually_exclusive_group()
    flag(rep, "--repeat-factors", "LVIS-style repeat factors from the lidarseg labels: a sample's weight is "
         "the max over its classes c of max(1, sqrt(T / f_c)), f_c the share of labelled samples holding c",
         type=_repeat_factors, metavar="lidarseg:t=T")  # fmt: skip
    flag(rep, "--sample-weights", "per-sample weights (CBGS, your own) from this numeric column of the "
         "--from-samples table; fractional weights are realized per epoch by seeded stochastic rounding",
         metavar="COLUMN")  # fmt: skip
    parser.set_defaults(policy="drop_last")


def _rank_speed(text: str) -> tuple[float, ...]:
    try:
        return parse_rank_speed(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _repeat_factors(text: str) -> float:
    try:
        return parse_repeat_factors(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def table_keys(parser: argparse.ArgumentParser) -> set[str]:
    """The keyword names (snake case) of the flags ``lidarshard.write_manifest`` takes."""
    names = set()
    for group in parser._action_groups:
        if group.title in TABLE_GROUPS:
            names |= {a.option_strings[0][2:].replace("-", "_") for a in group._group_actions}
    return names - set(_NOT_FOR_TABLES)
