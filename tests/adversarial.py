"""The adversarial input corpus of ``test_adversarial.py``, generated in a temporary directory (no
committed binaries).

``write_file_corpus`` writes plain point-cloud files for ``lidarshard scan/build INPUT``; ``write_tables_corpus``
writes a minimal nuScenes-style dataroot whose tables attack the loader. Each returns
``{reject path: expected reason}`` (paths exactly as ``rejects.parquet`` records them) plus what the
good inputs are, so a test can assert that every hostile input is rejected with its reason and that
nothing is lost (scanned = accepted + rejected).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import lzf
import numpy as np

from tests.helpers import one_scene_samples

__all__ = [
    "FILE_FLAGS",
    "TABLES_VERSION",
    "Corpus",
    "write_file_corpus",
    "write_tables_corpus",
    "pcd",
    "good_cloud",
]

#: Flags the file corpus is meant for: a range filter (empty_after_filter) and a file-size cap (too_large).
FILE_FLAGS = ("--point-cloud-range=-100,-100,-10,100,100,10", "--max-file-bytes", "1000000")
TABLES_VERSION = "v1.0-adv"
_IDENTITY_Q = [1.0, 0.0, 0.0, 0.0]


@dataclass
class Corpus:
    """What a corpus holds: the inputs that must be accepted and the rejects expected, by path."""

    root: Path
    good: list[str] = field(default_factory=list)  # sample ids expected in samples.parquet
    rejects: dict[str, str] = field(default_factory=dict)  # reject path -> reason

    @property
    def scanned(self) -> int:
        return len(self.good) + len(self.rejects)


def good_cloud(rng: np.random.Generator, n: int, dims: int = 4) -> bytes:
    """(n, dims) float32 points inside +-40 m."""
    return rng.uniform(-40.0, 40.0, (n, dims)).astype(np.float32).tobytes()


def pcd(fields: str, size: str, type_: str, count: str, points: str, data: str, body: bytes) -> bytes:
    """A PCD file with the given header values, verbatim (so they can lie)."""
    header = (
        f"# .PCD v0.7\nVERSION 0.7\nFIELDS {fields}\nSIZE {size}\nTYPE {type_}\nCOUNT {count}\n"
        f"WIDTH {points}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {points}\nDATA {data}\n"
    )
    return header.encode() + body


def _pcd_cases() -> dict[str, tuple[bytes, str]]:
    xyz = "x y z"
    raw = np.ones((3, 10), np.float32).tobytes()
    comp = lzf.compress(raw)

    def compressed(c: int, r: int, block: bytes) -> bytes:
        return pcd(
            xyz, "4 4 4", "F F F", "1 1 1", "10", "binary_compressed", struct.pack("<II", c, r) + block
        )

    def binary(size: str, count: str, points: str = "10", fields: str = xyz, type_: str = "F F F") -> bytes:
        return pcd(fields, size, type_, count, points, "binary", b"\0" * 120)

    return {
        "pcd/negative_size.pcd": (binary("-4 4 4", "1 1 1"), "bad_header"),
        "pcd/huge_size.pcd": (binary("4 4 4000000", "1 1 1"), "bad_header"),
        "pcd/huge_count.pcd": (binary("4 4 4", "1 1 100000"), "bad_header"),
        "pcd/negative_count.pcd": (binary("4 4 4", "1 1 -1"), "bad_header"),
        "pcd/zero_count.pcd": (binary("4 4 4", "1 1 0"), "bad_header"),
        "pcd/fields_vs_size.pcd": (binary("4 4", "1 1 1"), "bad_header"),
        "pcd/fields_vs_count.pcd": (binary("4 4 4", "1 1"), "bad_header"),
        "pcd/fields_vs_type.pcd": (binary("4 4 4", "1 1 1", type_="F F"), "bad_header"),
        "pcd/no_z.pcd": (binary("4 4 4", "1 1 1", fields="x y w"), "bad_header"),
        "pcd/huge_points.pcd": (binary("4 4 4", "1 1 1", points="1000000000000000"), "too_large"),
        "pcd/overflow_points.pcd": (binary("4 4 4", "1 1 1", points="9" * 30), "bad_header"),
        "pcd/negative_points.pcd": (binary("4 4 4", "1 1 1", points="-10"), "bad_header"),
        "pcd/short_binary.pcd": (binary("4 4 4", "1 1 1", points="11"), "truncated"),
        "pcd/compressed_size_lie.pcd": (compressed(10**6, 120, comp), "truncated"),
        "pcd/uncompressed_size_lie.pcd": (compressed(len(comp), 10**9, comp), "bad_header"),
        "pcd/impossible_ratio.pcd": (compressed(1, 120, comp), "bad_header"),
        "pcd/corrupt_lzf.pcd": (compressed(8, 120, bytes([0x1F, 1, 2, 3, 4, 5, 6, 7])), "bad_header"),
        "pcd/lzf_bomb.pcd": (compressed(8, 120, bytes([0xE0] + [0xFF] * 7)), "bad_header"),
        "pcd/no_size_prefix.pcd": (
            pcd(xyz, "4 4 4", "F F F", "1 1 1", "10", "binary_compressed", b"\1"),
            "truncated",
        ),
        "pcd/ascii_words.pcd": (pcd(xyz, "4 4 4", "F F F", "1 1 1", "1", "ascii", b"a b c\n"), "bad_header"),
        "pcd/no_data_line.pcd": (b"VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\n", "bad_header"),
        "pcd/binary_garbage.pcd": (bytes(range(256)) * 4, "bad_header"),
    }


def write_file_corpus(root: Path, good: int = 40, seed: int = 0) -> Corpus:
    """``good`` valid KITTI .bin clouds plus every hostile file; run with ``FILE_FLAGS``.

    Hostile inputs whose names the OS must allow: a non-UTF-8 file name (``b"\\xff\\xfe.bin"``),
    an .npy that would need unpickling, PLY/PCD headers that lie about sizes.
    """
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    corpus = Corpus(root)
    for i in range(good):
        (root / f"ok{i:03d}.bin").write_bytes(good_cloud(rng, int(rng.integers(200, 2000))))
        corpus.good.append(f"ok{i:03d}.bin")
    far = np.zeros((5, 4), np.float32)
    far[2, 0] = 1e30
    outside = np.full((50, 4), 500.0, np.float32)
    cases: dict[str, tuple[bytes, str]] = {
        "empty.bin": (b"", "empty"),
        "cut.bin": (good_cloud(rng, 10)[:-3], "truncated"),
        "nan.bin": (np.full((8, 4), np.nan, np.float32).tobytes(), "non_finite"),
        "absurd.bin": (far.tobytes(), "absurd_coordinates"),
        "outside_range.bin": (outside.tobytes(), "empty_after_filter"),
        "big.bin": (good_cloud(rng, 70_000), "too_large"),  # 1.12 MB > --max-file-bytes 1000000
        "notes.txt": (b"not a point cloud", "unsupported_format"),
        "pickled.npy": (_npy_header("|O", (3, 3)) + b"\0" * 72, "bad_header"),
        "shape_lie.npy": (_npy_header("<f4", (10**6, 3)) + b"\0" * 36, "truncated"),
        "huge.ply": (
            b"ply\nformat binary_little_endian 1.0\nelement vertex 1000000000000\n"
            b"property float x\nproperty float y\nproperty float z\nend_header\n" + b"\0" * 12,
            "too_large",
        ),  # fmt: skip
        "short.ply": (
            b"ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\n"
            b"property float z\nend_header\n1 2 3\n",
            "truncated",
        ),  # fmt: skip
        **_pcd_cases(),
    }
    for rel, (data, reason) in cases.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        corpus.rejects[str(root / rel)] = reason
    bad_name = os.fsencode(root) + b"/\xff\xfe.bin"
    with open(bad_name, "wb") as f:
        f.write(good_cloud(rng, 100))
    corpus.rejects[str(root) + "/\\xff\\xfe.bin"] = "unreadable"
    return corpus


def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    text = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text


# ---------------------------------------------------------------------------------------- tables


class _Tables:
    """A minimal one-scene nuScenes table set (LIDAR_TOP only) that tests append hostile records to."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.t: dict[str, list] = {
            "sensor": [{"token": "lidar", "channel": "LIDAR_TOP", "modality": "lidar"}],
            "calibrated_sensor": [
                {"token": "cs", "sensor_token": "lidar", "translation": [0, 0, 1.8], "rotation": _IDENTITY_Q}
            ],
            "ego_pose": [],
            "sample_data": [],
            "lidarseg": [],
        }
        self.clock = 1_000_000

    def record(self, token: str, filename: object, *, key: bool = True, prev: str = "", **extra) -> dict:
        self.clock += 50_000
        pose = f"ep{len(self.t['ego_pose'])}"
        self.t["ego_pose"].append(
            {"token": pose, "timestamp": self.clock, "translation": [0, 0, 0], "rotation": _IDENTITY_Q}
        )
        rec = {
            "token": token, "sample_token": f"s_{token}", "ego_pose_token": pose,
            "calibrated_sensor_token": "cs", "filename": filename, "timestamp": self.clock,
            "is_key_frame": key, "prev": prev, "next": "",
        } | extra  # fmt: skip
        self.t["sample_data"].append(rec)
        return rec

    def path(self, filename: str) -> str:
        return f"{self.root}/{filename}"

    def ref(self, token: str) -> str:
        return f"{self.root}/{TABLES_VERSION}/sample_data.json#{token}"

    def write(self) -> None:
        (self.root / TABLES_VERSION).mkdir(parents=True, exist_ok=True)
        for name, rows in (self.t | {"sample": one_scene_samples(self.t["sample_data"])}).items():
            (self.root / TABLES_VERSION / f"{name}.json").write_text(json.dumps(rows))


def _cloud_file(root: Path, rel: str, data: bytes) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)


def write_tables_corpus(root: Path, good: int = 12, seed: int = 0) -> Corpus:
    """A dataroot (``--nuscenes-version TABLES_VERSION --sweeps 1``) with ``good`` sound keyframes,
    each with one sweep, plus hostile records: path traversal (relative, absolute, URI, via a sweep),
    missing keyframe and sweep files, duplicate tokens and sample tokens, broken/cyclic prev chains,
    a NUL in a filename, absurd coordinates, a lidarseg file of the wrong length, a keyframe symlink loop.
    """
    rng = np.random.default_rng(seed)
    db = _Tables(root)
    corpus = Corpus(root)

    def keyframe(
        token: str, *, sweep: bool = True, write_key: bool = True, write_sweep: bool = True, **extra
    ):
        prev = ""
        if sweep:
            name = f"sweeps/LIDAR_TOP/{token}_sweep.pcd.bin"
            db.record(f"{token}_sweep", name, key=False)
            prev = f"{token}_sweep"
            if write_sweep:
                _cloud_file(root, name, good_cloud(rng, 300, dims=5))
        name = f"samples/LIDAR_TOP/{token}.pcd.bin"
        if write_key:
            _cloud_file(root, name, good_cloud(rng, int(rng.integers(500, 3000)), dims=5))
        return db.record(token, name, prev=prev, **extra)

    for i in range(good):
        keyframe(f"good{i:02d}")
        corpus.good.append(f"s_good{i:02d}")
    for token, filename in [
        ("traversal", "../../etc/passwd"),
        ("absolute", "/etc/passwd"),
        ("uri", "file:///etc/passwd"),
        ("sneaky", "samples/LIDAR_TOP/../../../etc/passwd"),
    ]:
        db.record(token, filename)
        corpus.rejects[db.ref(token)] = "outside_root"
    db.record("nul", "samples/LIDAR_TOP/a\x00.pcd.bin")
    corpus.rejects[db.ref("nul")] = "bad_table"
    evil_sweep = db.record("evil_sweep", "../../../etc/shadow", key=False)
    rec = keyframe("via_sweep", sweep=False)
    rec["prev"] = evil_sweep["token"]
    corpus.rejects[db.path(rec["filename"])] = "outside_root"
    rec = keyframe("no_sweep_file", write_sweep=False)
    corpus.rejects[db.path(rec["filename"])] = "missing_sweep"
    rec = keyframe("no_key_file", write_key=False)
    corpus.rejects[db.path(rec["filename"])] = "missing_file"
    rec = keyframe("no_key_file_first", sweep=False, write_key=False)
    corpus.rejects[db.path(rec["filename"])] = "missing_file"
    rec = keyframe("dup_token", sweep=False)
    twin = db.record("dup_token", "samples/LIDAR_TOP/dup_token_twin.pcd.bin")
    _cloud_file(root, twin["filename"], good_cloud(rng, 500, dims=5))
    corpus.good.append("s_dup_token")
    corpus.rejects[db.path(twin["filename"])] = "duplicate_id"
    rec = keyframe("same_sample_b", sweep=False, sample_token="s_good00")
    corpus.rejects[db.path(rec["filename"])] = "duplicate_id"
    rec = keyframe("unknown_prev", sweep=False)
    rec["prev"] = "no_such_token"
    corpus.rejects[db.path(rec["filename"])] = "bad_table"
    rec = keyframe("cycle", sweep=False)
    rec["prev"] = "cycle"
    corpus.rejects[db.path(rec["filename"])] = "bad_table"
    rec = keyframe("far", sweep=False)
    far = np.zeros((4, 5), np.float32)
    far[1, :3] = 1e30
    _cloud_file(root, rec["filename"], far.tobytes())
    corpus.rejects[db.path(rec["filename"])] = "absurd_coordinates"
    rec = keyframe("bad_labels", sweep=False)
    label = f"lidarseg/{TABLES_VERSION}/bad_labels_lidarseg.bin"
    _cloud_file(root, label, b"\1" * 7)
    db.t["lidarseg"].append({"token": "ls", "sample_data_token": "bad_labels", "filename": label})
    corpus.rejects[db.path(rec["filename"])] = "label_mismatch"
    rec = keyframe("loop", sweep=False, write_key=False)
    os.symlink(Path(rec["filename"]).name, root / rec["filename"])  # a symlink to itself: ELOOP
    corpus.rejects[db.path(rec["filename"])] = "missing_file"
    db.write()
    return corpus
