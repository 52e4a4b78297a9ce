"""Hostile label configs (``semantic-kitti.yaml``): a generated family of expansion bombs, deep nesting
and oversized values. The promise: one line naming the file, before Beam starts, in bounded memory and
without a RecursionError."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from lidarshard.transforms.formats.labels import MAX_YAML_DEPTH, parse_learning_map
from lidarshard.transforms.layouts import STORAGE_IO, semantickitti
from lidarshard.transforms.layouts.task import LayoutOptions

pytestmark = pytest.mark.hostile("files and cli")


def _laughs(levels: int, fan: int = 9) -> bytes:
    """A billion-laughs document: ``fan ** levels`` strings from a few hundred bytes of aliases."""
    lines = ['l0: &l0 "lol"']
    for k in range(1, levels + 1):
        lines.append(f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * fan)}]")
    lines.append(f"learning_map: {{0: *l{levels}}}")
    return "\n".join(lines).encode()


def _nested(depth: int, flow: bool) -> bytes:
    if flow:
        return b"learning_map: " + b"{0: " * depth + b"1" + b"}" * depth
    body = "".join(f"{'  ' * (k + 1)}k{k}:\n" for k in range(depth)) + "  " * (depth + 1) + "x: 1\n"
    return ("learning_map:\n" + body).encode()


CASES = {f"laughs-{n}": _laughs(n) for n in (2, 5, 9)}
CASES |= {f"alias-key-{n}": b"a: &a 7\nlearning_map: {*a : 1}\n" for n in (0,)}
CASES |= {f"nested-flow-{d}": _nested(d, True) for d in (MAX_YAML_DEPTH + 1, 1000, 50_000)}
CASES |= {f"nested-block-{d}": _nested(d, False) for d in (MAX_YAML_DEPTH + 1, 200)}
CASES |= {
    "long-key": b"learning_map: {" + b"9" * 100_000 + b": 1}",
    "long-value": b"learning_map: {0: " + b"x" * 100_000 + b"}",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_label_config_is_one_line_in_bounded_memory(name: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as err:
            parse_learning_map(CASES[name])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert "\n" not in message and len(message) < 400, message[:400]
    assert peak < 64 << 20, f"{name}: {peak} bytes"


def _scan(root: Path) -> None:
    (root / "sequences" / "00" / "velodyne").mkdir(parents=True)
    np.zeros((3, 4), "<f4").tofile(root / "sequences" / "00" / "velodyne" / "000000.bin")


@pytest.mark.parametrize("name", ["laughs-9", "nested-flow-50000", "long-value"])
def test_the_layout_names_the_file(tmp_path: Path, name: str) -> None:
    _scan(tmp_path)
    (tmp_path / "semantic-kitti.yaml").write_bytes(CASES[name])
    with pytest.raises(ValueError) as err:
        semantickitti.load_tasks(str(tmp_path), LayoutOptions(), STORAGE_IO)
    assert str(err.value).startswith(f"{tmp_path}/semantic-kitti.yaml: ") and "\n" not in str(err.value)


def test_the_build_refuses_it_before_beam_in_one_line(tmp_path: Path) -> None:
    _scan(tmp_path / "in")
    (tmp_path / "in" / "semantic-kitti.yaml").write_bytes(CASES["nested-flow-50000"])
    cmd = [
        sys.executable,
        "-m",
        "lidarshard.pipelines.cli",
        "build",
        str(tmp_path / "in"),
        str(tmp_path / "out"),
    ]
    r = subprocess.run(
        [*cmd, "--world-size", "1", "--batch-size", "1"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "semantic-kitti.yaml: label config is not valid YAML: nested deeper than" in last
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_the_real_config_still_parses(realdata: Path) -> None:
    path = realdata / "semantickitti_full" / "semantic-kitti.yaml"
    if not path.is_file():
        pytest.skip(f"no {path}")
    assert len(parse_learning_map(path.read_bytes())) == 34
