"""What ``scan`` and ``build`` accept, declared once on frozen dataclasses composed of the core's configs
(``ScanConfig``, ``PlanConfig``: ``world_size`` lives there, once), and :class:`BeamParser`, the parser of the
Beam commands: their flags and ``--help`` generated from the fields (``transforms.declare``), Beam's own
pipeline options passed through to the runner, anything else refused with a "did you mean" (exit 2).

Plain argparse, not a ``PipelineOptions`` subclass: Beam registers every subclass in one global parser, where
two commands' ``--seed`` (or INPUT) would collide.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.declare import Parser, add_flag, nested, option, options_of, switch
from lidarshard.transforms.features.cost import COST_MODEL_HELP, CostModel, parse_cost_model
from lidarshard.transforms.features.sample import ScanConfig
from lidarshard.transforms.io.parts import PART_ROWS
from lidarshard.transforms.layouts import LAYOUT_NAMES
from lidarshard.transforms.value_checks import UsageError, choice, float_in, int_in, parsed_by, path, per_name

__all__ = [
    "DEFAULT_REJECT_FRACTION",
    "ScanOptions",
    "BuildOptions",
    "TABLE_KEYS",
    "cost_model",
    "shared_filesystem",
    "BeamParser",
]

DEFAULT_REJECT_FRACTION = 0.01
_INPUT = "[NAME=]PATH: a directory or glob of point clouds, or a dataset root (nuScenes, Argoverse 2, SemanticKITTI, "


def cost_model(spec: str) -> CostModel:
    """``--cost-model`` as a model (``@file.json`` read here, once, by the pre-flight); UsageError naming it."""
    try:
        return parse_cost_model(spec)
    except (ValueError, OSError) as e:
        raise UsageError(f"--cost-model {spec}: {getattr(e, 'strerror', None) or e}") from None


def _model_spec(spec: str) -> str:
    """``--cost-model`` checked where given: a model whole, ``@FILE`` as a path (read by the pre-flight)."""
    if spec.startswith("@"):
        return "@" + path()(spec[1:])
    cost_model(spec)
    return spec


def shared_filesystem() -> Any:
    """The ``--shared-filesystem`` field of the commands whose workers read INPUT or write OUT."""
    return switch(
        "the local INPUT and OUT are on a filesystem mounted at the same path on every worker: run them on a "
        "runner whose workers may be on other machines (Dataflow, a remote Dask scheduler, Spark, Flink, "
        "containers)",
        group="output",
    )


def _refused(value: object) -> str:
    raise ValueError(f"{value!r} is not a valid value")


@dataclass(frozen=True, kw_only=True)
class ScanOptions:
    """``lidarshard scan``'s arguments: INPUT, OUT, how they are read (``scan``), what is published (``output``)."""

    input: tuple[str, ...] = option(_INPUT + "Waymo Open v2; local, gs://, s3://); several make one dataset of all",
                                    positional="+", check=path(many=True), metavar="INPUT")  # fmt: skip
    out: str = option("output directory (replaced atomically on success)", positional=True, check=path(),
                      metavar="OUT")  # fmt: skip
    nuscenes_version: str | None = option(
        "INPUT is a nuScenes dataroot: read its v1.0-xxx tables", None, group="scan", metavar="V1.0-XXX")  # fmt: skip
    dataset: str | tuple[tuple[str, str], ...] | None = option(
        f"INPUT's layout, recognised from what is there unless given: one of {', '.join(LAYOUT_NAMES)} for every "
        "INPUT, or NAME=LAYOUT,...", None, group="scan", check=per_name(choice(*LAYOUT_NAMES)), shown="detected",
        metavar="LAYOUT")  # fmt: skip
    sweeps: int | tuple[tuple[str, int], ...] = option(
        "previous sweeps (frames) aggregated into each sample, through the layout's poses: N for every INPUT, or "
        "NAME=N,... per INPUT (an INPUT not named: 0); only dataset layouts have sweeps", 0, group="scan",
        check=per_name(int_in(0, 1000)), metavar="N|NAME=N")  # fmt: skip
    config: ScanConfig = nested(ScanConfig(), group="scan")
    max_reject_fraction: float | None = option(
        "fail, publishing nothing, when more than this fraction of inputs is rejected; the rejects then go to "
        "OUT.rejects.parquet", None, group="output", check=float_in(0.0, 1.0), metavar="F",
        shown=f"{DEFAULT_REJECT_FRACTION}; with --from-samples the fraction that run recorded")  # fmt: skip
    part_rows: int = option(
        "rows of each samples part (OUT/samples/part-NNNNN.parquet, one write task each); --from-samples cuts at "
        "whole 16,384-row groups and at each input file", PART_ROWS, group="output", check=int_in(1, 1 << 30),
        shown=f"{PART_ROWS:,}", metavar="N")  # fmt: skip
    shared_filesystem: bool = shared_filesystem()

    @property
    def recorded_sweeps(self) -> int | dict[str, int]:
        """``sweeps`` as ``_scan.json`` records it: N, or {INPUT name: N}."""
        return self.sweeps if isinstance(self.sweeps, int) else dict(self.sweeps)


@dataclass(frozen=True, kw_only=True)
class BuildOptions(ScanOptions):
    """``lidarshard build``'s arguments: the scan's, the plan (``PlanConfig``), the cost model, a re-plan's source."""

    input: tuple[str, ...] = option(_INPUT + "Waymo Open v2; local, gs://, s3://); none with --from-samples", (),
                                    positional="*", check=path(many=True), metavar="INPUT")  # fmt: skip
    plan: PlanConfig = nested(group="plan")
    cost_model: str = option(COST_MODEL_HELP, "voxels", group="plan", check=parsed_by(_model_spec, _refused),
                             metavar="MODEL")  # fmt: skip
    from_samples: str | None = option(
        "re-plan from a previous run's samples, OUT/samples (or a 2.x samples.parquet); no rescan", None,
        group="plan", check=path(), metavar="SAMPLES")  # fmt: skip
    replan_from: int | None = option(
        "with --from-samples PREV/samples of a manifest PREV: keep PREV's plan of the epochs before E (byte for "
        "byte, with the cost model that planned them) and plan epochs E.. with --cost-model; the other plan flags "
        "must be PREV's; a running trainer moves to OUT with sampler.switch_plan(OUT)", None, group="plan",
        check=int_in(1, 10_000), metavar="E")  # fmt: skip
    relative_to: str | None = option(
        "store sample paths relative to ROOT and record it, so the data can move; 'none' stores full paths", None,
        group="plan", check=path(), metavar="ROOT", shown="a dataset layout's root, INPUT for a directory, the "
        "part before the first wildcard for a glob, the INPUTs' common parent for several; with --from-samples "
        "the previous run's root")  # fmt: skip

    def __post_init__(self) -> None:
        if self.replan_from is not None and not self.from_samples:
            raise UsageError(
                f"--replan-from {self.replan_from} re-plans a manifest: add --from-samples PREV/samples"
            )
        weights, k = self.plan.weights, self.plan.num_buckets
        if weights is None:
            return
        shown = ",".join(f"{v:g}" for v in weights)
        if max(weights) <= 0:
            raise UsageError(f"--bucket-weights {shown}: at least one weight must be > 0")
        if len(weights) > 1 and k != len(weights):
            raise UsageError(
                f"--bucket-weights has {len(weights)} values but --buckets is {k}: give 1 or {k} weights"
            )
        mean = sum(weights) / len(weights)  # plan entries per sample with equal-count buckets
        if mean > self.plan.max_plan_factor:
            raise UsageError(
                f"--bucket-weights {shown}: the plan would hold ~{mean:.3g}x the input samples per epoch, more "
                f"than --max-plan-factor {self.plan.max_plan_factor:g}; lower the weights or raise it"
            )


def _table_keys() -> frozenset[str]:
    """``lidarshard.write_manifest``'s keywords: the plan's and the output group's but W, B (arguments) and the
    dataset weights (a table has no INPUTs)."""
    keys = set()
    for leaf in options_of(BuildOptions):
        if leaf.route[0] == "plan" or leaf.group == "output":
            keys |= {s.name[2:].replace("-", "_") for s in leaf.spec.switches} or {leaf.key}
    return frozenset(keys - {"world_size", "batch_size", "dataset_weights"})


TABLE_KEYS = _table_keys()

_BEAM_EPILOG = (
    "Beam pipeline options pass through to the runner (e.g. --runner=FnApiRunner, --direct_num_workers=2, "
    "Dataflow's --project/--region/--temp_location), listed in apache_beam.options.pipeline_options and at "
    "https://beam.apache.org/documentation/runners/. Unknown flags are refused, never dropped."
)
#: Beam modules that define ``PipelineOptions`` of a runner outside ``pipeline_options``.
_RUNNER_OPTION_MODULES = ("apache_beam.runners.dask.dask_runner",)


class _BeamFlag(argparse.Action):
    """A Beam pipeline option: records the tokens as given (Beam checks them)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        tokens = list(getattr(namespace, "_beam", None) or [])
        if self.nargs == 0 or values is None:
            tokens.append(option_string)
        elif isinstance(values, str):
            tokens.append(f"{option_string}={values}")
        else:
            tokens += [option_string, *values]
        namespace._beam = tokens


@functools.lru_cache(maxsize=1)
def _beam_option_actions() -> tuple[tuple[tuple[str, ...], int | str | None], ...]:
    """(option strings, nargs) of every Beam pipeline option (Beam's own classes, not ours)."""
    from apache_beam.options import pipeline_options as po

    for module in _RUNNER_OPTION_MODULES:  # options classes Beam defines beside their runners
        try:
            importlib.import_module(module)
        except ImportError:  # that runner's extra is not installed: its flags are unknown here too
            pass
    parser = po._BeamArgumentParser(allow_abbrev=False, add_help=False)
    seen: dict[str, type] = {}
    for cls in po.PipelineOptions.__subclasses__():
        if cls.__module__.startswith("apache_beam."):
            seen.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)
    return tuple((tuple(a.option_strings), a.nargs) for a in parser._actions if a.option_strings)


class BeamParser(Parser):
    """A Beam command's parser: ``--debug``, ``-v``, ``--progress``, its options, Beam's passed through."""

    DEBUG_MORE = "; implies --verbose"

    def __init__(self, prog: str, description: str, options: type | None = None, **kw: Any) -> None:
        super().__init__(prog, description, options, epilog=_BEAM_EPILOG, **kw)

    def _add_common(self) -> None:  # read before Beam is imported: lidarshard.pipelines.cli.main
        add_flag(self, ["-v", "--verbose"], "show Beam's, Dask's and the workers' log lines, hidden by default",
             "off", action="store_true", default=False)  # fmt: skip
        add_flag(self, ["--progress"], "draw the progress line (work done of total, rate, ETA) also when stderr "
             "is not a terminal: a line every 10 s and the last one", "on a terminal", action="store_true",
             default=False)  # fmt: skip

    def _add_beam_options(self) -> None:
        mine = set(self._option_string_actions)
        for strings, nargs in _beam_option_actions():
            if not mine.intersection(strings):  # ours win (synth's --labels is not Dataflow's)
                self.add_argument(
                    *strings, action=_BeamFlag, nargs=nargs, dest="_beam", help=argparse.SUPPRESS
                )

    def parse(self, argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
        """(our args, Beam argv). Exits 2 with usage + one line on an unknown flag or a bad value."""
        if "--runner" not in self._option_string_actions:
            self._add_beam_options()
        return super().parse(argv)
