"""The manifest contract: one source of truth for every file lidarshard writes.

Field lists here produce the Arrow schemas the pipeline writes and the loaders check. Schemas are
plain data (name, Arrow type, doc) and are stored as JSON, never pickled.

Layout of an output directory ``OUT``::

    OUT/_manifest.json            run metadata (see ``MANIFEST_KEYS``)
    OUT/samples/part-00000.parquet   accepted samples (``SAMPLE_FIELDS`` + cost, bucket_id, weight),
                                     sorted by sample_id across consecutive parts (``samples_part``)
    OUT/rejects.parquet           one row per rejected input (``REJECT_FIELDS``)
    OUT/plan/epoch-E/rank-R/part-00000.parquet   rank R's plan for epoch E (``PLAN_FIELDS``)
    OUT/_SUCCESS                  written last; readers refuse a directory without it

``OUT/plan`` holds nothing but the plan. Each file carries its ``epoch`` and ``rank`` as int32 columns
(constant within the file, equal to its directory names), and the directory names are not hive
``key=value`` pairs, so any Parquet reader pointed at that one directory (pandas, ``pq.read_table``,
pyarrow.dataset, DuckDB, polars, Spark) returns the whole plan with plain integer ``epoch`` and ``rank``
and no option (hive names made pandas and ``pq.read_table`` infer dictionary-encoded categoricals).

Version history: 1.x kept ``epoch`` and ``rank`` both as columns and as directories directly under OUT
(readers pointed at a directory failed to merge the two); 2.0 moved the plan under ``OUT/plan``;
2.1 added samples.parquet's ``weight`` (repeat factors) and the manifest's ``repeat``;
3.0 split samples.parquet into ``OUT/samples/part-NNNNN.parquet`` (written in parallel, one task a
part): part k holds the k-th run of the rows sorted by sample_id, so reading the parts in name order
(or pointing any Parquet reader at ``OUT/samples``) gives the old single table;
3.1 added each referenced file's size and CRC-32 to the samples (``INTEGRITY_FIELDS``): the loaders
refuse a file of another size, ``lidarshard validate OUT --data`` checks them all. A minor version only
adds fields (``ADDED_IN``): a 3.1 reader reads 3.0 files as ``sample_schema("3.0")`` describes them;
4.0 moved the plan from hive directories ``plan/epoch=E/rank=R/`` (keys in the names only) to
``plan/epoch-E/rank-R/`` with ``epoch`` and ``rank`` as columns of each file (``plan_file``);
4.1 added the samples' ``dataset`` (several INPUTs in one plan) and ``frame`` / ``sweep_frames`` (samples
that are rows of a multi-frame file, Waymo v2); 4.2 added the manifest's ``cost_history`` (the epochs before
a ``build --replan-from`` keep the plan and the cost model that planned them) and ``rank_speed`` (mixed hardware). This lidarshard reads 3.x
(``READABLE_MAJORS``) and 4.x; it writes 4.2.
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
    "MANIFEST_KEYS",
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
    "plan_dir_names",
    "PLAN_KEY_FIELDS",
    "READABLE",
    "READABLE_MAJORS",
    "PLAN_DIR",
    "WORK_DIR",
    "META_FILES",
    "REPORT_DIR",
    "partition_schema",
    "check_version",
    "is_before",
    "is_readable",
    "as_written",
]

SCHEMA_VERSION = "4.2"
#: {major schema version this lidarshard reads: the newest minor of it}; the previous major too (see
#: the version history): 3.1 was the last 3.x.
READABLE: dict[str, str] = {"3": "3.1", "4": SCHEMA_VERSION}
READABLE_MAJORS = tuple(READABLE)

#: The single samples file of schema 2.x (``build --from-samples`` still reads it).
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


def plan_dir_names(version: str = SCHEMA_VERSION) -> tuple[str, str]:
    """The prefixes of a plan's epoch and rank directory names as schema ``version`` wrote them:
    ``("epoch-", "rank-")`` from 4.0, the hive ``("epoch=", "rank=")`` before."""
    return ("epoch=", "rank=") if is_before(version, "4.0") else ("epoch-", "rank-")


def plan_file(epoch: int, rank: int, version: str = SCHEMA_VERSION) -> str:
    """Relative path of rank ``rank``'s plan for ``epoch`` under ``PLAN_DIR``, as schema ``version``
    names it (``plan/epoch-E/rank-R/part-00000.parquet``; 3.x: ``plan/epoch=E/rank=R/...``)."""
    e, r = plan_dir_names(version)
    return f"{PLAN_DIR}/{e}{epoch}/{r}{rank}/part-00000.parquet"


def misplaced_key(table: pa.Table, epoch: int, rank: int) -> tuple[str, int] | None:
    """``(column, expected value)`` when a plan file's ``epoch`` or ``rank`` column (schema 4) is not
    ``epoch`` / ``rank`` on every row (a null counts as wrong), else None; a table without the column
    (a 3.x file) passes."""
    for name, want in (("epoch", epoch), ("rank", rank)):
        if name in table.column_names:
            col = table.column(name)
            if col.null_count or (table.num_rows and not pc.all(pc.equal(col, want)).as_py()):
                return name, want
    return None


def plan_key(rel: str, version: str = SCHEMA_VERSION) -> tuple[int, int] | None:
    """(epoch, rank) when ``rel`` is exactly ``plan_file(epoch, rank, version)``, else None (a copy
    such as ``epoch-00``, a second part or another layout's name)."""
    nums = re.findall(r"[0-9]{1,18}", rel)[:2]
    if len(nums) != 2:
        return None
    e, r = int(nums[0]), int(nums[1])
    return (e, r) if plan_file(e, r, version) == rel else None


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
    "over_cap": "the sample alone exceeds --max-points-per-rank-step or --max-cost-per-rank-step",
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
    ("num_points", _I64, "points read (keyframe + sweeps after close-point removal)"),
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
]

#: The content hash of the ``*_crc32`` columns: CRC-32 as zlib/gzip compute it (``content_hash``), an
#: unsigned 32-bit value. Not cryptographic: it detects files changed by accident, with the size.
CONTENT_HASH = "crc32"

#: Sample fields recording what the scan read of each referenced file (schema 3.1): sizes always (a
#: stat under ``--features stat``), CRC-32s of the files it read.
INTEGRITY_FIELDS = ("path_bytes", "path_crc32", "sweep_bytes", "sweep_crc32", "label_bytes", "label_crc32")

#: {field name: the schema version that added it}; a field not named here is in every 3.x file.
ADDED_IN: dict[str, str] = {
    **dict.fromkeys(INTEGRITY_FIELDS, "3.1"),
    "epoch": "4.0",
    "rank": "4.0",
    **dict.fromkeys(("dataset", "frame", "sweep_frames"), "4.1"),
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

#: Which plan a plan file holds: columns of every 4.x file (one value each, that of its directory
#: names ``epoch-E/rank-R``); in 3.x the hive directory names ``epoch=E/rank=R`` only.
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
    ("rank_count", pa.int32(), "samples this rank trains at this step (batch_size unless --strategy budget)"),
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
    """Arrow schema of every ``plan_file`` (as schema ``version`` wrote them: 3.x without ``epoch``,
    ``rank``)."""
    return _schema(PLAN_FIELDS, version)


def partition_schema() -> pa.Schema:
    """Arrow schema of a 3.x plan's hive directory keys (``epoch``, ``rank``: int32)."""
    return _schema(PLAN_KEY_FIELDS)


#: Keys of ``_manifest.json`` (JSON object) and what they hold.
MANIFEST_KEYS: dict[str, str] = {
    "schema_version": "SCHEMA_VERSION of the writer",
    "created_by": "lidarshard version",
    "world_size": "int W: ranks planned for",
    "batch_size": "int B: samples per rank per step (the mean per rank-step under --strategy budget)",
    "repeat": "{'mode': 'lidarseg:t=T' | 'column:NAME', 'expected': {class: copies}, 'realized': [E "
    "{class: copies}]} or null without weights (lidarseg class indices; else totals under key 'all')",
    "caps": "{'max_points_per_rank_step', 'max_cost_per_rank_step', 'max_samples_per_rank_step'}: int/float or "
    "null; 'heaviest_first': 'points'|'cost' when each epoch's step 0 holds its heaviest rank-step (absent: off)",
    "epochs": "int E: epochs planned",
    "seed": "int: the plan's seed",
    "strategy": "name of the planning strategy",
    "cost_model": "{'name': 'points'|'voxels'|'linear', 'c0', 'a', 'b'[, 'q']}: cost = c0 + a*points + b*voxels^q",
    "rank_speed": "[W floats > 0] (4.2, absent when not given): each rank's relative speed (--rank-speed); balance "
    "entries then add 'speed_linearity', the linearity of the ranks' times cost / speed, and 'random_speed_linearity', "
    "that of the random plan (absent in manifests written before it)",
    "cost_history": "[{'until_epoch': E, 'cost_model': {...}}] (4.2, absent when empty): the models that planned "
    "the epochs before each re-plan (build --replan-from), rising; later epochs were planned with cost_model",
    "buckets": "{'edges': [K-1 floats, cost units], 'weights': [K floats], 'counts': [K ints]}",
    "policy": "'drop_last' or 'pad': how a pool that is not a multiple of W*B is fitted",
    "steps_per_epoch": "[E ints]: steps in each epoch (weights < 1 thin randomly, so epochs may differ)",
    "counts": "{'scanned', 'accepted', 'rejected': int, 'planned', 'dropped', 'padded': [E ints]}",
    "balance": "[E objects]: {'epoch', 'linearity', 'greedy_reference' (3.0 manifests: 'bound'), 'random_linearity', 'spearman_step_cost', ...}",
    "inputs_fingerprint": "sha256 hex over the sorted (sample_id, file_bytes) of accepted inputs",
    "pair_repeat_rate": "{strategy: rate, 'random': rate}: share of epoch-0 step-mates that share a step in epoch 1",
    "input": "INPUT as given (absolute for local paths); 'from_samples' when re-planned from earlier samples",
    "nuscenes_version": "tables version in tables mode, else null; 'sweeps': previous sweeps aggregated",
    "datasets": "[{'name', 'root', 'layout', 'weight', 'label_map'}]: the INPUTs scanned (4.1); label_map "
    "{raw label id: class id} (SemanticKITTI's learning_map) or null",
    "scan_config": "the feature options (voxel size, range, formats, limits); 'max_reject_fraction' too; "
    "'content_hash': the algorithm of the samples' *_crc32 columns (CONTENT_HASH), null under --features stat",
    "part_rows": "int: rows of each samples part (--part-rows), which fixes where the parts are cut",
    "sample_schema": "the samples' fields as JSON (name, type, doc); 'plan_schema' likewise",
    "path_root": "ROOT that relative sample paths resolve against (build --relative-to), or null: absolute paths",
    "files": "{relative path: {'bytes': int, 'sha256': hex}} for every data file (the samples parts numbered from 0), "
    "recorded at commit",
}


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
