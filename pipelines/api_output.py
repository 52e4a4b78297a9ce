"""What a run of the Python API shows: its own one-line error, and nothing of Beam's on the caller's stderr.

The command decides its output once per process (``cli.configure``, ``cli.running``: fd 2 on /dev/null
while the pipeline runs). An API call runs inside someone else's program, so it changes nothing for
longer than its run and throws nothing away: Beam's records and whatever the run writes to fd 2 (worker
processes, the SDK harness's printed tracebacks) are re-logged at DEBUG on the ``lidarshard.beam`` logger.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from lidarshard.pipelines.cli import BeamRootRecords, one_line
from lidarshard.transforms.value_checks import UsageError

__all__ = ["BEAM_LOGGER", "beam_output_held"]

#: Where an API run's Beam output goes, at DEBUG.
BEAM_LOGGER = "lidarshard.beam"


class _HeldBeamRecords(logging.Handler):
    """Beam's log records of one API run, re-logged at DEBUG on ``lidarshard.beam``."""

    def emit(self, record: logging.LogRecord) -> None:
        _BEAM_LOG.debug("%s: %s", record.name, record.getMessage(), exc_info=record.exc_info)


_BEAM_LOG = logging.getLogger(BEAM_LOGGER)


@contextmanager
def beam_output_held() -> Iterator[None]:
    """Around one API run: nothing of Beam's reaches the caller's stderr. Beam's logger (and its records on
    the root logger, ``BeamRootRecords``) and file descriptor 2 (what worker processes and the SDK harness
    write, as ``cli.running`` hides it for the command) go to the ``lidarshard.beam`` logger at DEBUG;
    a failed run raises its innermost error as one line (``cli.one_line``), the original logged there too.

    Raises:
        UsageError: as raised inside (a check before Beam).
        Exception: the run failed: the same type with the one line (``RuntimeError`` when that type
            does not show the line as given).
    """
    beam, root = logging.getLogger("apache_beam"), logging.getLogger()
    held, hidden, propagate = _HeldBeamRecords(), BeamRootRecords(logging.CRITICAL + 1), beam.propagate
    beam.addHandler(held)
    beam.propagate = False
    root.addFilter(hidden)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        except UsageError:
            raise
        except Exception as e:
            _BEAM_LOG.debug("the run failed", exc_info=e)
            raise _one_line_error(e) from None
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            root.removeFilter(hidden)
            beam.propagate = propagate
            beam.removeHandler(held)
            caught.seek(0)
            text = caught.read().decode("utf-8", "replace")
            if text:
                _BEAM_LOG.debug("stderr of the run:\n%s", text)


def _one_line_error(e: Exception) -> Exception:
    """``e`` with its message cut to the one line a person needs (``cli.one_line``)."""
    line = one_line(e)
    try:
        same = type(e)(line)
    except Exception:
        return RuntimeError(line)
    return same if str(same) == line else RuntimeError(line)  # BeamIOError appends its exceptions
