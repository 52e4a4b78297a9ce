"""The fast point path (issue 29 item 1): ``multisweep.aggregate``, ``remove_close`` and
``loaders.points.load_points`` give, bit for bit, what the implementation before it gave
(``tests/multisweep_oracle.py``): same dtype, shape, row order and bits (NaN payloads and signed zeros
included) and the same errors, for random clouds, transforms, sweep counts, array layouts and file
formats, for sweeps of full nuScenes size and odd lengths (every BLAS edge path), and for the real
nuScenes files. The scan computes its size features with the same ``aggregate``, so its results and
manifests do not move either."""

from __future__ import annotations

import io
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lidarshard import schemas
from lidarshard.loaders.points import FileChangedError, Recorded, load_points
from lidarshard.transforms.errors import RejectError
from lidarshard.transforms.formats.readers import read_points
from lidarshard.transforms.layouts import multisweep
from lidarshard.transforms.layouts.multisweep import aggregate, remove_close
from tests import multisweep_oracle as oracle
from tests.helpers import yaw_tf

N015 = "nuscenes/samples/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470948018.pcd.bin"
N015_FULL = "nuscenes/samples/LIDAR_TOP/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"
N015_SWEEP = "nuscenes/sweeps/LIDAR_TOP/n015-2018-08-02-17-16-37+0800__LIDAR_TOP__1533201470898274.pcd.bin"
N008_SWEEP = "nuscenes/sweeps/LIDAR_TOP/n008-2018-09-18-12-07-26-0400__LIDAR_TOP__1537287083900561.pcd.bin"
_F32_MAX = float(np.finfo(np.float32).max)
#: float32 values a cloud draws from besides [-3, 3]: the box edges, signed zeros, NaN, inf, huge.
# exactly float32 values (hypothesis refuses an element the array's dtype would round, under numpy 1.x too)
_SPECIAL = [float(np.float32(v)) for v in
            (0.0, -0.0, 1.0, -1.0, 0.99999994, -0.99999994, 1.0000001, np.nan, np.inf, -np.inf, 3e38, -1e30)]  # fmt: skip


def _outcome(fn: Callable[..., np.ndarray], *args: Any, **kwargs: Any) -> tuple:
    """What ``fn`` did, comparable: ("ok", dtype, shape, bits) or ("raised", type, message, reason)."""
    try:
        out = fn(*args, **kwargs)
    except (ValueError, RejectError) as e:
        return ("raised", type(e), str(e), getattr(e, "reason", None))
    assert out.dtype == np.float32 and out.flags.c_contiguous
    # every NaN as one pattern: its sign bit is whatever the CPU's vector or scalar path left (inf * 0 gave
    # 0xffc00000 on one call and 0x7fc00000 on the next with numpy 1.24), not something either code chose
    bits = np.where(np.isnan(out), np.float32(np.nan), out).view(np.uint32).tobytes()
    return ("ok", out.dtype, out.shape, bits)


def _same(new: Callable[..., np.ndarray], old: Callable[..., np.ndarray], *args: Any, **kwargs: Any) -> tuple:
    """``new(*args, **kwargs)`` and ``old(...)`` did the same (bits or error); returns the outcome."""
    got, want = _outcome(new, *args, **kwargs), _outcome(old, *args, **kwargs)
    assert got[:3] == want[:3]  # readable on failure: outcome, dtype/type, shape/message
    assert got == want  # the bits (or the reason) too
    return got


# ---------------------------------------------------------------------------------------- strategies

_values = st.one_of(
    st.floats(-3, 3, width=32), st.floats(-3, 3, width=32), st.sampled_from(_SPECIAL), st.floats(width=32)
)


@st.composite
def _cloud(draw: st.DrawFn, cols: int, rows: st.SearchStrategy[int] | None = None) -> np.ndarray:
    """(N, cols) float32 in one of the layouts a caller may pass: contiguous, read-only file bytes,
    strided (columns or rows of a larger array), Fortran order, float64."""
    n = draw(rows if rows is not None else st.one_of(st.integers(0, 12), st.integers(0, 120)))
    pts = draw(arrays(np.float32, (n, cols), elements=_values))
    layout = draw(st.sampled_from(["c", "c", "readonly", "columns", "rows", "fortran", "float64"]))
    if layout == "readonly":
        return np.frombuffer(pts.tobytes(), np.float32).reshape(n, cols)
    if layout == "columns":
        wide = np.zeros((n, cols + 2), np.float32)
        wide[:, :cols] = pts
        return wide[:, :cols]
    if layout == "rows":
        tall = np.zeros((2 * n, cols), np.float32)
        tall[::2] = pts
        return tall[::2]
    if layout == "fortran":
        return np.asfortranarray(pts)
    return pts.astype(np.float64) if layout == "float64" else pts


@st.composite
def _transform(draw: st.DrawFn) -> np.ndarray:
    """(4, 4): a rotation (unit quaternion) + translation, or any matrix (huge, NaN, inf); float64
    (contiguous, or a view into a wider array) or float32."""
    tf = np.eye(4)
    if draw(st.sampled_from(["pose", "pose", "pose", "any"])) == "pose":
        q = np.array(draw(st.lists(st.floats(-1, 1), min_size=4, max_size=4)))
        w, x, y, z = q / np.linalg.norm(q) if np.linalg.norm(q) > 1e-3 else (1.0, 0.0, 0.0, 0.0)
        tf[:3, :3] = [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
        tf[:3, 3] = draw(st.lists(st.floats(-200, 200), min_size=3, max_size=3))
    else:
        special = st.sampled_from([0.0, -0.0, 1e300, -1e300, 1e36, np.nan, np.inf])
        entries = st.lists(st.one_of(st.floats(-1e3, 1e3), special), min_size=12, max_size=12)
        tf[:3, :] = np.array(draw(entries)).reshape(3, 4)
    layout = draw(st.sampled_from(["c", "c", "view", "float32"]))
    if layout == "view":
        wide = np.zeros((4, 7))
        wide[:, 2:6] = tf
        return wide[:, 2:6]
    if layout == "float32":
        with np.errstate(over="ignore"):  # 1e300 -> inf: a float32 pose can hold no more
            return tf.astype(np.float32)
    return tf


@st.composite
def _sample(draw: st.DrawFn) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    cols = draw(st.integers(3, 6))
    count = draw(st.integers(0, 5))
    sweeps = [draw(_cloud(cols)) for _ in range(count)]
    if count and draw(st.integers(0, 9)) == 0:  # bad input: a sweep with other columns
        sweeps[-1] = draw(_cloud(draw(st.sampled_from([c for c in range(3, 7) if c != cols]))))
    return draw(_cloud(cols)), sweeps, [draw(_transform()) for _ in range(count)]


# ------------------------------------------------------------------------------------ pure functions


@settings(max_examples=400, deadline=None)
@given(_sample(), st.booleans())
def test_aggregate_is_the_old_aggregate_bit_for_bit(sample: tuple, filter_keyframe: bool) -> None:
    key, sweeps, tfs = sample
    rule = "devkit" if filter_keyframe else "sweeps"
    got = _outcome(aggregate, key, sweeps, tfs, close_points=rule)
    assert got == _outcome(oracle.aggregate, key, sweeps, tfs, filter_keyframe=filter_keyframe)


@settings(max_examples=150, deadline=None)
@given(st.integers(3, 6).flatmap(_cloud), st.sampled_from([1.0, 0.0, 2.5, 0.3, 1e-45]))
def test_remove_close_is_the_old_remove_close(points: np.ndarray, radius: float) -> None:
    got, want = remove_close(points, radius), oracle.remove_close(points, radius)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def _nuscenes_like(rng: np.random.Generator, n: int, cols: int = 5) -> np.ndarray:
    """(n, cols) float32 like a LIDAR_TOP sweep: x, y out to 70 m, ~20% inside the 1 m box."""
    pts = np.empty((n, cols), np.float32)
    near = rng.random(n) < 0.2
    pts[:, :2] = np.where(near[:, None], rng.uniform(-1, 1, (n, 2)), rng.uniform(-70, 70, (n, 2)))
    pts[:, 2] = rng.uniform(-3, 8, n)
    pts[:, 3:] = rng.integers(0, 255, (n, cols - 3))
    return pts


def _pose(rng: np.random.Generator) -> np.ndarray:
    """A sweep pose: yaw, a little roll, a translation of metres."""
    tf = yaw_tf(float(rng.uniform(-np.pi, np.pi)), tuple(rng.uniform(-20, 20, 3)))
    c, s = np.cos(a := rng.uniform(-0.02, 0.02)), np.sin(a)
    tf[:3, :3] = tf[:3, :3] @ np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
    return tf


@pytest.mark.parametrize(
    "sizes", [[34_688] * 9, [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33], [4097, 100_003, 0, 1000]]
)
def test_full_size_and_odd_length_sweeps(sizes: list[int]) -> None:
    """Sizes that take every BLAS path (edge tiles, one row, threads over a large M) give the same bits."""
    rng = np.random.default_rng(len(sizes))
    key = _nuscenes_like(rng, 34_688)
    sweeps = [_nuscenes_like(rng, n) for n in sizes]
    tfs = [_pose(rng) for _ in sizes]
    _same(aggregate, oracle.aggregate, key, sweeps, tfs)
    got = _outcome(aggregate, key, sweeps, tfs, close_points="devkit")
    assert got == _outcome(oracle.aggregate, key, sweeps, tfs, filter_keyframe=True)


def test_absurd_coordinates_are_refused_as_before() -> None:
    key = np.zeros((2, 4), np.float32)
    good = np.array([[5.0, 5.0, 0.0, 1.0]], np.float32)
    huge = np.array([[5.0, 5.0, 0.0, 1.0], [3e38, 2.0, 1.0, 2.0], [np.inf, 2.0, 1.0, 3.0]], np.float32)
    scale = np.diag([10.0, 10.0, 10.0, 1.0])
    got = _same(aggregate, oracle.aggregate, key, [good, huge], [np.eye(4), scale])
    assert got[0] == "raised" and got[3] == "absurd_coordinates" and "sweep 1" in got[2]
    # Only an inf input row beyond float32: kept, as before (its row is not finite on input).
    got = _same(aggregate, oracle.aggregate, key, [huge[2:]], [scale])
    assert got[0] == "ok"
    # Just past float32's largest value in float64, which would round back to it: refused all the same.
    edge = np.array([[np.finfo(np.float32).max, 2.0, 0.0, 0.0]], np.float32)
    got = _same(aggregate, oracle.aggregate, key, [edge], [yaw_tf(0.0, (1e31, 0.0, 0.0))])
    assert got[0] == "raised" and got[3] == "absurd_coordinates"


def test_inputs_are_only_read_and_outputs_are_fresh() -> None:
    rng = np.random.default_rng(3)
    key, sweep = _nuscenes_like(rng, 50), _nuscenes_like(rng, 60)
    ro_key = np.frombuffer(key.tobytes(), np.float32).reshape(key.shape)
    ro_sweep = np.frombuffer(sweep.tobytes(), np.float32).reshape(sweep.shape)
    out = aggregate(ro_key, [ro_sweep], [_pose(rng)])
    assert out.flags.writeable and out.flags.owndata
    np.testing.assert_array_equal(ro_sweep, sweep)
    assert remove_close(ro_sweep).flags.writeable


def test_threads_share_nothing() -> None:
    """Each thread has its own scratch: concurrent calls of other sizes give the same bits as alone."""
    rng = np.random.default_rng(5)
    jobs = [
        (_nuscenes_like(rng, 500 * (k + 1)), [_nuscenes_like(rng, 3000 * (k + 1)) for _ in range(4)])
        for k in range(4)
    ]
    tfs = [_pose(rng) for _ in range(4)]
    want = [oracle.aggregate(key, sweeps, tfs) for key, sweeps in jobs]
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            for _ in range(20):
                assert aggregate(*jobs[k], tfs).tobytes() == want[k].tobytes()
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_scratch_beyond_the_kept_size_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multisweep, "_SCRATCH_KEEP_BYTES", 48 * 100)
    monkeypatch.setattr(multisweep, "_SCRATCH", threading.local())
    rng = np.random.default_rng(9)
    key = _nuscenes_like(rng, 10)
    for n in (50, 500, 80):  # 50 and 80 fit the kept 100-row buffer; 500 gets its own
        sweeps, tfs = [_nuscenes_like(rng, n)], [_pose(rng)]
        _same(aggregate, oracle.aggregate, key, sweeps, tfs)
        assert multisweep._SCRATCH.buf.nbytes <= 48 * 100


# ------------------------------------------------------------------------------------- file formats


def _file_bytes(points: np.ndarray, fmt: str) -> bytes:
    """``points`` (N, C) float32 as a file of ``fmt`` that ``read_points`` reads back to them."""
    n, cols = points.shape
    if fmt in ("nuscenes_bin", "kitti_bin", "bin"):
        return points.astype("<f4").tobytes()
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, points, allow_pickle=False)
        return buf.getvalue()
    names = ["x", "y", "z"] + [f"c{i}" for i in range(cols - 3)]
    if fmt == "pcd":

        def each(value: str) -> str:
            return " ".join([value] * cols)

        head = (
            f"VERSION .7\nFIELDS {' '.join(names)}\nSIZE {each('4')}\nTYPE {each('F')}\nCOUNT {each('1')}\n"
            f"WIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA binary\n"
        )
        return head.encode() + points.astype("<f4").tobytes()
    head = f"ply\nformat binary_little_endian 1.0\nelement vertex {n}\n"
    head += "".join(f"property float {name}\n" for name in names) + "end_header\n"
    return head.encode() + points.astype("<f4").tobytes()


_COLS = {"nuscenes_bin": 5, "kitti_bin": 4}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["nuscenes_bin", "kitti_bin", "bin", "npy", "pcd", "ply"]), st.data())
def test_load_points_is_the_old_load_points(fmt: str, data: st.DataObject) -> None:
    cols = _COLS.get(fmt) or data.draw(st.integers(3, 6))
    rows = st.integers(1, 80)
    clouds = [data.draw(_cloud(cols, rows)) for _ in range(data.draw(st.integers(1, 5)))]
    tfs = np.concatenate([data.draw(_transform()).ravel() for _ in clouds[1:]] or [np.empty(0)])
    hashed = data.draw(st.booleans())
    with tempfile.TemporaryDirectory() as tmp:
        paths, recorded = [], []
        for i, cloud in enumerate(clouds):
            path = Path(tmp) / f"{i}.{fmt}"
            path.write_bytes(blob := _file_bytes(np.ascontiguousarray(cloud, np.float32), fmt))
            paths.append(str(path))
            recorded.append(Recorded(len(blob), schemas.content_hash(blob) if hashed else None))
        dims = cols if fmt == "bin" else None
        args = (paths[0], fmt, paths[1:], tfs, dims, recorded)
        got = _outcome(load_points, *args, drop_nan=False)
        assert got == _outcome(oracle.load_points, *args)
        if got[0] == "ok":
            for out in (load_points(*args, drop_nan=False), load_points(*args)):
                assert out.flags.writeable and out.flags.owndata  # never a view of the files' bytes
            # by default the rows with a NaN or infinite x, y or z are dropped (remove_non_finite_points)
            np.testing.assert_array_equal(
                load_points(*args), multisweep.drop_non_finite_rows(oracle.load_points(*args))
            )


@pytest.mark.parametrize("fmt", ["nuscenes_bin", "npy", "pcd", "ply"])
def test_read_points_copies_unless_asked_not_to(fmt: str) -> None:
    """copy=True (default) always gives a new writable array (an npy of float32 once gave a read-only
    view); copy=False a read-only view of the bytes where the layout allows one."""
    pts = np.arange(20, dtype=np.float32).reshape(4, 5)
    data = _file_bytes(pts, fmt)
    copied, view = read_points(data, fmt), read_points(data, fmt, copy=False)
    np.testing.assert_array_equal(copied, pts)
    np.testing.assert_array_equal(view, pts)
    raw = np.frombuffer(data, np.uint8)
    assert copied.flags.writeable and not np.shares_memory(copied, raw)
    assert np.shares_memory(view, raw) == (not view.flags.writeable) == (fmt in ("nuscenes_bin", "npy"))


def test_a_changed_sweep_is_still_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    key, sweep = tmp_path / "k.pcd.bin", tmp_path / "s.pcd.bin"
    key.write_bytes(_nuscenes_like(rng, 30).tobytes())
    sweep.write_bytes(blob := _nuscenes_like(rng, 30).tobytes())
    sizes = [Recorded(key.stat().st_size), Recorded(len(blob), schemas.content_hash(blob) ^ 1)]
    with pytest.raises(FileChangedError, match="other contents"):
        load_points(str(key), None, [str(sweep)], np.eye(4).ravel(), None, sizes)
    sizes[1] = Recorded(len(blob) - 20)
    with pytest.raises(FileChangedError, match=f"{len(blob)} bytes, the scan recorded {len(blob) - 20}"):
        load_points(str(key), None, [str(sweep)], np.eye(4).ravel(), None, sizes)


# ---------------------------------------------------------------------------------- real nuScenes


def test_real_nuscenes_files(realdata: Path) -> None:
    """Real LIDAR_TOP files (a full 34,688-point keyframe, sweeps of two logs) through load_points,
    checked against the recorded sizes and CRC-32s, give the old arrays and the plain numpy result."""
    rng = np.random.default_rng(29)
    files = [realdata / p for p in (N015_FULL, N015_SWEEP, N008_SWEEP, N015, N015_FULL)]
    recorded = [Recorded(f.stat().st_size, schemas.content_hash(f.read_bytes())) for f in files]
    tfs = [_pose(rng), yaw_tf(0.01, (-0.5, 0.02, 0.0)), np.eye(4), _pose(rng)]
    args = (str(files[0]), None, [str(f) for f in files[1:]], np.stack(tfs).ravel(), None, recorded)
    got = _same(load_points, oracle.load_points, *args)
    assert got[0] == "ok"
    plain = [np.fromfile(f, np.float32).reshape(-1, 5) for f in files]
    for i, tf in enumerate(tfs, 1):
        pts = plain[i][~((np.abs(plain[i][:, 0]) < 1) & (np.abs(plain[i][:, 1]) < 1))]
        pts[:, :3] = pts[:, :3].astype(np.float64) @ tf[:3, :3].T + tf[:3, 3]
        plain[i] = pts
    np.testing.assert_array_equal(load_points(*args), np.concatenate(plain))
    _same(load_points, oracle.load_points, str(files[0]), None, recorded=recorded[:1])
