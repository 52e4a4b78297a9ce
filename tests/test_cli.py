"""Every user error of issue #13 through ``lidarshard``: exit code, one line naming the cause, nothing
published (or the rejects file where the message says)."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lidarshard import schemas
from lidarshard.pipelines import build as build_cli
from lidarshard.pipelines.cli import BeamRootRecords, main
from lidarshard.transforms.declare import Parser
from tests.helpers import BEAM_TEST_FLAGS, make_bins

PLAN = ["--world-size", "2", "--batch-size", "2"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """20 good .bin clouds and one truncated file (1 reject of 21)."""
    return make_bins(tmp_path_factory.mktemp("cli") / "in", n=20)


@pytest.fixture(scope="module")
def previous(corpus: Path) -> Path:
    """A manifest built with --max-reject-fraction 0.1 (its one reject is over the 0.01 default)."""
    out = corpus.parent / "prev"
    argv = ["build", str(corpus), str(out), *PLAN, "--max-reject-fraction", "0.1", *BEAM_TEST_FLAGS]
    assert main(argv) == 0
    return out


def _fails(capsys, argv: list[str], code: int, *needles: str) -> str:
    """Run ``lidarshard ARGV``; assert the exit code and that the error is one line holding ``needles``."""
    capsys.readouterr()
    assert main([*argv, *BEAM_TEST_FLAGS]) == code
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if ": error: " in line]
    assert len(errors) == 1, err
    assert "Traceback" not in "\n".join(err)
    assert len(err) == (1 if code == 1 else len(err)), err  # a failed run prints only its one line
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _nothing_published(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(out.name + ".staging-")]


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--sweps", "9"], ["unknown flag --sweps", "did you mean --sweeps?"]),
        (["--seeed", "3"], ["unknown flag --seeed", "did you mean --seed?"]),
        (["--temp_locaton=gs://b/tmp"], ["unknown flag --temp_locaton", "did you mean --temp_location?"]),
        (["--world", "2"], ["unknown flag --world", "did you mean --world-size?"]),  # no abbreviations
        (["--voxel-size", "nan"], ["--voxel-size", "nan", "[0.001, 1000]"]),
        (["--voxel-size", "inf"], ["--voxel-size", "inf", "[0.001, 1000]"]),
        (["--voxel-size", "0"], ["--voxel-size", "0", "[0.001, 1000]"]),
        (["--voxel-size", "1e-30"], ["--voxel-size", "1e-30", "[0.001, 1000]"]),
        (["--max-reject-fraction", "nan"], ["--max-reject-fraction", "nan", "[0, 1]"]),
        (["--max-reject-fraction", "-1"], ["--max-reject-fraction", "-1", "[0, 1]"]),
        (["--max-reject-fraction", "2"], ["--max-reject-fraction", "2", "[0, 1]"]),
        (["--buckets", "0"], ["--buckets", "0", "[1, 4096]"]),
        (["--buckets", "-3"], ["--buckets", "-3", "[1, 4096]"]),
        (["--sweeps", "-1"], ["--sweeps", "-1", "[0, 1000]"]),
        (["--point-cloud-range", "1,2,3"], ["--point-cloud-range", "'1,2,3'", "6 comma-separated"]),
        (["--bucket-weights", "1,2", "--buckets", "4"], ["--bucket-weights has 2 values but --buckets is 4"]),
        (["--bucket-weights", "0,0,0,0"], ["--bucket-weights 0,0,0,0", "at least one weight must be > 0"]),
        (["--bucket-weights", "1e308,1,1,1"], ["--bucket-weights 1e+308,1,1,1", "--max-plan-factor 100"]),
        (["--bucket-weights", "1e6,1,1,1"], ["~2.5e+05x the input", "--max-plan-factor 100"]),
        (["--bucket-weights", "-1,1"], ["--bucket-weights", "-1,1", ">= 0"]),
        (["--point-cloud-range", "-5,-5,-1,5,5,1e400"], ["--point-cloud-range", "1e400 is not finite"]),
        (["--cost-model", "linear:1,2"], ["--cost-model linear:1,2", "needs 3 or 4 numbers"]),
        (["--strategy", "fastest"], ["--strategy", "invalid choice: 'fastest'"]),
        (["--epochs", "0"], ["--epochs", "0 is out of range"]),
    ],
)
def test_bad_flags_and_values_stop_before_beam(
    corpus: Path, capsys, flags: list[str], needles: list[str]
) -> None:
    out = corpus.parent / "out_flags"
    _fails(capsys, ["build", str(corpus), str(out), *PLAN, *flags], 2, *needles)
    _nothing_published(out)


def test_a_typo_of_a_required_flag_names_the_typo(corpus: Path, capsys) -> None:
    out = corpus.parent / "out_required"
    argv = ["build", str(corpus), str(out), "--world-size", "2", "--batch-sise", "2"]
    _fails(capsys, argv, 2, "unknown flag --batch-sise", "did you mean --batch-size?")
    _fails(capsys, argv[:-2], 2, "the following arguments are required: --batch-size")
    _nothing_published(out)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[1, 2, 3]", 'expected {"cost_model": {"c0": number'),
        ('{"c0": 0, "a": 1}', "missing b"),
        ('{"cost_model": null}', "got NoneType"),
        ('{"cost_model": {"c0": 0, "a": "x", "b": 1}}', "a must be numbers, got 'x'"),
        ("not json", "the file is not valid JSON"),
        (None, "no such file"),
    ],
)
def test_malformed_cost_model_files(corpus: Path, tmp_path: Path, capsys, content, needle: str) -> None:
    fit = tmp_path / "fit.json"
    if content is not None:
        fit.write_text(content)
    out = tmp_path / "out"
    line = _fails(capsys, ["build", str(corpus), str(out), *PLAN, "--cost-model", f"@{fit}"], 2, needle)
    assert f"--cost-model @{fit}" in line
    _nothing_published(out)


def _dataroot(root: Path, *versions: str) -> Path:
    for v in versions:
        (root / v).mkdir(parents=True)
        (root / v / "sample_data.json").write_text("[]")
    (root / "maps").mkdir(parents=True, exist_ok=True)
    (root / "maps" / "m.png").write_bytes(b"\x89PNG")
    return root


def test_paths_are_checked_before_beam(corpus: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    _fails(
        capsys,
        ["build", str(tmp_path / "nope"), str(out), *PLAN],
        2,
        f"INPUT {tmp_path / 'nope'} does not exist",
    )
    _fails(capsys, ["build", str(tmp_path / "nope" / "*.bin"), str(out), *PLAN], 2, "matches no file")
    root = _dataroot(tmp_path / "nusc", "v1.0-mini", "v1.0-trainval")
    _fails(capsys, ["build", str(root), str(out), *PLAN], 2, "is a nuScenes dataroot (found v1.0-mini, v1.0-trainval)",
           "add --nuscenes-version v1.0-mini")  # fmt: skip
    _fails(capsys, ["build", str(root), str(out), *PLAN, "--nuscenes-version", "v1.0-test"], 2,
           "--nuscenes-version v1.0-test", "present: v1.0-mini, v1.0-trainval")  # fmt: skip
    _fails(capsys, ["scan", str(root), str(out)], 2, "add --nuscenes-version v1.0-mini")
    _nothing_published(out)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    _fails(capsys, ["build", str(corpus), str(a_file), *PLAN], 2, f"OUT {a_file}", "not a directory")
    _fails(capsys, ["build", str(corpus), str(corpus), *PLAN], 2, f"OUT {corpus} is INPUT")
    _fails(capsys, ["build", str(corpus), str(corpus / "m"), *PLAN], 2, "is inside INPUT")
    assert not (corpus / "m").exists()
    foreign = tmp_path / "foreign"
    (foreign / "keep").mkdir(parents=True)
    _fails(capsys, ["build", str(corpus), str(foreign), *PLAN], 2, f"OUT {foreign}", "no _SUCCESS")
    assert (foreign / "keep").is_dir()


def test_unwritable_out_parent(corpus: Path, tmp_path: Path, capsys) -> None:
    if os.geteuid() == 0:  # root writes anywhere but in a pseudo filesystem
        parent = Path("/sys")
        if not parent.is_dir() or os.access(parent, os.W_OK) and _can_mkdir(parent):
            pytest.skip("no unwritable directory available as root")
    else:
        parent = tmp_path / "ro"
        parent.mkdir()
        parent.chmod(0o555)
    out = parent / "lidarshard-out"
    _fails(capsys, ["build", str(corpus), str(out), *PLAN], 2, f"OUT {out}: cannot write into {parent}")
    assert not out.exists()


def _can_mkdir(parent: Path) -> bool:
    try:
        (parent / ".lidarshard-probe-test").mkdir()
    except OSError:
        return False
    (parent / ".lidarshard-probe-test").rmdir()
    return True


def test_from_samples_is_checked_and_keeps_the_recorded_reject_fraction(
    previous: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "re"
    _fails(capsys, ["build", str(out), "--from-samples", str(tmp_path / "x.parquet"), *PLAN], 2,
           f"--from-samples {tmp_path / 'x.parquet'} does not exist")  # fmt: skip
    (tmp_path / "junk.parquet").write_text("not parquet")
    _fails(capsys, ["build", str(out), "--from-samples", str(tmp_path / "junk.parquet"), *PLAN], 2,
           "is not a readable Parquet file")  # fmt: skip
    pq.write_table(pa.table({"sample_id": ["a"], "x": [1]}), tmp_path / "other.parquet")
    _fails(capsys, ["build", str(out), "--from-samples", str(tmp_path / "other.parquet"), *PLAN], 2,
           "lacks columns", "pass a lidarshard run's samples (OUT/samples)")  # fmt: skip
    samples = str(previous / schemas.SAMPLES_DIR)
    _fails(capsys, ["build", str(out), "--from-samples", samples, "--world-size", "8", "--batch-size", "4"], 2,
           "--world-size 8 x --batch-size 4 = 32 samples per step", "holds 20")  # fmt: skip
    _nothing_published(out)
    # 1 reject of 21 is over the default 0.01, but the previous run recorded 0.1: the re-plan keeps it
    assert main(["build", str(out), "--from-samples", samples, *PLAN, *BEAM_TEST_FLAGS]) == 0
    assert json.loads((out / schemas.MANIFEST_FILE).read_text())["max_reject_fraction"] == 0.1


def test_too_many_rejects_leave_the_rejects_beside_out(corpus: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    rejects = Path(f"{out}.rejects.parquet")
    line = _fails(capsys, ["build", str(corpus), str(out), *PLAN], 1, "1 of 21 inputs rejected",
                  "truncated: 1", f"every reject with its reason is in {rejects}")  # fmt: skip
    assert "while running" not in line
    _nothing_published(out)
    assert pq.read_table(rejects).column("reason").to_pylist() == ["truncated"]
    _fails(capsys, ["scan", str(corpus), str(out)], 1, f"is in {rejects}")
    _nothing_published(out)
    assert main(["scan", str(corpus), str(out), "--max-reject-fraction", "0.5", *BEAM_TEST_FLAGS]) == 0
    assert not rejects.exists()  # a successful run removes a stale one


def test_failed_run_is_one_line_unless_debug(corpus: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    flags = ["--world-size", "8", "--batch-size", "4", "--max-reject-fraction", "0.5"]
    _fails(capsys, ["build", str(corpus), str(out), *flags], 1, "20 samples do not fill one step of W*B = 32")
    _nothing_published(out)
    assert main(["build", str(corpus), str(out), *flags, "--debug", *BEAM_TEST_FLAGS]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_beam_options_pass_through_and_version(capsys) -> None:
    args, beam = build_cli.parser().parse(["i", "o", *PLAN, "--runner", "FnApiRunner", "--experiments=a",
                                           "--experiments", "b", "--save_main_session", "--temp_location=gs://t"])  # fmt: skip
    assert beam == ["--runner=FnApiRunner", "--experiments=a", "--experiments=b", "--save_main_session",
                    "--temp_location=gs://t"]  # fmt: skip
    assert (args.input, args.out, args.world_size) == (["i"], "o", 2)
    assert main(["--version"]) == 0 and capsys.readouterr().out.startswith("lidarshard 0.")
    assert main(["buidl"]) == 2 and "did you mean build?" in capsys.readouterr().err
    assert main(["synth", "x", "--version", "v1.0-x"]) == 2
    assert "unknown flag --version; did you mean --nuscenes-version?" in capsys.readouterr().err


def test_runner_options_defined_beside_their_runner_pass_through() -> None:
    pytest.importorskip("distributed")  # the DaskRunner's options module needs dask
    _, beam = build_cli.parser().parse(["i", "o", *PLAN, "--runner=dask", "--dask_client_address=h:8786"])
    assert beam == ["--runner=dask", "--dask_client_address=h:8786"]


@pytest.mark.parametrize("command", ["synth", "scan", "build"])
def test_every_flag_has_help_and_its_default(command: str) -> None:
    from importlib import import_module

    parser: Parser = import_module(f"lidarshard.pipelines.{command}").parser()
    for action in parser._actions:
        if action.help == "==SUPPRESS==" or not action.option_strings or action.dest == "help":
            continue
        assert action.help, action.option_strings
        flagged = action.nargs == 0  # a switch: its help says what it turns on
        assert (
            flagged
            or "(default: " in action.help
            or "(required)" in action.help
            or "(default)" in action.help
        ), action.option_strings
    text = parser.format_help()
    for name in ("balanced", "random", "stratified", "megabatch") if command == "build" else ():
        assert f"{name}: " in text


@pytest.mark.parametrize("command", ["build", "synth"])
def test_the_cli_reference_flag_tables_are_the_parsers(command: str) -> None:
    """docs/CLI.md's flag tables are what the parsers declare: same flags, defaults and meanings."""
    from importlib import import_module

    reference = (Path(__file__).resolve().parents[1] / "docs" / "CLI.md").read_text()
    table = import_module(f"lidarshard.pipelines.{command}").parser().flag_table()
    assert table in reference, (
        f"docs/CLI.md's `{command}` flag table differs from the parser; paste:\n{table}"
    )


def test_the_cli_reference_states_the_default_runners() -> None:
    from lidarshard.pipelines import launch, synth

    readme = " ".join((Path(__file__).resolve().parents[1] / "docs" / "CLI.md").read_text().split())
    assert "`scan` and `build` run on the local DirectRunner on all cores (`multi_processing`)" in readme
    assert "`synth` runs in-process on the FnApiRunner" in readme
    assert synth.DEFAULT_RUNNER[0] == "--runner=FnApiRunner"
    opts = launch.beam_options([]).get_all_options()
    assert (opts["runner"], opts["direct_running_mode"]) == ("DirectRunner", "multi_processing")


def test_beam_root_logger_records_follow_the_beam_level() -> None:
    """Beam's import-time ``logging.warning`` (root logger) must not precede the one-line error."""

    def record(name: str, path: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, path, 1, "msg", None, None)

    beam_file = os.path.join(os.sep, "site-packages", "apache_beam", "io", "gcp", "x.py")
    quiet, debug = BeamRootRecords(logging.CRITICAL), BeamRootRecords(logging.WARNING)
    assert not quiet.filter(record("root", beam_file, logging.WARNING))
    assert debug.filter(record("root", beam_file, logging.WARNING))
    assert quiet.filter(record("root", "/work/train.py", logging.WARNING))  # a user's own root records stay
    assert quiet.filter(record("lidarshard", beam_file, logging.INFO))


def test_one_line_drops_the_class_paths_beam_wraps_around_an_error() -> None:
    from lidarshard.pipelines.cli import one_line

    wrapped = RuntimeError(
        "Traceback (most recent call last):\n  File x\n"
        "RuntimeError: lidarshard.transforms.features.accounting.TooManyRejects: 2 of 2 inputs rejected "
        "(nothing left to plan): truncated: 2 [while running 'Build/Settle']"
    )
    assert one_line(wrapped) == "2 of 2 inputs rejected (nothing left to plan): truncated: 2"
    assert one_line(ValueError("plain words: kept")) == "plain words: kept"


def _pool_of(env: dict[str, str]) -> list[str]:
    """(Arrow's default pool, JE_ARROW_MALLOC_CONF) of a fresh process that starts as ``lidarshard`` does."""
    code = (
        "import os; from lidarshard.pipelines import cli; cli.arrow_allocator(); import pyarrow as pa; "
        "print(pa.default_memory_pool().backend_name, os.environ.get('JE_ARROW_MALLOC_CONF'))"
    )
    keep = {
        k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "JE_ARROW_MALLOC_CONF")
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=keep | env, capture_output=True, text=True, check=True
    )
    assert not done.stderr, done.stderr  # no "unsupported backend" warning
    return done.stdout.split()


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="the CLI picks jemalloc on x86-64 Linux only",
)
def test_the_command_runs_on_jemalloc_with_one_arena_unless_the_environment_chooses() -> None:
    """The command line imports no pyarrow before ``main`` picks Arrow's pool (read when pyarrow loads): jemalloc
    with one arena, the faster and leaner one measured for build and validate; a user's choice stands."""
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow has no jemalloc")
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, lidarshard.pipelines.cli; print('pyarrow' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert imported.stdout.strip() == "False"
    assert _pool_of({}) == ["jemalloc", "narenas:1"]
    assert _pool_of({"ARROW_DEFAULT_MEMORY_POOL": "system"}) == ["system", "None"]
    assert _pool_of({"JE_ARROW_MALLOC_CONF": "narenas:2"}) == ["jemalloc", "narenas:2"]


def test_main_picks_the_pool_before_anything(monkeypatch, capsys) -> None:
    """``main`` calls ``arrow_allocator`` first (in this process pyarrow is loaded already: it changes nothing)."""
    from lidarshard.pipelines import cli

    called: list[bool] = []
    monkeypatch.setattr(cli, "arrow_allocator", lambda: called.append(True))
    assert main(["--version"]) == 0
    assert called == [True]
    monkeypatch.undo()
    before = dict(os.environ)
    cli.arrow_allocator()  # too late to choose here: nothing is set
    assert dict(os.environ) == before
