"""``lidarshard report``'s page in a real browser: headless Chromium (Debian's ``chromium`` package, which
the Makefile's oracles step installs when it runs as root) opens ``OUT/report/report.html`` from disk
(``file://``, no network, a fresh profile). Every image must decode (``naturalWidth > 0``), and the page
must open with what the plan buys, in the words of the build's summary (one function: ``plan_buys``).
Skipped where no Chromium is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from html import unescape
from pathlib import Path

import pytest

from lidarshard import schemas
from lidarshard.pipelines import build as build_cli
from lidarshard.pipelines.cli import main as cli_main
from lidarshard.schemas.manifest import Manifest
from lidarshard.tools import report
from lidarshard.transforms.io import storage
from lidarshard.transforms.plan.explain import plan_buys
from tests.helpers import build_bins_manifest

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (make test installs Debian's as root)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip

#: Appended to a copy of the page: once everything has loaded, each <img> reports what it decoded to.
PROBE = """<script>
window.addEventListener('load', function () {
  var rows = Array.prototype.map.call(document.images, function (img) {
    return img.getAttribute('src') + '=' + (img.complete ? img.naturalWidth + 'x' + img.naturalHeight : 'pending');
  });
  document.body.setAttribute('data-images', rows.join(' '));
});
</script>"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = build_bins_manifest(tmp_path_factory.mktemp("browser"), 40, world_size=3, batch_size=2)
    assert cli_main(["report", str(out)]) == 0
    return out


def _dom(page: Path, profile: Path) -> str:
    """The page's DOM after load, as headless Chromium serializes it (``--dump-dom``)."""
    args = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom"]
    r = subprocess.run([*args, page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _probed(page: Path, name: str, replace: tuple[str, str] = ("", "")) -> Path:
    """A copy of ``page`` beside it (the same relative image paths) with ``PROBE`` appended."""
    text = page.read_text().replace(*replace) if replace[0] else page.read_text()
    copy = page.with_name(name)
    copy.write_text(text.replace("</body>", PROBE + "</body>"))
    return copy


def _decoded(dom: str) -> dict[str, tuple[int, int]]:
    """{img src: (naturalWidth, naturalHeight)} the probe recorded; (0, 0) for one still pending."""
    found = re.search(r'data-images="([^"]*)"', dom)
    assert found, "the probe did not run: no data-images on <body>"
    out = {}
    for row in unescape(found.group(1)).split():
        src, size = row.rsplit("=", 1)
        w, h = (int(v) for v in size.split("x")) if "x" in size else (0, 0)
        out[src] = (w, h)
    return out


def test_every_image_of_the_report_loads_in_chromium(built: Path, tmp_path: Path) -> None:
    folder = built / report.REPORT_DIR
    page = folder / "report.html"
    srcs = re.findall(r'<img src="([^"]+)"', page.read_text())
    assert len(srcs) >= 5 and len(set(srcs)) == len(srcs)
    decoded = _decoded(_dom(_probed(page, "probe.html"), tmp_path / "profile"))
    assert sorted(decoded) == sorted(srcs)
    for src, (w, h) in decoded.items():
        assert w > 0 and h > 0, f"{src} did not load in Chromium"
    # the probe can tell: an image that is not there decodes to nothing
    broken = _probed(page, "broken.html", (f'src="{srcs[0]}"', 'src="missing.png"'))
    assert _decoded(_dom(broken, tmp_path / "profile2"))["missing.png"][0] == 0


def test_the_report_opens_with_what_the_plan_buys(built: Path, tmp_path: Path, capsys) -> None:
    m = Manifest.from_json(storage.read_json(storage.join(str(built), schemas.MANIFEST_FILE)))
    words = [plan_buys(b) for b in m.balance]
    assert all(words) and len(words) == m.epochs
    capsys.readouterr()
    build_cli.print_summary(str(built))
    summary = capsys.readouterr().out.splitlines()
    assert [line for line in summary if "a random plan's" in line] == words  # the CLI says the same
    dom = _dom(built / report.REPORT_DIR / "report.html", tmp_path / "profile")
    body = dom.split("<body", 1)[1]
    first = re.search(r"<p\b[^>]*>(.*?)</p>", body, re.S)
    assert first and 'id="buys"' in first.group(0), "the first paragraph is not what the plan buys"
    assert [unescape(t).strip() for t in re.split(r"<br\s*/?>", first.group(1))] == words
    assert body.index("<h1>") < body.index('id="buys"') < body.index("<pre>")
    for name in ("linearity", "greedy_reference", "spearman", "pair repeat rate"):
        assert f"<dt>{name}</dt>" in dom  # every number is explained on the page
