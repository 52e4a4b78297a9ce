"""Hierarchical planning (issue 38): an epoch planned in G step groups (``transforms.core.groups``).

One group is today's plan, byte for byte; with a forced G every strategy, caps, weights, heaviest-first
and rank speeds still hold, the build validates, a re-plan keeps it, and an elastic restart re-plans it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lidarshard
from lidarshard import schemas
from lidarshard.loaders.elastic import load_epoch_plan, replan_remaining
from lidarshard.loaders.reader import load_manifest
from lidarshard.tools.validate import validate
from lidarshard.transforms.core import groups
from lidarshard.transforms.core.config import AUTO_RULE, GROUP_SAMPLES, PlanConfig, auto_groups
from lidarshard.transforms.core.planner import plan_samples
from lidarshard.transforms.core.pool import plan_pool
from lidarshard.transforms.plan import ANY_POOL, STRATEGIES, VARIABLE_COUNT, order, plan_epoch, seeds
from lidarshard.transforms.plan.caps import Caps, rank_step_sums
from lidarshard.transforms.plan.metrics import balance_entry, balance_summary, mate_counts, plan_sums
from lidarshard.transforms.value_checks import UsageError
from tests.helpers import BEAM_TEST_FLAGS, build_bins_manifest, make_bins, scored_pool

#: sha256[:16] of (plan, baseline) bytes of ``_today``'s epoch 1 per strategy, and of the plan rows of
#: ``build_bins_manifest(61, 2, 4)``, as main at 8c7fc1f (before step groups) wrote them; ``rebalance`` and
#: ``auto`` as first written (issue 52).
TODAY = {
    "balanced": "41bddf583477c292",
    "budget": "3cdfb76fce570b2f",
    "megabatch": "5ced17d7203be17a",
    "mixed": "983c27fc970a4899",
    "random": "bada43c8d96c7ae4",
    "rebalance": "45b30f6b492f4242",
    "auto": "0ede799677694c0b",
    "stratified": "52593431183c029b",
    "rows": "bdc12ebc337b6c31",
}
SPEEDS = (1.0, 1.0, 0.5, 1.0)


def _digest(*arrays: np.ndarray) -> str:
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()[:16]


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("forced", [None, 1])
def test_one_group_is_todays_plan_byte_for_byte(strategy: str, forced: int | None) -> None:
    cfg = PlanConfig(
        4, 8, epochs=2, strategy=strategy, heaviest_first="cost", rank_speed=SPEEDS, plan_groups=forced
    )
    assert cfg.groups(3000) == 1
    p = plan_samples(scored_pool(3000, 1), 1, cfg)
    assert _digest(p.plan, p.baseline) == TODAY[strategy]


def test_a_small_build_writes_todays_plan_rows_and_records_one_group(tmp_path: Path) -> None:
    out = build_bins_manifest(tmp_path, 61, 2, 4)
    m = json.loads((out / "_manifest.json").read_text())
    assert m["plan_groups"] == {"groups": 1, "rule": AUTO_RULE}
    h = hashlib.sha256()
    for rel in sorted(k for k in m["files"] if k.startswith("plan/")):
        h.update(rel.encode() + json.dumps(pq.read_table(out / rel).to_pydict()).encode())
    assert h.hexdigest()[:16] == TODAY["rows"]


def test_the_auto_rule() -> None:
    assert [auto_groups(n) for n in (0, 1, GROUP_SAMPLES - 1, 2 * GROUP_SAMPLES - 1, 2 * GROUP_SAMPLES)] == [
        1, 1, 1, 1, 2,
    ]  # fmt: skip
    assert auto_groups(10**9) == 10**9 // GROUP_SAMPLES == 953
    assert PlanConfig(1, 1, plan_groups=5).groups_record(10) == {"groups": 5, "rule": "forced"}
    with pytest.raises(ValueError, match="--plan-groups"):
        PlanConfig(1, 1, plan_groups=0)


def test_deal_is_a_stable_hash_of_the_sample_and_epoch() -> None:
    ids = [f"scene-{i:05d}" for i in range(20000)]
    keys = seeds.sample_keys(ids)
    dealt = groups.deal(keys, 7, 3, 5)
    assert dealt.min() == 0 and dealt.max() == 4
    assert np.abs(np.bincount(dealt) - 4000).max() < 250  # about even
    assert (groups.deal(keys[::-1], 7, 3, 5) == dealt[::-1]).all()  # per sample, not per position
    assert (groups.deal(keys, 7, 4, 5) != dealt).mean() > 0.7  # another epoch, another deal
    assert (groups.deal(keys, 8, 3, 5) != dealt).mean() > 0.7
    assert (groups.deal(keys, 7, 3, 1) == 0).all()
    assert seeds.sample_keys(["a"])[0] == 0xE8B7BE43  # CRC-32 of the UTF-8, on every platform


def test_interleave_keeps_counts_and_puts_the_heaviest_group_first() -> None:
    labels = groups.interleave([3, 5, 2], None, 1, 0)
    assert np.bincount(labels).tolist() == [3, 5, 2]
    assert (groups.interleave([3, 5, 2], None, 1, 0) == labels).all()
    for heavy in range(3):
        peaks = [1.0, 1.0, 1.0]
        peaks[heavy] = 2.0
        first = groups.interleave([3, 5, 2], peaks, 1, 0)
        assert first[0] == heavy and np.bincount(first).tolist() == [3, 5, 2]


def _copies(plan: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(plan[plan >= 0], minlength=n)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_plans_each_group_with_its_settings(strategy: str) -> None:
    table = scored_pool(3000, 2)
    caps = Caps(max_points=4000) if strategy in ANY_POOL else Caps()  # planned within: budget's
    cfg = PlanConfig(4, 8, epochs=2, strategy=strategy, plan_groups=3, heaviest_first="points", rank_speed=SPEEDS,
                     caps=caps)  # fmt: skip
    p = plan_samples(table, 0, cfg)
    keys = seeds.sample_keys(table.column("sample_id"))
    copies = groups.pool_copies(
        table.column("bucket_id").to_numpy(), table.column("weight").to_numpy(), keys, 0, cfg
    )
    assert p.stats["planned"] == int((p.plan >= 0).sum()) == copies.sum()
    if strategy not in ANY_POOL:  # every pool entry once; only whole steps (of B each, equal counts)
        assert (_copies(p.plan, table.num_rows) == copies).all()
        assert p.plan.shape[2] == 8 or strategy in VARIABLE_COUNT
    points = table.column("num_points").to_numpy()
    assert order.heaviest_step(p.plan, points) == 0
    if caps.active:
        assert rank_step_sums(p.plan, points).max() <= 4000
    keys_today = set(
        plan_samples(table, 0, PlanConfig(4, 8, epochs=2, strategy=strategy, rank_speed=SPEEDS)).stats
    )
    assert set(p.stats) == keys_today
    again = plan_samples(table.take(np.arange(table.num_rows)), 0, cfg)
    assert (again.plan == p.plan).all() and again.stats == p.stats


def test_a_group_smaller_than_a_step_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"step group \d+ holds \d+ samples.*lower --plan-groups"):
        plan_samples(scored_pool(200, 0), 0, PlanConfig(4, 8, plan_groups=16))


def test_one_groups_sums_give_the_single_pool_balance() -> None:
    table = scored_pool(2000, 3)
    cfg = PlanConfig(4, 8, strategy="mixed", rank_speed=SPEEDS)
    plan, _, costs, _, _ = plan_pool(table, 0, cfg)
    reference = plan_epoch("random", costs, 4, 8, seed=0, epoch=0)
    got = balance_entry([plan_sums(plan, costs, 8, reference, SPEEDS)], 0)
    want = balance_summary(plan, costs, 4, 8, baseline=reference, epoch=0, speeds=SPEEDS)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=2e-6), k


def test_the_group_balance_matches_the_single_pool() -> None:
    table = scored_pool(160000, 4)  # groups of ~40k: the gap closes as groups grow (10k: 0.005)
    one = plan_samples(table, 0, PlanConfig(8, 4, strategy="mixed")).stats
    four = plan_samples(table, 0, PlanConfig(8, 4, strategy="mixed", plan_groups=4)).stats
    assert abs(one["linearity"] - four["linearity"]) < 0.002
    assert abs(one["random_linearity"] - four["random_linearity"]) < 0.01


# ---------------------------------------------------------------------------------- through the build

PLAN = {"world_size": 2, "batch_size": 2, "epochs": 3, "strategy": "balanced", "max_reject_fraction": 0.1}


@pytest.fixture(scope="module")
def grouped(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("groups")
    data = make_bins(root / "in", n=60)
    out = root / "g3"
    lidarshard.build(
        str(data), str(out), pipeline_args=BEAM_TEST_FLAGS, plan_groups=3, heaviest_first="cost", **PLAN
    )
    new = root / "new"
    lidarshard.build(None, str(new), pipeline_args=BEAM_TEST_FLAGS, from_samples=str(out / "samples"),
                     replan_from=1, cost_model="linear:0,0,1,2", plan_groups=3, heaviest_first="cost", **PLAN)  # fmt: skip
    return {"g3": out, "new": new}


def test_a_grouped_build_records_g_and_validates(grouped) -> None:
    m = load_manifest(grouped["g3"])
    assert (m.groups, m.plan_groups.rule) == (3, "forced")
    assert validate(str(grouped["g3"]))[0] == []
    assert PlanConfig.from_manifest(m).plan_groups == 3


def test_validate_refuses_a_grouped_plan_recorded_as_one_group(grouped, tmp_path: Path) -> None:
    import shutil

    forged = tmp_path / "forged"
    shutil.copytree(grouped["g3"], forged)
    obj = json.loads((forged / "_manifest.json").read_text())
    obj.pop("plan_groups")
    (forged / "_manifest.json").write_text(json.dumps(obj))
    assert any("recomputes" in p or "re-derived" in p for p in validate(str(forged))[0])


def test_validate_finds_two_groups_steps_swapped(grouped, tmp_path: Path) -> None:
    """Two adjacent steps of different groups swapped in every rank file (sizes and hashes fixed): each
    group's own plan is intact, only the interleave of the groups' steps differs."""
    import shutil

    from lidarshard.transforms.io.arrow import parquet_bytes, sha256_hex

    forged = Path(shutil.copytree(grouped["g3"], tmp_path / "forged"))
    obj = json.loads((forged / "_manifest.json").read_text())
    e = 2
    labels = groups.step_labels(_summaries(forged, e), e, PlanConfig.from_manifest(load_manifest(forged)))
    s = next(i for i in range(1, labels.size - 1) if labels[i] != labels[i + 1])
    for r in range(PLAN["world_size"]):
        rel = schemas.plan_file(e, r)
        t = pq.read_table(forged / rel)
        step = t.column("step").to_numpy().copy()
        a, b = step == s, step == s + 1
        step[a], step[b] = s + 1, s
        t = t.set_column(t.schema.get_field_index("step"), "step", pa.array(step, pa.int32()))
        t = t.take(np.lexsort((t.column("slot").to_numpy(), step)))
        data = parquet_bytes(t.replace_schema_metadata(pq.read_schema(forged / rel).metadata))
        (forged / rel).write_bytes(data)
        obj["files"][rel] = {"bytes": len(data), "sha256": sha256_hex(data)}
    (forged / "_manifest.json").write_text(json.dumps(obj))
    problems = validate(str(forged))[0]
    assert any(
        p.startswith(f"epoch {e} step group ") and "interleave of the groups' steps" in p for p in problems
    ), problems


def _small_parts(monkeypatch) -> None:
    """validate's samples read back from its database 7 rows at a time; a whole-column read raises."""
    from lidarshard.tools import validate_db
    from lidarshard.tools.validate_samples import Samples

    def whole(*args, **kwargs):
        raise AssertionError("validate read a whole column of the samples")

    monkeypatch.setattr(Samples, "table", whole)
    monkeypatch.setattr(validate_db, "BATCH_ROWS", 7)


def test_grouped_validate_reads_a_chunk_or_a_group_at_a_time(grouped, monkeypatch) -> None:
    """With G > 1 no check reads the samples' numbers whole: a grouped build and its re-plan (epoch 0
    re-costed group by group) validate with tiny chunks."""
    _small_parts(monkeypatch)
    assert validate(str(grouped["g3"]))[0] == []
    assert validate(str(grouped["new"]))[0] == []


@pytest.mark.parametrize("name, small", [("cost", False), ("bucket_id", False), ("cost", True)])
def test_validate_names_a_grouped_files_first_forged_value(
    grouped, tmp_path, monkeypatch, name, small
) -> None:
    """A cost (or bucket_id) changed in two rows of one rank file whose samples lie in different step
    groups, the later group's row first in the file (size and hash fixed): one line, naming the file's
    first changed row, although its group is checked after the other's."""
    import shutil

    from lidarshard.transforms.io.arrow import parquet_bytes, sha256_hex

    if small:
        _small_parts(monkeypatch)
    forged = Path(shutil.copytree(grouped["g3"], tmp_path / "forged"))
    e, r = 1, 1
    rel = schemas.plan_file(e, r)
    t = pq.read_table(forged / rel)
    cfg = PlanConfig.from_manifest(load_manifest(forged))
    dealt = groups.deal(seeds.sample_keys(t.column("sample_id")), cfg.seed, e, 3)
    i, j = next((i, j) for i in range(t.num_rows) for j in range(i + 1, t.num_rows) if dealt[i] > dealt[j])
    values = t.column(name).to_numpy().copy()
    values[[i, j]] = values[[i, j]] * 2 + 1
    t = t.set_column(
        t.schema.get_field_index(name), t.schema.field(name), pa.array(values, t.schema.field(name).type)
    )
    data = parquet_bytes(t.replace_schema_metadata(pq.read_schema(forged / rel).metadata))
    (forged / rel).write_bytes(data)
    obj = json.loads((forged / "_manifest.json").read_text())
    obj["files"][rel] = {"bytes": len(data), "sha256": sha256_hex(data)}
    (forged / "_manifest.json").write_text(json.dumps(obj))
    step, slot, sid = (t.column(k)[i].as_py() for k in ("step", "slot", "sample_id"))
    want = f"{rel}: epoch {e} rank {r} step {step} slot {slot}: {name} of {sid} differs from the samples"
    assert validate(str(forged))[0] == [want]


def _summaries(out: Path, e: int) -> list:
    """The groups' summaries of epoch ``e`` of ``out`` re-derived (``plan_samples`` keeps only the epoch)."""
    m = load_manifest(out)
    cfg = PlanConfig.from_manifest(m)
    table = pq.read_table(out / "samples")
    dealt = groups.deal(seeds.sample_keys(table.column("sample_id")), cfg.seed, e, 3)
    out_ = []
    for g in range(3):
        rows = np.flatnonzero(dealt == g).astype(np.int64)
        out_.append(groups.plan_group(groups.group_table(table, rows, cfg), rows, e, g, cfg).summary)
    return out_


def test_a_replan_keeps_the_grouped_epochs_and_refuses_another_g(grouped, tmp_path: Path) -> None:
    old, new = grouped["g3"], grouped["new"]
    assert validate(str(new))[0] == []
    keep = sorted((old / "plan" / "epoch-0").rglob("*.parquet"))
    assert [p.read_bytes() for p in keep] == [(new / p.relative_to(old)).read_bytes() for p in keep]
    with pytest.raises(UsageError, match="--plan-groups"):
        lidarshard.build(None, str(tmp_path / "x"), pipeline_args=BEAM_TEST_FLAGS, from_samples=str(old / "samples"),
                         replan_from=1, cost_model="linear:0,0,1,2", heaviest_first="cost", **PLAN)  # fmt: skip


def test_an_elastic_restart_replans_a_grouped_epoch(grouped) -> None:
    base = load_epoch_plan(grouped["g3"], 1)
    p = replan_remaining(grouped["g3"], 1, 3, 1, None)
    both = Counter(p.consumed.tolist()) + Counter(p.rows[p.rows >= 0].tolist())
    assert both == Counter(base.rows[base.rows >= 0].tolist())


def _tree(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.slow  # every local runner, worker processes included
def test_the_group_path_is_the_same_on_every_runner_and_shard_size(grouped, tmp_path, monkeypatch) -> None:
    """Many shards and parts (16-row shards, 7-row parts): the groups' rows meet in several shard tasks; the
    DirectRunner with 2 threads writes the bytes of the FnApiRunner, and validate re-derives them."""
    from lidarshard.transforms.core import plan_writer

    monkeypatch.setattr(plan_writer, "ROWS_PER_SHARD", 16)
    data = grouped["g3"].parent / "in"
    flags = {"plan_groups": 3, "heaviest_first": "cost", "part_rows": 7, **PLAN}
    outs = []
    for name, beam in (("fn", BEAM_TEST_FLAGS), ("dr", ["--runner=DirectRunner", "--direct_num_workers=2",
                                                        "--direct_running_mode=multi_threading"])):  # fmt: skip
        outs.append(tmp_path / name)
        lidarshard.build(str(data), str(outs[-1]), pipeline_args=beam, **flags)
    assert _tree(outs[0]) == _tree(outs[1])
    assert validate(str(outs[0]))[0] == []
    m = load_manifest(outs[0])
    assert sum(1 for rel in m.files if rel.startswith("samples/")) > 3


def _arrays(value: object) -> int:
    """The numpy arrays inside a (nested) Beam element."""
    if isinstance(value, np.ndarray):
        return 1
    if isinstance(value, tuple | list):
        return sum(_arrays(v) for v in value)
    return sum(_arrays(v) for v in value.values()) if isinstance(value, dict) else 0


def test_the_group_path_shuffles_scratch_names_not_rows(grouped, tmp_path, monkeypatch) -> None:
    """What passes through ByGroup, ByShard and SpreadShards names files under the scratch directory (a
    local runner holds a shuffle in one process): DealShards, PlanGroups and MergeShards one after another
    on 16-row shards; the merged shards hold each epoch's planned rows once."""
    from lidarshard.transforms.beam import group_transform as gt
    from lidarshard.transforms.core import plan_writer
    from lidarshard.transforms.io.parts import parts_holding
    from lidarshard.transforms.io.scratch import read_columns

    monkeypatch.setattr(plan_writer, "ROWS_PER_SHARD", 16)
    m = load_manifest(grouped["g3"])
    cfg, work = PlanConfig.from_manifest(m), str(tmp_path)
    parts = sorted(str(p) for p in (grouped["g3"] / "samples").glob("*.parquet"))
    rows = [pq.read_metadata(p).num_rows for p in parts]
    tasks = [(a, b, parts_holding(parts, rows, a, b), 3) for a, b in plan_writer.shard_bounds(sum(rows), 16)]
    dealt = [e for task in tasks for e in gt._deal(task, cfg, work)]
    members: dict[tuple, list] = {}
    for _, (key, value) in (e for e in dealt if e[0] == "member"):
        members.setdefault(key, []).append(value)
    planned = [
        e for key, starts in sorted(members.items()) for e in gt._plan((key, starts), cfg, (0, 1), work)
    ]
    shards: dict[tuple, list] = {}
    for _, (key, value) in (e for e in [*dealt, *planned] if e[0] in ("hold", "entries")):
        shards.setdefault(key, []).append(value)
    merged = [t for key, values in sorted(shards.items()) for t in gt._merge((key, values), work)]
    assert len(members) == 3 * m.epochs and len(merged) == len(tasks) * m.epochs
    assert _arrays([dealt, [e for e in planned if e[0] != "pair"], merged]) == 0
    for e in range(m.epochs):
        got = np.concatenate([read_columns(t[3])["row"] for t in merged if t[0] == e])
        want = load_epoch_plan(grouped["g3"], e).rows
        assert Counter(got.tolist()) == Counter(want[want >= 0].tolist())


def test_a_sampler_replays_a_grouped_epoch_resumes_and_restarts_on_fewer_ranks(grouped) -> None:
    from lidarshard.loaders.elastic import ElasticBatchSampler

    out = str(grouped["g3"])
    base = load_epoch_plan(grouped["g3"], 0)
    for rank in range(2):
        batches = [list(b) for b in ElasticBatchSampler(out, rank, 2)]
        want = [[int(i) for i in step[step >= 0]] for step in base.rows[:, rank]]
        assert batches == want  # the default index is the samples' row order
        saved = ElasticBatchSampler(out, rank, 2)
        it = iter(saved)
        next(it)
        resumed = ElasticBatchSampler(out, rank, 2)
        resumed.load_state_dict(saved.state_dict())
        assert [list(b) for b in resumed] == batches[1:]
    alone = Counter(i for b in ElasticBatchSampler(out, 0, 1) for i in b)
    assert alone == Counter(base.rows[base.rows >= 0].tolist())  # one rank trains the whole epoch once


def test_the_report_reads_a_grouped_manifest(grouped) -> None:
    from lidarshard.tools.report import load

    data = load(str(grouped["g3"]))
    m = data.manifest
    for e, (chosen, baseline) in enumerate(zip(data.chosen, data.baseline, strict=True)):
        assert chosen.shape == (m.steps(e), m.world_size)
        # the random reference of every group's pool: the groups' linearity sums as recorded
        assert baseline.mean(axis=1).sum() / baseline.max(axis=1).sum() == pytest.approx(
            m.balance[e].value("random_linearity"), abs=2e-6
        )


@pytest.mark.parametrize("strategy", ["mixed", "budget"])
def test_the_pair_repeat_rate_from_shards_and_buckets_is_the_assembled_plans(strategy, monkeypatch) -> None:
    """The build's pair repeat rate without a gather (group_rows.pair_*, metrics.mate_counts), on 100-row shards, equals
    ``epoch_repeat_rates`` of the assembled epochs (weights up to 2.3: samples planned twice)."""
    from lidarshard.transforms.core import group_rows, plan_writer
    from lidarshard.transforms.core.planner import epoch_repeat_rates

    monkeypatch.setattr(plan_writer, "ROWS_PER_SHARD", 100)
    table = scored_pool(3000, 5)
    cfg = PlanConfig(4, 8, epochs=2, strategy=strategy, plan_groups=3)
    keys = seeds.sample_keys(table.column("sample_id"))
    by_shard: dict[int, dict] = {}
    for e in (0, 1):
        dealt = groups.deal(keys, cfg.seed, e, 3)
        for g in range(3):
            rows = np.flatnonzero(dealt == g).astype(np.int64)
            gp = groups.plan_group(groups.group_table(table, rows, cfg), rows, e, g, cfg)
            for kind, plan in (("plan", gp.plan), ("base", gp.baseline)):
                for start, r, s in group_rows.pair_entries(plan, g, 3):
                    by_shard.setdefault(start, {}).setdefault((kind, e), []).append((r, s))
    buckets: dict[tuple[str, int], list] = {}
    for found in by_shard.values():
        for kind in ("plan", "base"):
            for b, piece in group_rows.pair_buckets(
                found.get((kind, 0), []), found.get((kind, 1), [])
            ).items():
                buckets.setdefault((kind, b), []).append(piece)
    sums = {"plan": [0, 0], "base": [0, 0]}
    for (kind, _), pieces in buckets.items():
        both = np.concatenate(pieces)
        pairs, shared = mate_counts(both[:, 0], both[:, 1])
        sums[kind][0] += pairs
        sums[kind][1] += shared
    want = epoch_repeat_rates(plan_samples(table, 0, cfg), plan_samples(table, 1, cfg), strategy)
    assert round(sums["plan"][1] / sums["plan"][0], 6) == want[strategy]
    assert round(sums["base"][1] / sums["base"][0], 6) == want["random"]


def test_a_grouped_budget_build_with_speeds_and_weights_validates(grouped, tmp_path: Path) -> None:
    """Variable counts (groups of unequal slot widths), rank speeds and bucket weights through the engine."""
    out = tmp_path / "budget"
    flags = PLAN | {"strategy": "budget", "rank_speed": (1.0, 0.5), "bucket_weights": (1.0, 2.0, 0.5, 1.0)}
    lidarshard.build(None, str(out), pipeline_args=BEAM_TEST_FLAGS, from_samples=str(grouped["g3"] / "samples"),
                     plan_groups=2, **flags)  # fmt: skip
    assert validate(str(out))[0] == []
    m = load_manifest(out)
    assert (
        m.groups == 2 and m.pair_repeat_rate is not None and m.balance[0].value("speed_linearity") is not None
    )


@pytest.mark.parametrize("forced", [1, 3])
def test_validates_pair_repeat_rate_group_by_group_is_the_epochs(forced: int, tmp_path: Path) -> None:
    """``validate_derived.PairRepeat`` (each group's entries in validate's database, the step-mate pairs
    counted by a query) gives ``epoch_repeat_rates`` of the two assembled epochs, for one group and for three."""
    from lidarshard.tools.validate_db import Engine
    from lidarshard.tools.validate_derived import PairRepeat
    from lidarshard.transforms.core.planner import epoch_repeat_rates

    table = scored_pool(3000, 2)
    cfg = PlanConfig(4, 8, epochs=2, strategy="mixed", policy="pad", plan_groups=forced)
    pairs = PairRepeat(Engine(str(tmp_path)))
    keys = seeds.sample_keys(table.column("sample_id"))
    for e in (0, 1):
        if forced == 1:
            whole = plan_samples(table, e, cfg)
            pairs.add(e, 0, 1, (whole.plan, whole.baseline))
            continue
        dealt = groups.deal(keys, cfg.seed, e, forced)
        for g in range(forced):
            rows = np.flatnonzero(dealt == g).astype(np.int64)
            part = groups.plan_group(groups.group_table(table, rows, cfg), rows, e, g, cfg)
            pairs.add(e, g, forced, (part.plan, part.baseline))
    want = epoch_repeat_rates(plan_samples(table, 0, cfg), plan_samples(table, 1, cfg), "mixed")
    assert pairs.rates("mixed") == want and want["mixed"] > 0
