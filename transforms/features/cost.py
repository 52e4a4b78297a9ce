"""Cost models: predicted compute cost of a sample from its size features. Pure numpy/pyarrow.

``cost = c0 + a * points + b * voxels ** q`` (q = 1 unless given) per sample, where ``points`` is ``num_in_range`` (the points a model
sees after the range filter; ``num_points`` under ``--features stat``) and ``voxels`` is
``occupied_voxels``. ``points`` and ``voxels`` are the special cases (0, 1, 0) and (0, 0, 1);
``lidarshard calibrate`` fits (c0, a, b) to measured timings, and q when a cost grows faster than the voxels
(attention-like backbones), and writes ``@file.json``. A model calibrated on rank-steps of varying counts also
holds ``launch_ms``: what each rank pays once per rank-step whatever its samples (kernel launches), which is not
a sample's cost: the planners plan the per-sample costs and the balance numbers add it to every rank-step
(``PlanConfig.step_cost``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from lidarshard.schemas.records import CostModel
from lidarshard.transforms.io import storage

__all__ = [
    "CostModel",
    "parse_cost_model",
    "checked_model",
    "sample_costs",
    "points_column",
    "COST_MODEL_HELP",
    "Q_RANGE",
    "TIME_UNITS",
]

COST_MODEL_HELP = (
    "points | voxels | linear:c0,a,b[,q] (cost = c0 + a*points + b*voxels^q, q 1 unless given) | @fit.json "
    "(as written by lidarshard calibrate)"
)
_FILE_SCHEMA = (
    '{"cost_model": {"c0": number, "a": number, "b": number[, "q": number]}} (as lidarshard calibrate writes)'
)
#: The voxel exponents a cost model may hold (calibrate's grid lies inside).
Q_RANGE = (0.25, 4.0)


#: The largest cost-model coefficient: c0 + a * points + b * voxels ** q of any sample (2**32 points,
#: q <= 4) and the plan's sums of squares over a billion samples stay finite in float64.
MAX_COEFFICIENT = 1e12

_NAMED = {"points": CostModel("points", a=1.0), "voxels": CostModel("voxels", b=1.0)}


def _linear(c0: float, a: float, b: float, name: str = "linear", q: float = 1.0) -> CostModel:
    if not all(math.isfinite(v) for v in (c0, a, b, q)):
        raise ValueError(f"cost model coefficients must be finite, got {(c0, a, b, q)}")
    if a < 0 or b < 0 or (a == 0 and b == 0):
        raise ValueError(f"cost model needs a >= 0, b >= 0 and one of them > 0, got a={a}, b={b}")
    if c0 < 0 or max(c0, a, b) > MAX_COEFFICIENT:  # costs stay > 0 and finite, sums of squares too
        raise ValueError(
            f"cost model needs 0 <= c0, a, b <= {MAX_COEFFICIENT:g} (c0: a per-sample overhead), got {(c0, a, b)}"
        )
    if not Q_RANGE[0] <= q <= Q_RANGE[1]:
        raise ValueError(f"cost model voxel exponent q must be in [{Q_RANGE[0]:g}, {Q_RANGE[1]:g}], got {q}")
    return CostModel(name, float(c0), float(a), float(b), float(q))


def parse_cost_model(spec: str) -> CostModel:
    """``points`` | ``voxels`` | ``linear:c0,a,b`` | ``@path.json`` (as written by calibrate; a local
    path or URI)."""
    if spec in _NAMED:
        return _NAMED[spec]
    if spec.startswith("linear:"):
        parts = spec[len("linear:") :].split(",")
        if len(parts) not in (3, 4):
            raise ValueError(f"--cost-model linear:c0,a,b[,q] needs 3 or 4 numbers, got {spec!r}")
        c0, a, b, *q = (float(p) for p in parts)
        return _linear(c0, a, b, q=q[0] if q else 1.0)
    if spec.startswith("@"):
        path = spec[1:]
        try:
            obj = storage.read_json(path, what="the file")
        except FileNotFoundError:
            raise ValueError("no such file") from None
        except OSError as e:  # a directory, a FIFO, unreadable
            raise ValueError(str(e.strerror or e)) from None
        except ValueError as e:
            raise ValueError(f"{e}; expected {_FILE_SCHEMA}") from None
        model = obj.get("cost_model", obj) if isinstance(obj, dict) else obj
        if not isinstance(model, dict):
            raise ValueError(f"expected {_FILE_SCHEMA}, got {type(model).__name__} {json.dumps(model)[:40]}")
        missing = [k for k in ("c0", "a", "b") if k not in model]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}; expected {_FILE_SCHEMA}")
        bad = [
            k
            for k in ("c0", "a", "b", "q")
            if k in model and (isinstance(model[k], bool) or not isinstance(model[k], (int, float)))
        ]
        if bad:
            raise ValueError(
                f"{', '.join(bad)} must be numbers, got {', '.join(repr(model[k]) for k in bad)}"
            )
        power = float(model.get("q", 1.0))
        fitted = _linear(float(model["c0"]), float(model["a"]), float(model["b"]), name="linear", q=power)
        return _timed(fitted, model.get("units"), model.get("step_ms"), model.get("launch_ms"))
    raise ValueError(f"unknown --cost-model {spec!r}: use points, voxels, linear:c0,a,b or @file.json")


def checked_model(model: CostModel, *, given_ok: bool = False) -> CostModel:
    """``model`` (a manifest's typed ``cost_model``) when it can be applied: finite coefficients, a >= 0,
    b >= 0, one of them > 0, q in ``Q_RANGE``. ``given_ok``: a "given" model (costs that came with the
    samples) is returned as it is, not refused.

    Raises:
        ValueError: one line; "given" costs, which no model recomputes, unless ``given_ok``.
    """
    if model.name == "given":
        if given_ok:
            return model
        raise ValueError("the costs were given with the samples: no cost model recomputes them")
    linear = _linear(model.c0, model.a, model.b, name=model.name, q=model.q)
    return _timed(linear, model.units, model.step_ms, model.launch_ms)


#: The one unit a cost model's ``units`` may name: calibrate fits measured milliseconds.
TIME_UNITS = "ms"
#: The longest per-step overhead a cost model may hold (ms; 1e9 ms is 11.6 days).
MAX_STEP_MS = 1e9


def _timed(model: CostModel, units: object, step_ms: object, launch_ms: object = None) -> CostModel:
    """``model`` with ``units`` (None or "ms"), ``step_ms`` and ``launch_ms`` (each None or a number in
    0..``MAX_STEP_MS``, ms only), checked: one ValueError line."""
    if units is not None and units != TIME_UNITS:
        raise ValueError(
            f"cost model units must be {TIME_UNITS!r} (as calibrate writes) or absent, got {units!r}"
        )
    if units is not None and model.name in _NAMED:  # a proxy's costs are points or voxels, not time
        raise ValueError(
            f"cost model units {units!r} belong to a model calibrate fitted (linear), not to the "
            f"{model.name!r} proxy, whose costs count {model.name}"
        )
    return dataclasses.replace(
        model,
        units=units,
        step_ms=_ms("step_ms", step_ms, units),
        launch_ms=_ms("launch_ms", launch_ms, units),
    )


def _ms(name: str, value: object, units: object) -> float | None:
    """``value`` of the cost model's ``name``: None, or a number of ms in 0..``MAX_STEP_MS`` beside units "ms"."""
    if value is None:
        return None
    if (
        units is None
        or isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= MAX_STEP_MS
    ):
        raise ValueError(
            f"cost model {name} must be a number of ms in 0..{MAX_STEP_MS:g} beside units 'ms', got {value!r}"
        )
    return float(value)


def _column(samples: pa.Table, name: str, lacking: Mapping[str, int] | None = None) -> NDArray[np.float64]:
    col = samples.column(name)
    missing = col.null_count if lacking is None else lacking.get(name, 0)
    if missing:
        raise ValueError(f"cost model needs {name!r} but {missing} samples lack it (--features stat?)")
    return col.to_numpy().astype(np.float64)


def points_column(samples: pa.Table, lacking: Mapping[str, int] | None = None) -> str:
    """The column a cost (or memory) model reads as a sample's ``points``: ``num_in_range`` when every
    sample has it, else ``num_points`` (``--features stat`` records no range). ``lacking``: {column: nulls
    in the whole input} when ``samples`` is one slice of it, so every slice picks the whole input's."""
    if "num_in_range" not in samples.column_names:
        return "num_points"
    nulls = samples.column("num_in_range").null_count if lacking is None else lacking.get("num_in_range", 0)
    return "num_in_range" if nulls == 0 else "num_points"


def sample_costs(
    samples: pa.Table, model: CostModel, lacking: Mapping[str, int] | None = None
) -> NDArray[np.float64]:
    """(N,) float64 costs for the rows of a samples table.

    ``lacking``: {column: nulls in the whole input} when ``samples`` is one slice of it (a row group),
    so that the column chosen and the error raised are the whole input's; None: ``samples``' own.
    """
    cost = np.full(samples.num_rows, model.c0, dtype=np.float64)
    if model.a:
        cost += model.a * _column(samples, points_column(samples, lacking), lacking)
    if model.b:
        voxels = _column(samples, "occupied_voxels", lacking)
        cost += model.b * (voxels if model.q == 1.0 else voxels**model.q)
    return cost
