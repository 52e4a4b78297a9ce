"""Several outputs from one DoFn, correct on every runner: tagged records split by filters.

Beam's ``ParDo(...).with_outputs(...)`` is the usual way, but on the DaskRunner (apache-beam 2.77)
every tag receives every output (``benchmarks/dask_multi_output_repro.py``). So a DoFn yields
``(tag, value)`` pairs on its one output and ``SplitTags`` turns them into one PCollection per tag
with one single-output filter each; ``GatherTagged`` is the reverse, for a step that needs the
results of several others.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam

__all__ = ["SplitTags", "GatherTagged", "tag", "by_tag"]

_SENTINEL = "_lidarshard_gather_start"
#: Each pipeline's one sentinel PCollection, read by all of its gathers: a ``Create`` is a stage of its own
#: on the portable runners (~40 ms of a small build each), and one serves every gather.
_STARTS: weakref.WeakKeyDictionary[beam.Pipeline, beam.PCollection] = weakref.WeakKeyDictionary()


def _only(record: tuple[str, Any], tag: str, tags: Sequence[str]) -> Iterator[Any]:
    got, value = record
    if got == tag:
        yield value
    elif got not in tags:  # a typo in a DoFn would otherwise drop records silently
        raise ValueError(f"record tagged {got!r}, expected one of {list(tags)}")


class SplitTags(beam.PTransform):
    """PCollection of ``(tag, value)`` -> ``{tag: PCollection of value}`` for each of ``tags``."""

    def __init__(self, *tags: str) -> None:
        super().__init__()
        self._tags = tags

    def expand(self, pcoll: beam.PCollection) -> dict[str, beam.PCollection]:
        return {t: pcoll | f"Only_{t}" >> beam.FlatMap(_only, t, self._tags) for t in self._tags}


def tag(pcoll: beam.PCollection, name: str) -> beam.PCollection:
    """Each value ``v`` of ``pcoll`` as ``(name, v)``; the step is labelled ``Tag_<name>``."""
    return pcoll | f"Tag_{name}" >> beam.Map(lambda v, t: (t, v), name)


def by_tag(records: Iterable[tuple[str, Any]]) -> dict[str, list[Any]]:
    """``(tag, value)`` records -> ``{tag: [values]}`` (values in arrival order: sort before use)."""
    out: dict[str, list[Any]] = {}
    for t, value in records:
        out.setdefault(t, []).append(value)
    return out


class GatherTagged(beam.PTransform):
    """Several PCollections of ``(tag, value)`` -> ONE element ``{tag: [values]}`` (``by_tag``),
    also when all of them are empty (``{}``). Tags without values are absent from the dict.

    What a step needs from several upstream steps arrives as its main input, never as singleton
    side inputs, and no ``CombineGlobally`` with defaults is involved (it injects its default
    through a side input): the DaskRunner recomputes a side input's whole upstream graph in
    every task that reads it (apache-beam 2.77), which ran the scan up to 7 times per build and
    rewrote staged files while other tasks read them. One sentinel record makes the single
    GroupByKey group exist even for empty inputs; the pipeline's gathers share it (one ``Create``).
    """

    def expand(self, pcolls: Iterable[beam.PCollection]) -> beam.PCollection:
        pcolls = tuple(pcolls)
        pipeline = pcolls[0].pipeline
        start = _STARTS.get(pipeline)
        if start is None:
            start = _STARTS[pipeline] = pipeline | "Start" >> beam.Create([(_SENTINEL, None)])
        return (
            (start, *pcolls)
            | "Flatten" >> beam.Flatten()
            | "OneKey" >> beam.Map(lambda record: (0, record))
            | "Group" >> beam.GroupByKey()
            | "ByTag" >> beam.MapTuple(lambda _, records: by_tag(r for r in records if r[0] != _SENTINEL))
        )
