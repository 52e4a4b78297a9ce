"""The typed pieces of the contract's JSON files (``_manifest.json``, ``_scan.json``): one frozen record per
sub-object, each with ``parse`` (check a parsed JSON value, one ValueError line naming the key) and
``to_json`` (its exact inverse). A record's fields are the list of its keys. Pure: imports nothing else
of lidarshard but the contract.

Records check shapes and types, never meaning: whether a cost model's coefficients can be applied, a
repeat mode is one lidarshard knows or a cap is a usable one is the consumer's check (``validate`` reports
it as a problem of the plan, the planner refuses it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from lidarshard.schemas.jsonread import Reader, number_ok, relpath_problem
from lidarshard.schemas.jsonsafe import short

__all__ = [
    "Reader",
    "relpath_problem",
    "Counts",
    "ScanCounts",
    "Buckets",
    "FileEntry",
    "CostModel",
    "HistoryEntry",
    "CapsRecord",
    "RepeatRecord",
    "DatasetEntry",
    "label_maps",
]


@dataclass(frozen=True)
class ScanCounts:
    """Accounting of a scan: scanned = accepted + rejected, and the rejects by reason."""

    scanned: int
    accepted: int
    rejected: int
    rejected_by_reason: Mapping[str, int]

    @classmethod
    def parse(cls, r: Reader) -> ScanCounts:
        """``r``: a reader of the ``counts`` object."""
        by_reason = r.obj.get("rejected_by_reason", {})
        if not isinstance(by_reason, dict) or any(type(v) is not int or v < 0 for v in by_reason.values()):
            raise r.fail("rejected_by_reason", "an object of ints >= 0", by_reason)
        return cls(
            r.int_("scanned"),
            r.int_("accepted"),
            r.int_("rejected"),
            {str(k): v for k, v in by_reason.items()},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "scanned": self.scanned,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "rejected_by_reason": dict(self.rejected_by_reason),
        }


@dataclass(frozen=True)
class Counts(ScanCounts):
    """A build's accounting: the scan's, then per epoch planned/dropped/padded (E,)."""

    planned: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()
    padded: tuple[int, ...] = ()

    @classmethod
    def parse_epochs(cls, r: Reader, epochs: int) -> Counts:
        scan = ScanCounts.parse(r)
        planned, dropped, padded = (r.ints(k, epochs) for k in ("planned", "dropped", "padded"))
        return cls(
            scan.scanned, scan.accepted, scan.rejected, scan.rejected_by_reason, planned, dropped, padded
        )

    def to_json(self) -> dict[str, Any]:
        return super().to_json() | {
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

    @classmethod
    def parse(cls, r: Reader) -> Buckets:
        counts = r.ints("counts", None)
        edges, weights = r.floats("edges", r.obj.get("edges")), r.floats("weights", r.obj.get("weights"))
        if not counts or len(weights) != len(counts) or len(edges) != len(counts) - 1:
            raise r.fail("edges/weights/counts", "K-1 edges, K weights and K counts (K >= 1)", r.obj)
        return cls(edges, weights, counts)

    def to_json(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "weights": list(self.weights), "counts": list(self.counts)}


@dataclass(frozen=True)
class FileEntry:
    """One data file as recorded at commit: its size in bytes and hex SHA-256."""

    bytes: int
    sha256: str


@dataclass(frozen=True)
class CostModel:
    """``cost = c0 + a * points + b * voxels ** q`` (units: whatever the fit used, e.g. ms); the manifest's
    ``cost_model``. Whether it can be applied is ``lidarshard.transforms.features.cost.checked_model``'s.
    ``units`` ("ms" when ``lidarshard calibrate`` fitted it to measured milliseconds) and ``step_ms`` (the
    fitted ms a step lasts beyond its slowest rank's compute) are 4.4, absent when not known; ``launch_ms``
    (4.5, absent when not fitted) the ms each rank pays once per rank-step whatever its samples (kernel
    launches), beside the per-sample terms."""

    name: str
    c0: float = 0.0
    a: float = 0.0
    b: float = 0.0
    q: float = 1.0
    units: str | None = None
    step_ms: float | None = None
    launch_ms: float | None = None

    def to_json(self) -> dict:
        """The manifest's ``cost_model`` (``q`` only when it is not 1, ``units``/``step_ms``/``launch_ms`` only
        when known: older manifests keep their bytes)."""
        out = asdict(self)
        if self.q == 1.0:
            del out["q"]
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def parse(cls, obj: object, where: str) -> CostModel:
        """A recorded cost model: ``name`` and numbers ``c0``, ``a``, ``b`` (0 when absent), ``q`` (1), an
        optional ``units`` text and ``step_ms`` and ``launch_ms`` numbers."""
        keys = ("c0", "a", "b", "q")
        if (
            not isinstance(obj, dict)
            or not isinstance(obj.get("name"), str)
            or set(obj) - {"name", *keys, "units", "step_ms", "launch_ms"}
            or not all(number_ok(obj.get(k, 0.0)) for k in (*keys, "step_ms", "launch_ms"))
            or not isinstance(obj.get("units", ""), str)
        ):
            raise ValueError(
                f"{where} must be {{'name', 'c0', 'a', 'b'[, 'q', 'units', 'step_ms', 'launch_ms']}} (finite "
                f"numbers), got {short(obj)}"
            )
        c0, a, b, q = (float(obj.get(k, 1.0 if k == "q" else 0.0)) for k in keys)
        step, launch = obj.get("step_ms"), obj.get("launch_ms")
        return cls(
            obj["name"],
            c0,
            a,
            b,
            q,
            obj.get("units"),
            None if step is None else float(step),
            None if launch is None else float(launch),
        )


#: Most bucket edges a recorded history entry may hold.
MAX_EDGES = 1 << 16


def _edges(edges: object) -> bool:
    """Rising finite numbers (a bucket's edges), at most ``MAX_EDGES``."""
    if not isinstance(edges, list) or len(edges) > MAX_EDGES or not all(number_ok(v) for v in edges):
        return False
    return all(a < b for a, b in zip(edges, edges[1:], strict=False))


@dataclass(frozen=True)
class HistoryEntry:
    """One ``cost_history`` entry: the model and bucket edges (K-1,) that planned epochs before ``until_epoch``."""

    until_epoch: int
    cost_model: CostModel
    bucket_edges: tuple[float, ...]

    @classmethod
    def parse_all(cls, r: Reader, epochs: int) -> tuple[HistoryEntry, ...]:
        """The manifest's ``cost_history`` (absent: empty), ``until_epoch`` rising in 1..epochs-1."""
        h = r.obj.get("cost_history")
        if h is None:
            return ()
        entries = h if isinstance(h, list) and all(isinstance(x, dict) for x in h) else []
        ends = [x.get("until_epoch") for x in entries]
        good = (
            entries
            and all(type(e) is int and 0 < e < epochs for e in ends)
            and ends == sorted(set(ends))
            and all(set(x) == {"until_epoch", "cost_model", "bucket_edges"} for x in entries)
            and all(_edges(x["bucket_edges"]) for x in entries)
        )
        what = f"a list of {{until_epoch (rising, 1..{epochs - 1}), cost_model, bucket_edges}}"
        if not good:
            raise r.fail("cost_history", what, h)
        try:
            models = [CostModel.parse(x["cost_model"], "cost_model") for x in entries]
        except ValueError:
            raise r.fail("cost_history", what, h) from None
        return tuple(
            cls(x["until_epoch"], model, tuple(float(v) for v in x["bucket_edges"]))
            for x, model in zip(entries, models, strict=True)
        )

    def to_json(self) -> dict[str, Any]:
        return {"until_epoch": self.until_epoch, "cost_model": self.cost_model.to_json(),
                "bucket_edges": list(self.bucket_edges)}  # fmt: skip


@dataclass(frozen=True)
class CapsRecord:
    """The manifest's ``caps``: each per-rank-step cap (None: not set) and ``heaviest_first`` ('points' |
    'cost' when each epoch's step 0 holds its heaviest rank-step; 'off', not written, otherwise)."""

    max_points_per_rank_step: int | None = None
    max_cost_per_rank_step: float | None = None
    max_samples_per_rank_step: int | None = None
    heaviest_first: str = "off"

    @classmethod
    def parse(cls, r: Reader) -> CapsRecord | None:
        """``r.obj['caps']``, or None when it is null."""
        if r.obj_("caps", optional=True) is None:
            return None
        c = r.sub("caps")
        for key in ("max_points_per_rank_step", "max_samples_per_rank_step"):
            if c.obj.get(key) is not None:
                c.int_(key, 1)
        cost = c.number("max_cost_per_rank_step", optional=True)
        known = {
            "max_points_per_rank_step",
            "max_cost_per_rank_step",
            "max_samples_per_rank_step",
            "heaviest_first",
        }
        if set(c.obj) - known:
            raise r.fail("caps", f"an object of {sorted(known)}", c.obj)
        return cls(c.obj.get("max_points_per_rank_step"), cost, c.obj.get("max_samples_per_rank_step"),
                   str(c.str_("heaviest_first")) if "heaviest_first" in c.obj else "off")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.heaviest_first == "off":
            del out["heaviest_first"]
        return out


def _totals(v: object) -> bool:
    """A JSON object of finite numbers (copies per class)."""
    return isinstance(v, dict) and all(number_ok(x) for x in v.values())


@dataclass(frozen=True)
class RepeatRecord:
    """The manifest's ``repeat``: ``mode`` ('lidarseg:t=T' | 'column:NAME'; None: only dataset weights),
    ``expected`` {class: copies} per epoch, ``realized`` (E,) {class: copies} as planned, and ``datasets``
    {dataset name: weight} (``--dataset-weights``; None: not given). Class keys are lidarseg class
    indices, else 'all'."""

    mode: str | None
    expected: Mapping[str, float]
    realized: tuple[Mapping[str, float], ...]
    datasets: Mapping[str, float] | None = None

    @classmethod
    def parse(cls, r: Reader) -> RepeatRecord | None:
        """``r.obj['repeat']``, or None when it is null (no weights)."""
        if r.obj_("repeat", optional=True) is None:
            return None
        rep = r.sub("repeat")
        scale, realized = rep.obj.get("datasets"), rep.obj.get("realized")
        if not _totals(rep.obj.get("expected")):
            raise rep.fail("expected", "an object of numbers", rep.obj.get("expected"))
        if not (isinstance(realized, list) and all(_totals(x) for x in realized)):
            raise rep.fail("realized", "a list of objects of numbers", realized)
        if scale is not None and not _totals(scale):
            raise rep.fail("datasets", "an object of weights", scale)
        if set(rep.obj) - {"mode", "expected", "realized", "datasets"}:
            raise r.fail("repeat", "{'mode', 'expected', 'realized'[, 'datasets']}", rep.obj)
        return cls(rep.str_("mode", optional=True), dict(rep.obj["expected"]),
                   tuple(dict(x) for x in realized), None if scale is None else dict(scale))  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        out = {
            "mode": self.mode,
            "expected": dict(self.expected),
            "realized": [dict(x) for x in self.realized],
        }
        return out | ({} if self.datasets is None else {"datasets": dict(self.datasets)})


@dataclass(frozen=True)
class DatasetEntry:
    """One INPUT a scan read (the ``datasets`` list, 4.1): its name, root, layout, weight and label map
    {raw label id: class id} (SemanticKITTI's learning_map; None: the layout maps none)."""

    name: str
    root: str
    layout: str
    weight: float = 1.0
    label_map: Mapping[int, int] | None = None

    @classmethod
    def parse_all(cls, r: Reader) -> tuple[DatasetEntry, ...]:
        """``r.obj['datasets']`` (absent or null: none)."""
        found = r.obj.get("datasets")
        if found is None:
            return ()
        what = "a list of {'name', 'root', 'layout', 'weight', 'label_map'}"
        if not isinstance(found, list) or not all(isinstance(d, dict) for d in found):
            raise r.fail("datasets", what, found)
        return tuple(cls._parse(Reader(d, f"{r.where}: datasets")) for d in found)

    @classmethod
    def _parse(cls, d: Reader) -> DatasetEntry:
        name = d.str_("name")
        raw = d.obj_("label_map", optional=True)
        try:
            label_map = None if raw is None else {int(k): int(v) for k, v in raw.items()}
        except (TypeError, ValueError):
            raise d.fail(
                "label_map", f"an object mapping integer ids of {short(name)} to integers", raw
            ) from None
        weight = d.number("weight", optional=True)
        return cls(
            str(name),
            str(d.str_("root")),
            str(d.str_("layout")),
            1.0 if weight is None else weight,
            label_map,
        )

    def to_json(self) -> dict[str, Any]:
        labels = None if self.label_map is None else {str(k): v for k, v in sorted(self.label_map.items())}
        return {
            "name": self.name,
            "root": self.root,
            "layout": self.layout,
            "weight": self.weight,
            "label_map": labels,
        }


def label_maps(datasets: tuple[DatasetEntry, ...]) -> dict[str, dict[int, int]]:
    """{dataset name: label map} of the recorded ``datasets`` that map their labels."""
    return {d.name: dict(d.label_map) for d in datasets if d.label_map is not None}
