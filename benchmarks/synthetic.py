"""What several benchmarks start from: a nuScenes-style ``lidarshard synth`` dataroot, and a manifest
built from it. Imported by the scripts beside it (``python benchmarks/X.py`` puts this folder first on
``sys.path``); not a benchmark itself."""

from __future__ import annotations

from pathlib import Path

#: The ``--nuscenes-version`` of a synthetic dataroot.
VERSION = "v1.0-synth"


def synth_args(root: Path, scenes: int, keyframes: int) -> list[str]:
    """``lidarshard synth`` arguments: ``scenes`` x ``keyframes`` samples (34,688 points a file) in
    ``root``, seed 0."""
    return [
        "synth",
        str(root),
        "--scenes",
        str(scenes),
        "--keyframes-per-scene",
        str(keyframes),
        "--seed",
        "0",
    ]


def synth_build(tmp: Path, scenes: int, keyframes: int, world_size: int, sweeps: int = 9) -> tuple[Path, str]:
    """(dataroot, OUT) under ``tmp``: ``synth_args``' dataroot and its manifest built with ``sweeps``
    sweeps for ``world_size`` ranks x 2 samples, one epoch, in this process (FnApiRunner)."""
    from lidarshard.pipelines.cli import main

    root, out = tmp / "dataroot", tmp / "out"
    assert main(synth_args(root, scenes, keyframes)) == 0
    flags = ["--nuscenes-version", VERSION, "--sweeps", str(sweeps), "--world-size", str(world_size)]
    assert (
        main(
            [
                "build",
                str(root),
                str(out),
                *flags,
                "--batch-size",
                "2",
                "--epochs",
                "1",
                "--runner=FnApiRunner",
            ]
        )
        == 0
    )
    return root, str(out)
