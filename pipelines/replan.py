"""``build --from-samples PREV/samples --replan-from E`` and ``lidarshard.replan``: a re-plan's plan, before Beam.

A re-plan continues manifest PREV: epochs ``< E`` keep PREV's plan byte for byte (planned again with the
cost model that planned them, recorded in ``cost_history``), epochs ``E..`` are planned with the new
``--cost-model``. Every other plan setting must be PREV's, so that a trainer that ran PREV's epochs
``< E`` moves to the new manifest at epoch E (``sampler.switch_plan``) and its resume states stay valid.
The plan is constructed once, from PREV's manifest (``PlanConfig.continuing``); the flags of a command line
re-plan are only compared with it. The build checks at its end that the kept epochs' files are PREV's
(``transforms.core.manifest_writer.Kept``).
"""

from __future__ import annotations

from lidarshard.schemas.manifest import Manifest
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.core.earlier_run import previous_dir
from lidarshard.transforms.core.manifest_writer import Kept, kept_from
from lidarshard.transforms.io.metadata import load_manifest
from lidarshard.transforms.value_checks import UsageError

__all__ = ["KEPT_SETTINGS", "continued"]

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


def continued(
    from_samples: str,
    epoch: int,
    epochs: int | None,
    given: PlanConfig | None = None,
    m: Manifest | None = None,
) -> tuple[PlanConfig, Kept]:
    """The plan of a re-plan of the manifest beside ``from_samples`` (``m`` when the caller holds it) from
    ``epoch`` on, over ``epochs`` epochs (None: its own), and what the build must keep of it. ``given``: the
    plan the command line's flags ask for, which must keep the manifest's settings.

    Raises:
        UsageError: no committed manifest there, ``epoch`` outside the plans, a plan setting the flags
            change, settings of it that cannot be used, bucket weights, or costs given with the samples.
    """
    prev = previous_dir(from_samples)
    if m is None:
        try:
            m = load_manifest(prev)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(
                f"--replan-from {epoch} continues the manifest beside --from-samples: {e}"
            ) from None
    epochs = m.epochs if epochs is None else epochs
    if not epoch <= m.epochs or not epoch < epochs:
        raise UsageError(
            f"--replan-from {epoch}: {prev} plans epochs 0..{m.epochs - 1} and --epochs {epochs} plans "
            f"0..{epochs - 1}; E must be at most {m.epochs} and below --epochs"
        )
    if m.cost_model.name == "given":
        raise UsageError(
            f"--replan-from: {prev}'s costs were given with its samples: no cost model re-plans them"
        )
    try:
        cfg = PlanConfig.continuing(m, epoch, epochs)
    except (ValueError, TypeError) as e:
        raise UsageError(f"--replan-from {epoch}: {prev}'s plan settings cannot be used ({e})") from None
    for name, flag in KEPT_SETTINGS if given is not None else ():
        mine, theirs = getattr(given, name), getattr(cfg, name)
        if mine != theirs:
            raise UsageError(
                f"--replan-from keeps {prev}'s plan settings, but {flag} gives {name} {_shown(mine)} where it "
                f"planned {_shown(theirs)}: give the previous build's flags"
            )
    if cfg.weights is not None or (given is not None and given.weights is not None):
        raise UsageError(
            "--replan-from with --bucket-weights: the buckets are cost quantiles and move with the cost model; "
            "re-plan without bucket weights"
        )
    return cfg, kept_from(prev, m, epoch)


def _shown(value: object) -> str:
    if value is None:
        return "none"
    to_json = getattr(value, "to_json", None)
    return str(to_json() if callable(to_json) else value)
