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
_MAX_EDGES = 1 << 16


def relpath_problem(rel: object) -> str | None:
    """Why ``rel`` is not a plain path inside the manifest directory, or None.

    A listed file must stay inside OUT whatever joins it to OUT: a non-empty ``/``-separated relative
    path with no empty, ``.`` or ``..`` segment, no leading ``/``, no scheme or drive, no backslash
    and no NUL (lidarshard writes none of these; a forged ``files`` key must not point a reader or a
    publish at ``../../home``).
    """
    if not isinstance(rel, str) or not rel:
        return "is not a non-empty string"
    if rel.startswith("/") or "://" in rel or (len(rel) > 1 and rel[1] == ":" and rel[0].isalpha()):
        return "is absolute, not relative to the manifest directory"
    if "\\" in rel or "\0" in rel:
        return "holds a backslash or NUL"
    if any(seg in ("", ".", "..") for seg in rel.split("/")):
        return "has an empty, '.' or '..' segment (it must stay inside the manifest directory)"
    return None


def _short(value: object) -> str:
    from lidarshard.schemas.jsonsafe import short  # pure; keeps schemas import-light

    return short(value)


class _Reader:
    """Typed getters over one JSON object; every failure is one ValueError line naming ``where.key``."""

    def __init__(self, obj: Mapping[str, Any], where: str) -> None:
        self.obj, self.where = obj, where

    def fail(self, key: str, what: str, value: object) -> ValueError:
        return ValueError(f"{self.where}: {key} must be {what}, got {_short(value)}")

    def int_(self, key: str, lo: int = 0, hi: int | None = None, value: object = None) -> int:
        v = self.obj.get(key) if value is None else value
        if type(v) is not int or v < lo or (hi is not None and v > hi):
            raise self.fail(key, f"an int >= {lo}" + (f" and <= {hi}" if hi is not None else ""), v)
        return v

    def ints(self, key: str, n: int | None, value: object = None) -> tuple[int, ...]:
        v = self.obj.get(key) if value is None else value
        if (
            not isinstance(v, list)
            or (n is not None and len(v) != n)
            or any(type(x) is not int or x < 0 for x in v)
        ):
            raise self.fail(key, f"a list of {'' if n is None else n} ints >= 0".replace("of  ", "of "), v)
        return tuple(v)

    def floats(self, key: str, value: object) -> tuple[float, ...]:
        ok = isinstance(value, list) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value
        )
        if not ok:
            raise self.fail(key, "a list of finite numbers", value)
        assert isinstance(value, list)
        return tuple(float(x) for x in value)

    def str_(self, key: str, optional: bool = False) -> str | None:
        v = self.obj.get(key)
        if not (isinstance(v, str) or (optional and v is None)):
            raise self.fail(key, "a string" + (" or null" if optional else ""), v)
        return v

    def obj_(self, key: str, optional: bool = False) -> dict | None:
        v = self.obj.get(key)
        if not (isinstance(v, dict) or (optional and v is None)):
            raise self.fail(key, "a JSON object" + (" or null" if optional else ""), v)
        return v


@dataclass(frozen=True)
class Counts:
    """Accounting of a build: scanned = accepted + rejected; per epoch planned/dropped/padded (E,)."""

    scanned: int
    accepted: int
    rejected: int
    rejected_by_reason: Mapping[str, int]
    planned: tuple[int, ...]
    dropped: tuple[int, ...]
    padded: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "scanned": self.scanned,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "rejected_by_reason": dict(self.rejected_by_reason),
            "planned": list(self.planned),
            "dropped": list(self.dropped),
            "padded": list(self.padded),
        }


@dataclass(frozen=True)
class Buckets:
    """Exact quantile buckets of the cost: edges (K-1,) in cost units, weights (K,), counts (K,)."""

    edges: tuple[float, ...]
    weights: tuple[float, ...]
    counts: tuple[int, ...]

    @property
    def k(self) -> int:
        return len(self.counts)

    def to_json(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "weights": list(self.weights), "counts": list(self.counts)}


@dataclass(frozen=True)
class FileEntry:
    """One data file as recorded at commit: its size in bytes and hex SHA-256."""

    bytes: int
    sha256: str


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
    cost_model: Mapping[str, Any]
    caps: Mapping[str, Any] | None
    repeat: Mapping[str, Any] | None
    balance: tuple[Mapping[str, Any], ...]
    pair_repeat_rate: Mapping[str, float] | None
    inputs_fingerprint: str
    path_root: str | None
    files: Mapping[str, FileEntry]
    max_plan_factor: float | None = None
    plan_schema: list | None = None
    #: ``[{"until_epoch": E, "cost_model": {...}}, ...]``: the models that planned the epochs before each
    #: re-plan (``build --replan-from``), ascending; empty: every epoch was planned with ``cost_model``.
    cost_history: tuple[Mapping[str, Any], ...] = ()
    #: ``--rank-speed``: (W,) relative speed of each rank (mixed hardware), or None.
    rank_speed: tuple[float, ...] | None = None
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
        r = _Reader(obj, where)
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
            counts=_counts(r, epochs),
            buckets=_buckets(r),
            cost_model=_cost_model(r),
            caps=r.obj_("caps", optional=True),
            repeat=r.obj_("repeat", optional=True),
            balance=tuple(balance),
            pair_repeat_rate=_rates(r),
            inputs_fingerprint=str(r.str_("inputs_fingerprint")),
            path_root=r.str_("path_root", optional=True),
            files=_files(r),
            max_plan_factor=_factor(r),
            plan_schema=obj.get("plan_schema") if isinstance(obj.get("plan_schema"), list) else None,
            cost_history=_history(r, epochs),
            rank_speed=_speeds(r),
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
            "caps": None if self.caps is None else dict(self.caps),
            **({} if self.rank_speed is None else {"rank_speed": list(self.rank_speed)}),
            "repeat": None if self.repeat is None else dict(self.repeat),
            "cost_model": dict(self.cost_model),
            **({"cost_history": [dict(h) for h in self.cost_history]} if self.cost_history else {}),
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


def _counts(r: _Reader, epochs: int) -> Counts:
    c = r.obj_("counts")
    assert c is not None
    sub = _Reader(c, f"{r.where}: counts")
    by_reason = c.get("rejected_by_reason", {})
    if not isinstance(by_reason, dict) or any(type(v) is not int or v < 0 for v in by_reason.values()):
        raise sub.fail("rejected_by_reason", "an object of ints >= 0", by_reason)
    return Counts(
        scanned=sub.int_("scanned"),
        accepted=sub.int_("accepted"),
        rejected=sub.int_("rejected"),
        rejected_by_reason={str(k): v for k, v in by_reason.items()},
        planned=sub.ints("planned", epochs),
        dropped=sub.ints("dropped", epochs),
        padded=sub.ints("padded", epochs),
    )


def _buckets(r: _Reader) -> Buckets:
    b = r.obj_("buckets")
    assert b is not None
    sub = _Reader(b, f"{r.where}: buckets")
    counts = sub.ints("counts", None)
    edges, weights = sub.floats("edges", b.get("edges")), sub.floats("weights", b.get("weights"))
    if not counts or len(weights) != len(counts) or len(edges) != len(counts) - 1:
        raise sub.fail("edges/weights/counts", "K-1 edges, K weights and K counts (K >= 1)", b)
    return Buckets(edges, weights, counts)


def _cost_model(r: _Reader) -> Mapping[str, Any]:
    m = r.obj_("cost_model")
    assert m is not None
    if not isinstance(m.get("name"), str):
        raise r.fail("cost_model", "{'name', 'c0', 'a', 'b'}", m)
    return m


def _history(r: _Reader, epochs: int) -> tuple[Mapping[str, Any], ...]:
    h = r.obj.get("cost_history")
    if h is None:
        return ()
    ends = (
        [x.get("until_epoch") for x in h]
        if isinstance(h, list) and all(isinstance(x, dict) for x in h)
        else []
    )
    good = (
        isinstance(h, list)
        and h
        and all(type(e) is int and 0 < e < epochs for e in ends)
        and ends == sorted(set(ends))
        and all(set(x) == {"until_epoch", "cost_model", "bucket_edges"} for x in h)
        and all(isinstance(x["cost_model"], dict) and isinstance(x["cost_model"].get("name"), str) for x in h)
        and all(_edges(x["bucket_edges"]) for x in h)
    )
    if not good:
        raise r.fail(
            "cost_history",
            f"a list of {{until_epoch (rising, 1..{epochs - 1}), cost_model, bucket_edges}}",
            h,
        )
    return tuple(dict(x) for x in h)


def _speeds(r: _Reader) -> tuple[float, ...] | None:
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


def _edges(edges: object) -> bool:
    """Rising finite numbers (a bucket's edges), at most ``_MAX_EDGES``."""
    if not isinstance(edges, list) or len(edges) > _MAX_EDGES:
        return False
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in edges):
        return False
    return all(a < b for a, b in zip(edges, edges[1:], strict=False))


def _factor(r: _Reader) -> float | None:
    v = r.obj.get("max_plan_factor")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 1):
        raise r.fail("max_plan_factor", "a finite number >= 1", v)
    return float(v)


def _rates(r: _Reader) -> Mapping[str, float] | None:
    v = r.obj.get("pair_repeat_rate")
    if v is None:
        return None
    if not isinstance(v, dict) or any(
        isinstance(x, bool) or not isinstance(x, (int, float)) for x in v.values()
    ):
        raise r.fail("pair_repeat_rate", "an object of numbers or null", v)
    return v


def _files(r: _Reader) -> dict[str, FileEntry]:
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
            raise r.fail(f"files[{_short(path)}]", "{'bytes': int >= 0, 'sha256': hex}", entry)
        bad = relpath_problem(path)
        if bad:
            raise ValueError(f"{r.where}: files key {_short(path)} {bad}")
        out[str(path)] = FileEntry(entry["bytes"], entry["sha256"])
    return out
