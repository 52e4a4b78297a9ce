"""The manifest contract: one source of truth for every file lidarshard writes.

Field lists here produce the Arrow schemas the pipeline writes and the loaders check. Schemas are
plain data (name, Arrow type, doc) and are stored as JSON, never pickled. The layout of an output
directory (``_manifest.json``, ``samples/part-NNNNN.parquet``, ``rejects.parquet``,
``plan/epoch-E/rank-R/part-00000.parquet``, ``_SUCCESS`` last) is docs/MANIFEST.md's. Plan directory
names are not hive ``key=value`` pairs (hive names made pandas and ``pq.read_table`` infer
dictionary-encoded categoricals): each file carries ``epoch`` and ``rank`` as int32 columns instead.

Versions: a major version changes the layout (4.0: the plan moved to ``plan/epoch-E/rank-R/`` with
``epoch`` and ``rank`` as columns of each file); a minor only adds fields (``ADDED_IN``: 4.1 the samples'
``dataset``, ``frame``, ``sweep_frames``; 4.2 the manifest's ``cost_history`` and ``rank_speed``; 4.3 the
samples' ``sweep_time_lags``; 4.4 the manifest's ``memory_cap`` and ``plan_groups`` and the cost model's ``units``
and ``step_ms``; 4.5 the cost model's ``launch_ms`` and the variable-count strategies ``rebalance`` and ``auto``),
so a 4.5 reader reads 4.0 files as ``sample_schema("4.0")`` describes them. This lidarshard reads 4.x and writes
4.5; an older output is refused in one line naming its version and the command that rebuilds it from its
samples (``check_version``; ``build --from-samples`` still reads 3.x samples and a 2.x ``samples.parquet``,
whose fields ``ADDED_IN`` dates).
"""

from __future__ import annotations

import re
import zlib

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "SCHEMA_VERSION",
    "ADDED_IN",
    "CONTENT_HASH",
    "INTEGRITY_FIELDS",
    "content_hash",
    "REJECT_REASONS",
    "SAMPLE_FIELDS",
    "SCORED_FIELDS",
    "REJECT_FIELDS",
    "PLAN_FIELDS",
    "sample_schema",
    "scored_schema",
    "reject_schema",
    "plan_schema",
    "schema_to_json",
    "SAMPLES_FILE",
    "SAMPLES_DIR",
    "samples_part",
    "part_name",
    "part_index",
    "REJECTS_FILE",
    "MANIFEST_FILE",
    "SCAN_FILE",
    "SUCCESS_FILE",
    "plan_file",
    "plan_key",
    "misplaced_key",
    "PLAN_DIR_NAMES",
    "PLAN_KEY_FIELDS",
    "READABLE",
    "READABLE_MAJORS",
    "PLAN_DIR",
    "WORK_DIR",
    "META_FILES",
    "REPORT_DIR",
    "VARIABLE_COUNT",
    "check_version",
    "is_before",
    "is_readable",
    "as_written",
]

SCHEMA_VERSION = "4.5"
#: {major schema version this lidarshard reads: the newest minor of it}.
READABLE: dict[str, str] = {"4": SCHEMA_VERSION}
READABLE_MAJORS = tuple(READABLE)

#: The single samples file of schema 2.x (named in its rebuild command; ``build --from-samples`` reads it).
SAMPLES_FILE = "samples.parquet"
SAMPLES_DIR = "samples"
REJECTS_FILE = "rejects.parquet"
MANIFEST_FILE = "_manifest.json"
SCAN_FILE = "_scan.json"
SUCCESS_FILE = "_SUCCESS"
PLAN_DIR = "plan"
#: The metadata files of an output directory (not listed in its ``files``).
META_FILES = frozenset({MANIFEST_FILE, SCAN_FILE, SUCCESS_FILE})
#: Derived, non-contract output lidarshard may add to OUT (``lidarshard report``): not listed, kept readable.
REPORT_DIR = "report"
#: Scratch directory inside a run's staging directory (scan shards, plan pieces); removed before publishing.
WORK_DIR = "_work"


def part_name(k: int) -> str:
    """File name of part ``k`` (0-based, consecutive) of a parted table."""
    return f"part-{k:05d}.parquet"


def samples_part(k: int) -> str:
    """Relative path of part ``k`` of the samples."""
    return f"{SAMPLES_DIR}/{part_name(k)}"


def part_index(name: str) -> int | None:
    """``k`` of a part file's name ``part-NNNNN.parquet`` (five or more digits), else None."""
    stem = name.removeprefix("part-").removesuffix(".parquet")
    if len(name) != len(stem) + 13 or len(stem) < 5 or not (stem.isascii() and stem.isdigit()):
        return None
    return int(stem)


#: The prefixes of a plan's epoch and rank directory names (``plan/epoch-E/rank-R``).
PLAN_DIR_NAMES = ("epoch-", "rank-")


def plan_file(epoch: int, rank: int) -> str:
    """Relative path of rank ``rank``'s plan for ``epoch`` (``plan/epoch-E/rank-R/part-00000.parquet``)."""
    return f"{PLAN_DIR}/epoch-{epoch}/rank-{rank}/part-00000.parquet"


def misplaced_key(table: pa.Table, epoch: int, rank: int) -> tuple[str, int] | None:
    """``(column, expected value)`` when a plan file's ``epoch`` or ``rank`` column is not ``epoch`` /
    ``rank`` on every row (a null counts as wrong), else None; a table read without the column passes."""
    for name, want in (("epoch", epoch), ("rank", rank)):
        if name in table.column_names:
            col = table.column(name)
            if col.null_count or (table.num_rows and not pc.all(pc.equal(col, want)).as_py()):
                return name, want
    return None


def plan_key(rel: str) -> tuple[int, int] | None:
    """(epoch, rank) when ``rel`` is exactly ``plan_file(epoch, rank)``, else None (a copy such as
    ``epoch-00``, a second part or another layout's name)."""
    nums = re.findall(r"[0-9]{1,18}", rel)[:2]
    if len(nums) != 2:
        return None
    e, r = int(nums[0]), int(nums[1])
    return (e, r) if plan_file(e, r) == rel else None


#: Strategies whose plan files hold a variable ``rank_count`` per step (``--strategy budget``, ``rebalance``,
#: ``auto``); the planner's registry (``lidarshard.transforms.plan``) reads this list, so the contract names no
#: planner.
VARIABLE_COUNT = frozenset({"budget", "rebalance", "auto"})

#: Fixed vocabulary of reject reasons; ``detail`` carries the specifics.
REJECT_REASONS: dict[str, str] = {
    "unreadable": "the file could not be opened or read (I/O error, permission, not a regular file)",
    "empty": "the file holds no bytes or no points",
    "truncated": "the byte count is not a whole number of point records, or shorter than the header claims",
    "bad_header": "a header (PCD/PLY/NPY) is malformed or inconsistent with itself",
    "non_finite": "no point has finite x, y, z",
    "unsupported_format": "the extension or content is not a supported point-cloud format",
    "missing_sweep": "a sweep (previous frame) the dataset's tables or poses name does not exist",
    "missing_file": "a keyframe file (or frame) the dataset's tables name does not exist",
    "label_mismatch": "the label file does not hold exactly one valid label per keyframe point (lidarseg uint8, "
    "SemanticKITTI uint32 through its learning_map)",
    "too_large": "the file or its claimed point count exceeds --max-file-bytes / --max-points",
    "over_cap": "the sample alone exceeds --max-points-per-rank-step, --max-cost-per-rank-step or --max-step-memory",
    "outside_root": "a path in the tables resolves outside the dataroot",
    "duplicate_id": "another input already produced this sample_id",
    "absurd_coordinates": "finite coordinates beyond MAX_ABS_COORD metres from the sensor (often a wrong --point-dims)",
    "empty_after_filter": "no point is left inside --point-cloud-range",
    "bad_table": "a table record is malformed (nuScenes tables, AV2/Waymo poses, SemanticKITTI poses/calib: "
    "missing keys, broken prev chain, bad pose)",
    "sweep_columns": "a sweep's points have another number of columns than its keyframe's",
    "reader_error": "an unexpected error in a reader (a bug: please report with the detail)",
}

_F32 = pa.float32()
_F64 = pa.float64()
_I64 = pa.int64()
_STR = pa.string()

#: (name, type, doc) for one accepted sample's size features, as written by ``lidarshard scan``.
SAMPLE_FIELDS: list[tuple[str, pa.DataType, str]] = [
    ("sample_id", _STR, "stable id: sample token (tables mode) or path relative to INPUT"),
    ("path", _STR, "keyframe (or only) point-cloud file: relative to path_root, or a full path/URI"),
    ("sweep_paths", pa.list_(_STR), "aggregated previous sweeps, newest first; like path"),
    (
        "sweep_transforms",
        pa.list_(_F64),
        "row-major 4x4 sweep-sensor -> keyframe-sensor matrices, 16 per sweep",
    ),
    ("label_path", _STR, "lidarseg label file (like path), or null"),
    ("format", _STR, "reader used: nuscenes_bin, kitti_bin, bin, npy, pcd, ply"),
    ("file_bytes", _I64, "bytes of the keyframe file plus all sweep files"),
    ("num_points", _I64, "points the loaders return (close_points applied, NaN x/y/z rows not counted)"),
    ("num_finite", _I64, "points with finite x, y, z"),
    ("num_in_range", _I64, "finite points inside --point-cloud-range"),
    ("x_min", _F32, "m, over in-range points"),
    ("x_max", _F32, "m"),
    ("y_min", _F32, "m"),
    ("y_max", _F32, "m"),
    ("z_min", _F32, "m"),
    ("z_max", _F32, "m"),
    ("x_p01", _F32, "m, 1st percentile"),
    ("x_p99", _F32, "m, 99th percentile"),
    ("y_p01", _F32, "m"),
    ("y_p99", _F32, "m"),
    ("z_p01", _F32, "m"),
    ("z_p99", _F32, "m"),
    ("occupied_voxels", _I64, "distinct occupied voxels of --voxel-size over in-range points"),
    ("num_sweeps", pa.int32(), "previous sweeps aggregated (0 = keyframe only)"),
    ("has_labels", pa.bool_(), "a lidarseg label file was found and checked"),
    # Added in 3.1 (``ADDED_IN``); a minor version appends fields, so 3.0's columns keep their places.
    ("path_bytes", _I64, "bytes of the file at path as scanned (null: not recorded)"),
    ("path_crc32", _I64, "CRC-32 (zlib.crc32) of the bytes of path; null: not read (--features stat)"),
    (
        "sweep_bytes",
        pa.list_(_I64),
        "bytes of each sweep file, aligned with sweep_paths (null: not recorded)",
    ),
    ("sweep_crc32", pa.list_(_I64), "CRC-32 of each sweep file, aligned with sweep_paths; null: not read"),
    ("label_bytes", _I64, "bytes of the label file (null: no label_path, or not recorded)"),
    ("label_crc32", _I64, "CRC-32 of the label file; null: no label_path, or not read"),
    # Added in 4.1: datasets and layouts beyond one file per sample.
    ("dataset", _STR, "name of the INPUT the sample came from (several INPUTs: the sample_id's prefix)"),
    (
        "frame",
        _I64,
        "the keyframe's row key inside a multi-frame file (Waymo v2: frame_timestamp_micros); null: the "
        "file holds one frame",
    ),
    ("sweep_frames", pa.list_(_I64), "the sweeps' row keys, aligned with sweep_paths; null like frame"),
    # Added in 4.3: the time-lag channel of multi-sweep detectors.
    (
        "sweep_time_lags",
        pa.list_(_F64),
        "seconds from each sweep to the keyframe (t_keyframe - t_sweep, > 0), aligned with sweep_paths",
    ),
]

#: The content hash of the ``*_crc32`` columns: CRC-32 as zlib/gzip compute it (``content_hash``), an
#: unsigned 32-bit value. Not cryptographic: it detects files changed by accident, with the size.
CONTENT_HASH = "crc32"

#: Sample fields recording what the scan read of each referenced file (schema 3.1): sizes always (a
#: stat under ``--features stat``), CRC-32s of the files it read.
INTEGRITY_FIELDS = ("path_bytes", "path_crc32", "sweep_bytes", "sweep_crc32", "label_bytes", "label_crc32")

#: {field name: the schema version that added it}; a field not named here is in every file since 3.0
#: (the 3.x samples ``build --from-samples`` reads lack the later ones).
ADDED_IN: dict[str, str] = {
    **dict.fromkeys(INTEGRITY_FIELDS, "3.1"),
    "epoch": "4.0",
    "rank": "4.0",
    **dict.fromkeys(("dataset", "frame", "sweep_frames"), "4.1"),
    "sweep_time_lags": "4.3",
}


def content_hash(data: bytes | memoryview, running: int = 0) -> int:
    """``CONTENT_HASH`` of ``data``, continuing ``running`` (the value of the bytes before it): feeding a
    file block by block gives the value of the whole file. Releases the GIL on large blocks."""
    return zlib.crc32(data, running)


def _version(version: str) -> tuple[int, ...]:
    return tuple(int(v) for v in version.split(".") if v.isdigit())


def is_before(version: str, other: str) -> bool:
    """``version`` is older than ``other`` ("3.0" before "3.1"; numerically, not as text)."""
    return _version(version) < _version(other)


def is_readable(version: str) -> bool:
    """A file of schema ``version`` is read by this lidarshard: a ``READABLE`` major, not newer than the
    newest minor of it."""
    newest = READABLE.get(version.split(".")[0])
    return newest is not None and (version == newest or is_before(version, newest))


def as_written(schema: pa.Schema, version: str) -> pa.Schema:
    """``schema`` (a current contract) as a writer of ``version`` wrote it: without later fields."""
    return pa.schema(
        [f for f in schema if not is_before(version, ADDED_IN.get(f.name, version))],
        metadata={"lidarshard.schema_version": version},
    )


#: Sample rows in a built manifest: features plus the planner's inputs.
SCORED_FIELDS: list[tuple[str, pa.DataType, str]] = SAMPLE_FIELDS + [
    ("cost", _F64, "predicted compute cost under the run's cost model (arbitrary units)"),
    ("bucket_id", pa.int32(), "cost bucket, 0 = cheapest"),
    (
        "weight",
        _F64,
        "expected copies per epoch from --repeat-factors / --sample-weights (1.0 without); the bucket "
        "weight multiplies it; realized per epoch by deterministic stochastic rounding",
    ),
]

REJECT_FIELDS: list[tuple[str, pa.DataType, str]] = [
    ("path", _STR, "the offending input (file path, or table record)"),
    ("reason", _STR, "one of REJECT_REASONS"),
    ("detail", _STR, "human-readable specifics"),
]

#: Which plan a plan file holds: columns of every file (one value each, that of its directory names
#: ``epoch-E/rank-R``).
PLAN_KEY_FIELDS: list[tuple[str, pa.DataType, str]] = [
    ("epoch", pa.int32(), "epoch index, 0-based (the file's epoch-E directory)"),
    ("rank", pa.int32(), "data-parallel rank (the file's rank-R directory)"),
]

#: One row per (step, slot) of one (epoch, rank) plan file.
PLAN_FIELDS: list[tuple[str, pa.DataType, str]] = PLAN_KEY_FIELDS + [
    ("step", pa.int32(), "step index within the epoch"),
    ("slot", pa.int32(), "position within the rank's batch, 0..rank_count-1"),
    ("sample_id", _STR, "key into the samples"),
    ("path", _STR, "keyframe path, as in the samples (relative to path_root when it is set)"),
    ("sweep_paths", pa.list_(_STR), "sweep paths, as in the samples"),
    ("cost", _F64, "the sample's predicted cost"),
    ("bucket_id", pa.int32(), "the sample's cost bucket"),
    ("rank_count", pa.int32(), "samples this rank trains at this step (batch_size but for variable counts)"),
    (
        "global_count",
        pa.int32(),
        "samples all ranks train at this step; loss scale = world_size / global_count",
    ),
]


def _schema(fields: list[tuple[str, pa.DataType, str]], version: str = SCHEMA_VERSION) -> pa.Schema:
    """``fields`` as a writer of ``version`` wrote them (``as_written``)."""
    return as_written(
        pa.schema([pa.field(name, typ, metadata={"doc": doc}) for name, typ, doc in fields]), version
    )


def sample_schema(version: str = SCHEMA_VERSION) -> pa.Schema:
    """Arrow schema of ``lidarshard scan``'s samples parts (as schema ``version`` wrote them)."""
    return _schema(SAMPLE_FIELDS, version)


def scored_schema(version: str = SCHEMA_VERSION) -> pa.Schema:
    """Arrow schema of ``lidarshard build``'s samples parts (features + cost + bucket + weight; as
    schema ``version`` wrote them)."""
    return _schema(SCORED_FIELDS, version)


def reject_schema() -> pa.Schema:
    """Arrow schema of rejects.parquet."""
    return _schema(REJECT_FIELDS)


def plan_schema(version: str = SCHEMA_VERSION) -> pa.Schema:
    """Arrow schema of every ``plan_file`` (as schema ``version`` wrote them)."""
    return _schema(PLAN_FIELDS, version)


def schema_to_json(schema: pa.Schema) -> list[dict[str, str]]:
    """A JSON-able description of ``schema`` (name, type, doc), for metadata files."""
    return [
        {"name": f.name, "type": str(f.type), "doc": (f.metadata or {}).get(b"doc", b"").decode()}
        for f in schema
    ]


def check_version(version: object, where: str, manifest: dict | None = None) -> None:
    """Refuse metadata whose schema major version is not this lidarshard's.

    Args:
        version: the ``schema_version`` found.
        where: the directory or file it came from, for the message.
        manifest: the metadata, used to spell out the rebuild command with its own options.

    Raises:
        ValueError: naming both versions and the command that rebuilds the directory.
    """
    found = version[:40] if isinstance(version, str) else ""  # a forged value may be any JSON
    if found.split(".")[0] in READABLE_MAJORS:
        return
    m = manifest or {}
    plan = " ".join(
        f"--{k.replace('_', '-')} {m[k]}"
        for k in ("world_size", "batch_size", "epochs", "seed", "strategy")
        if isinstance(m.get(k), (int, str)) and len(str(m[k])) <= 40
    )
    major = found.split(".")[0]
    samples = SAMPLES_FILE if major.isdigit() and int(major) < 3 else SAMPLES_DIR
    raise ValueError(
        f"{where} was written with manifest schema {found or 'unknown'}; this lidarshard reads "
        f"{' and '.join(m + '.x' for m in READABLE_MAJORS)} (writes {SCHEMA_VERSION}): rebuild it without rescanning with "
        f"`lidarshard build NEW_OUT --from-samples {where.rstrip('/')}/{samples} {plan or '...'}`"
    )
