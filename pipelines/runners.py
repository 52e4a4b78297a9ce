"""Short runner names for ``--runner`` (``--runner=dask``) and where a runner's workers run, checked
before Beam starts.

Beam resolves ``--runner`` by class name or dotted path; ``dask`` is ours: Beam's in-tree
DaskRunner, which runs the pipeline on a ``dask.distributed`` cluster (``--dask_client_address=
HOST:PORT`` for an existing scheduler, else a LocalCluster on this machine). A runner whose workers
may be on other machines (Dataflow, a remote scheduler, master or job endpoint, containers) needs
INPUT and OUT where every worker reaches them: :func:`check_workers_reach`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

from lidarshard.pipelines.preflight import BuildSettings, ScanSettings
from lidarshard.transforms.io import storage
from lidarshard.transforms.value_checks import UsageError

__all__ = ["RUNNER_ALIASES", "check_workers_reach", "remote_workers", "resolve_runner", "run_paths"]

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


#: Runners whose workers run on this machine: in this process or processes it starts.
_LOCAL_RUNNERS = frozenset(
    {"direct", "fnapi", "bundlebaseddirect", "switchingdirect", "testdirect", "interactive"}
)
#: Portable runners (SDK workers per --environment_type) and the flag naming where their job runs.
_PORTABLE = {"flink": "flink_master", "spark": "spark_master_url", "portable": "job_endpoint", "prism": None}
_WHERE = ("flink_master", "spark_master_url", "job_endpoint")
_LOCAL_HOSTS = frozenset(
    {"localhost", "127.0.0.1", "::1", "[local]", "[auto]", "embed", socket.gethostname()}
)


def _is_local_address(address: str | None) -> bool:
    """``address`` (``HOST:PORT``, ``tcp://HOST:PORT``, ``spark://...``, ``local[4]``, ``[auto]``) is on this
    machine (None: the runner starts its own here)."""
    if address is None or address.lower() in _LOCAL_HOSTS or address.startswith("local"):
        return True
    host = urlsplit(address if "://" in address else f"x://{address}").hostname
    return host is not None and (host in _LOCAL_HOSTS or host.startswith("127."))


def _where_flags(beam_argv: Sequence[str]) -> argparse.Namespace:
    """The Beam flags that say where workers run (as Beam reads them: ``--f=v`` or ``--f v``, no abbreviations)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("runner", "dask_client_address", "environment_type", "environment_config", *_WHERE):
        p.add_argument(f"--{name}")
    return p.parse_known_args(list(beam_argv))[0]


def remote_workers(beam_argv: Sequence[str]) -> str | None:
    """The flags of ``beam_argv`` by which the runner's workers may run on other machines (e.g.
    ``--runner=DataflowRunner``), else None: this machine (the local runners; a LocalCluster; a scheduler,
    master or job endpoint on this host with workers in or beside the launcher, not in containers)."""
    ns = _where_flags(beam_argv)
    runner = ns.runner or "DirectRunner"
    kind = runner.rsplit(".", 1)[-1].lower().removesuffix("runner")
    if kind in _LOCAL_RUNNERS:
        return None
    if kind == "dask":  # without --dask_client_address: a LocalCluster on this machine
        address = ns.dask_client_address
        return None if _is_local_address(address) else f"--runner={runner} --dask_client_address={address}"
    if kind in _PORTABLE:
        flag = _PORTABLE[kind]
        where = getattr(ns, flag) if flag else None
        # no --environment_type: Flink/Spark on a local master and Prism run LOOPBACK; a PortableRunner, DOCKER
        env = (ns.environment_type or ("DOCKER" if kind == "portable" else "LOOPBACK")).upper()
        here = env in ("LOOPBACK", "PROCESS") or (
            env == "EXTERNAL" and _is_local_address(ns.environment_config)
        )
        if here and _is_local_address(where):
            return None
        said = f" --{flag}={where}" if flag and where else ""
        return f"--runner={runner}{said}" + (
            f" --environment_type={ns.environment_type}" if ns.environment_type else ""
        )
    return f"--runner={runner}"  # Dataflow, or a runner this check does not know


def check_workers_reach(beam_argv: Sequence[str], paths: Sequence[tuple[str, str]], shared: bool) -> None:
    """Refuse local ``paths`` ((what, path): INPUT, OUT, --from-samples) when the runner's workers may run
    elsewhere: they would not find INPUT, and what they write into OUT's staging directory would stay on
    their own disks (the run then fails half-way). ``shared`` (``--shared-filesystem``) asserts that the
    local paths are on a filesystem mounted at the same place on every worker.

    Raises:
        UsageError: one line naming the local paths, the runner and the two ways out.
    """
    local = [f"{what} {path}" for what, path in paths if storage.is_local(path)]
    where = None if shared or not local else remote_workers(beam_argv)
    if where is not None:
        raise UsageError(
            f"{' and '.join(local)} {'is a local path' if len(local) == 1 else 'are local paths'} but "
            f"{where} may run its workers on other machines, which do not see this machine's files: put INPUT "
            "and OUT in an object store every worker reaches (s3://BUCKET/..., gs://BUCKET/...; README, "
            "'Data in an object store'), or on a filesystem mounted at the same path on every worker and "
            "pass --shared-filesystem"
        )


def run_paths(settings: ScanSettings) -> list[tuple[str, str]]:
    """(what, path) of what a scan's or build's workers read or write: OUT, each INPUT, --from-samples."""
    from_samples = settings.options.from_samples if isinstance(settings, BuildSettings) else None
    return [
        ("OUT", settings.output),
        *(("INPUT", d.root) for d in settings.datasets),
        *([("--from-samples", from_samples)] if from_samples else []),
    ]
