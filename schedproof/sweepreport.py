"""What `schedproof sweep` prints and writes: the table of points, the boundary, and a report folder
with sweep.json, sweep.md and a self-contained sweep.html holding the heat map (SVG)."""

from __future__ import annotations

import dataclasses
import html as _html
import io
import json
from pathlib import Path

from .sweep import Point, Vary
from .sweepsolver import box_sentence

# a verdict's colour in the heat map: safe green, unsafe red, nothing claimed grey
COLOURS = {True: "#4daf4a", False: "#e41a1c", None: "#bdbdbd"}


def table_lines(varies: list[Vary], points: list[Point]) -> list[str]:
    head = "  ".join(f"{v.short:>{max(len(v.short), 6)}}" for v in varies)
    out = [f"{head}  {'verdict':<9} {'safe':<5} detail"]
    for p in points:
        cells = "  ".join(f"{x:>{max(len(v.short), 6)}}" for v, x in zip(varies, p.values))
        safe = {True: "yes", False: "no", None: "-"}[p.safe]
        out.append(f"{cells}  {p.verdict:<9} {safe:<5} {p.detail}")
    return out


def as_dict(path: str, varies: list[Vary], points: list[Point], boundary: list[str], seconds: float,
            workers: int) -> dict:
    return {"file": path, "vary": {v.short: list(v.values) for v in varies}, "workers": workers,
            "seconds": round(seconds, 2), "points": [p.as_dict(varies) for p in points], "boundary": boundary,
            "safe": sum(p.safe is True for p in points), "unsafe": sum(p.safe is False for p in points),
            "unclaimed": sum(p.safe is None for p in points)}


def solver_dict(varies: list[Vary], rows: list, box, covered: int) -> dict:
    """The solver's boundary (schedproof/sweepsolver.py): a sentence per row, then the box's."""
    lines = [r.sentence(varies) for r in rows] + ([box_sentence(varies, box)] if box is not None else [])
    queries = sum(len(r.queries) for r in rows) + (box is not None)
    return {"boundary": lines, "rows": [r.as_dict(varies) for r in rows], "queries": queries, "covered": covered,
            "box": dataclasses.asdict(box) if box is not None else None}


def heatmap_svg(varies: list[Vary], points: list[Point], title: str) -> str:
    """Rows: the first varied knob (or one row); columns: the last. More than two knobs: not drawn."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if len(varies) > 2:
        return ""
    rows = varies[0].values if len(varies) == 2 else (None,)
    cols = varies[-1].values
    at = {p.values: p for p in points}
    grid = [[to_rgb(COLOURS[at[(r, c) if r is not None else (c,)].safe]) for c in cols] for r in rows]
    fig = Figure(figsize=(min(14, 4.5 + 0.9 * len(cols)), min(10, 2.2 + 0.45 * len(rows))))
    FigureCanvasSVG(fig)
    ax = fig.add_subplot()
    ax.imshow(grid, aspect="auto", origin="lower", interpolation="nearest")
    ax.set_xticks(range(len(cols)), [str(c) for c in cols], rotation=45 if len(cols) > 8 else 0)
    ax.set_xlabel(varies[-1].short)
    if len(varies) == 2:
        ax.set_yticks(range(len(rows)), [str(r) for r in rows])
        ax.set_ylabel(varies[0].short)
    else:
        ax.set_yticks([])
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            p = at[(r, c) if r is not None else (c,)]
            ax.text(j, i, p.verdict, ha="center", va="center", fontsize=7)
    ax.legend(handles=[Patch(color=COLOURS[True], label="safe (ok / bounded)"),
                       Patch(color=COLOURS[False], label="violated"),
                       Patch(color=COLOURS[None], label="nothing claimed")],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    out = io.StringIO()
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "schedproof"}):
        fig.savefig(out, format="svg", metadata={"Date": None})
    text = out.getvalue()
    return text[text.index("<svg"):]


def write_folder(folder: Path, data: dict, varies: list[Vary], points: list[Point], lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sweep.json").write_text(json.dumps(data, indent=2))
    solver = data.get("solver")
    md = [f"# sweep of {data['file']}", ""]
    if solver:
        md += ["## Boundary, from the solver (every value of each range)", ""] + \
              [f"- {b}" for b in solver["boundary"]] + ["", f"{solver['queries']} queries; {solver['covered']} grid "
                                                           "points covered by them and not run.", ""]
    md += ["## Boundary, read off the grid", ""] + [f"- {b}" for b in data["boundary"]] + \
          ["", "## Points", "", "```"] + lines + ["```", ""]
    (folder / "sweep.md").write_text("\n".join(md))
    e = _html.escape
    svg = heatmap_svg(varies, points, data["file"])
    page = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
            f"<title>sweep of {e(data['file'])}</title><style>body{{font:15px/1.45 system-ui,sans-serif;"
            "max-width:1100px;margin:24px auto;padding:0 16px}} svg{{width:100%;height:auto}}</style></head><body>",
            f"<h1>sweep of {e(data['file'])}</h1>",
            f"<p>{data['safe']} safe, {data['unsafe']} violated, {data['unclaimed']} with nothing claimed; "
            f"{data['workers']} worker(s), {data['seconds']} s</p>",
            ]
    if solver:
        page += ["<h2>Boundary, from the solver</h2><ul>"] + [f"<li>{e(b)}</li>" for b in solver["boundary"]] + \
                [f"</ul><p>{solver['queries']} queries over intervals; {solver['covered']} grid points covered by "
                 "them and not run.</p>"]
    page += ["<h2>Boundary, read off the grid</h2><ul>"] + [f"<li>{e(b)}</li>" for b in data["boundary"]] + ["</ul>"]
    page += [f"<h2>Heat map</h2><figure id='heatmap'>{svg}</figure>" if svg else
             "<p>More than two knobs are varied: no heat map; see the table.</p>"]
    page += ["<h2>Points</h2><pre>", e("\n".join(lines)), "</pre></body></html>"]
    (folder / "sweep.html").write_text("\n".join(page) + "\n")
    return folder
