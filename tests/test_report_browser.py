"""The field failure's report.html, opened as a person would: headless Chromium (Debian's package, which
the README's test command installs) renders it, the DOM it built holds the cause and the picture, and
the screenshot shows the cause box and the timeline's colours (the pool, the phases, the stall line).

Where Chromium is missing the test fails and says how to install it; SCHEDPROOF_NO_BROWSER=1 skips it
on a machine without one, by choice and visibly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from schedproof import reportdir, timeline
from schedproof.finding import from_run
from schedproof.runner import run_scenario
from schedproof.scenario import load

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def _chromium() -> str:
    # Debian's chromium (the README's test command installs it where it may), or a runner's own Chrome
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found:
        return found
    if os.environ.get("SCHEDPROOF_NO_BROWSER") == "1":
        pytest.skip("SCHEDPROOF_NO_BROWSER=1: the browser check of report.html is skipped")
    pytest.fail("chromium is not installed: `apt-get install -y chromium` (the README's test command does), "
                "or set SCHEDPROOF_NO_BROWSER=1 to skip this check")


def _browse(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def field_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser") / "trtllm-v2-replay-over-budget"
    reportdir.write(from_run(run_scenario(load("scenarios/trtllm-v2-replay-over-budget.toml"))), folder)
    return folder


def test_rendered_dom_has_the_cause_the_changes_and_the_picture(field_report, tmp_path):
    chromium = _chromium()
    run = _browse(chromium, tmp_path, "--dump-dom", (field_report / "report.html").as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    assert "r3's replay of 1900 + 274 = 2174 tokens exceeds max_num_tokens 2048 and chunked prefill is off" in dom
    assert "engine.chunked_prefill = true" in dom and "Re-checked: re-run on this workload" in dom
    figure = dom[dom.index("id=\"timeline\""):]
    for text in ("GPU pool (272 pages)", "token budget (2048)", "progress stops (step 516)", "r3"):
        assert text in figure, text


def _count(image, colour: str, box=None) -> int:
    """Pixels within a small distance of `colour` (anti-aliasing blurs edges)."""
    want = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    region = image.crop(box) if box else image
    return sum(n for n, px in region.getcolors(maxcolors=1 << 20)
               if max(abs(a - b) for a, b in zip(px[:3], want)) <= 12)


def test_screenshot_shows_the_cause_box_and_the_timeline(field_report, tmp_path):
    from PIL import Image

    chromium = _chromium()
    shot = tmp_path / "report.png"
    run = _browse(chromium, tmp_path, "--window-size=1280,2000", f"--screenshot={shot}",
                  (field_report / "report.html").as_uri())
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    keep = os.environ.get("SCHEDPROOF_SCREENSHOT")      # a copy for a person to look at
    if keep:
        shutil.copy(shot, keep)
    image = Image.open(shot).convert("RGB")
    width, height = image.size
    top = (0, 0, width, height // 3)
    # the cause: its pale red box and dark red bar in the top third of the page
    assert _count(image, "#fff4f2", top) > 20_000 and _count(image, "#b3261e", top) > 500
    # the picture: the pool's fill, the phases (decoding, preempted, waiting, failed), the stall line
    for colour, least in ((timeline.PHASE_COLOURS[timeline.Phase.DECODING], 2_000),
                          (timeline.PHASE_COLOURS[timeline.Phase.PREEMPTED], 2_000),
                          (timeline.PHASE_COLOURS[timeline.Phase.WAITING], 5_000),
                          (timeline.PHASE_COLOURS[timeline.Phase.FAILED], 50),
                          (timeline.GPU_COLOUR, 300), (timeline.STALL_COLOUR, 200)):
        assert _count(image, colour) >= least, colour
