"""The benchmark's outputs: a markdown summary, the raw numbers (JSON) and a bar chart of tokens/s and
peak memory (PNG), all in one directory."""

import json

import matplotlib

matplotlib.use("Agg")  # files only: runs on machines without a display
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"ours": "flash_attn MHA", "plain": "plain PyTorch attention", "sdpa": "PyTorch SDPA"}

# The FlashAttention articles' LLaMA claim as issue #10 quotes it: LLaMA-7B training at 4k context on
# an A100, flash attention against standard PyTorch attention.
ARTICLES = {"context": 4096, "speedup": 2.9, "memory_change_pct": -52.8, "device": "A100"}


def write_all(results, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    _chart(results["runs"], out_dir / "throughput_memory.png", results["title"])
    (out_dir / "results.md").write_text(markdown(results))


def _chart(runs, path, title):
    contexts = sorted({run["context"] for run in runs})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(LABELS)
    for axis, key, ylabel in ((axes[0], "tokens_per_s", "training tokens / s"),
                              (axes[1], "peak_mib", "peak memory (MiB)")):
        for index, kind in enumerate(LABELS):
            rows = {run["context"]: run for run in runs if run["attention"] == kind}
            offset = (index - (len(LABELS) - 1) / 2) * width
            _bars(axis, [i + offset for i in range(len(contexts))], [rows.get(c) for c in contexts], key, width,
                  LABELS[kind])
        axis.set(xticks=range(len(contexts)), xticklabels=[str(c) for c in contexts], xlabel="context (tokens)",
                 ylabel=ylabel)
        axis.grid(axis="y", alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _bars(axis, positions, rows, key, width, label):
    """One implementation's bars; a run out of memory gets an empty bar marked OOM."""
    heights = [(row[key] or 0) if row else 0 for row in rows]
    bars = axis.bar(positions, heights, width, label=label)
    for bar, row in zip(bars, rows):
        if row and row["oom"]:
            axis.annotate("OOM", (bar.get_x() + width / 2, 0), ha="center", va="bottom", fontsize=8, rotation=90)


def markdown(results):
    lines = [f"# {results['title']}", "", results["setup"], "",
             "| context | batch | attention | tokens/s | ms / step | peak memory (MiB) | above weights + AdamW "
             "(MiB) | vs plain: speed | vs plain: memory | first-step loss | first-step grad norm |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in results["runs"]:
        plain = None if run["attention"] == "plain" else _plain_of(results["runs"], run["context"])
        lines.append(_row(run, plain))
    lines += ["", "SDPA backend picked by PyTorch (torch._fused_sdp_choice): "
              + ", ".join(f"{c['context']}: {c['sdpa_backend'] or 'unknown'}" for c in results["checks"]) + ".", ""]
    lines += [_agreement_line(check, results["tolerance"]) for check in results["checks"]]
    lines += ["", _beside_articles(results["runs"])]
    return "\n".join(lines) + "\n"


def _plain_of(runs, context):
    return next((run for run in runs if run["context"] == context and run["attention"] == "plain"), None)


def _row(run, plain):
    if run["oom"]:
        return f"| {run['context']} | {run['batch']} | {LABELS[run['attention']]} | OOM | OOM | OOM | | | | | |"
    return (f"| {run['context']} | {run['batch']} | {LABELS[run['attention']]} | {run['tokens_per_s']:,.0f} | "
            f"{run['ms_per_step']:.1f} | {_mib(run['peak_mib'])} | {_mib(run['above_resident_mib'])} | "
            f"{_speedup(run, plain)} | {_memory_change(run, plain)} | {run['first_loss']:.5f} | "
            f"{run['first_grad_norm']:.5f} |")


def speedup(run, plain):
    """run's throughput over plain's, None where either ran out of memory."""
    if run["oom"] or plain is None or plain["oom"]:
        return None
    return run["tokens_per_s"] / plain["tokens_per_s"]


def memory_change_pct(run, plain):
    """run's peak memory against plain's, in percent; None without both peaks (OOM, or the CPU)."""
    if run["oom"] or plain is None or plain["oom"] or run["peak_mib"] is None:
        return None
    return 100 * (run["peak_mib"] / plain["peak_mib"] - 1)


def _speedup(run, plain):
    value = speedup(run, plain)
    return "plain OOM" if value is None and plain and plain["oom"] else "" if value is None else f"{value:.2f}x"


def _memory_change(run, plain):
    value = memory_change_pct(run, plain)
    return "" if value is None else f"{value:+.1f}%"


def _agreement_line(check, tolerance):
    losses = ", ".join(f"{LABELS[kind]} {loss:.5f}" for kind, loss in check["first_loss"].items())
    return (f"- context {check['context']}, first step: loss {losses}; relative spread {check['loss_spread']:.1e} "
            f"(loss), {check['grad_norm_spread']:.1e} (gradient norm), tolerance {tolerance['loss']:.0e} / "
            f"{tolerance['grad_norm']:.0e}: {verdict(check)}")


def verdict(check):
    return {True: "agree", False: "DISAGREE", None: "not compared (fewer than two ran)"}[check["agree"]]


def _beside_articles(runs):
    """Our 4k numbers beside the articles' claim (the context they measured, if this run had it)."""
    context = ARTICLES["context"]
    claim = (f"The articles' claim at {context} tokens: {ARTICLES['speedup']}x the throughput of standard attention "
             f"and {ARTICLES['memory_change_pct']:+.1f}% memory (LLaMA-7B, {ARTICLES['device']}).")
    ours = next((run for run in runs if run["context"] == context and run["attention"] == "ours"), None)
    plain = _plain_of(runs, context)
    if ours is None or plain is None:
        return claim + f" This run has no {context}-token pair of ours and plain to set beside it."
    value, change = speedup(ours, plain), memory_change_pct(ours, plain)
    here = "plain attention ran out of memory" if plain["oom"] else f"{value:.2f}x the throughput"
    if change is not None:
        here += f", {change:+.1f}% peak memory"
    return claim + f" Here, flash_attn MHA against plain PyTorch attention at {context}: {here}."


def _mib(value):
    """Runs on the CPU have no peak-memory counter."""
    return "n/a (CPU)" if value is None else f"{value:,.0f}"
