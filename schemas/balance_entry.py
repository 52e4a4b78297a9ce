"""One epoch's ``balance`` entry of ``_manifest.json``, typed: what the plan buys, predicted from the
cost model. Imports nothing of lidarshard outside ``schemas``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from lidarshard.schemas.jsonread import Reader
from lidarshard.schemas.jsonsafe import short

__all__ = ["BALANCE_NUMBERS", "BALANCE_SPEED_NUMBERS", "BalanceEntry"]


#: A balance entry's numbers, in the order ``transforms.plan.metrics.balance_summary`` writes them.
BALANCE_NUMBERS = (
    "linearity",
    "greedy_reference",
    "random_linearity",
    "spearman_step_cost",
    "worst_step_linearity",
    "rank_total_cv",
    "mean_count",
)
#: Numbers an entry holds only with ``--rank-speed`` (4.2; ``random_speed_linearity`` from 4.3).
BALANCE_SPEED_NUMBERS = ("speed_linearity", "random_speed_linearity")


@dataclass(frozen=True)
class BalanceEntry:
    """One epoch's ``balance`` entry: what the plan buys, predicted from the cost model
    (``transforms.plan.explain.COLUMNS`` says what each number means)."""

    epoch: int
    steps: int
    max_count: int
    linearity: float
    greedy_reference: float
    random_linearity: float
    spearman_step_cost: float
    worst_step_linearity: float
    rank_total_cv: float
    mean_count: float
    speed_linearity: float | None = None
    random_speed_linearity: float | None = None

    def value(self, key: str) -> float | None:
        """The number ``key`` (one of ``BALANCE_NUMBERS`` + ``BALANCE_SPEED_NUMBERS``), None when absent."""
        if key not in BALANCE_NUMBERS + BALANCE_SPEED_NUMBERS:
            raise KeyError(f"a balance entry holds no {key!r}")
        got = getattr(self, key)
        return None if got is None else float(got)

    def to_json(self) -> dict:
        """The manifest's entry (the speed numbers only where recorded)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k not in BALANCE_SPEED_NUMBERS}

    @classmethod
    def parse(cls, obj: object, where: str) -> BalanceEntry:
        """Checked entry of ``obj`` (ints and finite numbers, the speed numbers optional).

        Raises:
            ValueError: one line naming ``where.key``.
        """
        if not isinstance(obj, Mapping):
            raise ValueError(f"{where}: expected an object, got {short(obj)}")
        r = Reader(obj, where)
        ints = {k: r.int_(k) for k in ("epoch", "steps", "max_count")}
        numbers = {k: r.number(k) for k in BALANCE_NUMBERS}
        speeds = {k: r.number(k, optional=True) for k in BALANCE_SPEED_NUMBERS}
        return cls(**ints, **numbers, **speeds)  # type: ignore[arg-type]
