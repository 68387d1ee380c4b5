"""The timeline picture of a report (schedproof/timeline.py): an SVG that inlines into HTML, whose
text is real text, that says what it folded, and that stays small on long and wide traces."""

import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib
import pytest

from model.simulator import simulate
from model.state import Phase
from schedproof.scenario import load
from schedproof.timeline import MAX_ROWS, bucket_size, choose_rows, phase_stride, timeline_figure, timeline_svg

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"
SIZE_LIMIT = 1_500_000


def trace(name):
    s = load(ROOT / "scenarios" / f"{name}.toml")
    return s.cfg, simulate(s.cfg, s.workload)


def texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return ["".join(el.itertext()) for el in root.iter(f"{SVG}text")]


def styled(svg: str, content: str) -> list[str]:
    """The style attributes of the text elements reading exactly `content`."""
    root = ET.fromstring(svg)
    return [el.get("style", "") for el in root.iter(f"{SVG}text") if "".join(el.itertext()) == content]


@pytest.fixture(scope="module")
def field():
    """The field failure: 12 requests, 3 finish, 9 fail when the engine's stall detector raises."""
    return trace("trtllm-v2-replay-over-budget")


@pytest.fixture(scope="module")
def field_svg(field):
    cfg, tr = field
    stuck = tuple(r.rid for r in tr.final.requests if r.phase == Phase.FAILED)
    return timeline_svg(cfg, tr.states, tr.records, stuck=stuck, stall_step=516, title="replay over budget")


def test_the_field_failure_draws_as_inlinable_svg_with_real_text(field, field_svg):
    cfg, tr = field
    assert tr.final.error and cfg.host_blocks == 0
    assert field_svg.startswith("<svg") and field_svg.rstrip().endswith("</svg>")
    assert "<?xml" not in field_svg and "<!DOCTYPE" not in field_svg
    words = texts(field_svg)            # parses as XML, and the labels are <text>, not glyph paths
    assert "GPU pool (272 pages)" in words
    assert "token budget (2048)" in words
    assert {f"r{i}" for i in range(12)} <= set(words)
    assert any(w.strip() == "progress stops (step 516)" for w in words)
    assert any(w.strip() == f"engine raises (step {len(tr.records) - 1})" for w in words)
    assert "replay over budget" in words
    assert not any("host" in w for w in words)                # no host tier in this configuration
    assert "charged to the budget" not in words                # charged equals scheduled on every step
    assert not any("max per" in w or "more not drawn" in w for w in words)   # nothing folded
    assert "<image" not in field_svg                            # few phase changes: vector bars


def test_the_phase_legend_names_the_phases_that_occur_and_stuck_rows_stand_out(field_svg):
    words = set(texts(field_svg))
    assert {"waiting", "decoding", "preempted", "finished", "failed", "stuck request"} <= words
    assert not {"prefilling", "offloaded", "rejected", "cancelled"} & words
    stuck_style = styled(field_svg, "r5")
    assert stuck_style and all("d62728" in s and "700" in s for s in stuck_style)   # stuck: bold red
    assert styled(field_svg, "r0") and not any("d62728" in s for s in styled(field_svg, "r0"))
    words_in_order = [w for w in texts(field_svg) if re.fullmatch(r"r\d+", w)]
    assert words_in_order[:9] == [f"r{i}" for i in range(3, 12)]                 # stuck rows first


def test_the_host_tier_is_drawn_only_when_there_is_one():
    cfg, tr = trace("trtllm-v2-host-tier-silent-spin")
    assert cfg.host_blocks == 300
    words = texts(timeline_svg(cfg, tr.states, tr.records, stuck=(1,)))
    assert "host pool (300 pages)" in words and "host pages in use" in words
    assert "GPU pool (272 pages)" in words
    assert not any("progress stops" in w or "engine raises" in w for w in words)


def test_a_two_step_wedge_draws_and_marks_the_stall_at_step_zero():
    cfg, tr = trace("vllm-chunked-off-head-of-line")
    assert len(tr.states) == 3
    svg = timeline_svg(cfg, tr.states, tr.records, stuck=(0, 1, 2, 3), stall_step=0)
    words = texts(svg)
    assert any(w.strip() == "progress stops (step 0)" for w in words)
    assert "token budget (64)" in words and "r3" in words


def test_the_same_input_gives_the_same_bytes(field):
    cfg, tr = field
    a = timeline_svg(cfg, tr.states[:40], tr.records[:39], stuck=(4,), stall_step=10, title="t")
    b = timeline_svg(cfg, tr.states[:40], tr.records[:39], stuck=(4,), stall_step=10, title="t")
    assert a == b


def test_rendering_leaves_matplotlib_settings_as_it_found_them(field):
    cfg, tr = field
    before = (matplotlib.rcParams["svg.fonttype"], matplotlib.rcParams["svg.hashsalt"])
    timeline_svg(cfg, tr.states[:5], tr.records[:4])
    assert (matplotlib.rcParams["svg.fonttype"], matplotlib.rcParams["svg.hashsalt"]) == before


def test_charged_is_drawn_where_it_differs_from_what_ran(field):
    cfg, tr = field
    records = list(tr.records[:30])
    records[3] = dataclasses.replace(records[3], charged=records[3].charged + 500)
    words = texts(timeline_svg(cfg, tr.states[:31], records))
    assert "charged to the budget" in words and "tokens scheduled" in words


def test_a_long_trace_is_folded_says_so_and_stays_small(field):
    cfg, tr = field
    n = 50_000
    period = len(tr.records)
    states = [tr.states[i % period] for i in range(n + 1)]
    records = [tr.records[i % period] for i in range(n)]
    svg = timeline_svg(cfg, states, records, stuck=(3,), stall_step=30_000)
    assert len(svg.encode()) < SIZE_LIMIT
    b = bucket_size(n + 1)
    assert b == 50
    words = texts(svg)
    assert "KV pages in use per tier (max per 50 steps)" in words
    assert any(w.startswith("tokens per step (max per 50 steps") for w in words)
    assert any(w.startswith("request phases (most frequent per 50 steps") for w in words)
    assert any(w.strip() == "progress stops (step 30000)" for w in words)


def test_many_requests_cap_the_rows_stuck_first_and_say_how_many_are_left_out(field):
    cfg, tr = field
    wide = 300

    def widen(state):
        proto = state.requests
        return dataclasses.replace(state, requests=tuple(
            dataclasses.replace(proto[i % len(proto)], rid=i) for i in range(wide)))

    states = [widen(s) for s in tr.states[:21]]
    svg = timeline_svg(cfg, states, tr.records[:20], stuck=(250, 7))
    assert len(svg.encode()) < SIZE_LIMIT
    words = texts(svg)
    rows = [w for w in words if re.fullmatch(r"r\d+", w)]
    assert len(rows) == MAX_ROWS == 64
    assert rows[:3] == ["r250", "r7", "r0"] and "r63" not in rows and "r62" in rows
    assert any(w.endswith(f"64 of {wide} requests drawn, stuck first, +{wide - 64} more not drawn") for w in words)


def test_a_busy_phase_panel_becomes_one_raster_image(field):
    cfg, tr = field
    phases = (Phase.WAITING, Phase.DECODING, Phase.PREEMPTED)
    states = [dataclasses.replace(s, requests=tuple(dataclasses.replace(r, phase=phases[(i + r.rid) % 3])
                                                    for r in s.requests))
              for i, s in enumerate(tr.states[:400])]
    svg = timeline_svg(cfg, states, tr.records[:399])
    assert svg.count("<image") == 1 and "image-rendering:pixelated" in svg.replace(" ", "")
    assert len(svg.encode()) < SIZE_LIMIT


def test_one_state_and_no_steps_still_draws(field):
    cfg, tr = field
    words = texts(timeline_svg(cfg, tr.states[:1], []))
    assert "no steps taken" in words and "r0" in words


def test_bad_input_is_refused_with_a_reason(field):
    cfg, tr = field
    with pytest.raises(ValueError, match="out of range"):
        timeline_svg(cfg, tr.states[:3], tr.records[:2], stuck=(12,))
    with pytest.raises(ValueError, match="want one more state"):
        timeline_svg(cfg, tr.states[:3], tr.records[:3])
    with pytest.raises(ValueError, match="stall_step"):
        timeline_svg(cfg, tr.states[:3], tr.records[:2], stall_step=99)


def test_folding_and_row_choice_arithmetic():
    assert [bucket_size(n) for n in (1, 2000, 2001, 50_001, 200_001)] == [1, 1, 2, 50, 200]
    assert phase_stride(2000, 64, 1) == 1
    assert phase_stride(200_001, 64, 200) == 4            # 12.8M phase reads: one step in 4
    assert choose_rows(5, (3,)) == [3, 0, 1, 2, 4]
    assert choose_rows(100, (), max_rows=3) == [0, 1, 2]


def test_the_same_figure_saves_as_png(field, tmp_path):
    cfg, tr = field
    fig = timeline_figure(cfg, tr.states, tr.records, stuck=(3,), stall_step=516)
    out = tmp_path / "timeline.png"
    fig.savefig(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
