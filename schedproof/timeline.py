"""The timeline picture of a counterexample: one self-contained SVG to inline into report.html.

Three stacked panels share the step axis:
1. KV pages in use per tier against each pool (GPU, and the host tier when there is one);
2. tokens scheduled per step (and charged to the budget, where that differs) against the token budget;
3. each request's phase, one row per request, the stuck ones outlined, and the final state's phase as a
   column of squares right of the panel ("end"), since an outcome reached at the last step is one cell wide.
The token panel turns logarithmic (and says so) when a few tokens a step sit against a large budget.
The step from which progress stops is a red line across all three, and an engine error marks the last step.

The step axis: step i occupies [i, i+1). Over it the pool and the phases are those of states[i] (the
state the step starts from) and the tokens those of records[i]; the final state gets the cell after
the last step. Long traces are folded into buckets of a round number of steps (at most MAX_COLUMNS
columns): the line panels draw the maximum per bucket, the phase panel the most frequent phase per
bucket, and every folded panel says so in its title. At most MAX_ROWS requests get a row (the
stuck ones first, then the rest in id order), and the panel says how many were left out.

The output is deterministic (fixed hash salt, no date), its text is real SVG text (searchable), and
it starts at `<svg` with no XML prolog, so it can be written straight into an HTML page. Drawing
uses `matplotlib.figure.Figure` with the SVG canvas, never pyplot; the few rc settings the SVG
writer reads are set under a lock, so concurrent calls in one process do not see each other's.
"""

from __future__ import annotations

import io
import operator
import threading
from typing import Optional, Sequence

from model.config import EngineConfig
from model.state import Phase, State, StepRecord

MAX_COLUMNS = 2000          # step columns drawn per panel; longer traces are folded into buckets
MAX_ROWS = 64               # requests drawn in the phase panel
MAX_PHASE_LOOKUPS = 4_000_000   # (step, request) phases read for the phase panel; past this it samples
MAX_VECTOR_RUNS = 1500      # phase runs drawn as vector bars; past this the panel is one raster image

# Okabe-Ito hues for the live phases (colour-blind safe); terminal ones: finished a quiet grey,
# failed a strong red, rejected a dark red, cancelled near-black. Pending is near-white.
PHASE_COLOURS = {
    Phase.PENDING: "#f0f0f0",
    Phase.WAITING: "#f0e442",
    Phase.PREFILLING: "#56b4e9",
    Phase.DECODING: "#0072b2",
    Phase.PREEMPTED: "#e69f00",
    Phase.OFFLOADED: "#cc79a7",
    Phase.FINISHED: "#b0b0b0",
    Phase.FAILED: "#d7191c",
    Phase.REJECTED: "#7a0010",
    Phase.CANCELLED: "#333333",
}
PHASE_LABELS = {p: p.name.lower() for p in Phase}

GPU_COLOUR = "#1f6fb4"
HOST_COLOUR = "#8e5bb5"
CACHE_COLOUR = "#7fb8e0"
TOKENS_COLOUR = "#2a9d4a"
CHARGED_COLOUR = "#e07b00"
STALL_COLOUR = "#d62728"
STUCK_COLOUR = "#d62728"
RAISE_COLOUR = "#000000"

_RC = {
    "svg.fonttype": "none",          # text stays text: searchable, selectable, asserted by the tests
    "svg.hashsalt": "schedproof-timeline",
    "svg.id": None,
    "svg.image_inline": True,
    "path.simplify": True,
    "font.family": ["DejaVu Sans"],
    "font.size": 9.0,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9.0,
    "legend.fontsize": 8.0,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_LOCK = threading.RLock()   # rcParams are process-global: one figure at a time


def timeline_svg(cfg: EngineConfig, states: Sequence[State], records: Sequence[StepRecord], *,
                 stuck: tuple[int, ...] = (), stall_step: Optional[int] = None, title: str = "") -> str:
    """The timeline as SVG text starting at `<svg` (no prolog), the same bytes for the same input."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    with _LOCK, rc_context(_RC):
        fig = _build(cfg, states, records, stuck=stuck, stall_step=stall_step, title=title)
        FigureCanvasSVG(fig)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def timeline_figure(cfg: EngineConfig, states: Sequence[State], records: Sequence[StepRecord], *,
                    stuck: tuple[int, ...] = (), stall_step: Optional[int] = None, title: str = ""):
    """The same picture as a matplotlib Figure (no pyplot), e.g. to save as PNG."""
    from matplotlib import rc_context

    with _LOCK, rc_context(_RC):
        return _build(cfg, states, records, stuck=stuck, stall_step=stall_step, title=title)


# --- data -------------------------------------------------------------------------------------------

def bucket_size(cells: int, max_columns: int = MAX_COLUMNS) -> int:
    """1 if `cells` fit in `max_columns`, else the smallest round number (1, 2, 5 x 10^k) of steps
    per column that does."""
    if cells <= max_columns:
        return 1
    scale = 1
    while True:
        for m in (1, 2, 5):
            b = m * scale
            if -(-cells // b) <= max_columns:
                return b
        scale *= 10


def _bucket_max(np, values, b: int):
    if b == 1 or len(values) == 0:
        return values
    return np.maximum.reduceat(values, np.arange(0, len(values), b))


def _bucket_mode(np, grid, b: int):
    """The most frequent phase per bucket of `b` columns, per row (ties: the later phase)."""
    if b == 1 or grid.shape[1] == 0:
        return grid
    starts = np.arange(0, grid.shape[1], b)
    present = np.unique(grid)
    counts = np.stack([np.add.reduceat((grid == p).astype(np.int32), starts, axis=1) for p in present])
    best = counts.shape[0] - 1 - np.argmax(counts[::-1], axis=0)
    return present[best].astype(grid.dtype)


def choose_rows(num_requests: int, stuck: Sequence[int], max_rows: int = MAX_ROWS) -> list[int]:
    """The requests that get a row: the stuck ones first (in the given order), then the rest by id."""
    order = list(dict.fromkeys(stuck))
    chosen = set(order)
    order += [r for r in range(num_requests) if r not in chosen][: max(0, max_rows - len(order))]
    return order[:max_rows]


def phase_stride(cells: int, rows: int, b: int, budget: int = MAX_PHASE_LOOKUPS) -> int:
    """Every how many steps the phase panel reads a state: 1 (every step) while cells x rows fits the
    budget, else the smallest divisor of the bucket size `b` that brings it within (so every bucket
    holds the same number of samples)."""
    if cells * rows <= budget:
        return 1
    need = -(-cells * rows // budget)
    return min(d for d in range(1, b + 1) if b % d == 0 and d >= need) if need <= b else b


def _phase_grid(np, states: Sequence[State], rows: list[int], stride: int = 1):
    """rows x (every `stride`-th state) phase values (int8). A request missing from a state is pending."""
    picked = states[::stride] if stride > 1 else states
    k, n = len(rows), len(picked)
    if k == 0:
        return np.zeros((0, n), dtype=np.int8)
    need = max(rows) + 1
    if min(map(len, map(operator.attrgetter("requests"), picked))) >= need:
        get = operator.itemgetter(*rows) if k > 1 else (lambda reqs, r=rows[0]: (reqs[r],))
        phase = operator.attrgetter("phase")
        flat = b"".join([bytes(map(phase, get(s.requests))) for s in picked])   # the hot loop, in C
        return np.frombuffer(flat, dtype=np.int8).reshape(n, k).T.copy()
    grid = np.full((k, n), int(Phase.PENDING), dtype=np.int8)
    for j, s in enumerate(picked):
        for i, rid in enumerate(rows):
            if rid < len(s.requests):
                grid[i, j] = s.requests[rid].phase
    return grid


# --- drawing ----------------------------------------------------------------------------------------

def _build(cfg, states, records, *, stuck, stall_step, title):
    import numpy as np
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter
    from matplotlib.transforms import blended_transform_factory

    if not states:
        raise ValueError("timeline: no states")
    if len(states) != len(records) + 1:
        raise ValueError(f"timeline: {len(states)} states for {len(records)} records (want one more state)")
    cells = len(states)                 # state i is the cell [base + i, base + i + 1)
    base = states[0].step
    end = base + cells
    num_requests = max(len(states[0].requests), len(states[-1].requests))
    bad = [r for r in stuck if not 0 <= r < num_requests]
    if bad:
        raise ValueError(f"timeline: stuck request ids {bad} out of range (the trace has {num_requests} requests)")
    if stall_step is not None and not base <= stall_step <= end:
        raise ValueError(f"timeline: stall_step {stall_step} outside the trace's steps {base}..{end - 1}")

    b = bucket_size(cells)
    folded = f"max per {b} steps" if b > 1 else ""

    def edges(count: int):
        """Bucket edges over `count` cells starting at base."""
        return np.append(np.arange(0, count, b), count).astype(np.float64) + base

    def stairs(ax, values, count, colour, fill: Optional[float] = None, **kw):
        """values per bucket as steps over [base, base + count]: a line, or (fill = its opacity) a filled
        area outlined by the line, in one path (half the SVG of a line plus a separate fill)."""
        if fill is None:
            return ax.stairs(values, edges(count), baseline=None, fill=False, edgecolor=colour, **kw)
        return ax.stairs(values, edges(count), baseline=0, fill=True, edgecolor=colour,
                         facecolor=to_rgba(colour, fill), **kw)

    # Data.
    # (map with C getters: a trace can hold 200,000 states)
    def column(attr, items):
        return np.fromiter(map(operator.attrgetter(attr), items), dtype=np.int64, count=len(items))

    used = cfg.num_blocks - column("free_blocks", states)
    cached = (np.fromiter((s.cached_blocks for s in states), dtype=np.int64, count=cells)
              if any(map(operator.attrgetter("prefix_cache"), states)) else np.zeros(cells, dtype=np.int64))
    host = cfg.host_blocks > 0
    host_used = cfg.host_blocks - column("free_host_blocks", states) if host else None
    second = operator.itemgetter(1)
    tokens = np.fromiter((sum(map(second, sch)) for sch in map(operator.attrgetter("scheduled"), records)),
                         dtype=np.int64, count=len(records))
    charged = column("charged", records)
    charged_differs = bool(np.any(tokens != charged))

    rows = choose_rows(num_requests, stuck)
    hidden = num_requests - len(rows)
    stride = phase_stride(cells, len(rows), b)
    grid = _bucket_mode(np, _phase_grid(np, states, rows, stride), b // stride)

    # Layout.
    k = len(rows)
    phase_h = min(11.0, max(1.3, 0.155 * k + 0.55))
    fig = Figure(figsize=(11.0, 2.5 + 2.1 + phase_h + (0.35 if title else 0.0)), dpi=100, layout="constrained")
    if title:
        fig.suptitle(title, fontsize=11, fontweight="bold")
    ax_pages, ax_tokens, ax_phase = fig.subplots(3, 1, sharex=True, height_ratios=[2.5, 2.1, phase_h])
    for ax in (ax_pages, ax_tokens, ax_phase):
        ax.set_xlim(base, end)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True))
    legend_kw = dict(loc="upper left", bbox_to_anchor=(1.035, 1.0), borderaxespad=0.0, frameon=False)

    # 1. KV pages in use against each pool.
    used_b = _bucket_max(np, used, b)
    stairs(ax_pages, used_b, cells, GPU_COLOUR, fill=0.22, linewidth=1.4, label="GPU pages in use")
    if cached.any():
        cached_b = _bucket_max(np, cached, b)
        ax_pages.stairs(cached_b, edges(cells), baseline=0, fill=True, facecolor="none", edgecolor=CACHE_COLOUR,
                        hatch="////", linewidth=0.6, label="of which prefix cache")
    ax_pages.axhline(cfg.num_blocks, color=GPU_COLOUR, linestyle="--", linewidth=1.2,
                     label=f"GPU pool ({cfg.num_blocks} pages)")
    top = max(cfg.num_blocks, int(used.max()))
    if host:
        host_b = _bucket_max(np, host_used, b)
        stairs(ax_pages, host_b, cells, HOST_COLOUR, fill=0.18, linewidth=1.4, label="host pages in use")
        ax_pages.axhline(cfg.host_blocks, color=HOST_COLOUR, linestyle="--", linewidth=1.2,
                         label=f"host pool ({cfg.host_blocks} pages)")
        top = max(top, cfg.host_blocks, int(host_used.max()))
    ax_pages.set_ylim(0, top * 1.4 + 1)
    ax_pages.set_ylabel("KV pages")
    ax_pages.set_title("KV pages in use per tier" + (f" ({folded})" if folded else ""), loc="left")
    ax_pages.legend(**legend_kw)

    # 2. Tokens per step against the budget.
    if len(records):
        tok_b = _bucket_max(np, tokens, b)
        stairs(ax_tokens, tok_b, len(records), TOKENS_COLOUR, linewidth=1.4, label="tokens scheduled")
        if charged_differs:
            stairs(ax_tokens, _bucket_max(np, charged, b), len(records), CHARGED_COLOUR,
                   linewidth=1.2, linestyle=(0, (4, 2)), label="charged to the budget")
        peak = max(int(tokens.max()), int(charged.max()))
    else:
        peak = 0
        ax_tokens.text(0.5, 0.5, "no steps taken", transform=ax_tokens.transAxes, ha="center", va="center",
                       color="#555555")
    ax_tokens.axhline(cfg.max_num_tokens, color="#222222", linestyle="--", linewidth=1.2,
                      label=f"token budget ({cfg.max_num_tokens})")
    positive = np.concatenate((tokens[tokens > 0], charged[charged > 0], [cfg.max_num_tokens]))
    log = positive.max() > 50 * positive.min()     # a few tokens a step against a large budget: log scale
    if log:
        ax_tokens.set_yscale("symlog", linthresh=1, linscale=0.5)
        ax_tokens.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax_tokens.set_ylim(0, max(cfg.max_num_tokens, peak) * 4)
    else:
        ax_tokens.set_ylim(0, max(cfg.max_num_tokens, peak) * 1.2 + 1)
    ax_tokens.set_ylabel("tokens / step")
    notes = ", ".join(n for n in (folded, "log scale" if log else "") if n)
    ax_tokens.set_title("tokens per step" + (f" ({notes})" if notes else ""), loc="left")
    ax_tokens.legend(**legend_kw)

    # 3. Phases, one row per request.
    phase_title = "request phases"
    if b > 1:
        phase_title += f" (most frequent per {b} steps" + (f", sampling one step in {stride})" if stride > 1 else ")")
    if hidden:
        phase_title += f": {k} of {num_requests} requests drawn" + (", stuck first" if stuck else "") \
            + f", +{hidden} more not drawn"
    ax_phase.set_title(phase_title, loc="left")
    ax_phase.set_ylabel("request")
    ax_phase.set_xlabel("engine step")
    handles = []
    if k == 0:
        ax_phase.text(0.5, 0.5, "no requests", transform=ax_phase.transAxes, ha="center", va="center",
                      color="#555555")
        ax_phase.set_yticks([])
    else:
        ax_phase.set_ylim(k - 0.5, -0.5)
        xs = edges(cells)
        changes = grid[:, 1:] != grid[:, :-1]
        runs = int(changes.sum()) + k
        if runs <= MAX_VECTOR_RUNS:
            # Vector bars: one PolyCollection per phase, one rectangle per run of equal phases.
            starts, stops, values, ys = [], [], [], []
            for i in range(k):
                cut = np.flatnonzero(changes[i]) + 1
                s = np.concatenate(([0], cut))
                e = np.concatenate((cut, [grid.shape[1]]))
                starts.append(xs[s])
                stops.append(xs[e])
                values.append(grid[i, s])
                ys.append(np.full(len(s), i))
            starts, stops = np.concatenate(starts), np.concatenate(stops)
            values, ys = np.concatenate(values), np.concatenate(ys)
            for p in sorted(set(values.tolist())):
                sel = values == p
                x0, x1, y = starts[sel], stops[sel], ys[sel]
                verts = np.stack([np.stack([x0, y - 0.4], 1), np.stack([x1, y - 0.4], 1),
                                  np.stack([x1, y + 0.4], 1), np.stack([x0, y + 0.4], 1)], 1)
                ax_phase.add_collection(PolyCollection(verts, facecolors=PHASE_COLOURS[Phase(p)],
                                                       edgecolors="none", linewidths=0))
        else:
            # One raster image, drawn pixel for pixel (no smoothing between phases).
            palette = np.array([[int(PHASE_COLOURS[p][i:i + 2], 16) for i in (1, 3, 5)] for p in Phase],
                               dtype=np.uint8)
            ax_phase.imshow(palette[grid], extent=(base, end, k - 0.5, -0.5), aspect="auto",
                            interpolation="none", resample=False)
            if k > 1:
                ax_phase.hlines(np.arange(k - 1) + 0.5, base, end, colors="white", linewidth=0.8)
        ax_phase.set_xlim(base, end)
        ax_phase.set_ylim(k - 0.5, -0.5)
        ax_phase.set_yticks(range(k), [f"r{rid}" for rid in rows])
        if k > 24:
            ax_phase.tick_params(axis="y", labelsize=6.5, length=2)
        stuck_set = set(stuck)
        for label, rid in zip(ax_phase.get_yticklabels(), rows):
            if rid in stuck_set:
                label.set_color(STUCK_COLOUR)
                label.set_fontweight("bold")
        for i, rid in enumerate(rows):
            if rid in stuck_set:
                ax_phase.add_patch(Rectangle((base, i - 0.5), end - base, 1.0, fill=False,
                                             edgecolor=STUCK_COLOUR, linewidth=1.6, zorder=3))
        # The final state's phase per row, as a column of squares just right of the panel: an outcome
        # reached at the last step (the field failure's nine failed requests) is one cell wide otherwise.
        final = [int(states[-1].requests[rid].phase) if rid < len(states[-1].requests) else int(Phase.PENDING)
                 for rid in rows]
        row_pt = max(3.0, min(12.0, (phase_h - 0.55) * 72 / k * 0.75))
        end_col = blended_transform_factory(ax_phase.transAxes, ax_phase.transData)
        ax_phase.scatter(np.full(k, 1.014), np.arange(k), transform=end_col, marker="s", s=row_pt ** 2,
                         c=[PHASE_COLOURS[Phase(p)] for p in final], edgecolors="#666666", linewidths=0.4,
                         clip_on=False, zorder=5)
        ax_phase.text(1.014, -0.5, "end", transform=end_col, ha="center", va="bottom", fontsize=7,
                      color="#444444")
        occurring = sorted(set(np.unique(grid).tolist()) | set(final))
        handles = [Patch(facecolor=PHASE_COLOURS[Phase(p)], edgecolor="#999999", linewidth=0.5,
                         label=PHASE_LABELS[Phase(p)]) for p in occurring]
        if stuck:
            handles.append(Patch(facecolor="none", edgecolor=STUCK_COLOUR, linewidth=1.6,
                                 label="stuck request"))
        ax_phase.legend(handles=handles, title="phase", **legend_kw)

    # Marks across all three panels.
    axes = (ax_pages, ax_tokens, ax_phase)
    mark_y = blended_transform_factory(ax_pages.transData, ax_pages.transAxes)
    box = dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.85)
    if stall_step is not None:
        for ax in axes:
            ax.axvspan(stall_step, end, color=STALL_COLOUR, alpha=0.06, linewidth=0, zorder=0)
            ax.axvline(stall_step, color=STALL_COLOUR, linewidth=1.6, zorder=4)
        right = (stall_step - base) > 0.6 * (end - base)
        ax_pages.text(stall_step, 0.97, f" progress stops (step {stall_step}) ",
                      transform=mark_y, ha="right" if right else "left", va="top", color=STALL_COLOUR,
                      fontsize=8.5, fontweight="bold", bbox=box, zorder=5)
    if states[-1].error:
        last = base + len(records) - 1 if records else base
        for ax in axes:
            ax.axvline(end - 1, color=RAISE_COLOUR, linewidth=1.3, linestyle="-.", zorder=4)
        ax_pages.text(end - 1, 0.80, f" engine raises (step {last}) ", transform=mark_y, ha="right", va="top",
                      color=RAISE_COLOUR, fontsize=8.5, bbox=box, zorder=5)
    return fig
