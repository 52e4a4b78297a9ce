"""What decides a plan besides the samples (``PlanConfig``): frozen, built once from the options of a build
(``lidarshard.pipelines.settings.plan_config``) or from the manifest a plan was written with
(``PlanConfig.from_manifest``: validate, report, a re-plan), and passed down. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.plan_groups import MAX_PLAN_GROUPS
from lidarshard.transforms.features import buckets
from lidarshard.transforms.features.cost import CostModel, checked_model
from lidarshard.transforms.features.repeat import WeightSpec, parse_repeat_factors
from lidarshard.transforms.plan import DEFAULT_STRATEGY, STRATEGIES, order
from lidarshard.transforms.plan.caps import Caps

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
        isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PLAN_GROUPS
    ):
        raise ValueError(f"{value!r} is not auto or an integer in [1, {MAX_PLAN_GROUPS}]")
    return value


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
    """Everything that decides a plan besides the samples."""

    world_size: int
    batch_size: int
    epochs: int = 1
    seed: int = 0
    strategy: str = DEFAULT_STRATEGY
    policy: str = "drop_last"
    num_buckets: int | None = None  # None: buckets.default_num_buckets(N)
    weights: tuple[float, ...] | None = None
    caps: Caps = Caps()
    max_plan_factor: float = MAX_PLAN_FACTOR  # plan entries per sample per epoch, at most
    repeat: WeightSpec = WeightSpec()  # where per-sample weights come from (the manifest's repeat.mode)
    heaviest_first: str = "off"  # order.HEAVIEST_FIRST: by which rank-step sums put the heaviest step at 0
    #: ``(until_epoch, model, bucket edges)`` ascending: epochs before ``until_epoch`` (and from the previous
    #: entry's on) were planned with ``model``'s costs in those buckets, later ones with the samples' own
    #: ``cost`` and ``bucket_id`` (``build --replan-from``).
    earlier: tuple[tuple[int, CostModel, tuple[float, ...]], ...] = ()
    #: ``--rank-speed``: (W,) relative speed of each rank (mixed hardware), None: all equal.
    rank_speed: tuple[float, ...] | None = None
    #: ``--plan-groups``: step groups G of each epoch's plan (``transforms.core.groups``); None: ``auto_groups``.
    plan_groups: int | None = None
    #: The cost model's ``launch_ms``: what every rank-step adds whatever its samples (0: none fitted); the
    #: balance numbers price it (``step_cost``), the planners plan the per-sample costs.
    launch: float = 0.0

    def __post_init__(self) -> None:
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
        if self.heaviest_first == "memory" and self.caps.memory is None:
            raise ValueError("--heaviest-first memory needs the memory model of --max-step-memory")
        if self.rank_speed is not None and (
            len(self.rank_speed) != self.world_size
            or not all(math.isfinite(v) and v > 0 for v in self.rank_speed)
        ):
            raise ValueError(
                f"--rank-speed gives {len(self.rank_speed)} speeds for --world-size {self.world_size} ranks: "
                "give one finite speed > 0 per rank"
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
        first = {} if self.heaviest_first == "off" else {"heaviest_first": self.heaviest_first}
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
            "caps": self.caps.to_json() | first,
            **(
                {"memory_cap": self.caps.memory.to_record().to_json()} if self.caps.memory is not None else {}
            ),
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


def _recorded_groups(m: Manifest) -> int | None:
    """``plan_groups`` of the plan ``m`` records: None (auto) when the auto rule still gives its G, else its G."""
    g = m.plan_groups.groups if m.plan_groups is not None else 1
    auto = m.plan_groups is None or m.plan_groups.rule == AUTO_RULE
    return None if auto and auto_groups(m.counts.accepted) == g else g
