"""What a sampler's position means: the batches it hands out (:class:`PlannedBatch`), the resume state's
ties to its plan (:func:`plan_keys`, :func:`saved_shape`) and a re-plan's continuation
(:func:`continued_from`). Pure Python, used by the sampler core ``lidarshard.loaders.replay.PlanReplay``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from lidarshard.loaders.reader import check_int
from lidarshard.loaders.reshard import Switch
from lidarshard.schemas.manifest import Manifest
from lidarshard.schemas.records import HistoryEntry

__all__ = ["PlannedBatch", "plan_keys", "saved_shape", "continued_from"]


class PlannedBatch(list):
    """One planned batch of dataset indices (a ``list[int]``), with where it stands in the plan.

    Attributes:
        step: the step of the epoch this batch is.
        ahead: the index lists of the next batches the same consumer (DataLoader worker) will be
            given, nearest first, from the plan (``Position.lookahead``); empty when nothing asked.
            A dataset may start reading their files now (``PointCloudDataset``'s prefetch).

    ``sent``, when given, is called each time the batch is pickled: a ``DataLoader`` with worker processes
    pickles every batch it hands to a worker, which is how a sampler learns that batches run ahead of
    training (the copy a worker gets has no ``sent``).
    """

    def __init__(
        self,
        indices: list[int],
        step: int,
        ahead: tuple[tuple[int, ...], ...] = (),
        sent: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(indices)
        self.step, self.ahead, self._sent = step, ahead, sent

    def __index__(self) -> int:
        """Refused: a whole batch taken as one dataset index means the sampler was given as ``sampler=``
        (torch then hands each batch to ``dataset[i]``); ``list[int]``, numpy and torch uses still work."""
        raise TypeError(
            f"a planned batch of {len(self)} dataset indices was used as one index: the lidarshard batch "
            "sampler yields whole batches, pass it as DataLoader(dataset, batch_sampler=sampler), not "
            "sampler= (or use PlanLoader(dataset, sampler))"
        )

    def __reduce__(self):  # pickled to DataLoader workers whole
        if self._sent is not None:
            self._sent()
        return (PlannedBatch, (list(self), self.step, self.ahead))


def plan_keys(manifest: Manifest, epoch: int) -> dict[str, int | str]:
    """The keys that tie a resume state to epoch ``epoch``'s plan: ``seed``, ``strategy``, ``plan_fingerprint``
    (``Manifest.plan_fingerprint`` of the planned epoch ``epoch % epochs``)."""
    return {
        "seed": manifest.seed,
        "strategy": manifest.strategy,
        "plan_fingerprint": manifest.plan_fingerprint(epoch % manifest.epochs),
    }


def saved_shape(state: Mapping, manifest: Manifest, where: object) -> tuple[int, int, list[Switch]]:
    """``(world_size, batch_size, history)`` a resume state was saved at, once it is known to be this plan's.

    A state without ``world_size`` / ``batch_size`` (written by an older lidarshard) was saved at the
    manifest's W, B; one without ``plan_fingerprint`` cannot be tied to its plan and is taken as this one's.

    Raises:
        ValueError: the state belongs to another plan (other seed, world size, batch size, strategy or a
            rebuilt manifest): one line naming both.
        TypeError: a value is not an int.
    """
    epoch = check_int("epoch", state["epoch"], 0)
    mine = manifest.plan_fingerprint(epoch % manifest.epochs)
    theirs = state.get("plan_fingerprint")
    w = check_int("world_size", state.get("world_size", manifest.world_size), 1)
    b = check_int("batch_size", state.get("batch_size", manifest.batch_size), 1)
    if theirs is not None and theirs != mine:
        raise ValueError(
            f"the resume state belongs to another plan: saved on plan {theirs} (seed {state.get('seed', '?')}, "
            f"strategy {state.get('strategy', '?')}, running world_size {w}, batch_size {b}) but {where} epoch "
            f"{epoch % manifest.epochs} is plan {mine} (seed {manifest.seed}, strategy {manifest.strategy}, "
            f"world_size {manifest.world_size}, batch_size {manifest.batch_size}): resume on the manifest the "
            "checkpoint trained on, or start this plan's epoch from step 0"
        )
    raw = state.get("history") or []
    if not isinstance(raw, (list, tuple)) or any(
        not isinstance(h, (list, tuple)) or len(h) != 3 for h in raw
    ):
        raise ValueError(f"history must list [consumed_steps, world_size, batch_size] switches, got {raw!r}")
    history: list[Switch] = [
        (
            check_int("history step", c, 0),
            check_int("history world_size", hw, 1),
            check_int("history batch_size", hb, 1),
        )
        for c, hw, hb in raw
    ]
    return w, b, history


def continued_from(current: Manifest, new: Manifest, here: object, there: object) -> int:
    """The epoch E from which ``new`` (a ``build --replan-from E`` of ``current``) plans anew, after checking
    that it continues ``current``: the same samples, W, B, seed and strategy, and every epoch before E
    the same plan file for file (so a position or resume state of those epochs means the same batches).

    Raises:
        ValueError: ``new`` does not continue ``current`` (one line naming what differs).
    """
    if not new.cost_history:
        raise ValueError(
            f"{there} is not a re-plan (no cost_history): build it with --from-samples {here}/samples --replan-from E"
        )
    start = new.cost_history[-1].until_epoch
    if new.epochs == current.epochs and all(
        new.plan_fingerprint(e) == current.plan_fingerprint(e) for e in range(new.epochs)
    ):
        raise ValueError(f"{there} is the plan {here} already replays: nothing to switch to")
    for what in ("world_size", "batch_size", "seed", "strategy", "inputs_fingerprint"):
        mine, theirs = getattr(current, what), getattr(new, what)
        if mine != theirs:
            raise ValueError(f"{there} does not continue {here}: {what} {theirs} != {mine}")
    differs = next(
        (
            e
            for e in range(start)
            if e >= current.epochs or new.plan_fingerprint(e) != current.plan_fingerprint(e)
        ),
        None,
    )
    if differs is not None:
        raise ValueError(
            f"{there} does not continue {here}: its epoch {differs} is another plan (it re-plans from epoch {start})"
        )
    if list(new.cost_history) != _history_until(current, start):
        raise ValueError(
            f"{there} does not continue {here}: its cost_history does not record the cost models that planned "
            f"{here}'s epochs 0..{start - 1}"
        )
    return start


def _history_until(m: Manifest, start: int) -> list[HistoryEntry]:
    """The ``cost_history`` a re-plan of ``m`` from epoch ``start`` records: ``m``'s entries before ``start``,
    then (``start``, the model and bucket edges that planned ``m``'s epoch ``start - 1``)."""
    then = next((h for h in m.cost_history if h.until_epoch >= start), None)
    model, edges = (then.cost_model, then.bucket_edges) if then else (m.cost_model, tuple(m.buckets.edges))
    return [*(h for h in m.cost_history if h.until_epoch < start), HistoryEntry(start, model, edges)]
