"""lidarshard synth OUT --scenes S: a nuScenes-style synthetic dataroot, written by a Beam pipeline.

Writes what nuscenes-devkit's ``NuScenes(version, OUT)`` loads:

  OUT/samples/LIDAR_TOP/<log>__LIDAR_TOP__<timestamp_us>.pcd.bin   keyframes (2 Hz)
  OUT/sweeps/LIDAR_TOP/<log>__LIDAR_TOP__<timestamp_us>.pcd.bin    sweeps in between (20 Hz)
  OUT/<version>/*.json        scene, sample, sample_data, ego_pose, calibrated_sensor, sensor, log,
                              map, category, attribute, visibility, instance, sample_annotation
  OUT/maps/<token>.png        blank map masks (one per location)
  OUT/lidarseg/<version>/<sample_data_token>_lidarseg.bin  and <version>/lidarseg.json (--labels)

Every lidar file holds 34,688 points (32 rings x 1,084 columns) as float32 x, y, z, intensity, ring
in the sensor frame, ray-cast from urban / suburban / open street scenes with the ego stopped or
driving. Same options and seed give byte-identical files on any runner and worker count.

Measured sizes: seed 0, defaults except --scenes 40 (400 samples; scene i is the same in every
dataset, so the default 4 scenes are scenes 0-3 of these). "10-sweep" = keyframe + 9 previous sweeps
through ego_pose + calibrated_sensor with remove_close(1 m), like the devkit's
from_file_multisweep; voxels = occupied 0.05 m cells. Kinds cycle urban/suburban/open 5:3:2, every
4th scene is stopped, the others drive at 1-8 m/s:

                                            min      p10      p50      p90      max
  keyframe points                        34,688   34,688   34,688   34,688   34,688
  keyframe points within 1 m (fraction)   0.153    0.157    0.188    0.242    0.270
  keyframe voxels (all points)           21,517   22,912   24,936   26,478   26,744
  10-sweep points (n=360)               253,484  262,818  280,806  292,518  293,386
  10-sweep voxels                        85,687   98,109  167,094  184,449  193,231
  10-sweep / keyframe voxels, stopped      3.31     3.69     4.05     4.69     4.90
  10-sweep / keyframe voxels, moving       5.62     6.08     6.94     7.42     8.16
  first keyframe of a scene (n=40):
    1-frame points after remove_close    25,307   26,291   28,226   29,285   29,356

Real nuScenes for comparison: 34,688 points per keyframe, ~0.23 within 1 m, 22-28k keyframe
voxels, 240-300k 10-sweep points, 10-sweep voxels ~4x (stopped) to ~7x (moving) one frame.
With --keyframes-per-scene 40 (as in nuScenes) 2.5% of samples are first keyframes (10% at 10).

Scenes are generated in parallel (one DoFn call per scene); tables are assembled from all scenes,
sorted, and written once. Any Beam runner flag works (--runner, --direct_num_workers, Dataflow);
OUT may be a gs:// URI. Without --runner: FnApiRunner, in memory.
The table folder is --nuscenes-version (default v1.0-synth), the name `lidarshard build` reads it by.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import StandardOptions

from lidarshard.pipelines import launch
from lidarshard.pipelines.checks import check_output_parent
from lidarshard.pipelines.options import BeamParser, shared_filesystem
from lidarshard.pipelines.runners import check_workers_reach
from lidarshard.transforms import progress
from lidarshard.transforms.declare import from_flags, nested, option
from lidarshard.transforms.io import storage
from lidarshard.transforms.synth import dataroot as synth
from lidarshard.transforms.synth import nuscenes_tables as tb
from lidarshard.transforms.value_checks import UsageError, choice, path

#: What ``synth --layout`` writes: the nuScenes dataroot, or one of ``LAYOUT_WRITERS``.
SYNTH_LAYOUTS = ("nuscenes", "av2", "semantickitti", "waymo_v2")

__all__ = ["GenerateDataroot", "SynthOptions", "parser", "run"]

_LOG = logging.getLogger(__name__)

#: Without --runner: FnApiRunner in memory (DirectRunner >= 2.62 first tries to download Prism).
DEFAULT_RUNNER = launch.LOCAL_RUNNER


@dataclass(frozen=True, kw_only=True)
class SynthOptions:
    """``lidarshard synth``'s arguments: OUT, the dataset's shape (``SynthConfig``, composed; one name per
    concept with ``build``) and its layout."""

    out: str = option(
        "dataroot to write (local path or gs:// URI)", positional=True, check=path(), metavar="OUT"
    )
    config: synth.SynthConfig = nested(synth.SynthConfig(), group="dataset")
    layout: str = option("dataset layout to write; other than nuscenes: --scenes logs/sequences/segments of "
                         "--keyframes-per-scene frames each", "nuscenes", group="dataset",
                         check=choice(*SYNTH_LAYOUTS))  # fmt: skip
    shared_filesystem: bool = shared_filesystem()


def parser() -> BeamParser:
    """The ``synth`` command line: the arguments of ``SynthOptions``, Beam options."""
    return BeamParser("lidarshard synth", __doc__, SynthOptions)


def _write(out: str, rel: str, data: bytes) -> None:
    storage.write_bytes(storage.join(out, rel), data)


class _GenerateSceneFn(beam.DoFn):
    """Scene index -> its files written under ``out``; yields (table, (sort key, record))."""

    def __init__(self, out: str, cfg: synth.SynthConfig) -> None:
        self._out, self._cfg = out, cfg
        self._scenes = Metrics.counter("synth", "scenes")
        self._files = Metrics.counter("synth", "files")
        self._bytes = Metrics.counter("synth", "bytes")

    def setup(self) -> None:
        self._tally = progress.Tally("scenes written")

    def process(self, index: int) -> Iterator[tuple[str, tuple[str, dict]]]:
        for rel, data in synth.scene_files(self._cfg, index):
            _write(self._out, rel, data)
            self._files.inc()
            self._bytes.inc(len(data))
        for table, records in synth.scene_tables(self._cfg, index).items():
            for i, rec in enumerate(records):
                yield table, (f"1/{index:09d}/{i:09d}", rec)
        self._scenes.inc()
        self._tally.add(total=self._cfg.scenes)

    def finish_bundle(self) -> None:
        self._tally.flush()


class _WriteTableFn(beam.DoFn):
    """(table, [(sort key, record)]) -> ``out/<version>/<table>.json``; map masks with the map table."""

    def __init__(self, out: str, version: str) -> None:
        self._out, self._version = out, version

    def process(self, element: tuple[str, Iterable[tuple[str, dict] | None]]) -> Iterator[str]:
        table, rows = element
        records = [rec for _, rec in sorted((r for r in rows if r is not None), key=lambda r: r[0])]
        if table == "map":
            records = tb.merge_map_records(records)
            for rec in records:
                _write(self._out, rec["filename"], tb.blank_png())
        _write(self._out, f"{self._version}/{table}.json", tb.table_json(records))
        yield table


def _writer(layout: str):
    """The synthetic writer of ``layout`` (``transforms.synth.layouts.LAYOUT_WRITERS``)."""
    from lidarshard.transforms.synth.layouts import LAYOUT_WRITERS

    return LAYOUT_WRITERS[layout]


class _GenerateUnitFn(beam.DoFn):
    """Unit index (a log, sequence or segment) -> its files of ``layout`` written under ``out``."""

    def __init__(self, out: str, layout: str, seed: int, frames: int, units: int) -> None:
        self._out, self._layout, self._seed, self._frames, self._units = out, layout, seed, frames, units
        self._files = Metrics.counter("synth", "files")

    def setup(self) -> None:
        self._tally = progress.Tally("units written")

    def process(self, index: int) -> Iterator[int]:
        for rel, data in _writer(self._layout).unit_files(self._seed, index, self._frames):
            _write(self._out, rel, data)
            self._files.inc()
        self._tally.add(total=self._units)
        yield index

    def finish_bundle(self) -> None:
        self._tally.flush()


class GenerateLayout(beam.PTransform):
    """Writes ``units`` logs/sequences/segments of ``frames`` frames of a synthetic ``layout`` dataset (av2,
    semantickitti, waymo_v2) in parallel (its shared files are written first, by ``run``); outputs the
    unit indices."""

    def __init__(self, out: str, layout: str, seed: int, units: int, frames: int) -> None:
        super().__init__()
        self._out, self._layout, self._seed, self._units, self._frames = out, layout, seed, units, frames

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[int]:
        return (
            pbegin
            | "UnitIndices" >> beam.Create(range(self._units))
            | "Spread" >> beam.Reshuffle()
            | "GenerateUnits"
            >> beam.ParDo(_GenerateUnitFn(self._out, self._layout, self._seed, self._frames, self._units))
        )


class GenerateDataroot(beam.PTransform):
    """Writes a whole synthetic dataroot; outputs the names of the tables written."""

    def __init__(self, out: str, cfg: synth.SynthConfig) -> None:
        super().__init__()
        self._out, self._cfg = out, cfg

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection[str]:
        tables = synth.static_tables(self._cfg)
        # every table gets written, even if empty
        static: list[tuple[str, tuple[str, tb.Record] | None]] = [(table, None) for table in tables]
        static += [
            (table, (f"0/{i:09d}", rec)) for table, recs in tables.items() for i, rec in enumerate(recs)
        ]
        scene_rows = (
            pbegin
            | "SceneIndices" >> beam.Create(range(self._cfg.scenes))
            | "Spread" >> beam.Reshuffle()
            | "GenerateScenes" >> beam.ParDo(_GenerateSceneFn(self._out, self._cfg))
        )
        static_rows = pbegin | "StaticTables" >> beam.Create(static)
        return (
            (static_rows, scene_rows)
            | "AllRows" >> beam.Flatten()
            | "ByTable" >> beam.GroupByKey()
            | "WriteTables" >> beam.ParDo(_WriteTableFn(self._out, self._cfg.version))
        )


def run(argv: list[str] | None = None) -> int:
    """Entry point of ``lidarshard synth``: exits 2 on a usage error, raises when the run fails."""
    # With postponed annotations Beam logs every DoFn hint it cannot resolve at INFO; not news.
    logging.getLogger("apache_beam.typehints.native_type_compatibility").setLevel(logging.WARNING)
    p = parser()
    parsed, beam_argv = p.parse(argv)
    try:
        args = from_flags(SynthOptions, parsed)
        cfg, out = args.config, storage.absolute(args.out)
        check_output_parent(out)
        check_workers_reach(beam_argv, [("OUT", out)], args.shared_filesystem)
    except UsageError as e:
        p.error(str(e))
    opts = launch.beam_options(beam_argv, DEFAULT_RUNNER)
    if args.layout != "nuscenes":
        return _run_layout(args, out, opts)
    if storage.exists(storage.join(out, cfg.version, "scene.json")):
        _LOG.warning("%s already holds %s tables: overwriting (files of the old run stay)", out, cfg.version)
    runner = opts.view_as(StandardOptions).runner
    _LOG.info("synth: %d scenes x %d frames -> %s (%s)", cfg.scenes, cfg.frames_per_scene, out, runner)
    launch.run_pipeline(lambda pipeline: pipeline | "Synth" >> GenerateDataroot(out, cfg), opts)
    keyframes = cfg.scenes * cfg.keyframes_per_scene
    print(
        f"wrote {out}: {cfg.scenes} scenes, {keyframes} keyframes, {cfg.scenes * cfg.frames_per_scene} "
        f"lidar files ({cfg.version} tables{', lidarseg labels' if cfg.labels else ''})"
    )
    return 0


def _run_layout(args: SynthOptions, out: str, opts: beam.options.pipeline_options.PipelineOptions) -> int:
    """``synth --layout av2|semantickitti|waymo_v2``: ``--scenes`` units of ``--keyframes-per-scene`` frames."""
    units, frames = args.config.scenes, args.config.keyframes_per_scene
    for rel, data in _writer(args.layout).static_files(args.config.seed):  # shared files first (a label map)
        _write(out, rel, data)
    launch.run_pipeline(
        lambda pipeline: (
            pipeline | "Synth" >> GenerateLayout(out, args.layout, args.config.seed, units, frames)
        ),
        opts,
    )
    print(f"wrote {out}: {args.layout}, {units} x {frames} frames")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(run())
