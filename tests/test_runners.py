"""``lidarshard build`` gives byte-identical manifests on every runner CI exercises.

One tiny synthetic nuScenes dataroot (3 scenes x 4 keyframes, 2 sweeps each) is built on:

- FnApiRunner, in memory (the reference);
- DirectRunner, ``multi_processing`` with 2 workers;
- PortableRunner against Beam's Python local job service, ``--environment_type=LOOPBACK``;
- PortableRunner against the same job service with an EXTERNAL worker pool (``worker_pool_main``)
  whose working directory differs from the launcher's, launched as ``python -m lidarshard.pipelines.build``
  with relative INPUT/OUT: nothing may rely on ``__main__`` state or on the launcher's cwd;
- ``--runner=dask`` on a real ``dask.distributed`` cluster: a ``dask scheduler`` and two
  ``dask worker --nworkers 1`` processes on 127.0.0.1 (skipped without the ``dask`` extra), which
  also writes the synthetic dataroot (compared with the FnApiRunner's);

and every file of every output is compared byte for byte with the reference. Everything runs in
child processes (own process group) with a timeout and is killed in teardown: CI cannot hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from lidarshard import schemas
from lidarshard.loaders.reader import load_manifest
from lidarshard.pipelines import build, runners
from lidarshard.pipelines.options import BuildOptions
from lidarshard.pipelines.preflight import build_settings
from lidarshard.tools.validate import validate
from lidarshard.transforms import progress
from lidarshard.transforms.declare import from_flags

pytestmark = pytest.mark.slow

PY = sys.executable
VENV_BIN = str(Path(PY).parent)
#: Seconds one launcher run may take (a build here takes 3-10 s) and a server start.
RUN_TIMEOUT = 120
START_TIMEOUT = 60

SYNTH = [
    "--scenes",
    "3",
    "--keyframes-per-scene",
    "4",
    "--sweeps-per-keyframe",
    "2",
    "--seed",
    "0",
    "--labels",
]
PLAN = ["--nuscenes-version", "v1.0-synth", "--sweeps", "2"]
PLAN += ["--world-size", "2", "--batch-size", "2", "--epochs", "2", "--seed", "3"]
PLAN += ["--repeat-factors", "lidarseg:t=0.5"]  # label files read in the plan step, weights rounded per epoch
PLAN += ["--part-rows", "5"]  # 12 samples: the scan and the build write 3 samples parts in parallel


def _env(**extra: str) -> dict[str, str]:
    """The test's environment with the venv's bin first on PATH (workers start a bare ``python``)."""
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PYTHONSTARTUP", None)
    return env | extra


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and every child it started (it leads its own process group)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def _spawn(args: list[str], cwd: Path, out, **env: str) -> subprocess.Popen:
    """``python <args>`` leading its own process group (``_kill_group`` stops its children too)."""
    return subprocess.Popen(
        [PY, *args], cwd=cwd, env=_env(**env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def run_cli(
    args: list[str], cwd: Path, log: Path, timeout: float = RUN_TIMEOUT, **env: str
) -> subprocess.CompletedProcess:
    """Run ``python <args>`` in its own process group; kill the whole group after ``timeout`` s."""
    with log.open("w") as out:
        proc = _spawn(args, cwd, out, **env)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            pytest.fail(f"{args[:3]} ran past {timeout} s and was killed; log tail:\n{_tail(log)}")
        finally:
            _kill_group(proc)  # workers a finished launcher left behind
    return subprocess.CompletedProcess(args, rc, _tail(log, 20000), "")


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("localhost", port)) == 0


@contextlib.contextmanager
def server(args: list[str], cwd: Path, log: Path, ready: int | Path) -> Iterator[int]:
    """Start ``python <args>`` in the background; yield its port once it listens (``ready``: the
    port, or a file the server writes its port to); kill its process group on exit."""
    with background(args, cwd, log) as proc:
        deadline = time.monotonic() + START_TIMEOUT
        port = None
        while port is None:
            if proc.poll() is not None:
                pytest.fail(f"{args[:2]} exited with {proc.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(f"{args[:2]} not ready after {START_TIMEOUT} s:\n{_tail(log)}")
            if isinstance(ready, Path):
                text = ready.read_text().strip() if ready.exists() else ""
                port = int(text) if text and _listening(int(text)) else None
            else:
                port = ready if _listening(ready) else None
            time.sleep(0.2)
        yield port


@contextlib.contextmanager
def background(args: list[str], cwd: Path, log: Path, **env: str) -> Iterator[subprocess.Popen]:
    """``python <args>`` in its own process group for the ``with`` block; killed with its children."""
    with log.open("w") as out:
        proc = _spawn(args, cwd, out, **env)
        try:
            yield proc
        finally:
            _kill_group(proc)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """{relative path: bytes} of every file under ``root``."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_tree(got: Path, want: Path) -> None:
    """File-by-file byte comparison with a readable message (which files differ, not the bytes)."""
    a, b = tree_bytes(got), tree_bytes(want)
    assert sorted(a) == sorted(b), f"file sets differ: only in {got}: {sorted(set(a) - set(b))}, " + (
        f"only in reference: {sorted(set(b) - set(a))}"
    )
    differ = [name for name in sorted(a) if a[name] != b[name]]
    assert not differ, f"{len(differ)} of {len(a)} files differ from the reference: {differ}"


def _build(
    cwd: Path,
    inp: str,
    out: str,
    runner: list[str],
    log: Path,
    module: str = "lidarshard.pipelines.cli",
    **env: str,
) -> subprocess.CompletedProcess:
    sub = ["build"] if module == "lidarshard.pipelines.cli" else []
    return run_cli(["-m", module, *sub, inp, out, *PLAN, *runner], cwd, log, **env)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runners")


@pytest.fixture(scope="module")
def dataroot(work: Path) -> Path:
    root = work / "dataroot"
    r = run_cli(
        ["-m", "lidarshard.pipelines.cli", "synth", str(root), *SYNTH, "--runner=FnApiRunner"],
        work,
        work / "synth.log",
    )
    assert r.returncode == 0, r.stdout
    return root


@pytest.fixture(scope="module")
def reference(work: Path, dataroot: Path) -> Path:
    out = work / "ref"
    r = _build(work, str(dataroot), str(out), ["--runner=FnApiRunner"], work / "ref.log")
    assert r.returncode == 0, r.stdout
    assert "scanned 12: accepted 12, rejected 0" in r.stdout
    assert sorted(p.name for p in (out / schemas.SAMPLES_DIR).iterdir()) == [
        schemas.part_name(k) for k in range(3)
    ]
    return out


@pytest.fixture(scope="module")
def job_service(work: Path) -> Iterator[str]:
    """Beam's Python local job service (no Java); yields its ``localhost:PORT``."""
    port_file = work / "job_service.port"
    args = ["-m", "apache_beam.runners.portability.local_job_service_main", "--port", "0"]
    with server([*args, "--port_file", str(port_file)], work, work / "job_service.log", port_file) as port:
        yield f"localhost:{port}"


@pytest.fixture(scope="module")
def worker_pool(work: Path) -> Iterator[str]:
    """An EXTERNAL SDK worker pool in its own directory; yields its ``localhost:PORT``."""
    cwd = work / "pool_cwd"
    cwd.mkdir()
    port = free_port()
    args = ["-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"]
    with server(args, cwd, work / "worker_pool.log", port):
        yield f"localhost:{port}"


@pytest.fixture(scope="module")
def dask_cluster(work: Path) -> Iterator[str]:
    """``dask scheduler`` + two single-process ``dask worker``s (their own cwd) on 127.0.0.1;
    yields the scheduler's ``tcp://127.0.0.1:PORT`` once both workers have registered."""
    pytest.importorskip("distributed", reason="the dask extra is not installed")
    cwd = work / "dask_cwd"
    cwd.mkdir()
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = ["-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]
    worker = ["-m", "dask", "worker", address, "--nworkers", "1", "--nthreads", "1", "--no-dashboard"]
    worker += ["--host", "127.0.0.1", "--local-directory", str(cwd)]
    with contextlib.ExitStack() as stack:
        stack.enter_context(server(scheduler, cwd, work / "dask_scheduler.log", port))
        tallies = work / "dask_tallies"  # the workers' progress tallies (transforms.progress)
        tallies.mkdir()
        for i in range(2):
            log = work / f"dask_worker{i}.log"
            stack.enter_context(background(worker, cwd, log, **{progress.ENV: str(tallies)}))
        wait = (
            f"from distributed import Client; Client({address!r}, timeout=30).wait_for_workers(2, timeout=60)"
        )
        r = run_cli(["-c", wait], cwd, work / "dask_wait.log", timeout=START_TIMEOUT + 30)
        assert r.returncode == 0, (
            r.stdout + _tail(work / "dask_worker0.log") + _tail(work / "dask_worker1.log")
        )
        yield address


def test_direct_multi_processing_matches_fnapi(work: Path, dataroot: Path, reference: Path) -> None:
    out = work / "direct_mp"
    flags = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    r = _build(work, str(dataroot), str(out), [*flags, "--progress"], work / "direct_mp.log")
    assert r.returncode == 0, r.stdout
    assert_same_tree(out, reference)
    # the worker processes' tallies, summed by the launcher: its last progress line (stderr is a file)
    assert re.search(r"^lidarshard build: all 12 inputs read in \d+ s; finishing, \d+ s$", r.stdout, re.M), (
        r.stdout
    )
    assert "INFO" not in r.stdout and "Traceback" not in r.stdout  # the workers' logs are hidden


def test_portable_loopback_matches_fnapi(
    work: Path, dataroot: Path, reference: Path, job_service: str
) -> None:
    out = work / "portable_loopback"
    flags = ["--runner=PortableRunner", f"--job_endpoint={job_service}", "--environment_type=LOOPBACK"]
    r = _build(work, str(dataroot), str(out), flags, work / "loopback.log")
    assert r.returncode == 0, r.stdout + _tail(work / "job_service.log")
    assert_same_tree(out, reference)


def test_portable_external_pool_matches_fnapi(
    work: Path, dataroot: Path, reference: Path, job_service: str, worker_pool: str
) -> None:
    """Workers run in another cwd; INPUT/OUT are given relative to the launcher's cwd."""
    out = work / "portable_external"
    flags = ["--runner=PortableRunner", f"--job_endpoint={job_service}"]
    flags += ["--environment_type=EXTERNAL", f"--environment_config={worker_pool}"]
    r = _build(
        work, dataroot.name, out.name, flags, work / "external.log", module="lidarshard.pipelines.build"
    )
    logs = r.stdout + _tail(work / "job_service.log") + _tail(work / "worker_pool.log")
    assert r.returncode == 0, logs
    assert_same_tree(out, reference)
    assert not any((work / "pool_cwd").iterdir()), "a worker wrote relative to its own cwd"


def test_dask_cluster_matches_fnapi(work: Path, dataroot: Path, reference: Path, dask_cluster: str) -> None:
    """synth and build with ``--runner=dask`` on the two-worker cluster: byte-identical to FnApiRunner.
    (The build reads the FnApiRunner's dataroot: its path is recorded in the manifest.)"""
    flags = ["--runner=dask", f"--dask_client_address={dask_cluster}"]
    synth_root = work / "dask_dataroot"
    args = ["-m", "lidarshard.pipelines.cli", "synth", str(synth_root), *SYNTH, *flags]
    r = run_cli(args, work, work / "dask_synth.log")
    assert r.returncode == 0, r.stdout
    assert_same_tree(synth_root, dataroot)
    tallies = work / "dask_tallies"
    written = progress.read(str(tallies))
    assert written is not None and (written.what, written.done, written.total) == ("scenes written", 3, 3)
    for f in tallies.iterdir():
        f.unlink()
    out = work / "dask"
    r = _build(work, str(dataroot), str(out), flags, work / "dask_build.log")
    assert r.returncode == 0, r.stdout + _tail(work / "dask_worker0.log") + _tail(work / "dask_worker1.log")
    assert "scanned 12: accepted 12, rejected 0" in r.stdout
    assert_same_tree(out, reference)
    # every input was read on the cluster's workers, exactly once (no recomputed side inputs)
    read = progress.read(str(tallies))
    assert read is not None and (read.what, read.done, read.total) == ("inputs read", 12, 12), read
    assert not any(p.is_file() for p in (work / "dask_cwd").iterdir()), "a worker wrote into its cwd"


def test_dask_cluster_plans_step_groups_like_fnapi(work: Path, dataroot: Path, dask_cluster: str) -> None:
    """``--plan-groups 2`` (each epoch dealt into two step groups, planned on the cluster's workers):
    byte-identical to FnApiRunner's build with the same flag, and valid."""
    grouped = ["--plan-groups", "2"]
    ref = work / "ref_g2"
    r = _build(work, str(dataroot), str(ref), ["--runner=FnApiRunner", *grouped], work / "ref_g2.log")
    assert r.returncode == 0, r.stdout
    assert load_manifest(ref).groups == 2
    out = work / "dask_g2"
    flags = ["--runner=dask", f"--dask_client_address={dask_cluster}", *grouped]
    r = _build(work, str(dataroot), str(out), flags, work / "dask_g2.log")
    assert r.returncode == 0, r.stdout + _tail(work / "dask_worker0.log") + _tail(work / "dask_worker1.log")
    assert_same_tree(out, ref)
    assert validate(str(out))[0] == []


def test_runner_alias_resolves_dask_and_leaves_others() -> None:
    dask = runners.RUNNER_ALIASES["dask"][0]
    assert runners.resolve_runner(["--runner=dask", "--x=1"]) == [f"--runner={dask}", "--x=1"]
    assert runners.resolve_runner(["--runner", "Dask"]) == ["--runner", dask]
    assert runners.resolve_runner(["--runner=FnApiRunner", "dask"]) == ["--runner=FnApiRunner", "dask"]


def test_runner_alias_names_the_extra_when_missing(monkeypatch) -> None:
    monkeypatch.setattr(runners.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        SystemExit, match=r"--runner=dask needs distributed: pip install 'lidarshard\[dask\]'"
    ):
        runners.resolve_runner(["--runner=dask"])


def test_multi_threading_never_loses_samples_silently(work: Path, dataroot: Path, reference: Path) -> None:
    """DirectRunner multi_threading can drop elements after a reshuffle (seen here: 0.3-2%).
    Each run must either match the reference or fail the accounting check; never a short plan."""
    flags = ["--runner=DirectRunner", "--direct_running_mode=multi_threading", "--direct_num_workers=2"]
    for i in range(2):
        out = work / f"direct_mt{i}"
        r = _build(work, str(dataroot), str(out), flags, work / f"direct_mt{i}.log")
        if r.returncode == 0:
            assert_same_tree(out, reference)
        else:
            assert "accounting check failed" in r.stdout, r.stdout
            assert not out.exists()


def test_counters_report_every_outcome(dataroot: Path, tmp_path: Path) -> None:
    """Beam counters (namespace ``lidarshard``): what remote runners show while a job runs."""
    args, _ = build.parser().parse([str(dataroot), str(tmp_path / "out"), *PLAN])
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    settings = build_settings(from_flags(BuildOptions, args))
    build.build_pipeline(pipeline, settings, str(tmp_path / "staging"))
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_namespace("lidarshard"))["counters"]
    got: dict[str, int] = {}
    for c in counters:  # one counter per (step, name)
        got[c.key.metric.name] = got.get(c.key.metric.name, 0) + c.committed
    files = sum(1 for _ in (tmp_path / "staging").rglob("*.parquet"))
    planned = sum(json.loads((tmp_path / "staging" / schemas.MANIFEST_FILE).read_text())["counts"]["planned"])
    assert (got["accepted"], got["planned"], got["files_written"]) == (12, planned, files), got


@pytest.mark.parametrize(
    "argv, near",
    [
        (["--runner", "DirectRuner"], "DirectRunner"),
        (["--runner=dsak"], "dask"),
        (["--runner=Flink"], "FlinkRunner"),
        (["--runner=local"], None),
    ],
)
def test_a_runner_typo_is_one_line_with_the_nearest_name(argv: list[str], near: str | None) -> None:
    from lidarshard.transforms.value_checks import UsageError

    with pytest.raises(UsageError) as err:
        runners.resolve_runner(argv)
    message = str(err.value)
    assert "\n" not in message and "is not a runner" in message and "DirectRunner" in message
    assert (f"did you mean {near}?" in message) if near else "did you mean" not in message
    dotted = "--runner=my_pkg.runners.MyRunner"  # a user's own runner class passes through
    assert runners.resolve_runner([dotted, "--runner=DataflowRunner"]) == [dotted, "--runner=DataflowRunner"]
