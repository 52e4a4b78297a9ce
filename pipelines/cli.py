"""The ``lidarshard`` command: ``lidarshard <subcommand> ...``; each subcommand is a module's ``run``."""

from __future__ import annotations

import importlib
import logging
import os
import sys

__all__ = ["main", "SUBCOMMANDS"]

#: subcommand -> (module with ``run(argv) -> int``, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("lidarshard.pipelines.synth", "write a nuScenes-style synthetic dataroot"),
    "scan": ("lidarshard.pipelines.scan", "size features of every point cloud; bad input to rejects.parquet"),
    "build": (
        "lidarshard.pipelines.build",
        "scan + cost + buckets + balanced rank-sharded Parquet manifests",
    ),
    "validate": ("lidarshard.pipelines.tools.validate", "check a manifest directory against the contract"),
    "report": ("lidarshard.pipelines.tools.report", "plots and a summary of a manifest directory"),
    "calibrate": (
        "lidarshard.pipelines.tools.calibrate",
        "fit the linear cost model to measured step timings",
    ),
}


def _usage() -> str:
    lines = ["usage: lidarshard <command> [args] [beam pipeline options]", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "lidarshard <command> --help for its flags; unknown flags go to Beam (--runner, ...)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"lidarshard: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Beam relays every worker's start-up warnings; keep them for debugging only (LIDARSHARD_BEAM_LOG_LEVEL=INFO).
    logging.getLogger("apache_beam").setLevel(os.environ.get("LIDARSHARD_BEAM_LOG_LEVEL", "ERROR"))
    logging.getLogger("distributed").setLevel(logging.WARNING)  # --runner=dask: a line per connection
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "apache_beam":
            raise
        print(f'lidarshard {name}: needs Apache Beam: pip install "lidarshard[pipeline]"', file=sys.stderr)
        return 2
    return int(module.run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
