"""Tables (markdown, LaTeX, CSV) and figures (PNG, PDF) of the reproduction suite.

Everything is written atomically and without timestamps or other run-varying metadata, so a
rebuild from the same results gives the same bytes. Every table and figure says SIMULATED
and names its routing source.
"""

from __future__ import annotations

import math
from pathlib import Path

from analysis.sweepstats import pyplot, save_figure
from core.atomic import write_text

# Decimals by column name: milliseconds, factors and GiB to 2, shares and rates to 4.
_TWO = ("_ms", "_gib", "ratio", "speedup", "headroom", "_s", "gbps", "_gb")
_FOUR = ("hit_rate", "miss_rate", "share", "recall", "precision", "per_s", "_rps",
         "gb_per_token")


def fmt(value, column: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if column.endswith(_FOUR) or any(k in column for k in _FOUR):
            return f"{value:.4f}"
        if column.endswith(_TWO) or any(k in column for k in _TWO):
            return f"{value:.2f}"
        return f"{value:.4g}"
    return str(value)


def _strings(table):
    return table.apply(lambda col: [fmt(v, str(col.name)) for v in col]).astype(str)


def _latex(table, caption: str) -> str:
    """A plain tabular (booktabs rules) with LaTeX special characters escaped."""
    def esc(s: str) -> str:
        for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"),
                     ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}")):
            s = s.replace(a, b)
        return s

    cols = list(table.columns)
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{esc(caption)}}}",
             r"\begin{tabular}{" + "l" * len(cols) + "}", r"\toprule",
             " & ".join(esc(str(c)) for c in cols) + r" \\", r"\midrule"]
    lines += [" & ".join(esc(v) for v in row) + r" \\" for row in table.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_table(table, out_dir: Path, stem: str, header: list[str],
                notes: list[str] = ()) -> list[Path]:
    """<stem>.md (header lines, the table, numbered notes), <stem>.tex and <stem>.csv."""
    text = _strings(table)
    md = [*header, "", text.to_markdown(index=False, disable_numparse=True), ""]
    md += [f"{i + 1}. {n}" for i, n in enumerate(notes)]
    out = Path(out_dir)
    paths = [out / f"{stem}.md", out / f"{stem}.tex", out / f"{stem}.csv"]
    write_text(paths[0], "\n".join(md).rstrip() + "\n")
    write_text(paths[1], _latex(text, header[0].lstrip("# ") if header else stem))
    write_text(paths[2], text.to_csv(index=False, lineterminator="\n"))
    return paths


def new_figure(title: str, routing: str, width: float = 7.0, height: float = 4.2):
    """(figure, axes) with the title and a SIMULATED / routing-source label."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_title(title, fontsize=10)
    fig.text(0.99, 0.01, f"SIMULATED · {routing} routing", ha="right", va="bottom",
             fontsize=7, color="0.35")
    return fig, ax


def write_figure(fig, out_dir: Path, stem: str) -> list[Path]:
    fig.tight_layout()
    paths = save_figure(fig, out_dir, stem)
    pyplot().close(fig)
    return paths


def grouped_bars(ax, groups: list[str], series: dict[str, list], ylabel: str,
                 log: bool = False) -> None:
    """Bars per group (x) for each series (legend); None values are left out."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        pts = [(x, v) for x, v in zip(xs, values) if v is not None and not math.isnan(v)]
        if pts:
            ax.bar([x for x, _ in pts], [v for _, v in pts], width, label=name)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(FuncFormatter(lambda v, _: f"{v:g}"))  # 2, 3, 4 rather than 2x10^0
    if ax.get_legend_handles_labels()[0]:  # no bar at all (no valid row): no legend
        ax.legend(fontsize=7)
