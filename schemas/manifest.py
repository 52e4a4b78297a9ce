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
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from lidarshard.schemas import VARIABLE_COUNT, plan_file, plan_key
from lidarshard.schemas.balance_entry import BalanceEntry
from lidarshard.schemas.jsonsafe import short
from lidarshard.schemas.memory_cap import MemoryCapRecord
from lidarshard.schemas.plan_groups import PlanGroups
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
from lidarshard.schemas.scan_record import PROVENANCE_KEYS

__all__ = ["Manifest", "MANIFEST_KEYS", "Counts", "Buckets", "FileEntry", "POLICIES", "relpath_problem"]

#: How a pool that is not a multiple of W*B is fitted (``--drop-last`` / ``--pad``).
POLICIES = ("drop_last", "pad")
_REQUIRED_KEY: Any = object()
_SEED_MAX = 2**63 - 1
#: No epoch plans more entries than this (planning takes ~100 bytes an entry: 2**40 would need ~100 TiB).
MAX_EPOCH_ENTRIES = 1 << 40


def _key(doc: str, default: Any = _REQUIRED_KEY, *, omit: bool = False) -> Any:
    """A field written to ``_manifest.json`` under its name: ``doc`` (``MANIFEST_KEYS``), its ``default``
    (none: the key is required), ``omit``: not written when None or empty (keys added in a minor)."""
    meta = {"written": True, "doc": doc, "omit": omit}
    if default is _REQUIRED_KEY:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def _json(value: Any) -> Any:
    """A field's JSON value: records by their ``to_json``, tuples as lists, mappings copied."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, FileEntry):
        return {"bytes": value.bytes, "sha256": value.sha256}
    if isinstance(value, (tuple, list)):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A committed manifest's ``_manifest.json``, checked (see :meth:`from_json`).

    ``where`` names the file in messages; it is not written. Plan-shape invariants hold for every
    instance: ``len(steps_per_epoch) == len(balance) == epochs`` and every per-epoch count has E values.
    """

    where: str = field(default="_manifest.json", metadata={"written": False})
    schema_version: str = _key("SCHEMA_VERSION of the writer")
    #: The scan's keys as written (``PROVENANCE_KEYS``: ``input``, ``datasets``, ``scan_config``, ...).
    provenance: Mapping[str, Any] = field(default_factory=dict, metadata={"written": False})
    path_root: str | None = _key(
        "ROOT that relative sample paths resolve against (build --relative-to), or null: absolute paths", None
    )
    world_size: int = _key("int W: ranks planned for")
    batch_size: int = _key(
        "int B: samples per rank per step (the mean per rank-step under --strategy budget)"
    )
    epochs: int = _key("int E: epochs planned")
    seed: int = _key("int: the plan's seed")
    strategy: str = _key("name of the planning strategy")
    policy: str = _key("'drop_last' or 'pad': how a pool that is not a multiple of W*B is fitted")
    max_plan_factor: float | None = _key(
        "the most copies of one sample an epoch may plan (absent: the default)", None, omit=True
    )
    caps: CapsRecord | None = _key(
        "the per-rank-step caps and heaviest_first (records.CapsRecord) or null", None
    )
    rank_speed: tuple[float, ...] | None = _key(
        "[W floats > 0] (4.2, absent when not given): each rank's relative speed (--rank-speed); balance "
        "entries then add 'speed_linearity', the linearity of the ranks' times cost / speed, and "
        "'random_speed_linearity', that of the random plan (absent in manifests written before it)",
        None,
        omit=True,
    )
    memory_cap: MemoryCapRecord | None = _key(
        "{'max_step_bytes', 'model': {'base_bytes', 'bytes_per_point', 'bytes_per_voxel'}} (4.4, absent when "
        "not given): every rank-step's predicted peak memory, base_bytes + bytes_per_point * its points + "
        "bytes_per_voxel * its voxels, is at most max_step_bytes (build --max-step-memory)",
        None,
        omit=True,
    )
    plan_groups: PlanGroups | None = _key(
        "{'groups': G, 'rule': text} (4.4, absent before: one group): each epoch was planned in G step groups "
        "dealt by a stable hash of (sample_id, seed, epoch), their steps interleaved; rule: the auto rule or 'forced'",
        None,
        omit=True,
    )
    repeat: RepeatRecord | None = _key(
        "the repeat factors / sample weights (records.RepeatRecord) or null", None
    )
    cost_model: CostModel = _key(
        "{'name', 'c0', 'a', 'b'[, 'q', 'units', 'step_ms', 'launch_ms']}: cost = c0 + a*points + b*voxels^q; "
        "'units' 'ms' and 'step_ms' (4.4, absent when unknown): a calibrated model's ms and per-step overhead; "
        "'launch_ms' (4.5, absent when not fitted): ms each rank pays once per rank-step, whatever its samples"
    )
    cost_history: tuple[HistoryEntry, ...] = _key(
        "[{'until_epoch', 'cost_model', 'bucket_edges'}] (4.2, absent when empty): the models that planned the "
        "epochs before each re-plan (build --replan-from), rising; later epochs were planned with cost_model",
        (),
        omit=True,
    )
    buckets: Buckets = _key("{'edges': [K-1 floats, cost units], 'weights': [K floats], 'counts': [K ints]}")
    steps_per_epoch: tuple[int, ...] = _key("[E ints]: steps in each epoch (weights < 1 thin randomly)")
    counts: Counts = _key(
        "{'scanned', 'accepted', 'rejected': int, 'rejected_by_reason', 'planned', 'dropped', 'padded': [E ints]}"
    )
    balance: tuple[BalanceEntry, ...] = _key(
        "[E objects]: {'epoch', 'linearity', 'greedy_reference', 'random_linearity', 'spearman_step_cost', ...}"
    )
    pair_repeat_rate: Mapping[str, float] | None = _key(
        "{strategy: rate, 'random': rate}: share of epoch-0 step-mates that share a step in epoch 1", None
    )
    inputs_fingerprint: str = _key("sha256 hex over the sorted (sample_id, file_bytes) of accepted inputs")
    files: Mapping[str, FileEntry] = _key(
        "{relative path: {'bytes': int, 'sha256': hex}} for every data file (the samples parts numbered from 0)"
    )
    plan_schema: list | None = _key("the plan files' fields as JSON (name, type, doc)", None)
    #: Typed views of two provenance keys (written as part of ``provenance``).
    datasets: tuple[DatasetEntry, ...] = field(default=(), metadata={"written": False})
    max_reject_fraction: float | None = field(default=None, metadata={"written": False})

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
        if not isinstance(balance, list) or len(balance) != epochs:
            raise r.fail("balance", f"a list of {epochs} objects", balance)
        entries = tuple(BalanceEntry.parse(b, f"{where}: balance[{e}]") for e, b in enumerate(balance))
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
            memory_cap=MemoryCapRecord.parse(r),
            repeat=RepeatRecord.parse(r),
            balance=entries,
            pair_repeat_rate=_rates(r),
            inputs_fingerprint=str(r.str_("inputs_fingerprint")),
            path_root=r.str_("path_root", optional=True),
            files=_files(r),
            max_plan_factor=_factor(r),
            plan_schema=obj.get("plan_schema") if isinstance(obj.get("plan_schema"), list) else None,
            cost_history=HistoryEntry.parse_all(r, epochs),
            rank_speed=_speeds(r),
            plan_groups=PlanGroups.parse(r),
            datasets=DatasetEntry.parse_all(r),
            max_reject_fraction=r.number("max_reject_fraction", optional=True),
            provenance={k: v for k, v in obj.items() if k not in _WRITTEN},
        )

    # ------------------------------------------------------------------------------------- writing

    def to_json(self) -> dict[str, Any]:
        """The ``_manifest.json`` object: schema version, provenance, then every written field in order
        (an ``omit`` field only when set)."""
        out: dict[str, Any] = {"schema_version": self.schema_version, **self.provenance}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _WRITTEN and f.name != "schema_version" and not (f.metadata["omit"] and not value):
                out[f.name] = _json(value)
        return out

    # ------------------------------------------------------------------------------------- queries

    @property
    def groups(self) -> int:
        """G: the step groups each epoch was planned in (1 before 4.4)."""
        return self.plan_groups.groups if self.plan_groups is not None else 1

    @property
    def variable_count(self) -> bool:
        """True when rank-steps hold a variable number of samples (``--strategy budget``)."""
        return self.strategy in VARIABLE_COUNT

    def steps(self, epoch: int) -> int:
        """Steps of planned epoch ``epoch`` (``0 <= epoch < epochs``)."""
        return self.steps_per_epoch[epoch]

    def plan_file(self, epoch: int, rank: int) -> str:
        """Relative path of rank ``rank``'s plan for ``epoch``, as this manifest's schema names it."""
        return plan_file(epoch, rank)

    def plan_key(self, rel: str) -> tuple[int, int] | None:
        """(epoch, rank) of ``rel`` when it is exactly one of this manifest's plan file names, else None."""
        return plan_key(rel)

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


#: The keys of ``_manifest.json`` the plan writes (in order), the required ones, and what each holds.
_WRITTEN = tuple(f.name for f in fields(Manifest) if f.metadata["written"])
_REQUIRED = tuple(f.name for f in fields(Manifest) if f.metadata["written"] and f.default is MISSING)
MANIFEST_KEYS: dict[str, str] = PROVENANCE_KEYS | {
    f.name: f.metadata["doc"] for f in fields(Manifest) if f.metadata["written"]
}


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
    return dict(sorted(out.items()))  # written in path order
