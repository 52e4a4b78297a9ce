"""The manifest's ``plan_groups`` (4.4): how many step groups each epoch was planned in, and by which rule.

A hierarchical plan (``lidarshard.transforms.core.groups``) deals an epoch's samples into G step groups
by a stable hash of (sample_id, seed, epoch), plans each group alone and interleaves the groups' steps;
G = 1 is the single-pool plan. ``rule`` is the auto rule's text (G chosen from the accepted samples) or
``"forced"`` (``--plan-groups N``). Absent in manifests written before 4.4: one group. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lidarshard.schemas.jsonread import Reader

__all__ = ["PlanGroups", "MAX_PLAN_GROUPS"]

#: The most step groups a plan may have (``--plan-groups``).
MAX_PLAN_GROUPS = 1 << 20


@dataclass(frozen=True)
class PlanGroups:
    """``{"groups": G, "rule": text}``: G >= 1 step groups per epoch, chosen by ``rule``."""

    groups: int
    rule: str

    @classmethod
    def parse(cls, r: Reader) -> PlanGroups | None:
        """``r.obj['plan_groups']``, or None when absent (a plan of one group)."""
        if r.obj_("plan_groups", optional=True) is None:
            return None
        g = r.sub("plan_groups")
        if set(g.obj) != {"groups", "rule"}:
            raise r.fail("plan_groups", "an object of ['groups', 'rule']", g.obj)
        return cls(g.int_("groups", 1, MAX_PLAN_GROUPS), str(g.str_("rule")))

    def to_json(self) -> dict[str, Any]:
        return {"groups": self.groups, "rule": self.rule}
