"""Short runner names for ``--runner`` (``--runner=dask``), checked before Beam starts.

Beam resolves ``--runner`` by class name or dotted path; ``dask`` is ours: Beam's in-tree
DaskRunner, which runs the pipeline on a ``dask.distributed`` cluster (``--dask_client_address=
HOST:PORT`` for an existing scheduler, else a LocalCluster on this machine).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

__all__ = ["RUNNER_ALIASES", "resolve_runner"]

#: alias -> (Beam runner path, module that must be importable, pip extra that provides it)
RUNNER_ALIASES: dict[str, tuple[str, str, str]] = {
    "dask": ("apache_beam.runners.dask.dask_runner.DaskRunner", "distributed", "lidarshard[dask]"),
}


def _alias(name: str) -> str:
    if name.lower() not in RUNNER_ALIASES:
        return name
    path, module, extra = RUNNER_ALIASES[name.lower()]
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"lidarshard: --runner={name} needs {module}: pip install '{extra}'")
    return path


def resolve_runner(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--runner=ALIAS`` / ``--runner ALIAS`` replaced by the Beam runner's path.

    Raises:
        SystemExit: one line naming the extra to install when the alias's runner is missing.
    """
    out, args = [], list(argv)
    for i, a in enumerate(args):
        if a.startswith("--runner="):
            a = "--runner=" + _alias(a.split("=", 1)[1])
        elif i > 0 and args[i - 1] == "--runner":
            a = _alias(a)
        out.append(a)
    return out
