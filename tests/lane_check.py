"""What CI checks in an install lane's own venv, where pytest may be absent (``make demo``'s venv holds only
``.[pipeline,report]``): ``python -m tests.lane_check [MANIFEST]``.

1. Every product module (``lidarshard.*``) imports, or fails only for want of a product extra's package that
   this venv lacks (Beam, PyYAML, matplotlib, torch, ...); a package the product does not declare for users
   (pandas, only in ``[test]``) or a declared one that is installed yet fails is an error. (A package imported
   only when a function runs, as pyarrow 25's ``DataType.to_pandas_dtype`` imports pandas, shows in the lane's
   own runs: ``make demo``, ``validate`` and the reader below, in venvs without pandas.)
2. With MANIFEST: ``ManifestReader`` reads every rank of every epoch, and the samples it hands out are the
   plan's rows, each accepted sample as often as the manifest counts it (a reader's view of the contract).

Prints one line per problem and exits 1, else one summary line.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import sys
from collections import Counter
from pathlib import Path

import tomllib

#: Import names of distributions whose import name is not their own (others: ``-`` -> ``_``).
_IMPORT_NAMES = {
    "apache-beam": "apache_beam",
    "pyyaml": "yaml",
    "open3d-cpu": "open3d",
    "python-neo-lzf": "lzf",
}
#: Extras for the lanes' own tools, not for users' installs.
_TOOL_EXTRAS = ("test", "dev")


def _names(requirements: list[str]) -> set[str]:
    out = set()
    for req in requirements:
        dist = re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0].lower()
        if dist != "lidarshard":
            out.add(_IMPORT_NAMES.get(dist, dist.replace("-", "_")))
    return out


def optional_packages(pyproject: Path) -> set[str]:
    """Import names of the packages that the product's extras (not ``test``/``dev``) bring."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return set().union(*(_names(reqs) for name, reqs in extras.items() if name not in _TOOL_EXTRAS))


def _missing(e: BaseException) -> str:
    """The top-level package an ImportError (or the error it was raised from) could not find."""
    for err in (e, e.__cause__, e.__context__):
        name = getattr(err, "name", None)
        if name:
            return str(name).split(".")[0]
    return ""


def import_problems(optional: set[str]) -> tuple[list[str], str]:
    """(problems, what imported) over every module of the installed ``lidarshard`` package."""
    import lidarshard

    problems, imported, lacking = [], 0, Counter[str]()
    for info in pkgutil.walk_packages(lidarshard.__path__, "lidarshard."):
        try:
            importlib.import_module(info.name)
            imported += 1
        except ImportError as e:  # ModuleNotFoundError, or our own "needs the [extra]" ImportError
            missing = _missing(e)
            if missing not in optional:
                problems.append(
                    f"{info.name}: {type(e).__name__}: {e} (not a package a product extra declares)"
                )
            elif importlib.util.find_spec(missing) is not None:
                problems.append(f"{info.name}: {type(e).__name__}: {e} ({missing} is installed)")
            else:
                lacking[missing] += 1
    how = ", ".join(f"{n} need {name}" for name, n in sorted(lacking.items()))
    return problems, f"{imported} product modules import" + (f" (not installed here: {how})" if how else "")


def reader_problems(out: str) -> tuple[list[str], int]:
    """(problems, plan rows read) of reading every rank's plan of ``out`` with ``ManifestReader``."""
    import lidarshard
    from lidarshard.loaders.reader import load_manifest

    m = load_manifest(out)
    problems, rows = [], 0
    for epoch in range(m.epochs):
        seen: Counter[str] = Counter()
        for rank in range(m.world_size):
            for batch in lidarshard.ManifestReader(out, rank, m.world_size, epoch):
                seen.update(batch.sample_ids)
        rows += sum(seen.values())
        if sum(seen.values()) != m.counts.planned[epoch]:
            problems.append(
                f"epoch {epoch}: read {sum(seen.values())} rows, the manifest plans {m.counts.planned[epoch]}"
            )
        if m.policy == "drop_last" and max(seen.values(), default=1) > 1:
            problems.append(f"epoch {epoch}: a sample read twice under drop_last")
    return problems, rows


def main(argv: list[str]) -> int:
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    problems, line = import_problems(optional_packages(pyproject))
    if argv:
        more, rows = reader_problems(argv[0])
        problems += more
        line += f"; ManifestReader read {rows} plan rows of {argv[0]}"
    for p in problems:
        print(f"lane check: {p}")
    if not problems:
        print(f"lane check OK ({sys.prefix}): {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
