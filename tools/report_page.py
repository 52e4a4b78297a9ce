"""The report's HTML page: what the plan buys first, the summary, every figure with its caption, and
what each number means (``explain.COLUMNS`` and the report's own ``REPORT_COLUMNS``)."""

from __future__ import annotations

import html
import re

from lidarshard.transforms.plan.explain import COLUMNS

__all__ = ["REPORT_COLUMNS", "epoch_figure", "page"]

#: ``step_balance-epoch-2.png``: the per-step figure of another epoch than the first shown.
_EPOCH = re.compile(r"-epoch-(\d+)(?=\.png$)")


def epoch_figure(name: str, epoch: int, first: bool) -> str:
    """The file name of a per-step figure: ``name`` for the first epoch shown, ``<stem>-epoch-E.png`` after."""
    return name if first else name.replace(".png", f"-epoch-{epoch}.png")


def _epoch_of(name: str) -> int:
    found = _EPOCH.search(name)
    return -1 if found is None else int(found[1])


def caption(name: str, cap: str) -> str:
    """A figure's caption, naming its epoch when it is another epoch's (``epoch_figure``)."""
    epoch = _epoch_of(name)
    return cap if epoch < 0 else f"Epoch {epoch}: {cap}"


_FIGURES = [
    ("sizes.png", "Predicted cost per sample, coloured by bucket; dashed lines are the bucket edges."),
    (
        "step_balance.png",
        "Slowest and mean rank load at every step (top) and their ratio (bottom): the chosen plan "
        "vs a random plan of the same pool. DDP waits for the slowest rank, so a ratio of 1.0 is "
        "ideal; a cheap step weighs little in the linearity.",
    ),
    ("rank_totals.png", "Each rank's total predicted cost per epoch relative to the mean rank."),
    ("buckets.png", "How many samples of each cost bucket every step holds (all ranks together)."),
    ("rejects.png", "Inputs left out of the manifest, by reason (details in rejects.parquet)."),
    (
        "repeat.png",
        "Repeat factors / sample weights: expected copies per epoch of the samples holding each lidarseg "
        "class (or of all samples), and the copies each epoch's seeded stochastic rounding realized.",
    ),
    (
        "predicted_vs_measured.png",
        "Predicted cost vs measured time from the timings CSV: a straight, "
        "tight cloud means the cost model ranks samples the way the hardware does.",
    ),
]


#: The report's own numbers (beside the build's, ``explain.COLUMNS``): name as printed -> meaning.
REPORT_COLUMNS = {
    "worst step max/mean": "the slowest rank's cost / the mean rank's at the most uneven step of the epoch",
    "rank totals within": "the largest difference of one rank's total cost over the epoch from the mean rank's",
}


def page(out: str, lines: list[str], names: set[str], lead: int) -> bytes:
    """The page: the first ``lead`` lines (what the plan buys) as its opening paragraph, the rest of the
    summary, the figures, and what each number means."""
    m = html.escape
    figs = "".join(
        f'<figure><img src="{name}" alt="{m(name)}"><figcaption>{m(caption(name, cap))}</figcaption></figure>\n'
        for base, cap in _FIGURES
        for name in sorted((n for n in names if _EPOCH.sub("", n) == base), key=_epoch_of)
    )
    words = "".join(f"<dt>{m(k)}</dt><dd>{m(v)}</dd>" for k, v in (COLUMNS | REPORT_COLUMNS).items())
    body = (
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>lidarshard report</title>\n"
        "<style>body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}"
        "pre{background:#f4f4f4;padding:1em;white-space:pre-wrap}img{max-width:100%}"
        "figure{margin:2em 0}figcaption{color:#555;font-size:90%}dt{font-weight:bold}"
        "dd{margin:0 0 .6em 1.5em}#buys{font-size:110%}</style></head><body>\n"
        f"<h1>lidarshard report</h1>\n<p id='buys'>{'<br>'.join(map(m, lines[:lead]))}</p>\n"
        f"<p>{m(out)}</p>\n<pre>{m(chr(10).join(lines[lead:]))}</pre>\n{figs}"
        f"<h2>What the numbers mean</h2>\n<dl>{words}</dl>\n</body></html>\n"
    )
    return body.encode()
