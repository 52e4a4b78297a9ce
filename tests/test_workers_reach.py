"""A local INPUT or OUT with a runner whose workers may run elsewhere is a usage error before Beam starts
(``pipelines.runners.check_workers_reach``); it failed half-way with ``[Errno 2] No such file or directory:
'.../OUT.staging-.../_work/scanned/part-00000.parquet'`` and left staging files on the workers' disks."""

from __future__ import annotations

from pathlib import Path

import pytest

import lidarshard
from lidarshard.pipelines.cli import main
from lidarshard.pipelines.runners import check_workers_reach, remote_workers
from lidarshard.transforms.value_checks import UsageError
from tests.helpers import make_bins

PLAN = ["--world-size", "2", "--batch-size", "2"]
FIX = "pass --shared-filesystem"

ELSEWHERE = [
    pytest.param(["--runner=DataflowRunner", "--project=p", "--region=r"], id="dataflow"),
    pytest.param(["--runner=dask", "--dask_client_address=tcp://10.1.2.3:8786"], id="remote-dask"),
    pytest.param(["--runner=SparkRunner", "--spark_master_url=spark://sparkhost:7077"], id="spark"),
    pytest.param(["--runner=FlinkRunner", "--flink_master=flinkhost:8081"], id="flink"),
    pytest.param(["--runner=PortableRunner", "--job_endpoint=localhost:8099"], id="portable-docker"),
    pytest.param(
        [
            "--runner=PortableRunner",
            "--job_endpoint=localhost:8099",
            "--environment_type=EXTERNAL",
            "--environment_config=pool.example:50000",
        ],
        id="portable-remote-pool",
    ),  # fmt: skip
]
HERE = [
    [],
    ["--runner=FnApiRunner"],
    ["--runner=DirectRunner", "--direct_running_mode=multi_processing"],
    ["--runner=dask"],  # a LocalCluster
    ["--runner=dask", "--dask_client_address=tcp://127.0.0.1:8786"],
    ["--runner=FlinkRunner"],  # [auto]: an embedded cluster, LOOPBACK workers
    ["--runner=SparkRunner", "--spark_master_url=local[4]"],
    ["--runner=PortableRunner", "--job_endpoint=localhost:8099", "--environment_type=LOOPBACK"],
    [
        "--runner=PortableRunner",
        "--job_endpoint=localhost:8099",
        "--environment_type=EXTERNAL",
        "--environment_config=localhost:50000",
    ],  # fmt: skip
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bins(tmp_path_factory.mktemp("reach") / "in", n=6)


@pytest.mark.hostile("files and cli")
@pytest.mark.parametrize("flags", ELSEWHERE)
def test_a_local_out_with_remote_workers_is_one_line_before_beam(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    out = tmp_path / "out"
    assert main(["build", str(corpus), str(out), *PLAN, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if ": error: " in line]) == 1 and "Traceback" not in "\n".join(err)
    line = err[-1]
    assert f"OUT {out} and INPUT {corpus} are local paths but {flags[0]}" in line, line
    assert "object store" in line and FIX in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, no staging directory


@pytest.mark.hostile("files and cli")
def test_scan_synth_and_the_api_refuse_too(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataflow = ["--runner=DataflowRunner", "--project=p", "--region=r"]
    assert main(["scan", str(corpus), str(tmp_path / "scan"), *dataflow]) == 2
    assert main(["synth", str(tmp_path / "synth"), "--scenes", "1", *dataflow]) == 2
    err = capsys.readouterr().err
    assert f"OUT {tmp_path / 'synth'} is a local path but --runner=DataflowRunner" in err, err
    with pytest.raises(UsageError, match=f"OUT {tmp_path / 'api'} and INPUT {corpus} are local paths.*{FIX}"):
        lidarshard.build(str(corpus), str(tmp_path / "api"), world_size=2, batch_size=2, runner="DataflowRunner",
                         pipeline_args=["--project=p", "--region=r"])  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags", HERE, ids=str)
def test_workers_on_this_machine_are_not_refused(flags: list[str]) -> None:
    assert remote_workers(flags) is None


def test_an_object_store_or_the_shared_flag_passes() -> None:
    dataflow = ["--runner=DataflowRunner"]
    check_workers_reach(dataflow, [("OUT", "s3://bucket/out"), ("INPUT", "gs://bucket/in")], shared=False)
    check_workers_reach(dataflow, [("OUT", "/mnt/shared/out")], shared=True)
    with pytest.raises(UsageError, match="INPUT /data/in is a local path but --runner=DataflowRunner"):
        check_workers_reach(dataflow, [("OUT", "s3://bucket/out"), ("INPUT", "/data/in")], shared=False)
