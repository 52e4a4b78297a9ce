"""What an earlier run left beside its samples (``build --from-samples``): the root its paths are stored
under, the reject fraction it ran with, its rejects, and a check that the samples are ours. Pure.

An earlier run's samples are ``OUT/samples`` (3.x parts) or a 2.x ``OUT/samples.parquet``; its
``_manifest.json`` or ``_scan.json`` and ``rejects.parquet`` sit in the same directory.
"""

from __future__ import annotations

import pyarrow as pa

from lidarshard import schemas
from lidarshard.schemas.records import DatasetEntry
from lidarshard.schemas.scan_record import ScanRecord
from lidarshard.transforms.io import metadata, storage
from lidarshard.transforms.io.arrow import row_groups
from lidarshard.transforms.io.parts import open_parts, samples_files
from lidarshard.transforms.layouts.multisweep import DEFAULT_CLOSE_POINTS, recorded_close_points

__all__ = [
    "previous_datasets",
    "previous_dir",
    "previous_root",
    "recorded_fraction",
    "previous_close_points",
    "previous_rejects",
    "check_schema",
    "previous_rows",
]


def previous_dir(samples_path: str) -> str:
    """The directory an earlier run's samples (``OUT/samples`` or ``OUT/samples.parquet``) sit in."""
    return samples_path.rsplit("/", 1)[0] if "/" in samples_path else "."


def _recorded(samples_path: str) -> ScanRecord | None:
    """What the earlier run recorded of its scan beside its samples (``metadata.previous_record``: its
    ``_manifest.json``, else its ``_scan.json``); None when there is neither.

    Raises:
        ValueError: the file is there but cannot be read or is malformed (one line naming it).
    """
    try:
        return metadata.previous_record(previous_dir(samples_path))
    except OSError as e:
        raise ValueError(f"--from-samples {samples_path}: {e}") from None


def previous_root(samples_path: str) -> str | None:
    """The ``path_root`` recorded next to an earlier run's samples (None: full paths)."""
    recorded = _recorded(samples_path)
    return recorded.path_root if recorded else None


def previous_datasets(samples_path: str) -> tuple[DatasetEntry, ...]:
    """The ``datasets`` (INPUTs with their layouts and label maps) the earlier run recorded (empty: none)."""
    recorded = _recorded(samples_path)
    return recorded.datasets if recorded else ()


def previous_sweeps(samples_path: str) -> tuple[int | dict[str, int], str | None]:
    """The ``sweeps`` (N, or {INPUT name: N}) and nuScenes tables version the earlier run recorded: its
    samples carry those sweeps, and a re-plan records them as they are (0 and None when none recorded)."""
    recorded = _recorded(samples_path)
    if recorded is None:
        return 0, None
    sweeps = recorded.sweeps
    return (sweeps if isinstance(sweeps, int) else dict(sweeps)), recorded.nuscenes_version


def previous_close_points(samples_path: str) -> str:
    """The close-point rule the earlier run's size features were computed under
    (``multisweep.recorded_close_points``: ``"sweeps"`` when none is recorded)."""
    recorded = _recorded(samples_path)
    return recorded_close_points(recorded.provenance) if recorded else DEFAULT_CLOSE_POINTS


def recorded_fraction(samples_path: str) -> float | None:
    """The ``--max-reject-fraction`` the earlier run recorded (None: none recorded)."""
    recorded = _recorded(samples_path)
    return recorded.max_reject_fraction if recorded else None


def previous_rejects(samples_path: str) -> pa.Table:
    """The earlier run's ``rejects.parquet`` (an empty table when there is none)."""
    try:
        table = storage.read_parquet(storage.join(previous_dir(samples_path), schemas.REJECTS_FILE))
    except OSError:
        return schemas.reject_schema().empty_table()
    return table.cast(schemas.reject_schema())


def check_schema(where: str, table: pa.Table, want: pa.Schema | None = None) -> None:
    """The columns and types of a samples table or row group cast to ``want`` (the samples contract).

    Raises:
        ValueError: one line naming ``where`` and the fix.
    """
    want = schemas.sample_schema() if want is None else want
    schema = table.schema
    missing = [n for n in want.names if n not in schema.names and n not in schemas.ADDED_IN]
    if missing:
        raise ValueError(f"{where} lacks columns {missing}: pass a lidarshard run's samples (OUT/samples)")
    ids = schema.field("sample_id").type if "sample_id" in want.names else pa.string()
    if not (pa.types.is_string(ids) or pa.types.is_large_string(ids)):
        raise ValueError(f"{where}: sample_id is {ids}, not strings: pass a lidarshard run's samples")
    present = pa.schema([f for f in want if f.name in schema.names])  # an earlier 3.x lacks later fields
    try:
        table.select(present.names).cast(present)
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"{where}: columns do not match the samples contract ({str(e)[:160]})") from None


def previous_rows(path: str) -> tuple[int, str | None]:
    """Rows of an earlier run's samples after checking their schema and that no sample_id is null,
    reading the footer and the sample_id column a row group at a time (never the whole table), and
    the first stored ``path`` of the first row group (None: none).

    Raises:
        ValueError: not samples of ours: columns missing or of another type, null or non-string ids.
    """
    where = f"--from-samples {path}"
    try:
        with open_parts(samples_files(path)) as file:
            check_schema(where, file.schema_arrow.empty_table())
            want = schemas.sample_schema()
            stored = file.schema_arrow
            other = [
                f for f in want if f.name in stored.names and not stored.field(f.name).type.equals(f.type)
            ]
            nulls = 0
            names = list(dict.fromkeys(["sample_id", *(f.name for f in other)]))
            for t in row_groups(file, names):  # values of other types must cast
                nulls += t.column("sample_id").null_count
                if other:
                    check_schema(where, t.select([f.name for f in other]), pa.schema(other))
            rows = file.metadata.num_rows
            stored = file.read_row_group(0, columns=["path"]).column("path").drop_null() if rows else []
    except pa.ArrowException as e:
        raise ValueError(f"{where} is not a readable Parquet file ({str(e)[:120]})") from None
    if nulls:
        raise ValueError(f"{where}: {nulls} rows have a null sample_id")
    return rows, (stored[0].as_py() if len(stored) else None)
