"""``build --from-samples PREV/samples --replan-from E``: the checks and settings of a re-plan, before Beam.

A re-plan continues manifest PREV: epochs ``< E`` keep PREV's plan byte for byte (planned again with the
cost model that planned them, recorded in ``cost_history``), epochs ``E..`` are planned with the new
``--cost-model``. Every other plan setting must be PREV's, so that a trainer that ran PREV's epochs
``< E`` moves to the new manifest at epoch E (``sampler.switch_plan``) and its resume states stay valid.
The build checks at its end that the kept epochs' files are PREV's (``transforms.core.manifest_writer.Kept``).

``lidarshard.replan`` holds PREV's manifest already: ``replan_options`` constructs the options and the
plan of the re-plan directly from it (no flags, no text), and the build uses that manifest instead of
reading it again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lidarshard.pipelines.flags import UsageError
from lidarshard.pipelines.options import BuildOptions
from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.earlier_run import previous_dir
from lidarshard.transforms.core.manifest_writer import Kept, kept_from
from lidarshard.transforms.features.cost import checked_model
from lidarshard.transforms.io.metadata import load_manifest

__all__ = ["replan_settings", "KEPT_SETTINGS", "replan_options"]

#: The plan settings a re-plan keeps: each must be the previous manifest's.
KEPT_SETTINGS = (
    ("world_size", "--world-size"),
    ("batch_size", "--batch-size"),
    ("seed", "--seed"),
    ("strategy", "--strategy"),
    ("policy", "--drop-last/--pad"),
    ("caps", "--max-*-per-rank-step/--max-step-memory/--memory-model"),
    ("repeat", "--repeat-factors/--sample-weights/--dataset-weights"),
    ("heaviest_first", "--heaviest-first"),
    ("max_plan_factor", "--max-plan-factor"),
    ("rank_speed", "--rank-speed"),
    ("plan_groups", "--plan-groups"),
)


def _previous(from_samples: str, epoch: int, m: Manifest | None) -> tuple[str, Manifest]:
    """PREV (the directory of ``from_samples``) and its manifest (``m`` when the caller holds it)."""
    prev = previous_dir(from_samples)
    if m is None:
        try:
            m = load_manifest(prev)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(
                f"--replan-from {epoch} continues the manifest beside --from-samples: {e}"
            ) from None
    return prev, m


def replan_settings(
    cfg: PlanConfig, from_samples: str, epoch: int, previous: Manifest | None = None
) -> tuple[PlanConfig, Kept]:
    """``cfg`` with the previous manifest's cost history and the model that planned its epochs before
    ``epoch`` (``PlanConfig.earlier``), and what the build must keep of it. ``previous``: that manifest
    when the caller holds it (else it is read from beside ``from_samples``).

    Raises:
        UsageError: no committed manifest beside --from-samples, ``epoch`` outside the plans, a
            plan setting that differs from the previous manifest's, or costs given with the samples.
    """
    prev, m = _previous(from_samples, epoch, previous)
    if not epoch <= m.epochs or not epoch < cfg.epochs:
        raise UsageError(
            f"--replan-from {epoch}: {prev} plans epochs 0..{m.epochs - 1} and --epochs {cfg.epochs} plans "
            f"0..{cfg.epochs - 1}; E must be at most {m.epochs} and below --epochs"
        )
    try:
        before = PlanConfig.from_manifest(m)
    except (ValueError, TypeError) as e:
        raise UsageError(f"--replan-from: {prev}'s plan settings cannot be used ({e})") from None
    if m.cost_model.name == "given":
        raise UsageError(
            f"--replan-from: {prev}'s costs were given with its samples: no cost model re-plans them"
        )
    for name, flag in KEPT_SETTINGS:
        mine, theirs = getattr(cfg, name), getattr(before, name)
        if mine != theirs:
            raise UsageError(
                f"--replan-from keeps {prev}'s plan settings, but {flag} gives {name} {_shown(mine)} where it "
                f"planned {_shown(theirs)}: give the previous build's flags"
            )
    if cfg.weights is not None or before.weights is not None:
        raise UsageError(
            "--replan-from with --bucket-weights: the buckets are cost quantiles and move with the cost model; "
            "re-plan without bucket weights"
        )
    then = before.planned_with(epoch - 1) or (checked_model(m.cost_model), m.buckets.edges)
    earlier = (*(h for h in before.earlier if h[0] < epoch), (epoch, *then))
    try:
        cfg = dataclasses.replace(cfg, earlier=earlier)
    except ValueError as e:
        raise UsageError(f"--replan-from {epoch}: {e}") from None
    return cfg, kept_from(prev, m, epoch)


def _shown(value: object) -> str:
    if value is None:
        return "none"
    to_json = getattr(value, "to_json", None)
    return str(to_json() if callable(to_json) else value)


def replan_options(
    m: Manifest, samples: str, epoch: int, cost_model: str, epochs: int | None = None
) -> tuple[BuildOptions, PlanConfig]:
    """The options and plan of ``build OUT --from-samples samples --replan-from epoch --cost-model
    cost_model`` that continue manifest ``m`` with its own plan settings (``KEPT_SETTINGS``), epochs
    (``epochs`` None: ``m``'s) and recorded reject fraction: what ``lidarshard.replan`` builds.

    Raises:
        UsageError: a bad ``epoch``, ``cost_model`` or ``epochs`` (the flags' messages), or plan
            settings of ``m`` that cannot be used.
    """
    fraction = m.max_reject_fraction
    given: dict[str, Any] = {
        "world_size": m.world_size,
        "batch_size": m.batch_size,
        "epochs": m.epochs if epochs is None else epochs,
        "from_samples": samples,
        "replan_from": epoch,
        "cost_model": cost_model,
        "max_reject_fraction": fraction if isinstance(fraction, (int, float)) else None,
    }
    opts = BuildOptions.from_keywords(given)
    try:
        cfg = PlanConfig.from_manifest(m, epochs=opts.epochs, earlier=())  # replan_settings adds the history
    except (ValueError, TypeError) as e:
        raise UsageError(f"replan: the plan settings of {samples} cannot be used ({e})") from None
    return opts, cfg
