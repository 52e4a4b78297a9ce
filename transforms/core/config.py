"""What decides a plan besides the samples (``PlanConfig``): frozen, built once and passed down. Each field
that a user sets is an option (``lidarshard.transforms.declare``): ``lidarshard build``'s flags and the
Python API's keywords are generated from these fields, so the planner's config is the one declaration of
its settings. Built from the flags or keywords of a build (composed into ``pipelines.options.BuildOptions``)
or from the manifest a plan was written with (``PlanConfig.from_manifest``: validate, report, a re-plan).
Pure.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.plan_groups import MAX_PLAN_GROUPS
from lidarshard.transforms.declare import Switch, nested, option
from lidarshard.transforms.features import buckets
from lidarshard.transforms.features.cost import CostModel, checked_model
from lidarshard.transforms.features.repeat import WeightSpec, parse_repeat_factors
from lidarshard.transforms.plan import DEFAULT_STRATEGY, STRATEGIES, STRATEGY_HELP, budget, order
from lidarshard.transforms.plan.caps import Caps
from lidarshard.transforms.plan.speeds import parse_rank_speed, rank_speeds
from lidarshard.transforms.value_checks import choice, float_in, float_list, int_in, parsed_by

__all__ = [
    "MAX_PLAN_FACTOR",
    "GROUP_SAMPLES",
    "AUTO_RULE",
    "auto_groups",
    "parse_plan_groups",
    "plan_groups_value",
    "PlanConfig",
]

#: Default bound on plan entries per input sample per epoch (``--max-plan-factor``).
MAX_PLAN_FACTOR = 100.0
#: Samples per step group of a hierarchical plan (``transforms.core.groups``): the auto rule plans N
#: accepted samples in ``G = max(1, N // GROUP_SAMPLES)`` groups, so each group holds 2^20 to 2^21 samples
#: on average (a pool whose balance matches one pool's) and N < 2^21 is one group, today's plan.
GROUP_SAMPLES = 1 << 20
#: How the manifest names the auto rule (``plan_groups.rule``); a forced G (``--plan-groups N``) is "forced".
AUTO_RULE = "auto: G = max(1, N // 1048576)"


def auto_groups(n: int) -> int:
    """G of the auto rule for ``n`` accepted samples."""
    return max(1, n // GROUP_SAMPLES)


def plan_groups_value(value: int | None) -> int | None:
    """``--plan-groups`` as given to the API: None (auto) or an int in 1..MAX_PLAN_GROUPS."""
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or not 1 <= value <= MAX_PLAN_GROUPS
    ):
        raise ValueError(f"{value!r} is not auto or an integer in [1, {MAX_PLAN_GROUPS}]")
    return None if value is None else int(value)


def parse_plan_groups(text: str) -> int | None:
    """``--plan-groups`` text: ``auto`` (None) or an int in 1..MAX_PLAN_GROUPS."""
    if text.strip() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not auto or an integer in [1, {MAX_PLAN_GROUPS}]") from None
    return plan_groups_value(value)


@dataclass(frozen=True)
class PlanConfig:
    """Everything that decides a plan besides the samples; the fields a user sets are ``build``'s options."""

    world_size: int = option("data-parallel ranks W", check=int_in(1, 1 << 20), metavar="W")
    batch_size: int = option("samples per rank per step B", check=int_in(1, 1 << 20), metavar="B")
    epochs: int = option("epochs to plan", 1, check=int_in(1, 10_000), metavar="E")
    seed: int = option("plan seed", 0, check=int_in(0, 2**63 - 1), metavar="S")
    strategy: str = option("how each step is filled, one of:\n" + STRATEGY_HELP, DEFAULT_STRATEGY,
                           check=choice(*sorted(STRATEGIES)))  # fmt: skip
    #: None: ``buckets.default_num_buckets(N)``, or the number of ``weights`` when there are several.
    policy: str = option("what fills the last step", "drop_last", switches=(
        Switch("--drop-last", "drop_last", "drop the samples that do not fill a last step", "on"),
        Switch("--pad", "pad", "repeat random samples to fill the last step", "off (--drop-last)")))  # fmt: skip
    num_buckets: int | None = option(
        "cost buckets K in [1, 4096]", None, flag="--buckets", check=int_in(1, 4096), metavar="K",
        shown="clamp(sqrt(N)/4, 4, 64), or the number of --bucket-weights")  # fmt: skip
    weights: tuple[float, ...] | None = option(
        "w0,w1,..: per-bucket sampling weight, w>1 repeats a bucket, w<1 thins it", None, flag="--bucket-weights",
        check=float_list(lo=0.0), shown="all 1", metavar="W0,W1,..")  # fmt: skip
    caps: Caps = nested(Caps())
    max_plan_factor: float = option(
        "refuse a plan with more than this many entries per input sample per epoch", MAX_PLAN_FACTOR,
        check=float_in(1.0, 1e6), metavar="X")  # fmt: skip
    repeat: WeightSpec = nested(
        WeightSpec()
    )  # where per-sample weights come from (the manifest's repeat.mode)
    #: Step groups G of each epoch's plan (``transforms.core.groups``); None: ``auto_groups``.
    heaviest_first: str = option(
        "off | points | cost | memory: fail fast on memory: each epoch's step 0 is the step holding its heaviest "
        "rank-step by points (num_points), predicted cost or predicted peak memory (needs --max-step-memory), the "
        "sums the caps bound; only the order of the steps changes", "off", check=choice(*order.HEAVIEST_FIRST))  # fmt: skip
    #: (W,) relative speed of each rank (mixed hardware), None: all equal.
    earlier: tuple[tuple[int, CostModel, tuple[float, ...]], ...] = ()
    rank_speed: tuple[float, ...] | None = option(
        "S0,S1,.. or @file.json: each rank's relative speed (mixed hardware, e.g. 1,1,0.6,0.6): budget gives "
        "each rank work in proportion at every step; other strategies hand each step's heaviest batch to the "
        "fastest rank", None, check=parsed_by(parse_rank_speed, rank_speeds), shown="all equal",
        metavar="S0,S1,..")  # fmt: skip
    plan_groups: int | None = option(
        "advanced: plan each epoch in G step groups (samples dealt by a stable hash of sample_id, seed and epoch; "
        "each group planned alone, the steps interleaved), so no process plans the whole epoch; 1 is one pool",
        None, check=parsed_by(parse_plan_groups, plan_groups_value), shown=AUTO_RULE, metavar="auto|G")  # fmt: skip
    #: ``(until_epoch, model, bucket edges)`` ascending: epochs before ``until_epoch`` (and from the previous
    #: entry's on) were planned with ``model``'s costs in those buckets, later ones with the samples' own
    #: ``cost`` and ``bucket_id`` (``build --replan-from``).
    #: The cost model's ``launch_ms``: what every rank-step adds whatever its samples (0: none fitted); the
    #: balance numbers price it (``step_cost``), the planners plan the per-sample costs.
    launch: float = 0.0

    def __post_init__(self) -> None:
        if self.num_buckets is None and self.weights is not None and len(self.weights) > 1:
            object.__setattr__(self, "num_buckets", len(self.weights))  # one bucket per weight
        if self.world_size < 1 or self.batch_size < 1 or self.epochs < 1:
            raise ValueError("--world-size, --batch-size and --epochs must be >= 1")
        if self.seed < 0:
            raise ValueError("--seed must be >= 0")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown --strategy {self.strategy!r}; choose from {sorted(STRATEGIES)}")
        if self.policy not in buckets.POLICIES:
            raise ValueError(f"policy must be one of {buckets.POLICIES}")
        if self.heaviest_first not in order.HEAVIEST_FIRST:
            raise ValueError(
                f"unknown --heaviest-first {self.heaviest_first!r}; choose from {list(order.HEAVIEST_FIRST)}"
            )
        problem = budget.caps_problem(self.caps, self.world_size) if self.strategy == "budget" else None
        if problem:
            raise ValueError(problem)
        if self.heaviest_first == "memory" and self.caps.memory is None:
            raise ValueError(
                "--heaviest-first memory needs the memory model of --max-step-memory: give --max-step-memory "
                "and --memory-model, or order by points or cost"
            )
        if self.rank_speed is not None and (
            len(self.rank_speed) != self.world_size
            or not all(math.isfinite(v) and v > 0 for v in self.rank_speed)
        ):
            raise ValueError(
                f"--rank-speed gives {len(self.rank_speed)} speeds but --world-size is {self.world_size}: give "
                "one finite speed > 0 per rank"
            )
        if self.plan_groups is not None and not 1 <= self.plan_groups <= MAX_PLAN_GROUPS:
            raise ValueError(f"--plan-groups must be auto or in 1..{MAX_PLAN_GROUPS}, got {self.plan_groups}")
        if not (math.isfinite(self.launch) and self.launch >= 0):
            raise ValueError(f"the cost model's launch_ms must be a finite number >= 0, got {self.launch}")
        ends = [e for e, _, _ in self.earlier]
        if ends != sorted(set(ends)) or any(not 0 < e < self.epochs for e in ends):
            raise ValueError(
                f"a re-plan's epochs {ends} must rise and lie in 1..{self.epochs - 1} (the plan has {self.epochs})"
            )

    def planned_with(self, epoch: int) -> tuple[CostModel, tuple[float, ...]] | None:
        """(the model, its bucket edges) that planned ``epoch`` when they are not the samples' own costs
        and buckets (an epoch before a re-plan, ``earlier``), else None."""
        return next(((model, edges) for end, model, edges in self.earlier if epoch < end), None)

    def step_cost(self, epoch: int) -> float:
        """What every rank-step of ``epoch`` adds to its samples' costs: the ``launch_ms`` of the model that
        planned it (``planned_with``), else ``launch``."""
        then = self.planned_with(epoch)
        return (then[0].launch_ms or 0.0) if then is not None else self.launch

    def groups(self, n: int) -> int:
        """G, the step groups each epoch of ``n`` accepted samples is planned in: forced or ``auto_groups``."""
        return self.plan_groups if self.plan_groups is not None else auto_groups(n)

    def groups_record(self, n: int) -> dict[str, Any]:
        """The manifest's ``plan_groups`` object for ``n`` accepted samples: ``{"groups": G, "rule": ...}``."""
        return {"groups": self.groups(n), "rule": "forced" if self.plan_groups is not None else AUTO_RULE}

    @property
    def step_size(self) -> int:
        """W*B: the samples one step of all ranks holds (the mean under ``budget``)."""
        return self.world_size * self.batch_size

    def to_json(self) -> dict[str, Any]:
        """The manifest's plan settings (``Manifest.to_json`` keys); ``heaviest_first`` is recorded beside
        the caps, in the ``caps`` object, only when it is on (so plans without it keep their bytes)."""
        caps, memory = self.caps.to_record(self.heaviest_first)
        history = [
            {"until_epoch": e, "cost_model": model.to_json(), "bucket_edges": list(edges)}
            for e, model, edges in self.earlier
        ]
        return {
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "epochs": self.epochs,
            "seed": self.seed,
            "strategy": self.strategy,
            "policy": self.policy,
            "max_plan_factor": self.max_plan_factor,
            "caps": caps.to_json(),
            **({"memory_cap": memory.to_json()} if memory is not None else {}),
            **({"cost_history": history} if history else {}),
            **({"rank_speed": list(self.rank_speed)} if self.rank_speed is not None else {}),
        }

    @classmethod
    def from_manifest(cls, m: Manifest, **changes: Any) -> PlanConfig:
        """The settings a manifest was planned with, as its planner saw them: bucket weights cut to
        the buckets that hold samples; ``changes`` override fields (``strategy="random"``).

        Raises:
            ValueError: a setting the manifest records is not a valid one (strategy, caps, repeat mode).
        """
        used = [k for k, n in enumerate(m.buckets.counts) if n > 0]
        k = used[-1] + 1 if used else 1
        mode = m.repeat.mode if m.repeat is not None else None
        repeat = WeightSpec()
        if mode is not None and mode.startswith("lidarseg:"):
            repeat = WeightSpec(threshold=parse_repeat_factors(mode))
        elif mode is not None and mode.startswith("column:"):
            repeat = WeightSpec(column=mode[len("column:") :])
        scale = m.repeat.datasets if m.repeat is not None else None
        if scale:
            pairs = tuple(sorted((str(k), float(v)) for k, v in scale.items()))
            repeat = WeightSpec(repeat.threshold, repeat.column, pairs)
        first = m.caps.heaviest_first if m.caps is not None else "off"
        earlier = tuple((h.until_epoch, checked_model(h.cost_model), h.bucket_edges) for h in m.cost_history)
        weights = tuple(m.buckets.weights[:k])
        fields: dict[str, Any] = {
            "world_size": m.world_size,
            "batch_size": m.batch_size,
            "epochs": m.epochs,
            "seed": m.seed,
            "strategy": m.strategy,
            "policy": m.policy,
            "num_buckets": m.buckets.k,
            "weights": None if all(w == 1.0 for w in weights) else weights,  # None: all 1, any k
            "caps": Caps.from_record(m.caps, m.memory_cap),
            "max_plan_factor": MAX_PLAN_FACTOR if m.max_plan_factor is None else m.max_plan_factor,
            "repeat": repeat,
            "heaviest_first": first,
            "earlier": earlier,
            "rank_speed": m.rank_speed,
            "plan_groups": _recorded_groups(m),
            "launch": m.cost_model.launch_ms or 0.0,
        }
        return cls(**(fields | changes))

    @classmethod
    def continuing(cls, m: Manifest, epoch: int, epochs: int) -> PlanConfig:
        """The settings of a re-plan of ``m`` from ``epoch`` on, over ``epochs`` epochs (``build --replan-from``):
        ``m``'s own, its epochs before ``epoch`` planned as ``m`` planned them (its cost history up to there,
        then the model that planned epoch ``epoch - 1``); later ones with the samples' new costs.

        Raises:
            ValueError: a setting ``m`` records is not a valid one, or ``epoch`` is outside ``1..epochs-1``.
        """
        history = tuple((h.until_epoch, checked_model(h.cost_model), h.bucket_edges) for h in m.cost_history)
        then = next(((model, edges) for end, model, edges in history if epoch - 1 < end), None)
        then = then or (checked_model(m.cost_model), m.buckets.edges)
        return cls.from_manifest(
            m, epochs=epochs, earlier=(*(h for h in history if h[0] < epoch), (epoch, *then))
        )


def _recorded_groups(m: Manifest) -> int | None:
    """``plan_groups`` of the plan ``m`` records: None (auto) when the auto rule still gives its G, else its G."""
    g = m.plan_groups.groups if m.plan_groups is not None else 1
    auto = m.plan_groups is None or m.plan_groups.rule == AUTO_RULE
    return None if auto and auto_groups(m.counts.accepted) == g else g
