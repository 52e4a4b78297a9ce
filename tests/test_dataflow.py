"""Packaging for remote workers and the Dataflow job graph, all offline.

- The wheel of this repository holds every module a worker unpickles and imports from the wheel
  alone (the repo and its editable install hidden), so ``--extra_package dist/*.whl`` works.
- Beam's stager takes that wheel, a ``--requirements_file`` and (with ``build`` installed)
  ``--setup_file pyproject.toml`` as job resources.
- With ``apache-beam[gcp]`` installed, ``--runner=DataflowRunner --dry_run=True`` (fake project,
  region, gs:// paths) turns ``build`` and ``scan`` into a Dataflow job with our steps and the
  wheel staged, also through the CLI, offline. Skipped without the extra.
- ``--dry_run`` never publishes an output, even on a local runner that ignores it and runs.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.stager import Stager

from lidarshard.pipelines import build, launch, scan
from lidarshard.pipelines.options import BuildOptions, ScanOptions
from lidarshard.pipelines.preflight import build_settings, scan_settings
from lidarshard.transforms.declare import from_flags
from tests.helpers import PACKAGES, make_bins

pytestmark = pytest.mark.slow  # wheel builds and Dataflow job graphs

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 240
GS = "gs://lidarshard-fake-bucket"
DATAFLOW = [
    "--runner=DataflowRunner",
    "--dry_run=True",
    "--project=lidarshard-fake-project",
    "--region=us-central1",
    f"--temp_location={GS}/tmp",
]


def _modules() -> list[str]:
    """Every module of our packages, dotted."""
    dotted = (
        ".".join(p.relative_to(REPO).with_suffix("").parts)
        for pkg in PACKAGES
        for p in (REPO / pkg).rglob("*.py")
    )
    return sorted(
        ("" if d.startswith("lidarshard") else "lidarshard.") + d.removesuffix(".__init__") for d in dotted
    )


def test_wheel_holds_every_module_and_imports_alone(wheel: Path, tmp_path: Path) -> None:
    """Import the pipeline from the wheel (zipimport) in a process that cannot see the repo."""
    code = f"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
sys.path[:] = [{str(wheel)!r}] + [p for p in sys.path if p not in ("", ".", {str(REPO)!r})]
import lidarshard.pipelines.build, lidarshard.pipelines.scan, lidarshard.pipelines.cli, lidarshard.transforms.beam.scan_transform, lidarshard.transforms.core.planner
for m in (lidarshard.pipelines.build, lidarshard.transforms.beam.scan_transform, lidarshard.transforms.core.planner):
    assert m.__file__.startswith({str(wheel)!r}), m.__file__
print("ok")
"""
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [
        m
        for m in _modules()
        if m.replace(".", "/") + ".py" not in names and m.replace(".", "/") + "/__init__.py" not in names
    ]
    assert not missing, f"modules missing from the wheel: {missing}"


def test_stager_takes_wheel_requirements_and_setup_file(wheel: Path, source: Path, tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("pyarrow>=14\n")
    flags = [f"--extra_package={wheel}", f"--requirements_file={req}", "--requirements_cache=skip"]
    if importlib.util.find_spec("build") is not None:  # Beam builds --setup_file with python -m build
        flags.append(f"--setup_file={source / 'pyproject.toml'}")
    staged_dir = tmp_path / "staged"
    staged_dir.mkdir()
    resources = Stager.create_job_resources(PipelineOptions(flags), str(staged_dir))
    staged = _staged_names(resources)
    assert wheel.name in staged and "requirements.txt" in staged, staged
    if any(f.startswith("--setup_file") for f in flags):
        assert "workflow.tar.gz" in staged, staged


def _staged_names(artifacts) -> set[str]:
    """File names of Beam ``ArtifactInformation`` protos as staged for the workers."""
    return {
        beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(a.role_payload).staged_name
        for a in artifacts
    }


def _dataflow_or_skip() -> None:
    for mod in ("google.cloud.storage", "apache_beam.runners.dataflow.internal.apiclient"):
        try:
            importlib.import_module(mod)
        except ImportError as e:
            pytest.skip(f"apache-beam[gcp] not installed ({e}); pip install 'apache-beam[gcp]'")


def _dry_run(wheel: Path, construct, argv: list[str]) -> set[str]:
    """Parse ``argv`` with the subcommand's parser, construct, dry-run on Dataflow; step names."""
    opts = PipelineOptions([*DATAFLOW, f"--extra_package={wheel}"])
    pipeline = beam.Pipeline(options=opts)
    construct(pipeline, argv)
    result = pipeline.run()
    assert result.state == "DONE"
    proto = pipeline.runner.proto_pipeline
    envs = proto.components.environments.values()
    staged = _staged_names(dep for env in envs for dep in env.dependencies)
    assert wheel.name in staged, f"the wheel is not among the job's artifacts: {staged}"
    assert all(env.urn == "beam:env:docker:v1" for env in envs)
    return {t.unique_name for t in proto.components.transforms.values()}


def _build(pipeline: beam.Pipeline, argv: list[str]) -> None:
    args, _ = build.parser().parse(argv)
    settings = build_settings(from_flags(BuildOptions, args), dry_run=True)
    build.build_pipeline(pipeline, settings, f"{settings.output}.staging-dryrun")


def _scan(pipeline: beam.Pipeline, argv: list[str]) -> None:
    args, _ = scan.parser().parse(argv)
    settings = scan_settings(from_flags(ScanOptions, args), dry_run=True)
    scan.build_scan(pipeline, settings, f"{settings.output}.staging-dryrun")


@pytest.mark.timeout(TIMEOUT)
def test_dataflow_dry_run_builds_the_job_graph(wheel: Path) -> None:
    _dataflow_or_skip()
    argv = [f"{GS}/nuscenes", f"{GS}/manifest", "--nuscenes-version", "v1.0-trainval", "--sweeps", "9"]
    names = _dry_run(wheel, _build, [*argv, "--world-size", "64", "--batch-size", "2", "--epochs", "4"])
    for step in (
        "Scan/Load",
        "Scan/Featurize",
        "Build/SettleAndScore",
        "Build/PlanEpoch",
        "Build/WriteManifest",
    ):
        assert any(n == step or n.startswith(step + "/") for n in names), (step, sorted(names)[:40])
    names = _dry_run(wheel, _scan, [f"{GS}/kitti/*.bin", f"{GS}/scan"])
    assert any(n.startswith("Scan/Featurize") for n in names) and "Finalize" in names


@pytest.mark.timeout(TIMEOUT)
def test_cli_dry_run_is_offline_and_publishes_nothing(wheel: Path, tmp_path: Path, capsys) -> None:
    """``lidarshard build/scan ... --dry_run=True`` on Dataflow: no GCS call (offline it would hang
    on credentials), the job graph is built and the CLI says nothing was written."""
    _dataflow_or_skip()
    argv = [f"{GS}/nuscenes", f"{GS}/manifest", "--nuscenes-version", "v1.0-trainval"]
    argv += ["--world-size", "8", "--batch-size", "2", *DATAFLOW, f"--extra_package={wheel}"]
    assert build.run(argv) == 0
    assert scan.run([f"{GS}/kitti", f"{GS}/scan", *DATAFLOW, f"--extra_package={wheel}"]) == 0
    assert capsys.readouterr().out.count(launch.DRY_RUN_NOTE) == 2


def test_dry_run_on_a_local_runner_publishes_nothing(tmp_path: Path) -> None:
    """Local runners ignore ``--dry_run`` and run; the CLI still publishes nothing."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("previous run")
    flags = ["--world-size", "8", "--batch-size", "2", "--dry_run=True", "--runner=FnApiRunner"]
    inp = make_bins(tmp_path / "in", n=20)
    assert build.run([str(inp), str(out), *flags, "--max-reject-fraction", "0.1"]) == 0  # it runs...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]  # ...and publishes nothing
    assert (out / "keep.txt").read_text() == "previous run"
