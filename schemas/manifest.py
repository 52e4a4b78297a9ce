"""``_manifest.json`` as one typed, checked, frozen object: what every consumer reads.

The build writes it with :meth:`Manifest.to_json`; validate, report, calibrate, elastic and the loaders
read it with :meth:`Manifest.from_json` (``lidarshard.loaders.reader.load_manifest`` adds the
``_SUCCESS`` and schema-version checks). A forged or malformed file is refused here, once, with one line
naming the key, so no consumer indexes a raw dict or sizes an allocation by an unchecked number.

Keys and their meaning: ``lidarshard.schemas.MANIFEST_KEYS``. Keys this module does not type (the
scan's provenance: ``input``, ``scan_config``, ...) are kept as written in ``provenance``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lidarshard.schemas import VARIABLE_COUNT, plan_file, plan_key
from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.records import (
    Buckets,
    CapsRecord,
    CostModel,
    Counts,
    DatasetEntry,
    FileEntry,
    HistoryEntry,
    Reader,
    RepeatRecord,
    relpath_problem,
)

__all__ = ["Manifest", "Counts", "Buckets", "FileEntry", "POLICIES", "relpath_problem"]

#: How a pool that is not a multiple of W*B is fitted (``--drop-last`` / ``--pad``).
POLICIES = ("drop_last", "pad")
#: The plan keys, in the order ``to_json`` writes them after the provenance.
_PLAN_KEYS = (
    "world_size", "batch_size", "epochs", "seed", "strategy", "policy", "max_plan_factor", "caps", "rank_speed", "repeat", "cost_model",
    "cost_history", "buckets", "steps_per_epoch", "counts", "balance", "pair_repeat_rate", "inputs_fingerprint", "files",
    "plan_schema",
)  # fmt: skip
_REQUIRED = (
    "schema_version", "world_size", "batch_size", "epochs", "seed", "strategy", "policy", "cost_model",
    "buckets", "steps_per_epoch", "counts", "balance", "inputs_fingerprint", "files",
)  # fmt: skip
_SEED_MAX = 2**63 - 1
#: No epoch plans more entries than this (planning takes ~100 bytes an entry: 2**40 would need ~100 TiB).
MAX_EPOCH_ENTRIES = 1 << 40


@dataclass(frozen=True)
class Manifest:
    """A committed manifest's ``_manifest.json``, checked (see :meth:`from_json`).

    ``where`` names the file in messages; it is not written. Plan-shape invariants hold for every
    instance: ``len(steps_per_epoch) == len(balance) == epochs`` and every per-epoch count has E values.
    """

    where: str
    schema_version: str
    world_size: int
    batch_size: int
    epochs: int
    seed: int
    strategy: str
    policy: str
    steps_per_epoch: tuple[int, ...]
    counts: Counts
    buckets: Buckets
    cost_model: CostModel
    caps: CapsRecord | None
    repeat: RepeatRecord | None
    balance: tuple[Mapping[str, Any], ...]
    pair_repeat_rate: Mapping[str, float] | None
    inputs_fingerprint: str
    path_root: str | None
    files: Mapping[str, FileEntry]
    max_plan_factor: float | None = None
    plan_schema: list | None = None
    #: The models (and bucket edges) that planned the epochs before each re-plan (``build --replan-from``),
    #: ``until_epoch`` rising; empty: every epoch was planned with ``cost_model``.
    cost_history: tuple[HistoryEntry, ...] = ()
    #: ``--rank-speed``: (W,) relative speed of each rank (mixed hardware), or None.
    rank_speed: tuple[float, ...] | None = None
    #: The scan's INPUTs (``provenance['datasets']``, typed).
    datasets: tuple[DatasetEntry, ...] = ()
    #: The scan's ``--max-reject-fraction`` (``provenance['max_reject_fraction']``; None: not recorded).
    max_reject_fraction: float | None = None
    #: The scan's keys as written (``input``, ``datasets``, ``scan_config``, ...): what ``to_json`` writes first.
    provenance: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------- reading

    @classmethod
    def from_json(cls, obj: object, where: str = "_manifest.json") -> Manifest:
        """Check and type a parsed ``_manifest.json``.

        Raises:
            ValueError: one line naming the first missing or malformed key (``where: key must be ...``).
        """
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: not a JSON object")
        missing = [k for k in _REQUIRED if k not in obj]
        if missing:
            raise ValueError(f"{where}: missing keys {missing}")
        r = Reader(obj, where)
        epochs = r.int_("epochs", 1)
        steps = r.ints("steps_per_epoch", epochs)
        policy = r.str_("policy")
        if policy not in POLICIES:
            raise r.fail("policy", f"one of {POLICIES}", policy)
        balance = obj.get("balance")
        if (
            not isinstance(balance, list)
            or len(balance) != epochs
            or not all(isinstance(b, dict) for b in balance)
        ):
            raise r.fail("balance", f"a list of {epochs} objects", balance)
        return cls(
            where=where,
            schema_version=str(r.str_("schema_version")),
            world_size=r.int_("world_size", 1),
            batch_size=r.int_("batch_size", 1),
            epochs=epochs,
            seed=r.int_("seed", 0, _SEED_MAX),
            strategy=str(r.str_("strategy")),
            policy=str(policy),
            steps_per_epoch=steps,
            counts=Counts.parse_epochs(r.sub("counts"), epochs),
            buckets=Buckets.parse(r.sub("buckets")),
            cost_model=CostModel.parse(obj["cost_model"], f"{where}: cost_model"),
            caps=CapsRecord.parse(r),
            repeat=RepeatRecord.parse(r),
            balance=tuple(balance),
            pair_repeat_rate=_rates(r),
            inputs_fingerprint=str(r.str_("inputs_fingerprint")),
            path_root=r.str_("path_root", optional=True),
            files=_files(r),
            max_plan_factor=_factor(r),
            plan_schema=obj.get("plan_schema") if isinstance(obj.get("plan_schema"), list) else None,
            cost_history=HistoryEntry.parse_all(r, epochs),
            rank_speed=_speeds(r),
            datasets=DatasetEntry.parse_all(r),
            max_reject_fraction=r.number("max_reject_fraction", optional=True),
            provenance={
                k: v
                for k, v in obj.items()
                if k not in _PLAN_KEYS and k not in ("schema_version", "path_root")
            },
        )

    # ------------------------------------------------------------------------------------- writing

    def to_json(self) -> dict[str, Any]:
        """The ``_manifest.json`` object: schema version, provenance, ``path_root``, then the plan keys."""
        return {
            "schema_version": self.schema_version,
            **self.provenance,
            "path_root": self.path_root,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "epochs": self.epochs,
            "seed": self.seed,
            "strategy": self.strategy,
            "policy": self.policy,
            **({} if self.max_plan_factor is None else {"max_plan_factor": self.max_plan_factor}),
            "caps": None if self.caps is None else self.caps.to_json(),
            **({} if self.rank_speed is None else {"rank_speed": list(self.rank_speed)}),
            "repeat": None if self.repeat is None else self.repeat.to_json(),
            "cost_model": self.cost_model.to_json(),
            **({"cost_history": [h.to_json() for h in self.cost_history]} if self.cost_history else {}),
            "buckets": self.buckets.to_json(),
            "steps_per_epoch": list(self.steps_per_epoch),
            "counts": self.counts.to_json(),
            "balance": [dict(b) for b in self.balance],
            "pair_repeat_rate": None if self.pair_repeat_rate is None else dict(self.pair_repeat_rate),
            "inputs_fingerprint": self.inputs_fingerprint,
            "files": {p: {"bytes": f.bytes, "sha256": f.sha256} for p, f in sorted(self.files.items())},
            "plan_schema": self.plan_schema,
        }

    # ------------------------------------------------------------------------------------- queries

    @property
    def variable_count(self) -> bool:
        """True when rank-steps hold a variable number of samples (``--strategy budget``)."""
        return self.strategy in VARIABLE_COUNT

    def steps(self, epoch: int) -> int:
        """Steps of planned epoch ``epoch`` (``0 <= epoch < epochs``)."""
        return self.steps_per_epoch[epoch]

    def plan_file(self, epoch: int, rank: int) -> str:
        """Relative path of rank ``rank``'s plan for ``epoch``, as this manifest's schema names it."""
        return plan_file(epoch, rank, self.schema_version)

    def plan_key(self, rel: str) -> tuple[int, int] | None:
        """(epoch, rank) of ``rel`` when it is exactly one of this manifest's plan file names, else None."""
        return plan_key(rel, self.schema_version)

    def epoch_files(self, epoch: int) -> dict[str, FileEntry]:
        """{relative path: entry} of epoch ``epoch``'s plan files, in rank order."""
        ranks = {key[1]: p for p in self.files if (key := self.plan_key(p)) is not None and key[0] == epoch}
        return {ranks[r]: self.files[ranks[r]] for r in sorted(ranks)}

    def plan_fingerprint(self, epoch: int) -> str:
        """A short hex digest naming epoch ``epoch``'s plan: its files' hashes with W, B, the seed and
        the strategy. A resume state carries it, so it never loads into another plan."""
        import hashlib

        h = hashlib.sha256()
        h.update(f"{self.world_size}/{self.batch_size}/{self.seed}/{self.strategy}/{epoch}\n".encode())
        for path, entry in sorted(self.epoch_files(epoch).items()):  # by name, as states of 3.1 hashed
            h.update(f"{path}\t{entry.sha256}\n".encode())
        return h.hexdigest()[:16]

    def bounds_problem(self) -> str | None:
        """Why the plan numbers cannot describe a real plan, or None. The readers check this before a
        recorded number sizes anything; ``validate`` compares every number with the files themselves.

        Every rank-step holds at least one sample, so ``steps_per_epoch[e] * world_size`` cannot exceed
        ``counts.planned[e]``; an epoch plans at most ``(max_plan_factor + 1) * accepted`` entries plus
        one step of padding (the planner refuses more than ``max_plan_factor`` per sample, and rounding
        adds at most one each), and never more than ``MAX_EPOCH_ENTRIES``.
        """
        w = self.world_size
        for e, (steps, planned) in enumerate(zip(self.steps_per_epoch, self.counts.planned, strict=True)):
            if planned > MAX_EPOCH_ENTRIES:
                return f"{self.where}: counts.planned[{e}] = {planned} is more than any epoch plans"
            if steps * w > planned:
                return (
                    f"{self.where}: steps_per_epoch[{e}] = {steps} x world_size {w} = {steps * w} rank-steps, "
                    f"but counts.planned[{e}] is {planned} (every rank-step holds a sample)"
                )
            factor = self.max_plan_factor
            if factor is not None and planned > (factor + 1) * self.counts.accepted + w * self.batch_size:
                return (
                    f"{self.where}: counts.planned[{e}] = {planned} entries from {self.counts.accepted} accepted "
                    f"samples is more than max_plan_factor {factor:g} allows"
                )
        return None


def _speeds(r: Reader) -> tuple[float, ...] | None:
    v = r.obj.get("rank_speed")
    if v is None:
        return None
    w = r.obj.get("world_size")
    good = (
        isinstance(v, list)
        and len(v) == w
        and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in v
        )
    )
    if not good:
        raise r.fail("rank_speed", f"a list of world_size ({w}) numbers > 0", v)
    return tuple(float(x) for x in v)


def _factor(r: Reader) -> float | None:
    v = r.obj.get("max_plan_factor")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 1):
        raise r.fail("max_plan_factor", "a finite number >= 1", v)
    return float(v)


def _rates(r: Reader) -> Mapping[str, float] | None:
    v = r.obj.get("pair_repeat_rate")
    if v is None:
        return None
    if not isinstance(v, dict) or any(
        isinstance(x, bool) or not isinstance(x, (int, float)) for x in v.values()
    ):
        raise r.fail("pair_repeat_rate", "an object of numbers or null", v)
    return v


def _files(r: Reader) -> dict[str, FileEntry]:
    files = r.obj_("files")
    assert files is not None
    out = {}
    for path, entry in files.items():
        if (
            not isinstance(entry, dict)
            or type(entry.get("bytes")) is not int
            or entry["bytes"] < 0
            or not isinstance(entry.get("sha256"), str)
        ):
            raise r.fail(f"files[{short(path)}]", "{'bytes': int >= 0, 'sha256': hex}", entry)
        bad = relpath_problem(path)
        if bad:
            raise ValueError(f"{r.where}: files key {short(path)} {bad}")
        out[str(path)] = FileEntry(entry["bytes"], entry["sha256"])
    return out
