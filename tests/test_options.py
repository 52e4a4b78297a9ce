"""``pipelines.options`` and the checks of ``transforms.declare``: one declaration per flag serves the
command line and the Python API; a typed keyword value gets the check and the message its text gets."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lidarshard.pipelines import build as build_cmd
from lidarshard.pipelines import scan as scan_cmd
from lidarshard.pipelines.options import TABLE_KEYS, BuildOptions, ScanOptions
from lidarshard.transforms.core.config import PlanConfig
from lidarshard.transforms.declare import from_flags, from_keywords, options_of
from lidarshard.transforms.value_checks import UsageError, float_in, float_list, int_in

SIZE = {"out": "o", "world_size": 2, "batch_size": 3}


@pytest.mark.parametrize(
    ("check", "text", "value"),
    [
        (int_in(1, 8), "9", 9),
        (int_in(1), "0", 0),
        (int_in(1, 8), "2.5", 2.5),
        (float_in(0.0, 1.0), "1.5", 1.5),
        (float_in(0.0, above=True), "0", 0),
        (float_in(0.0), "inf", float("inf")),
        (float_list(6), "1,2,3", (1, 2, 3)),
        (float_list(lo=0.0), "1,-2", (1, -2)),
    ],
)
def test_a_typed_value_is_refused_with_the_message_of_its_text(check, text: str, value) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as by_text:
        check(text)
    with pytest.raises(argparse.ArgumentTypeError) as by_value:
        check.value(value)
    assert str(by_value.value) == str(by_text.value)


def test_typed_values_pass_unchanged_and_text_is_still_read() -> None:
    assert int_in(1, 8).value(8) == 8 and float_in(0.0, 1.0).value(1) == 1.0
    assert float_list(6).value((0, 0, 0, 1, 1, 1.5)) == (0.0, 0.0, 0.0, 1.0, 1.0, 1.5)
    assert float_list(lo=0.0).value("1,2") == (1.0, 2.0)
    with pytest.raises(argparse.ArgumentTypeError, match="not a number"):
        float_list(lo=0.0).value((1, True))


def test_the_parsers_declare_one_flag_per_field_in_field_order() -> None:
    """Every option field is a flag (``policy`` through its two switches; nested configs' fields in place), in
    the order of the fields."""
    for command, cls in ((build_cmd, BuildOptions), (scan_cmd, ScanOptions)):
        declared = [a.dest for a in command.parser()._actions if a.dest not in
                    ("help", "debug", "verbose", "progress", "_beam")]  # fmt: skip
        assert list(dict.fromkeys(declared)) == [leaf.key for leaf in options_of(cls)]
    parsed, _ = build_cmd.parser().parse(["o", "--world-size", "2", "--batch-size", "3"])
    assert from_flags(BuildOptions, parsed) == BuildOptions(
        out="o", plan=PlanConfig(2, 3)
    )  # the fields' defaults


def test_keyword_values_are_typed_not_text(tmp_path: Path) -> None:
    opts = from_keywords(
        BuildOptions,
        SIZE | {"rank_speed": [1, 0.5], "repeat_factors": 0.25, "from_samples": tmp_path, "drop_last": True},
    )
    assert opts.plan.rank_speed == (1.0, 0.5) and opts.plan.repeat.threshold == 0.25
    assert opts.from_samples == str(tmp_path) and opts.plan.policy == "drop_last"
    assert from_keywords(BuildOptions, SIZE | {"repeat_factors": "lidarseg:t=0.25"}) == from_keywords(
        BuildOptions, SIZE | {"repeat_factors": 0.25}
    )
    assert from_keywords(BuildOptions, SIZE | {"rank_speed": (1, 2)}).plan.rank_speed == (1.0, 2.0)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"pad": 1}, "--pad is a switch: pass True, got 1"),
        ({"pad": True, "drop_last": True}, "argument --pad: not allowed with argument --drop-last"),
        ({"repeat_factors": 0.5, "sample_weights": "w"},
         "argument --sample-weights: not allowed with argument --repeat-factors"),
        ({"rank_speed": (1, 0)}, "argument --rank-speed: rank speeds must be finite numbers > 0"),
        ({"repeat_factors": 2}, r"argument --repeat-factors: expected lidarseg:t=T with 0 < T <= 1, got 2"),
        ({"cost_model": 3}, "argument --cost-model: 3 is not a valid value"),
        ({"policy": "pad"}, "unknown argument policy"),
        ({"batch_size": None}, "the following arguments are required: --batch-size"),
        ({"bucket_wieghts": (1, 2)}, "unknown argument bucket_wieghts; did you mean bucket_weights?"),
    ],
)  # fmt: skip
def test_a_bad_keyword_is_one_line_naming_the_flag(given: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        from_keywords(BuildOptions, SIZE | given)


def test_write_manifest_takes_the_plan_and_output_flags_but_paths() -> None:
    keys = TABLE_KEYS
    assert {"epochs", "pad", "drop_last", "part_rows", "max_reject_fraction", "rank_speed"} <= keys
    assert not keys & {"from_samples", "replan_from", "relative_to", "world_size", "policy", "sweeps"}


def test_world_size_has_one_typed_home_until_the_manifest(tmp_path: Path) -> None:
    """The plan the keywords build is the one object the pre-flight's settings and the build core's job hold
    (composed, never copied into a second config)."""
    from lidarshard.pipelines.preflight import build_settings
    from tests.helpers import make_bins

    opts = from_keywords(
        BuildOptions, SIZE | {"input": make_bins(tmp_path / "in", n=4), "out": tmp_path / "o"}
    )
    settings = build_settings(opts)
    assert settings.options.plan is opts.plan and settings.job(str(tmp_path / "staging")).cfg is opts.plan
    assert not hasattr(settings, "world_size") and not hasattr(opts, "world_size")
