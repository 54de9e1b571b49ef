"""The example's outputs: loss curves and the long-context memory chart (PNG), a markdown summary and
the raw numbers (JSON), all in one directory."""

import json

import matplotlib

matplotlib.use("Agg")  # files only: runs on machines without a display
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"ours": "flash_attn MHA", "plain": "plain PyTorch attention"}


def write_all(results, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    _loss_curves(results["runs"], out_dir / "loss_curves.png", results["title"])
    if results["memory"]:
        _memory_chart(results["memory"], out_dir / "memory.png", results["memory_batch"])
    (out_dir / "results.md").write_text(markdown(results))


def _loss_curves(runs, path, title):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for kind, run in runs.items():
        axes[0].plot(run["eval_steps"], run["train_loss"], label=LABELS[kind])
        axes[1].plot(run["eval_steps"], run["val_loss"], label=LABELS[kind])
    for axis, name in zip(axes, ("train", "validation")):
        axis.set(title=f"{name} loss", xlabel="step", ylabel="cross-entropy (nats / byte)")
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _memory_chart(memory, path, batch):
    contexts = sorted({row["context"] for row in memory})
    fig, axis = plt.subplots(figsize=(6, 4))
    width = 0.38
    for offset, kind in zip((-width / 2, width / 2), LABELS):
        rows = {row["context"]: row for row in memory if row["attention"] == kind}
        heights = [rows[c]["peak_mib"] or 0 for c in contexts]
        bars = axis.bar([i + offset for i in range(len(contexts))], heights, width, label=LABELS[kind])
        for bar, c in zip(bars, contexts):
            if rows[c]["peak_mib"] is None:
                axis.annotate("OOM", (bar.get_x() + width / 2, 0), ha="center", va="bottom")
    axis.set(xticks=range(len(contexts)), xticklabels=[str(c) for c in contexts], xlabel="context (tokens)",
             ylabel="peak memory (MiB)", title=f"one training step, batch {batch}")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(results):
    lines = [f"# {results['title']}", "", results["setup"], "",
             "| attention | steps | train loss | val loss | tokens/s | peak memory (MiB) |",
             "|---|---|---|---|---|---|"]
    for kind, run in results["runs"].items():
        lines.append(f"| {LABELS[kind]} | {run['steps_done']} | {run['train_loss'][-1]:.3f} | "
                     f"{run['val_loss'][-1]:.3f} | {run['tokens_per_s']:,.0f} | {_mib(run['peak_mib'], 'n/a (CPU)')} |")
    if results["memory"]:
        batch = results["memory_batch"]
        lines += ["", f"One training step (forward + backward) at long context, batch {batch}:", "",
                  "| context | attention | peak memory (MiB) | ms / step |", "|---|---|---|---|"]
        for row in results["memory"]:
            step = "OOM" if row["ms_per_step"] is None else f"{row['ms_per_step']:.1f}"
            lines.append(f"| {row['context']} | {LABELS[row['attention']]} | {_mib(row['peak_mib'], 'OOM')} | {step} |")
    return "\n".join(lines) + "\n"


def _mib(value, missing):
    """Runs on the CPU have no peak-memory counter; a long-context step that ran out of memory has none."""
    return missing if value is None else f"{value:,.0f}"
