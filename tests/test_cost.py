"""Cost models: parsing and evaluation over a samples table."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from lidarshard.transforms.features.cost import CostModel, parse_cost_model, sample_costs


def _samples(in_range: list, points: list, voxels: list) -> pa.Table:
    return pa.table(
        {
            "num_in_range": pa.array(in_range, pa.int64()),
            "num_points": pa.array(points, pa.int64()),
            "occupied_voxels": pa.array(voxels, pa.int64()),
        }
    )


def test_named_and_linear_models() -> None:
    t = _samples([10, 20], [11, 21], [5, 9])
    np.testing.assert_array_equal(sample_costs(t, parse_cost_model("points")), [10, 20])
    np.testing.assert_array_equal(sample_costs(t, parse_cost_model("voxels")), [5, 9])
    np.testing.assert_allclose(sample_costs(t, parse_cost_model("linear:1.5,0.1,2")), [12.5, 21.5])


def test_stat_features_fall_back_to_num_points_and_refuse_voxels() -> None:
    t = _samples([None, None], [11, 21], [None, None])
    np.testing.assert_array_equal(sample_costs(t, parse_cost_model("points")), [11, 21])
    with pytest.raises(ValueError, match="occupied_voxels"):
        sample_costs(t, parse_cost_model("voxels"))


def test_model_from_calibration_file(tmp_path) -> None:
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"cost_model": {"name": "linear", "c0": 2.0, "a": 0.5, "b": 0.25}, "r2": 0.9}))
    assert parse_cost_model(f"@{path}") == CostModel("linear", 2.0, 0.5, 0.25)


@pytest.mark.parametrize("spec", ["linear:1,2", "linear:0,0,0", "linear:0,-1,1", "linear:nan,1,1", "bogus"])
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_cost_model(spec)


def test_a_voxel_exponent_bends_the_model_and_round_trips() -> None:
    t = _samples([10, 20], [11, 21], [4, 9])
    model = parse_cost_model("linear:1,0,2,1.5")
    np.testing.assert_allclose(sample_costs(t, model), [1 + 2 * 4**1.5, 1 + 2 * 9**1.5])
    assert model.to_json()["q"] == 1.5 and "q" not in parse_cost_model("linear:1,0,2").to_json()
    assert parse_cost_model("linear:1,0,2,1") == parse_cost_model("linear:1,0,2")  # q 1: the linear model
    with pytest.raises(ValueError, match=r"exponent q must be in \[0.25, 4\]"):
        parse_cost_model("linear:0,0,1,9")


def test_a_calibration_file_with_an_exponent(tmp_path) -> None:
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"cost_model": {"name": "linear", "c0": 0.0, "a": 0.0, "b": 2e-4, "q": 1.3}}))
    assert parse_cost_model(f"@{path}") == CostModel("linear", 0.0, 0.0, 2e-4, 1.3)
    path.write_text(
        json.dumps({"cost_model": {"name": "linear", "c0": 0.0, "a": 0.0, "b": 2e-4, "q": "1.3"}})
    )
    with pytest.raises(ValueError, match="q must be numbers"):
        parse_cost_model(f"@{path}")


@pytest.mark.parametrize(
    "spec", ["linear:0,1e160,0", "linear:-1e12,1,0", "linear:0,1e308,0", "linear:-0.5,1,0", "linear:0,0,2e12"]
)
def test_a_cost_model_out_of_range_is_refused_where_it_enters(spec: str) -> None:
    """Costs stay > 0 and finite (sums of squares too): refused when parsed, not at publish."""
    with pytest.raises(ValueError, match=r"0 <= c0, a, b <= 1e\+12"):
        parse_cost_model(spec)
    assert parse_cost_model("linear:0,1e12,0").a == 1e12  # the bound itself is fine


def test_a_cost_model_file_that_is_a_directory_is_a_value_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="is a directory"):
        parse_cost_model(f"@{tmp_path}")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"units": "s"}, "units must be 'ms'"),
        ({"units": ["ms"]}, "units must be 'ms'"),
        ({"step_ms": 4.0}, "step_ms must be a number of ms in 0..1e\\+09 beside units 'ms'"),
        ({"units": "ms", "step_ms": -1.0}, "step_ms must be a number"),
        ({"units": "ms", "step_ms": True}, "step_ms must be a number"),
        ({"units": "ms", "step_ms": 1e300}, "step_ms must be a number"),
        ({"units": "ms", "step_ms": "4"}, "step_ms must be a number"),
    ],
)
def test_a_calibration_file_with_bad_time_units_is_refused(tmp_path, extra: dict, message: str) -> None:
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"cost_model": {"c0": 0.0, "a": 1e-3, "b": 0.0} | extra}))
    with pytest.raises(ValueError, match=message) as info:
        parse_cost_model(f"@{path}")
    assert "\n" not in str(info.value)


def test_a_calibration_file_keeps_its_time_units(tmp_path) -> None:
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"cost_model": {"c0": 0.5, "a": 1e-3, "b": 0.0, "units": "ms", "step_ms": 4}}))
    assert parse_cost_model(f"@{path}") == CostModel("linear", 0.5, 1e-3, 0.0, units="ms", step_ms=4.0)
