"""transforms/features/accounting.py: duplicate ids, the accounting and reject-fraction checks, the
inputs fingerprint."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.transforms.features.accounting import (
    TooManyRejects,
    counts_of,
    counts_or_stop,
    dedupe,
    fingerprint,
)


def _samples(ids: list[str], nbytes: list[int | None] | None = None) -> pa.Table:
    nbytes = nbytes if nbytes is not None else [10 * (i + 1) for i in range(len(ids))]
    return pa.table(
        {"sample_id": ids, "path": [f"/d/{i}.bin" for i in range(len(ids))], "file_bytes": nbytes},
        schema=pa.schema([("sample_id", pa.string()), ("path", pa.string()), ("file_bytes", pa.int64())]),
    )


def _rejects(rows: list[tuple[str, str, str]]) -> pa.Table:
    cols = {k: [r[i] for r in rows] for i, k in enumerate(("path", "reason", "detail"))}
    return pa.Table.from_pydict(cols, schema=schemas.reject_schema())


def test_dedupe_keeps_the_first_row_of_each_id() -> None:
    kept, dup = dedupe(_samples(["a", "b", "b", "b", "c"]))
    assert kept.column("sample_id").to_pylist() == ["a", "b", "c"]
    assert kept.column("path").to_pylist() == ["/d/0.bin", "/d/1.bin", "/d/4.bin"]
    assert [(d["path"], d["reason"]) for d in dup] == [
        ("/d/2.bin", "duplicate_id"),
        ("/d/3.bin", "duplicate_id"),
    ]
    assert dedupe(_samples(["a"])) == (_samples(["a"]), [])


def test_counts_of_checks_accounting_and_reject_fraction() -> None:
    rejects = _rejects([("/x", "empty", "0 bytes")])
    counts = counts_of(3, _samples(["a", "b"]).num_rows, rejects)
    assert counts == {"scanned": 3, "accepted": 2, "rejected": 1, "rejected_by_reason": {"empty": 1}}
    with pytest.raises(RuntimeError, match="lost or duplicated"):
        counts_of(4, _samples(["a", "b"]).num_rows, rejects)
    with pytest.raises(RuntimeError, match=r"1 of 3 inputs rejected .*empty: 1.*/x: empty"):
        counts_of(3, _samples(["a", "b"]).num_rows, rejects, max_reject_fraction=0.2)


def test_counts_or_stop_writes_every_reject_beside_out(tmp_path) -> None:
    rejects = _rejects([("/0", "empty", ""), ("/1", "empty", "")])
    assert counts_or_stop(4, 2, rejects, 0.5, str(tmp_path / "x.parquet"))["rejected"] == 2
    assert not (tmp_path / "x.parquet").exists()
    with pytest.raises(TooManyRejects, match=r"2 of 4 inputs rejected.*every reject .* is in .*x\.parquet"):
        counts_or_stop(4, 2, rejects, 0.25, str(tmp_path / "x.parquet"))
    assert pq.read_table(tmp_path / "x.parquet").column("path").to_pylist() == ["/0", "/1"]


def _plain(ids: list[str], nbytes: list[int | None]) -> str:
    h = hashlib.sha256()
    for sid, n in zip(ids, nbytes, strict=True):
        h.update(f"{sid}\t{n}\n".encode())
    return h.hexdigest()


def test_fingerprint_is_the_per_row_definition() -> None:
    ids, nbytes = ["a", "b\u00e9", "c"], [1, 22, 333]
    assert fingerprint(_samples(ids, nbytes)) == _plain(ids, nbytes)
    chunked = pa.concat_tables([_samples(ids[:1], nbytes[:1]), _samples(ids[1:], nbytes[1:])])
    assert chunked.column("sample_id").num_chunks == 2 and fingerprint(chunked) == _plain(ids, nbytes)
    assert fingerprint(_samples(ids, [1, None, 3])) == _plain(ids, [1, None, 3])
    assert fingerprint(_samples([])) == hashlib.sha256().hexdigest()
    assert fingerprint(_samples(ids, nbytes).slice(1)) == _plain(ids[1:], nbytes[1:])


def test_first_not_increasing_across_parts() -> None:
    from lidarshard.transforms.features.accounting import first_not_increasing

    assert first_not_increasing(pa.array(["a", "b", "c"])) is None
    assert first_not_increasing(pa.array(["a", "b", "b"])) == 2  # a duplicate
    assert first_not_increasing(pa.array(["a", "c", "b"])) == 2
    assert first_not_increasing(pa.array(["b", "c"]), last="b") == 0  # equal to the previous part's last
    assert first_not_increasing(pa.array(["c"]), last="b") is None
    assert first_not_increasing(pa.array([], pa.string()), last="x") is None


def test_a_build_with_every_input_rejected_keeps_its_reasons(tmp_path) -> None:
    """Even at --max-reject-fraction 1 a plan needs samples: every reject goes beside OUT with its
    reason and the error says why and where; a scan (plan=False) publishes them as usual."""
    rejects = _rejects([("/x", "truncated", "17 bytes"), ("/y", "empty", "0 bytes")])
    out = tmp_path / "x.parquet"
    assert counts_or_stop(2, 0, rejects, 1.0, str(out))["rejected"] == 2 and not out.exists()
    with pytest.raises(TooManyRejects, match=r"2 of 2 inputs rejected \(nothing left to plan\)") as err:
        counts_or_stop(2, 0, rejects, 1.0, str(out), plan=True)
    assert str(out) in str(err.value) and pq.read_table(out).num_rows == 2


def test_too_many_rejects_names_the_first_reject_whole() -> None:
    """A detail holding "; " is not cut in half (the message's parentheses stay balanced)."""
    rejects = _rejects(
        [("/d/a.bin", "bad_table", "row 3; column x (a float) is null"), ("/d/b.bin", "x", "")]
    )
    with pytest.raises(TooManyRejects) as e:
        counts_of(2, 0, rejects, max_reject_fraction=0.5)
    text = str(e.value)
    assert text.endswith("first: /d/a.bin: bad_table (row 3; column x (a float) is null)")
    assert text.count("(") == text.count(")")
