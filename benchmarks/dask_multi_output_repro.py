"""Minimal reproduction of two DaskRunner bugs (apache-beam 2.77) that lidarshard works around.

1. A multi-output ParDo (``.with_outputs("odd", main="even")``) delivers ALL its outputs to every
   tag: each tag's consumers see the elements of both.
2. Only the transform applied last, and what it depends on, is computed: a branch that the last
   transform does not consume (a second sink) never runs.

``python benchmarks/dask_multi_output_repro.py`` (needs ``apache-beam[dask]``) runs both pipelines on
the FnApiRunner and on the DaskRunner (a LocalCluster it starts) and prints what each got. Exit
status 1 when the DaskRunner differs from the FnApiRunner (a bug is present), 0 when they agree.
The ``__main__`` guard is required: the LocalCluster's worker processes re-import this module.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

DASK = "--runner=apache_beam.runners.dask.dask_runner.DaskRunner"


class _Split(beam.DoFn):
    def process(self, n: int):
        yield n if n % 2 == 0 else beam.pvalue.TaggedOutput("odd", n)


def _report(_, out: Path, even: list[int], odd: list[int]) -> None:
    out.write_text(f"even {sorted(even)}  odd {sorted(odd)}")


def tags(flags: list[str], out: Path) -> str:
    """Bug 1: split range(10) by parity; one final step receives both tags (so both are computed)."""
    with beam.Pipeline(options=PipelineOptions(flags)) as p:
        split = p | beam.Create(range(10)) | beam.ParDo(_Split()).with_outputs("odd", main="even")
        lists = [
            beam.pvalue.AsSingleton(split[t] | f"List{t}" >> beam.combiners.ToList()) for t in ("even", "odd")
        ]
        _ = p | "Once" >> beam.Create([None]) | beam.Map(_report, out, *lists)
    return out.read_text()


def sinks(flags: list[str], out: Path) -> str:
    """Bug 2: two independent sinks; which of them ran?"""
    with beam.Pipeline(options=PipelineOptions(flags)) as p:
        for name in ("first", "second"):
            _ = (
                p
                | f"Create{name}" >> beam.Create([name])
                | f"Touch{name}" >> beam.Map(lambda n: (out / n).touch())
            )
    return " ".join(n for n in ("first", "second") if (out / n).exists()) or "<none>"


def main() -> int:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for runner, flags in (("FnApiRunner", ["--runner=FnApiRunner"]), ("DaskRunner", [DASK])):
            Path(tmp, runner).mkdir()
            results[runner] = (tags(flags, Path(tmp, runner, "tags")), sinks(flags, Path(tmp, runner)))
    print(f"apache-beam {beam.__version__}")
    for runner, (got_tags, got_sinks) in results.items():
        print(f"{runner:>11}: multi-output ParDo: {got_tags};  sinks that ran: {got_sinks}")
    same = results["DaskRunner"] == results["FnApiRunner"]
    print("DaskRunner agrees with FnApiRunner" if same else "BUG: DaskRunner differs from FnApiRunner")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
