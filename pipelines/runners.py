"""Short runner names for ``--runner`` (``--runner=dask``), checked before Beam starts.

Beam resolves ``--runner`` by class name or dotted path; ``dask`` is ours: Beam's in-tree
DaskRunner, which runs the pipeline on a ``dask.distributed`` cluster (``--dask_client_address=
HOST:PORT`` for an existing scheduler, else a LocalCluster on this machine).
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Sequence

from lidarshard.transforms.value_checks import UsageError

__all__ = ["RUNNER_ALIASES", "resolve_runner"]

#: alias -> (Beam runner path, module that must be importable, pip extra that provides it)
RUNNER_ALIASES: dict[str, tuple[str, str, str]] = {
    "dask": ("apache_beam.runners.dask.dask_runner.DaskRunner", "distributed", "lidarshard[dask]"),
}


def _known() -> list[str]:
    """Beam's runner names (``StandardOptions.KNOWN_RUNNER_NAMES``) and our aliases."""
    from apache_beam.options.pipeline_options import StandardOptions

    return [*StandardOptions.KNOWN_RUNNER_NAMES, *RUNNER_ALIASES]


def _alias(name: str) -> str:
    if name.lower() not in RUNNER_ALIASES:
        known = _known()
        if "." not in name and name not in known:  # a dotted name is a runner class of the user's
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UsageError(f"--runner {name} is not a runner: {hint}(one of {', '.join(sorted(known))})")
        return name
    path, module, extra = RUNNER_ALIASES[name.lower()]
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"lidarshard: --runner={name} needs {module}: pip install '{extra}'")
    return path


def resolve_runner(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--runner=ALIAS`` / ``--runner ALIAS`` replaced by the Beam runner's path.

    Raises:
        SystemExit: one line naming the extra to install when the alias's runner is missing.
        UsageError: an unknown runner name, with the nearest known one ("did you mean").
    """
    out, args = [], list(argv)
    for i, a in enumerate(args):
        if a.startswith("--runner="):
            a = "--runner=" + _alias(a.split("=", 1)[1])
        elif i > 0 and args[i - 1] == "--runner":
            a = _alias(a)
        out.append(a)
    return out
