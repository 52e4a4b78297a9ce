"""What ``scan`` and ``build`` accept, as data: frozen dataclasses whose fields declare their flags.

Each field of :class:`ScanOptions` / :class:`BuildOptions` is one flag: :func:`option` records its help,
validator, group and how its default reads. The one declaration serves the command line
(:func:`declare` adds the argparse flags, so ``--help`` and docs/CLI.md's tables come from it), the
Python API (:meth:`Options.from_keywords` checks typed keyword arguments with the same validators and
messages, never through text) and the re-plan (``lidarshard.replan`` constructs ``BuildOptions``
directly). Adding a flag is one field here, plus its use in ``lidarshard.pipelines.settings``.
``lidarshard.write_manifest`` takes the fields of the ``plan`` and ``output`` groups
(``TABLE_GROUPS``) but ``--from-samples`` and ``--relative-to``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from lidarshard.pipelines.flags import (
    Check,
    UsageError,
    flag,
    float_in,
    float_list,
    int_in,
    parsed_by,
    per_name,
)
from lidarshard.transforms.core.config import AUTO_RULE, MAX_PLAN_FACTOR, parse_plan_groups, plan_groups_value
from lidarshard.transforms.features.cost import COST_MODEL_HELP
from lidarshard.transforms.features.repeat import parse_repeat_factors, repeat_threshold
from lidarshard.transforms.features.sample import FEATURE_MODES
from lidarshard.transforms.formats.readers import FORMATS
from lidarshard.transforms.io.parts import PART_ROWS
from lidarshard.transforms.layouts import LAYOUT_NAMES
from lidarshard.transforms.layouts.multisweep import CLOSE_POINTS, DEFAULT_CLOSE_POINTS
from lidarshard.transforms.plan import DEFAULT_STRATEGY, STRATEGIES, STRATEGY_HELP
from lidarshard.transforms.plan.caps import load_memory_model, memory_model_of
from lidarshard.transforms.plan.memory import MemoryModel, checked_bytes, parse_bytes
from lidarshard.transforms.plan.order import HEAVIEST_FIRST
from lidarshard.transforms.plan.speeds import parse_rank_speed, rank_speeds

__all__ = [
    "DEFAULT_REJECT_FRACTION",
    "VOXEL_RANGE",
    "TABLE_GROUPS",
    "Flag",
    "Switch",
    "option",
    "Options",
    "ScanOptions",
    "BuildOptions",
    "declare",
    "shared_filesystem",
    "table_keys",
]

DEFAULT_REJECT_FRACTION = 0.01
VOXEL_RANGE = (1e-3, 1e3)  # m: below 1 mm the int64 voxel grid of a 100 km cloud overflows
#: The argument groups whose flags ``lidarshard.write_manifest`` takes (a table needs no scan).
TABLE_GROUPS = ("plan", "output")
_NOT_FOR_TABLES = ("from_samples", "replan_from", "relative_to", "world_size", "batch_size")


@dataclass(frozen=True)
class Switch:
    """A flag without a value that sets its field to ``const`` (``--pad``: ``policy="pad"``)."""

    name: str
    const: Any
    help: str
    shown: str


@dataclass(frozen=True)
class Flag:
    """How one field reads on the command line: ``--`` + its name in kebab case, unless ``switches``."""

    help: str
    group: str
    check: Check | None = None
    choices: tuple[str, ...] | None = None
    shown: str = ""
    metavar: str | None = None
    #: Name of a set of flags of which at most one may be given (``repeat``: weights from one source).
    exclusive: str | None = None
    switches: tuple[Switch, ...] = ()


def option(help: str, group: str, default: Any = MISSING, **kw: Any) -> Any:
    """A dataclass field that is a flag (no ``default``: a required flag)."""
    return field(default=default, metadata={"flag": Flag(help, group, **kw)})


def _flag(f: dataclasses.Field) -> Flag:
    return f.metadata["flag"]


def _name(f: dataclasses.Field) -> str:
    return "--" + f.name.replace("_", "-")


_O = TypeVar("_O", bound="Options")


@dataclass(frozen=True, kw_only=True)
class Options:
    """Base of the option sets: construction from parsed flags or keyword arguments."""

    @classmethod
    def from_namespace(cls: type[_O], ns: argparse.Namespace) -> _O:
        """The options of parsed flags (values were checked by the parser)."""
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)})

    @classmethod
    def from_keywords(cls: type[_O], values: Mapping[str, Any]) -> _O:
        """The options of the Python API's keyword arguments: field names (``bucket_weights=(1, 2)``)
        or switch names (``pad=True``); None or False leaves a default. Each value is checked by its
        flag's validator as a typed value (a string is read as the flag's text).

        Raises:
            UsageError: an unknown name (with a "did you mean"), a value the flag refuses, two flags
                of one exclusive set, or a required flag missing (the command line's messages).
        """
        by_name = {f.name: f for f in fields(cls) if not _flag(f).switches}
        switches = {s.name[2:].replace("-", "_"): (f, s) for f in fields(cls) for s in _flag(f).switches}
        known = [*by_name, *switches]
        given: dict[str, Any] = {}
        named: list[str] = []
        for key, value in values.items():
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                raise UsageError(f"unknown argument {key}" + (f"; did you mean {close[0]}?" if close else ""))
            if value is None or value is False:
                continue
            if key in switches:
                f, s = switches[key]
                if value is not True:
                    raise UsageError(f"{s.name} is a switch: pass True, got {value!r}")
                given[f.name], name = s.const, s.name
            else:
                f, name = by_name[key], _name(by_name[key])
                given[key] = _checked(_flag(f), name, value)
            named.append(name)
        _exclusive(cls, named)
        missing = [_name(f) for f in fields(cls) if f.default is MISSING and f.name not in given]
        if missing:
            raise UsageError(f"the following arguments are required: {', '.join(missing)}")
        return cls(**given)


def _checked(spec: Flag, name: str, value: Any) -> Any:
    """One keyword argument's value, checked as the command line checks the flag's text."""
    if isinstance(value, bool):
        raise UsageError(f"argument {name}: {value!r} is not a valid value")
    if spec.check is not None:
        try:
            return spec.check.value(value)
        except argparse.ArgumentTypeError as e:
            raise UsageError(f"argument {name}: {e}") from None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise UsageError(f"argument {name}: {value!r} is not a valid value (a string)")
    if spec.choices is not None and value not in spec.choices:
        choices = ", ".join(map(repr, spec.choices))
        raise UsageError(f"argument {name}: invalid choice: {value!r} (choose from {choices})")
    return value


def _exclusive(cls: type[Options], named: Sequence[str]) -> None:
    """At most one flag of each exclusive set (switches of one field, or fields sharing ``exclusive``)."""
    sets: dict[str, list[str]] = {}
    for f in fields(cls):
        spec = _flag(f)
        if spec.switches:
            sets[f.name] = [s.name for s in spec.switches]
        elif spec.exclusive:
            sets.setdefault(spec.exclusive, []).append(_name(f))
    for members in sets.values():
        both = [m for m in members if m in named]
        if len(both) > 1:
            raise UsageError(f"argument {both[1]}: not allowed with argument {both[0]}")


_CAPS = "; a sample above it is rejected as over_cap, budget plans within it, other strategies fail over it"
_SHARED = (
    "the local INPUT and OUT are on a filesystem mounted at the same path on every worker: run them on a runner "
    "whose workers may be on other machines (Dataflow, a remote Dask scheduler, Spark, Flink, containers)"
)


def shared_filesystem() -> Any:
    """The ``--shared-filesystem`` field of the commands whose workers read INPUT or write OUT."""
    return option(_SHARED, "output", False, switches=(Switch("--shared-filesystem", True, _SHARED, "off"),))


@dataclass(frozen=True, kw_only=True)
class ScanOptions(Options):
    """The flags of what is read, how features are computed (group ``scan``) and what a run publishes
    (group ``output``): ``lidarshard scan``'s, and the first part of ``build``'s."""

    nuscenes_version: str | None = option(
        "INPUT is a nuScenes dataroot: read its v1.0-xxx tables", "scan", None, metavar="V1.0-XXX")  # fmt: skip
    dataset: str | None = option(
        f"INPUT's layout, recognised from what is there unless given: one of {', '.join(LAYOUT_NAMES)} for every "
        "INPUT, or NAME=LAYOUT,...", "scan", None, shown="detected", metavar="LAYOUT")  # fmt: skip
    dataset_weights: str | None = option(
        "NAME=W,...: expected copies per epoch of each sample of INPUT NAME (x its repeat factor)", "scan", None,
        shown="1 each", metavar="NAME=W")  # fmt: skip
    sweeps: int | tuple[tuple[str, int], ...] = option(
        "previous sweeps (frames) aggregated into each sample, through the layout's poses: N for every INPUT, or "
        "NAME=N,... per INPUT (an INPUT not named: 0); only dataset layouts have sweeps", "scan", 0,
        check=per_name(int_in(0, 1000)), metavar="N|NAME=N")  # fmt: skip
    format: str | None = option("override extension-based format detection", "scan", None, choices=FORMATS,
                                shown="by extension")  # fmt: skip
    point_dims: int | None = option("float32 values per point of headerless .bin files", "scan", None,
                                    check=int_in(3, 64), shown="by format", metavar="N")  # fmt: skip
    voxel_size: float = option(f"occupancy voxel edge, metres, in [{VOXEL_RANGE[0]:g}, {VOXEL_RANGE[1]:g}]",
                               "scan", 0.05, check=float_in(*VOXEL_RANGE), metavar="M")  # fmt: skip
    point_cloud_range: tuple[float, ...] | None = option(
        "x0,y0,z0,x1,y1,z1 metres: points outside are ignored", "scan", None, check=float_list(6),
        shown="all points", metavar="X0,Y0,Z0,X1,Y1,Z1")  # fmt: skip
    features: str = option("'stat' sizes fixed-record files from their byte count, unread", "scan", "full",
                           choices=FEATURE_MODES)  # fmt: skip
    backend: str = option("reader for .pcd/.ply", "scan", "numpy", choices=("numpy", "open3d"))
    close_points: str = option(
        "which clouds lose their points within 1 m of the sensor (|x|, |y| < 1 m): 'sweeps' (mmdet3d), 'devkit' "
        "(every cloud, the keyframe too: nuScenes from_file_multisweep), 'none'; size features and loaders use "
        "the same rule", "scan", DEFAULT_CLOSE_POINTS, choices=CLOSE_POINTS)  # fmt: skip
    max_file_bytes: int = option("larger files are rejected as too_large before reading", "scan", 2 << 30,
                                 check=int_in(1), shown="2 GiB", metavar="BYTES")  # fmt: skip
    max_points: int = option("larger clouds are rejected as too_large before allocation", "scan", 50_000_000,
                             check=int_in(1), shown="50M", metavar="N")  # fmt: skip
    max_reject_fraction: float | None = option(
        "fail, publishing nothing, when more than this fraction of inputs is rejected; the rejects then go to "
        "OUT.rejects.parquet", "output", None, check=float_in(0.0, 1.0),
        shown=f"{DEFAULT_REJECT_FRACTION}; with --from-samples the fraction that run recorded", metavar="F")  # fmt: skip
    part_rows: int = option(
        "rows of each samples part (OUT/samples/part-NNNNN.parquet, one write task each); --from-samples cuts at "
        "whole 16,384-row groups and at each input file", "output", PART_ROWS, check=int_in(1, 1 << 30),
        shown=f"{PART_ROWS:,}", metavar="N")  # fmt: skip
    shared_filesystem: bool = shared_filesystem()


@dataclass(frozen=True, kw_only=True)
class BuildOptions(ScanOptions):
    """``lidarshard build``'s flags: the scan's, then the plan's (group ``plan``)."""

    world_size: int = option("data-parallel ranks W", "plan", check=int_in(1, 1 << 20), metavar="W")
    batch_size: int = option("samples per rank per step B", "plan", check=int_in(1, 1 << 20), metavar="B")
    epochs: int = option("epochs to plan", "plan", 1, check=int_in(1, 10_000), metavar="E")
    seed: int = option("plan seed", "plan", 0, check=int_in(0, 2**63 - 1), metavar="S")
    strategy: str = option("how each step is filled, one of:\n" + STRATEGY_HELP, "plan", DEFAULT_STRATEGY,
                           choices=tuple(sorted(STRATEGIES)))  # fmt: skip
    buckets: int | None = option("cost buckets K in [1, 4096]", "plan", None, check=int_in(1, 4096), metavar="K",
                                 shown="clamp(sqrt(N)/4, 4, 64), or the number of --bucket-weights")  # fmt: skip
    bucket_weights: tuple[float, ...] | None = option(
        "w0,w1,..: per-bucket sampling weight, w>1 repeats a bucket, w<1 thins it", "plan", None,
        check=float_list(lo=0.0), shown="all 1", metavar="W0,W1,..")  # fmt: skip
    max_plan_factor: float = option(
        "refuse a plan with more than this many entries per input sample per epoch", "plan", MAX_PLAN_FACTOR,
        check=float_in(1.0, 1e6), metavar="X")  # fmt: skip
    cost_model: str = option(COST_MODEL_HELP, "plan", "voxels", metavar="MODEL")
    policy: str = option("what fills the last step", "plan", "drop_last", switches=(
        Switch("--drop-last", "drop_last", "drop the samples that do not fill a last step", "on"),
        Switch("--pad", "pad", "repeat random samples to fill the last step", "off (--drop-last)")))  # fmt: skip
    from_samples: str | None = option(
        "re-plan from a previous run's samples, OUT/samples (or a 2.x samples.parquet); no rescan", "plan", None,
        metavar="SAMPLES")  # fmt: skip
    replan_from: int | None = option(
        "with --from-samples PREV/samples of a manifest PREV: keep PREV's plan of the epochs before E (byte for "
        "byte, with the cost model that planned them) and plan epochs E.. with --cost-model; the other plan flags "
        "must be PREV's; a running trainer moves to OUT with sampler.switch_plan(OUT)", "plan", None,
        check=int_in(1, 10_000), metavar="E")  # fmt: skip
    relative_to: str | None = option(
        "store sample paths relative to ROOT and record it, so the data can move; 'none' stores full paths",
        "plan", None, metavar="ROOT", shown="a dataset layout's root, INPUT for a directory, the part before the "
        "first wildcard for a glob, the INPUTs' common parent for several; with --from-samples the previous "
        "run's root")  # fmt: skip
    max_points_per_rank_step: int | None = option(
        "hard cap on points (num_points) one rank gets at one step" + _CAPS, "plan", None, check=int_in(1),
        metavar="N")  # fmt: skip
    max_cost_per_rank_step: float | None = option(
        "hard cap on predicted cost one rank gets at one step" + _CAPS, "plan", None,
        check=float_in(0.0, above=True), metavar="C")  # fmt: skip
    max_samples_per_rank_step: int | None = option(
        "hard cap on samples one rank gets at one step", "plan", None, check=int_in(1), metavar="N")  # fmt: skip
    heaviest_first: str = option(
        "off | points | cost | memory: fail fast on memory: each epoch's step 0 is the step holding its heaviest "
        "rank-step by points (num_points), predicted cost or predicted peak memory (needs --max-step-memory), the "
        "sums the caps bound; only the order of the steps changes",
        "plan", "off", choices=HEAVIEST_FIRST)  # fmt: skip
    max_step_memory: int | None = option(
        "SIZE, e.g. 20GiB (B, KiB, MiB, GiB, TiB): hard cap on every rank-step's predicted peak device memory, "
        "by the --memory-model" + _CAPS, "plan", None, check=parsed_by(parse_bytes, checked_bytes),
        metavar="SIZE")  # fmt: skip
    memory_model: MemoryModel | None = option(
        "FILE: lidarshard calibrate's JSON whose memory_model (fitted to the recorder's peak_bytes) predicts a "
        "rank-step's peak; needed by --max-step-memory and recorded in the manifest", "plan", None,
        check=parsed_by(load_memory_model, lambda v: memory_model_of(v, "memory_model")), metavar="FILE")  # fmt: skip
    rank_speed: tuple[float, ...] | None = option(
        "S0,S1,.. or @file.json: each rank's relative speed (mixed hardware, e.g. 1,1,0.6,0.6): budget gives "
        "each rank work in proportion at every step; other strategies hand each step's heaviest batch to the "
        "fastest rank", "plan", None, check=parsed_by(parse_rank_speed, rank_speeds), shown="all equal",
        metavar="S0,S1,..")  # fmt: skip
    repeat_factors: float | None = option(
        "LVIS-style repeat factors from the lidarseg labels: a sample's weight is the max over its classes c of "
        "max(1, sqrt(T / f_c)), f_c the share of labelled samples holding c", "plan", None,
        check=parsed_by(parse_repeat_factors, repeat_threshold), metavar="lidarseg:t=T", exclusive="repeat")  # fmt: skip
    sample_weights: str | None = option(
        "per-sample weights (CBGS, your own) from this numeric column of the --from-samples table; fractional "
        "weights are realized per epoch by seeded stochastic rounding", "plan", None, metavar="COLUMN",
        exclusive="repeat")  # fmt: skip
    plan_groups: int | None = option(
        "advanced: plan each epoch in G step groups (samples dealt by a stable hash of sample_id, seed and epoch; "
        "each group planned alone, the steps interleaved), so no process plans the whole epoch; 1 is one pool",
        "plan", None, check=parsed_by(parse_plan_groups, plan_groups_value), shown=AUTO_RULE,
        metavar="auto|G")  # fmt: skip


def declare(parser: argparse.ArgumentParser, cls: type[Options]) -> None:
    """Add a flag for every field of ``cls`` to ``parser``, in field order, in the fields' groups."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for f in fields(cls):
        spec = _flag(f)
        group = groups.get(spec.group) or groups.setdefault(spec.group, parser.add_argument_group(spec.group))
        default = None if f.default is MISSING else f.default
        if spec.switches:  # several switches of one field exclude each other
            pol = group.add_mutually_exclusive_group() if len(spec.switches) > 1 else group
            for s in spec.switches:
                flag(pol, s.name, s.help, dest=f.name, action="store_const", const=s.const, default=default,
                     shown=s.shown)  # fmt: skip
            continue
        where: argparse._ActionsContainer = group
        if spec.exclusive:
            where = exclusive.get(spec.exclusive) or exclusive.setdefault(
                spec.exclusive, group.add_mutually_exclusive_group()
            )
        kw: dict[str, Any] = {"metavar": spec.metavar} if spec.metavar else {}
        if spec.check is not None:
            kw["type"] = spec.check
        if spec.choices is not None:
            kw["choices"] = spec.choices
        if f.default is MISSING:
            kw["required"] = True
        flag(where, _name(f), spec.help, default=default, shown=spec.shown, **kw)


def table_keys(cls: type[Options] = BuildOptions) -> set[str]:
    """The keyword names (snake case) ``lidarshard.write_manifest`` takes: the fields of ``TABLE_GROUPS``
    and their switches, but those a table has no use for."""
    names = set()
    for f in fields(cls):
        spec = _flag(f)
        if spec.group in TABLE_GROUPS:
            names |= {f.name} | {s.name[2:].replace("-", "_") for s in spec.switches}
    return names - set(_NOT_FOR_TABLES) - {"policy"}
