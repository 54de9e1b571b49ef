"""Markdown and JSON of a run: the header with the device and versions, one table per suite with
ours / best peer and ours / sdpa-flash per row, the noise estimate, and why cells have no value."""

import dataclasses
import json
import math
from pathlib import Path

from .cells import ERROR, format_cell, format_value
from .env import environment_line
from .impls import label
from .shapes import format_seqlen

JSON_NAME = "results.json"
MARKDOWN_NAME = "results.md"
MAX_LISTED_NOTES = 12  # distinct error messages listed under a table; the JSON has all of them
NOTE_CHARS = 240


def _config_text(key, value):
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in ("seqlen", "context") and isinstance(value, int):
        return format_seqlen(value)
    return str(value)


def _ratio_text(ratio, best=None):
    if ratio is None:
        return "—"
    return f"{ratio:.2f} ({label(best)})" if best else f"{ratio:.2f}"


def _cell_text(suite, cell):
    if suite.show_us and cell is not None and cell.ok and cell.ms is not None:
        return f"{cell.ms * 1000:.1f} µs · {format_value(cell.value, suite.digits)}"
    return format_cell(cell, suite.digits)


def _extra_text(value, digits):
    if value is None:
        return ""
    if isinstance(value, float):
        return format_value(value, digits)
    return str(value)


def _ratio_headers(suite):
    if not suite.peer_ratios:
        return []
    return ["ours / best peer"] + (["ours / sdpa-flash"] if "flash" in suite.columns else [])


def _ratio_cells(suite, row):
    if not suite.peer_ratios:
        return []
    cells = [_ratio_text(row.ratios.get("ours_over_best_peer"), row.ratios.get("best_peer"))]
    if "flash" in suite.columns:
        cells.append(_ratio_text(row.ratios.get("ours_over_reference")))
    return cells


def suite_table(suite):
    """The suite's markdown table: config columns, one column per implementation, the derived columns,
    then (for suites that compare with peers) ours / best peer, naming the peer, and ours / sdpa-flash."""
    headers = (list(suite.config_keys) + [label(name) for name in suite.columns]
               + [header for _, header, _ in suite.extra_columns] + _ratio_headers(suite))
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in suite.rows:
        cells = ([_config_text(key, row.config.get(key)) for key in suite.config_keys]
                 + [_cell_text(suite, row.cells.get(name)) for name in suite.columns]
                 + [_extra_text(row.extra.get(key), digits) for key, _, digits in suite.extra_columns]
                 + _ratio_cells(suite, row))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell_notes(suite):
    """Distinct error messages, and notes on cells that have a value (how it was obtained)."""
    seen, notes = set(), []
    for row in suite.rows:
        for name, cell in row.cells.items():
            if not cell.note or not (cell.status == ERROR or cell.ok):
                continue
            key = (name, cell.note)
            if key not in seen:
                seen.add(key)
                text = cell.note if len(cell.note) <= NOTE_CHARS else cell.note[: NOTE_CHARS - 1] + "…"
                notes.append(f"- {label(name)}: {text}")
    if len(notes) > MAX_LISTED_NOTES:
        notes = notes[:MAX_LISTED_NOTES] + [f"- … {len(notes) - MAX_LISTED_NOTES} more in {JSON_NAME}"]
    return notes


def _noise_line(noise):
    if not noise or noise.get("max_spread_pct") is None:
        return None
    return (f"Noise: {noise['config']} timed twice; the largest spread between the two medians was "
            f"{noise['max_spread_pct']:.1f}%. Differences smaller than that are noise.")


def suite_markdown(suite):
    """Title, table, then one paragraph per note, the noise line, and the cell notes as a list."""
    paragraphs = [f"## {suite.title}", suite_table(suite), *suite.notes]
    noise = _noise_line(suite.noise)
    if noise:
        paragraphs.append(noise)
    notes = _cell_notes(suite)
    if notes:
        paragraphs.append("\n".join(["Cell notes:", *notes]))
    return "\n\n".join(paragraphs) + "\n"


def header_markdown(metadata):
    gpu_details = ", ".join(
        text for text in (
            f"sm {metadata['capability']}" if metadata.get("capability") else "",
            f"{metadata['sm_count']} SMs" if metadata.get("sm_count") else "",
            f"{metadata['memory_gib']} GiB" if metadata.get("memory_gib") else "",
        ) if text
    )
    lines = [
        f"# flash_attn benchmark — {environment_line(metadata)}",
        "",
        f"- Device: {metadata['device']}" + (f" ({gpu_details})" if gpu_details else ""),
        f"- Software: torch {metadata['torch']}, CUDA {metadata['cuda']}, cuDNN {metadata['cudnn']}, "
        f"triton {metadata['triton']}, Python {metadata['python']}",
        f"- flash_attn {metadata['flash_attn']} "
        f"(CUDA kernels loaded: {'yes' if metadata['flash_attn_cuda_kernels'] else 'no'})"
        + (f", commit {metadata['git_commit']}" if metadata.get("git_commit") else ""),
        f"- Date: {metadata['time']}",
    ]
    if metadata.get("timer"):
        lines.append(f"- Timer: {metadata['timer']}")
    if metadata.get("set"):
        lines.append(f"- Set: {metadata['set']}")
    if metadata.get("plots"):
        lines.append(f"- Plots: {metadata['plots']}")
    lines += [
        "- ours / best peer: ours over the best peer measured in this run, per row (> 1: ours is faster, or "
        "for memory smaller); ours / sdpa-flash: the same against SDPA's FlashAttention 2 backend, our "
        "acceptance bar. OOM: would not fit (estimated before running, or out of memory); skip: over the "
        "quick set's cost cap (naive and sdpa-math where they move tens of GB).",
    ]
    return "\n".join(lines) + "\n"


def markdown_report(metadata, suites):
    return "\n".join([header_markdown(metadata)] + [suite_markdown(suite) for suite in suites])


def _finite(value):
    """JSON has no NaN or infinity: write them as strings ('nan', 'inf') so the file stays valid."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def results_json(metadata, suites):
    return _finite({"metadata": metadata, "suites": {suite.name: dataclasses.asdict(suite) for suite in suites}})


def write_results(out_dir, metadata, suites):
    """Write results.json and results.md into out_dir (created). Returns the two paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / JSON_NAME, out_dir / MARKDOWN_NAME
    json_path.write_text(json.dumps(results_json(metadata, suites), indent=1, allow_nan=False) + "\n")
    md_path.write_text(markdown_report(metadata, suites))
    return [json_path, md_path]
