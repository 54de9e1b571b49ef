"""PNG plots of a run (matplotlib with the Agg backend, imported only when plotting, so the
benchmark runs without it). Every title carries the device, torch, CUDA, cuDNN and the date."""

import itertools
from pathlib import Path

from .env import environment_line
from .impls import label
from .shapes import PASSES, format_seqlen

DPI = 110
HEADER_INCHES = 0.95  # room above a grid of subplots for a two-line title and a legend row
# One colour per implementation in every plot, ours in black so it stands out.
# Our decode variants are greys (kvcache, paged 16, paged 256 from dark to light).
COLORS = {"ours": "black", "ours-kvcache": "dimgray", "ours-paged16": "darkgray", "ours-paged256": "lightgray",
          "ours-triton": "C7", "flash": "C0", "cudnn": "C1", "efficient": "C2", "math": "C3", "naive": "C4",
          "flex": "C5", "sdpa": "C6"}


def load_pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), or None when not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(rows, name, x_key):
    """(x, value) of the rows where implementation `name` has a value, sorted by x."""
    points = [(row.config[x_key], row.cells[name].value) for row in rows if name in row.cells and row.cells[name].ok]
    points.sort()
    return [x for x, _ in points], [y for _, y in points]


def _seqlen_axis(ax, seqlens, xlabel="sequence length (tokens)"):
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqlens)
    ax.set_xticklabels([format_seqlen(s) for s in seqlens])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.grid(True, alpha=0.3)


def _line_style(name):
    return {"linewidth": 2.6 if name.startswith("ours") else 1.4, "color": COLORS.get(name)}


def _save(plt, fig, path):
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_speed(plt, suite, metadata, out_dir):
    """One PNG per dtype: rows fwd / bwd / fwd+bwd, columns (headdim, causal); TFLOP/s vs seqlen."""
    paths = []
    for dtype in sorted({row.config["dtype"] for row in suite.rows}):
        rows = [row for row in suite.rows if row.config["dtype"] == dtype]
        combos = sorted({(row.config["headdim"], row.config["causal"]) for row in rows})
        height = 3.6 * len(PASSES) + HEADER_INCHES
        fig, axes = plt.subplots(len(PASSES), len(combos), figsize=(4.6 * len(combos), height), squeeze=False)
        for i, pass_name in enumerate(PASSES):
            for j, (headdim, causal) in enumerate(combos):
                ax = axes[i][j]
                subset = [row for row in rows if row.config["pass"] == pass_name
                          and row.config["headdim"] == headdim and row.config["causal"] == causal]
                for name in suite.columns:
                    xs, ys = _series(subset, name, "seqlen")
                    ax.plot(xs, ys, marker="o", label=label(name), **_line_style(name))
                _seqlen_axis(ax, sorted({row.config["seqlen"] for row in subset}),
                             "sequence length (tokens)" if i == len(PASSES) - 1 else "")
                ax.set_ylabel("TFLOP/s")
                ax.set_ylim(bottom=0)
                ax.set_title(f"{pass_name} · headdim {headdim} · {'causal' if causal else 'non-causal'}")
        # Title, then one legend row, then the grid: positions in inches from the top, so they hold
        # for any number of subplot columns.
        fig.suptitle(f"Attention speed, {dtype} (higher is better)\n{environment_line(metadata)}",
                     y=1 - 0.08 / height, va="top")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize="small",
                   bbox_to_anchor=(0.5, 1 - 0.62 / height))
        fig.tight_layout(rect=(0, 0, 1, 1 - HEADER_INCHES / height))
        paths.append(_save(plt, fig, out_dir / f"speed_{dtype}.png"))
    return paths


SERIES_LINESTYLES = ("-", "--", ":", "-.")


def plot_speedup(plt, suite, metadata, out_dir):
    """Speed-up of forward+backward over naive attention vs seqlen, one line per series (plain, causal,
    dropout+mask) for ours and for SDPA (sdpa-flash, or SDPA with the mask where the series has one)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    names = list(dict.fromkeys(row.config["series"] for row in suite.rows))  # in the suite's order
    for series, linestyle in zip(names, itertools.cycle(SERIES_LINESTYLES)):
        rows = [row for row in suite.rows if row.config["series"] == series]
        sdpa = "sdpa" if any("sdpa" in row.cells for row in rows) else "flash"
        for key, name in (("speedup_ours", "ours"), ("speedup_sdpa", sdpa)):
            points = sorted((row.config["seqlen"], row.extra[key]) for row in rows if row.extra.get(key))
            if points:
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=f"{label(name)}, {series}",
                        linestyle=linestyle, **_line_style(name))
    _seqlen_axis(ax, sorted({row.config["seqlen"] for row in suite.rows}))
    ax.axhline(1.0, color="gray", linewidth=1)
    ax.set_ylabel("speed-up over naive attention (×)")
    ax.legend(fontsize="small")
    shape = suite.rows[0].config if suite.rows else {}
    ax.set_title(f"Forward+backward speed-up over naive attention (batch {shape.get('batch')}, "
                 f"{shape.get('nheads')} heads, headdim {shape.get('headdim')})\n{environment_line(metadata)}")
    return [_save(plt, fig, out_dir / "speedup.png")]


def plot_memory(plt, suite, metadata, out_dir):
    """Peak memory (log scale) and the reduction factor naive / ours vs seqlen."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    seqlens = sorted({row.config["seqlen"] for row in suite.rows})
    for name in suite.columns:
        xs, ys = _series(suite.rows, name, "seqlen")
        left.plot(xs, ys, marker="o", label=label(name), **_line_style(name))
    if any(cell.ok for row in suite.rows for cell in row.cells.values()):
        left.set_yscale("log")
    _seqlen_axis(left, seqlens)
    left.set_ylabel("peak memory above inputs (MiB, log scale)")
    left.set_title("Forward+backward peak memory (missing points: OOM)")
    left.legend()
    points = sorted((row.config["seqlen"], row.extra["reduction_vs_naive"]) for row in suite.rows
                    if row.extra.get("reduction_vs_naive"))
    right.plot([x for x, _ in points], [y for _, y in points], marker="o", **_line_style("ours"))
    if points:
        right.set_yscale("log")
    _seqlen_axis(right, seqlens)
    right.set_ylabel("naive / ours (×, log scale)")
    right.set_title("Memory reduction factor vs naive attention")
    fig.suptitle(f"Attention memory, causal\n{environment_line(metadata)}", y=1.04)
    return [_save(plt, fig, out_dir / "memory.png")]


def _decode_bars(ax, suite):
    """One bar per implementation (ours-kvcache, the paged ones, ours, the peers) in each row's group."""
    width = 0.8 / max(1, len(suite.columns))
    for index, name in enumerate(suite.columns):
        cells = [row.cells.get(name) for row in suite.rows]
        values = [cell.value if cell is not None and cell.ok else 0.0 for cell in cells]
        positions = [i + (index - (len(suite.columns) - 1) / 2) * width for i in range(len(suite.rows))]
        ax.bar(positions, values, width, label=label(name), color=COLORS.get(name), edgecolor="black",
               linewidth=0.4)


def _copy_marks(ax, suite):
    """The copy GB/s measured in the same run, as a dashed line across each row's group."""
    labelled = False
    for i, row in enumerate(suite.rows):
        copy = row.extra.get("copy_GBps")
        if isinstance(copy, (int, float)):
            ax.hlines(copy, i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1.4,
                      label=None if labelled else "device copy (read+write)")
            labelled = True


def plot_decode(plt, suite, metadata, out_dir):
    """GB/s of K+V read per (batch, context), one bar per implementation, and the device's copy GB/s
    of the same run as a dashed line over each group."""
    fig, ax = plt.subplots(figsize=(max(7.5, 2.4 * len(suite.rows)), 4.8))
    _decode_bars(ax, suite)
    _copy_marks(ax, suite)
    ax.set_xticks(range(len(suite.rows)))
    ax.set_xticklabels([f"batch {row.config['batch']}\ncontext {format_seqlen(row.config['context'])}"
                        for row in suite.rows])
    ax.set_ylabel("GB/s of K+V read (higher is better)")
    ax.set_xlabel("configuration (missing bar: error or not run)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    heads = suite.rows[0].config if suite.rows else {}
    ax.set_title(f"Decode, one query token, {heads.get('nheads')}/{heads.get('nheads_k')} heads, headdim "
                 f"{heads.get('headdim')}\n{environment_line(metadata)}")
    return [_save(plt, fig, out_dir / "decode.png")]


PLOTTERS = {"speed": plot_speed, "speedup": plot_speedup, "memory": plot_memory, "decode": plot_decode}


def write_plots(plt, suite, metadata, out_dir):
    """The suite's PNG files in out_dir (none for the features suite: its rows are ratios against
    targets, which its table states). Returns their paths."""
    plotter = PLOTTERS.get(suite.name)
    if plotter is None:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return plotter(plt, suite, metadata, out_dir)
