"""``tools.validate_files``: the manifest's list of data files, checked from its names."""

from __future__ import annotations

from lidarshard import schemas
from lidarshard.schemas import plan_key
from lidarshard.tools.validate_files import check_listed


def _listed(w: int, epochs: int, parts: int = 2) -> dict:
    files = {schemas.samples_part(k): {} for k in range(parts)} | {schemas.REJECTS_FILE: {}}
    return files | {schemas.plan_file(e, r): {} for e in range(epochs) for r in range(w)}


def _check(
    files: dict, w: int, epochs: int, up_to: int = 200
) -> tuple[bool, list | None, list[tuple[str, str]]]:
    problems: list[tuple[str, str]] = []
    complete, parts = check_listed(
        lambda where, what: problems.append((where, what)), files, w, epochs, up_to
    )
    return complete, parts, problems


def test_plan_key_takes_only_the_exact_plan_file_name() -> None:
    assert schemas.plan_file(3, 12) == "plan/epoch-3/rank-12/part-00000.parquet"
    assert plan_key(schemas.plan_file(3, 12)) == (3, 12)
    assert plan_key("plan/epoch-03/rank-12/part-00000.parquet") is None  # not how lidarshard names it
    assert plan_key("plan/epoch-3/rank-12/other.parquet") is None and plan_key("rejects.parquet") is None
    assert plan_key("plan/epoch=3/rank=12/part-00000.parquet") is None  # a 3.x name: not read


def test_a_3_x_list_is_all_stray_names() -> None:
    files = {schemas.samples_part(0): {}, schemas.REJECTS_FILE: {}}
    files |= {f"plan/epoch={e}/rank={r}/part-00000.parquet": {} for e in range(2) for r in range(3)}
    problems: list[tuple[str, str]] = []
    complete, _ = check_listed(lambda *p: problems.append(p), files, 3, 2, 200)
    assert not complete and len(problems) == 6 + 6, problems  # 6 stray names, 6 missing


def test_a_complete_list_gives_the_parts_in_order() -> None:
    files = dict(reversed(list(_listed(4, 2, parts=3).items())))
    assert _check(files, 4, 2) == (True, [schemas.samples_part(k) for k in range(3)], [])


def test_missing_and_stray_entries_are_named() -> None:
    files = _listed(2, 2)
    del files[schemas.plan_file(1, 0)], files[schemas.samples_part(0)]
    files["notes.txt"] = {}
    complete, parts, problems = _check(files, 2, 2)
    assert not complete and parts is None
    wheres = [w for w, _ in problems]
    assert wheres == ["notes.txt", schemas.SAMPLES_DIR, schemas.plan_file(1, 0)], problems


def test_a_forged_world_size_costs_one_line() -> None:
    complete, _, problems = _check(_listed(2, 1), 10**7, 1)
    assert not complete and problems == [
        ("_manifest.json", "world_size 10000000 x epochs 1 need 10000000 plan files, 'files' lists 2")
    ]
