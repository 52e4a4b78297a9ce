"""SplitTags / GatherTagged: several outputs and several inputs without multi-output ParDos or
singleton side inputs (both misbehave on the DaskRunner; the Dask run is in test_runners.py)."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from lidarshard.transforms.beam.tagged import GatherTagged, SplitTags, by_tag, tag

OPTIONS = ["--runner=FnApiRunner"]


def _parity(n: int):
    yield ("even" if n % 2 == 0 else "odd"), n


def test_split_tags_sends_each_record_to_its_tag_only() -> None:
    with test_pipeline.TestPipeline(argv=OPTIONS) as p:
        split = p | beam.Create(range(10)) | beam.FlatMap(_parity) | SplitTags("even", "odd")
        assert_that(split["even"], equal_to([0, 2, 4, 6, 8]), label="Even")
        assert_that(split["odd"], equal_to([1, 3, 5, 7, 9]), label="Odd")


def test_split_tags_refuses_an_unknown_tag() -> None:
    with pytest.raises(Exception, match="record tagged 'typo', expected one of"):
        with test_pipeline.TestPipeline(argv=OPTIONS) as p:
            _ = p | beam.Create([("typo", 1)]) | SplitTags("even", "odd")


def test_gather_tagged_gives_one_dict_of_every_tag() -> None:
    with test_pipeline.TestPipeline(argv=OPTIONS) as p:
        a = p | "A" >> beam.Create([1, 2, 3])
        b = p | "B" >> beam.Create(["x"])
        got = (
            (tag(a, "a"), tag(b, "b"))
            | GatherTagged()
            | beam.Map(lambda g: {k: sorted(v) for k, v in g.items()})
        )
        assert_that(got, equal_to([{"a": [1, 2, 3], "b": ["x"]}]))


def test_gather_tagged_of_empty_inputs_is_one_empty_dict() -> None:
    with test_pipeline.TestPipeline(argv=OPTIONS) as p:
        empty = p | beam.Create([])
        assert_that((tag(empty, "a"),) | GatherTagged(), equal_to([{}]))


def test_by_tag_groups_in_arrival_order() -> None:
    assert by_tag([("a", 2), ("b", 0), ("a", 1)]) == {"a": [2, 1], "b": [0]}
