"""Docs are tests: every fenced code block of README.md and docs/*.md is run here, on synthetic data.

What a doc writer needs to know:

* Every fence names its language. ```python and ```bash blocks run; ```text holds output
  listings, directory layouts and diagrams, and is never run.
* A block that cannot run here is marked on the line before its fence, with the reason:
  ``<!-- docs-test: parse-only (needs Dataflow) -->``. It is still checked: python with
  ``ast.parse``; bash with ``bash -n``, and per command: ``lidarshard <cmd> ...`` by that command's
  own parser (a flag that does not exist or a bad value fails; ``...`` stands for flags left out, so
  the required ones are filled in, and for INPUT OUT when it comes first), ``make TARGET`` with
  ``make -n``, ``python SCRIPT.py`` / ``python -m MODULE`` for the script or module, and
  ``pip install "lidarshard[EXTRA]"`` for the extra (the installed package's metadata).
* A runnable block runs in a fresh directory that holds what the docs name: ``DATAROOT`` (a
  ``lidarshard synth`` dataroot: 2 scenes x 4 keyframes, 2 sweeps per keyframe, v1.0-synth),
  ``OUT`` and ``VAL_OUT`` (manifests built from it for 1 rank x 2, 2 epochs), ``demo_out/dataroot``
  and ``demo_out/manifest`` (what ``make demo`` writes, smaller: 4 ranks x 2, 2 epochs), and the
  repository's ``examples/`` and ``benchmarks/``.
* bash: a command per line (``\\`` continues it, ``#`` starts a comment). Two kinds run:
  ``lidarshard ...`` (in this process, as the console script; a Beam command without ``--runner``
  runs on the FnApiRunner) and ``python SCRIPT.py ...`` (a subprocess). Anything else needs the mark.
* python: executed in this process, where a 1-rank gloo process group is initialized (as ``torchrun``
  would), with these names defined: ``model`` (a torch module: a ``collate`` batch -> per-sample
  losses, shape (B,)), ``optimizer``, ``checkpoint`` and ``ckpt`` (``{}``: a fresh start),
  ``epochs`` (2), ``out_dir`` (``"OUT"``), ``rank`` (0) and ``world_size`` (1).
* Every ``lidarshard-X.Y.Z`` (wheel or image tag) a block names is this version.

The shared manifests are built once per run of this module (FnApiRunner, ~8 s); the whole module
takes under a minute, half of it the one block that runs ``examples/train_ddp.py`` (marked ``slow``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import lidarshard
from lidarshard import schemas
from lidarshard.pipelines.cli import BEAM_COMMANDS, SUBCOMMANDS, main
from lidarshard.transforms.value_checks import UsageError

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = ("python", "bash", "text")
MARK = re.compile(r"<!-- docs-test: parse-only \((?P<why>[^()]+)\) -->")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VERSIONED = re.compile(r"lidarshard(?:-worker:|-)(\d+\.\d+\.\d+)")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code, and the mark before it (if any)."""

    doc: str  # "README.md", "docs/GUIDE.md"
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    mark: str | None  # the HTML comment on the line before the fence

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def parse_only(self) -> bool:
        return self.mark is not None


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of one markdown file, in order."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```(.*)$", lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = len(opening.group(1)), opening.group(2).strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = before if "docs-test" in before else None
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        found.append(Block(str(path.relative_to(REPO)), i + 1, lang, code, mark))
        i = end + 1
    return found


BLOCKS = [b for doc in DOCS for b in read_blocks(doc)]
CODE = [b for b in BLOCKS if b.lang in ("python", "bash")]
RUNNABLE = [b for b in CODE if not b.parse_only]
#: The README's closed loop (record, calibrate, re-plan, report): run by its own test, which reads its output.
LOOP = next(b for b in RUNNABLE if b.doc == "README.md" and "--replan-from" in b.code and "report" in b.code)


def _ids(blocks: list[Block]) -> list[str]:
    return [b.id for b in blocks]


def test_every_fence_names_its_language_and_every_mark_gives_a_reason() -> None:
    problems = [f"{b.id}: ```{b.lang} (use python, bash, or text for output and layouts)"
                for b in BLOCKS if b.lang not in LANGUAGES]  # fmt: skip
    problems += [f"{b.id}: {b.mark} (want <!-- docs-test: parse-only (why) -->)"
                 for b in BLOCKS if b.mark is not None and not MARK.fullmatch(b.mark)]  # fmt: skip
    problems += [
        f"{b.id}: a ```text block is never run; drop the mark" for b in BLOCKS if b.lang == "text" and b.mark
    ]
    assert not problems, "\n".join(problems)


def test_blocks_name_this_version() -> None:
    stale = [
        f"{b.id}: lidarshard {v}"
        for b in BLOCKS
        for v in VERSIONED.findall(b.code)
        if v != lidarshard.__version__
    ]
    assert not stale, f"this is lidarshard {lidarshard.__version__}:\n" + "\n".join(stale)


def test_the_manifest_reference_lists_every_reject_reason() -> None:
    readme = (REPO / "docs" / "MANIFEST.md").read_text()
    listed = readme.split("Reject reasons (`lidarshard.schemas.REJECT_REASONS`):", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"`(\w+)`", listed) == list(schemas.REJECT_REASONS)


def plan_columns_table() -> str:
    """docs/MANIFEST.md's table of the plan's columns, from the schema (its key, epoch and rank, first)."""
    rows = ["| column | type | meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | `{kind}` | {doc} |" for name, kind, doc in schemas.PLAN_FIELDS]
    return "\n".join(rows)


def test_the_manifest_reference_documents_every_plan_column() -> None:
    table = plan_columns_table()
    reference = (REPO / "docs" / "MANIFEST.md").read_text()
    assert table in reference, f"docs/MANIFEST.md's plan column table differs; paste:\n{table}"


def test_the_readme_is_a_page_a_newcomer_reads() -> None:
    """At most 200 lines: what it is, the two commands, the trainer's side, links; references live in docs/."""
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move reference material to docs/"


def _known_flags() -> set[str]:
    """Every flag of the lidarshard commands (Beam's options included) and of the tools, examples and
    benchmarks (their argparse declarations)."""
    known = {"--help", "--version"}
    for name in BEAM_COMMANDS:
        parser = importlib.import_module(SUBCOMMANDS[name][0]).parser()
        parser._add_beam_options()
        known |= set(parser.known_flags())
    for folder in ("tools", "examples", "benchmarks"):
        for script in (REPO / folder).glob("*.py"):
            known |= set(re.findall(r"[\"'](--[a-z][\w-]*)", script.read_text()))
    return known


def test_prose_names_real_flags() -> None:
    """A flag named in the text (`--flag ...` or `lidarshard CMD ... --flag`) exists."""
    known, unknown = _known_flags(), []
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for span in re.findall(r"`([^`\n]+)`", prose):
            if span.startswith(("--", "lidarshard ")):
                unknown += [f"{doc.name}: {flag} in `{span}`" for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", span)
                            if flag not in known]  # fmt: skip
    assert not unknown, "\n".join(unknown)


# ------------------------------------------------------------------------------------------ parsing


def _commands(code: str) -> list[list[str]]:
    """The bash block's simple commands as argv lists: continuations joined, comments dropped, split at
    ``&&``, ``||``, ``;``, ``|`` and ``&``, leading ``VAR=value`` assignments dropped."""
    commands: list[list[str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        current: list[str] = []
        for token in lexer:
            if token in ("&&", "||", ";", "|", "&"):
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    commands = [c[next((i for i, t in enumerate(c) if not ASSIGNMENT.match(t)), len(c)) :] for c in commands]
    return [c for c in commands if c]


def _parse_lidarshard(argv: list[str]) -> None:
    """``lidarshard ARGV`` parsed by the command's own parser (Beam commands; the tools' parsers live
    inside their ``run``, so for those the command's existence is checked)."""
    name, rest = argv[0], argv[1:]
    assert name in SUBCOMMANDS, f"lidarshard has no command {name!r}"
    if name not in BEAM_COMMANDS:
        return
    parser = importlib.import_module(SUBCOMMANDS[name][0]).parser()
    parser.raise_errors = True
    if "..." in rest:  # flags left out: fill the required ones (and INPUT OUT when they come first)
        rest = (["INPUT", "OUT"] if rest[0] == "..." else []) + [a for a in rest if a != "..."]
        for action in parser._actions:
            given = any(a == o or a.startswith(o + "=") for a in rest for o in action.option_strings)
            if action.required and action.option_strings and not given:
                rest += [action.option_strings[0], "1"]
    parser.parse(rest)


def _check_command(argv: list[str]) -> None:
    """What a parse-only command can be checked for without running it."""
    if argv[0] == "lidarshard":
        _parse_lidarshard(argv[1:])
    elif argv[0] == "make":
        for target in argv[1:]:
            r = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, f"make {target}: {r.stderr.strip()}"
    elif argv[0] == "python" and argv[1:2] == ["-m"]:
        assert importlib.util.find_spec(argv[2]) is not None, f"no module {argv[2]}"
    elif argv[0] == "python":
        assert (REPO / argv[1]).is_file(), f"no script {argv[1]}"
    elif argv[:2] == ["pip", "install"]:
        extras = importlib.metadata.metadata("lidarshard").get_all("Provides-Extra") or []
        for arg in argv[2:]:
            wanted = re.fullmatch(r"lidarshard\[([\w,]+)\]", arg)
            for extra in wanted.group(1).split(",") if wanted else ():
                assert extra in extras, f"lidarshard has no extra [{extra}]"


def test_the_checks_read_commands_as_bash_does_and_catch_drift() -> None:
    code = 'make wheel && pip install "lidarshard[gcp]"  # a comment\nIMAGE=x lidarshard build A B \\\n  --pad &\n'
    assert _commands(code) == [
        ["make", "wheel"],
        ["pip", "install", "lidarshard[gcp]"],
        ["lidarshard", "build", "A", "B", "--pad"],
    ]
    _parse_lidarshard(["build", "...", "--runner=PortableRunner", "--job_endpoint=localhost:8099"])
    with pytest.raises(UsageError, match="unknown flag --max-abs-coord"):
        _parse_lidarshard(
            ["build", "IN", "OUT", "--world-size", "2", "--batch-size", "2", "--max-abs-coord", "9"]
        )
    with pytest.raises(AssertionError, match=r"no extra \[gpu\]"):
        _check_command(["pip", "install", "lidarshard[gpu]"])


@pytest.mark.parametrize("block", CODE, ids=_ids(CODE))
def test_block_parses(block: Block) -> None:
    if block.lang == "python":
        ast.parse(block.code, block.id)
        return
    r = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{block.id}: {r.stderr}"
    for argv in _commands(block.code):
        _check_command(argv)


# ------------------------------------------------------------------------------------------ running


def _lidarshard(argv: list[str]) -> None:
    if argv[0] in BEAM_COMMANDS and not any(a.startswith("--runner") for a in argv):
        argv = [*argv, "--runner=FnApiRunner"]
    assert main(argv) == 0, f"lidarshard {shlex.join(argv)} failed"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template of every block's directory (see the module docstring); the dataroot beside it."""
    tmp = tmp_path_factory.mktemp("docs")
    data, template = tmp / "DATAROOT", tmp / "template"
    _lidarshard(
        [
            "synth",
            str(data),
            "--scenes",
            "2",
            "--keyframes-per-scene",
            "4",
            "--sweeps-per-keyframe",
            "2",
            "--labels",
        ]
    )
    scan = [str(data), "--nuscenes-version", "v1.0-synth", "--sweeps", "2", "--epochs", "2"]
    _lidarshard(
        ["build", scan[0], str(template / "OUT"), *scan[1:], "--world-size", "1", "--batch-size", "2"]
    )
    _lidarshard(["build", scan[0], str(template / "demo_out/manifest"), *scan[1:], "--world-size", "4",
                 "--batch-size", "2"])  # fmt: skip
    shutil.copytree(template / "OUT", template / "VAL_OUT")
    (template / "DATAROOT").symlink_to(data)
    (template / "demo_out" / "dataroot").symlink_to(data)
    for name in ("examples", "benchmarks"):
        (template / name).symlink_to(REPO / name)
    return template


@pytest.fixture
def workspace(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    ws = Path(shutil.copytree(built, tmp_path / "ws", symlinks=True))
    monkeypatch.chdir(ws)
    return ws


def _run_bash(block: Block, ws: Path) -> None:
    for argv in _commands(block.code):
        if argv[0] == "lidarshard":
            _lidarshard(argv[1:])
        elif argv[0] == "python" and argv[1:2] != ["-m"]:
            r = subprocess.run(
                [sys.executable, *argv[1:]], cwd=ws, capture_output=True, text=True, timeout=300
            )
            assert r.returncode == 0, f"{block.id}: {shlex.join(argv)}\n{r.stderr[-3000:]}"
        else:
            pytest.fail(f"{block.id}: `{shlex.join(argv)}` cannot run here: mark the block "
                        "<!-- docs-test: parse-only (why) -->")  # fmt: skip


def _namespace() -> dict:
    """The names a python block may use (see the module docstring)."""
    import torch

    class Model(torch.nn.Module):
        """Stand-in for a user's model: the per-sample mean squared distance of the points to a learnt radius."""

        def __init__(self) -> None:
            super().__init__()
            self.radius = torch.nn.Parameter(torch.zeros(()))

        def forward(self, batch: dict) -> torch.Tensor:
            per_point = (batch["points"][:, :3].norm(dim=1) - self.radius) ** 2
            total = torch.zeros(len(batch["num_points"])).index_add(0, batch["batch"], per_point)
            return total / batch["num_points"]

    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return {"__name__": "__docs__", "model": model, "optimizer": optimizer, "checkpoint": {}, "ckpt": {},
            "epochs": 2, "out_dir": "OUT", "rank": 0, "world_size": 1}  # fmt: skip


def _run_python(block: Block, ws: Path) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    code = compile("\n" * block.line + block.code, str(REPO / block.doc), "exec")  # tracebacks name doc lines
    dist.init_process_group("gloo", init_method=(ws / "dist_store").as_uri(), rank=0, world_size=1)
    try:
        exec(code, _namespace())  # noqa: S102 - the doc's own code
    finally:
        dist.destroy_process_group()


def _runnable(block: Block) -> object:
    """A runnable block as a test parameter; one that starts a training script is ``slow``."""
    slow = block.lang == "bash" and any(argv[0] == "python" for argv in _commands(block.code))
    return pytest.param(block, id=block.id, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("block", [_runnable(b) for b in RUNNABLE if b is not LOOP])
def test_block_runs(block: Block, workspace: Path) -> None:
    if block.lang == "python":
        _run_python(block, workspace)
    else:
        _run_bash(block, workspace)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_closed_loop_ends_with_a_prediction_beside_the_measurement(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's closed loop as a new user runs it: train recording every epoch (the last included),
    calibrate, re-plan epoch 1 with the fit, train the re-plan, report: epoch 1 is predicted in seconds
    and measured (it said "no predicted time" when the path planned with voxels)."""
    _run_bash(LOOP, workspace)
    printed = capsys.readouterr().out
    recorded = sorted(p.name for p in (workspace / "demo_out" / "timings").glob("timings-rank-*.parquet"))
    assert recorded == [f"timings-rank-{r:05d}-part-{e:05d}.parquet" for r in range(4) for e in range(2)]
    line = r"^  epoch 1: predicted [0-9.]+ s for 1 steps, measured [0-9.]+ s \([+-][0-9.]+%\)$"
    assert re.search(line, printed, re.M), printed[-3000:]


def _documented(doc: str, after: str) -> dict[str, tuple[str, str]]:
    """{key: (type, shape)} of the first table after the line of ``doc`` holding ``after``."""
    text = (REPO / doc).read_text().split(after, 1)[1]
    rows = re.findall(
        r"^\| `([^`]+)` \| `([^`]+)` \| `([^`]+)` \|", text.split("\n\n|", 1)[1].split("\n\n")[0], re.M
    )
    return {key: (kind, shape) for key, kind, shape in rows}


def _holds(value: object, kind: str, shape: str, sizes: dict[str, int]) -> bool:
    """``value`` is of the documented ``kind`` (``torch.float32``, ``int``, ``list[str]``...) and ``shape``
    (``(N, C)``, ``(sum N,)``, ``()``), its symbols' sizes in ``sizes``."""
    import torch

    dims = tuple(sizes[d.strip()] for d in shape.strip("()").split(",") if d.strip())
    if kind.startswith("torch."):
        return isinstance(value, torch.Tensor) and str(value.dtype) == kind and tuple(value.shape) == dims
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value) and (len(value),) == dims
    return type(value).__name__ == kind and dims == ()


def test_the_documented_batch_format_is_a_real_batch(workspace: Path) -> None:
    """The README's tables of ``dataset[i]`` and of a ``collate`` batch hold for a real one, keys, types and
    shapes, with labels and without."""
    pytest.importorskip("torch")
    from lidarshard.loaders.torch import PointCloudDataset, collate

    item_doc = _documented("README.md", "`dataset[i]` (`PointCloudDataset(")
    batch_doc = _documented("README.md", "`collate(items)` concatenates")
    for labels in (True, False):
        items = [PointCloudDataset("OUT", labels=labels)[i] for i in (0, 1)]
        batch = collate(items)
        (n0, c), n1 = items[0]["points"].shape, len(items[1]["points"])
        for got, doc, sizes in ((items[0], item_doc, {"N": n0, "C": c}),
                                (batch, batch_doc, {"B": 2, "sum N": n0 + n1, "C": c})):  # fmt: skip
            expected = {k for k in doc if labels or k != "labels"}
            assert set(got) == expected, (sorted(got), sorted(expected))
            wrong = [k for k in expected if not _holds(got[k], *doc[k], sizes)]
            assert not wrong, {k: (type(got[k]), getattr(got[k], "dtype", None), doc[k]) for k in wrong}


# ------------------------------------------------------------------------------------------ modules

PRODUCT = ("pipelines", "transforms", "schemas", "loaders", "tools")


def _module_rows() -> dict[str, set[str]]:
    """docs/MODULES.md's table: each row's first cell (a folder ``x/`` or files ``x.py``) -> the backticked
    identifiers of its text."""
    rows: dict[str, set[str]] = {}
    for line in (REPO / "docs" / "MODULES.md").read_text().splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not cells[1].strip().startswith("`"):
            continue
        names = set(re.findall(r"`([A-Za-z_]\w*)`", cells[2]))
        for where in re.findall(r"`([\w/.]+)`", cells[1]):
            rows[where] = names
    return rows


def _defined(module: Path) -> set[str]:
    """The top-level names a module defines or imports."""
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_the_module_map_names_every_module_and_only_real_names() -> None:
    """docs/MODULES.md names every product module in its folder's row (or as a file of its own), and every
    identifier a row names is a module of that row or a name one of them defines."""
    rows, problems = _module_rows(), []
    for module in sorted(
        p for folder in PRODUCT for p in (REPO / folder).rglob("*.py") if p.name != "__init__.py"
    ):
        path = str(module.relative_to(REPO))
        folder = str(module.parent.relative_to(REPO)) + "/"
        if path not in rows and module.stem not in rows.get(folder, set()):
            problems.append(f"{path}: not named in docs/MODULES.md (its row: `{folder}`)")
    for where, names in rows.items():
        files = [REPO / where] if where.endswith(".py") else sorted((REPO / where).glob("*.py"))
        files += [REPO / w for w in rows if w.endswith(".py") and rows[w] is names and w != where]
        if not files or not all(f.exists() for f in files):
            problems.append(f"`{where}`: no such module or folder")
            continue
        known = {"lidarshard", *SUBCOMMANDS, *(f.stem for f in files)}  # the commands, by name
        known |= {p.name for p in (REPO / where).glob("*/")} if where.endswith("/") else set()
        for f in files:
            known |= _defined(f)
        problems += [
            f"`{where}` names `{n}`: no module there, nor a name one defines" for n in sorted(names - known)
        ]
    assert not problems, "\n".join(problems)
