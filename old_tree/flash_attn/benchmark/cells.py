"""Result cells (one implementation at one configuration), rows, suites, and the ratios between them."""

import re
from dataclasses import dataclass, field

OK, OOM, SKIPPED, ERROR = "ok", "oom", "skipped", "error"
SHORT_ERROR_CHARS = 48  # an error cell in a markdown table stays readable at this length


@dataclass
class Cell:
    """status is ok / oom / skipped / error. value is the suite's metric (TFLOP/s, GB/s, ms or MiB,
    named by the suite); ms the median time in milliseconds where the cell was timed; note says why a
    cell has no value, or how the value was obtained."""

    status: str
    value: float | None = None
    ms: float | None = None
    note: str = ""

    @property
    def ok(self):
        return self.status == OK and self.value is not None


@dataclass
class Row:
    """One configuration: `config` describes it, `cells` holds one Cell per implementation name,
    `extra` holds derived numbers (speed-ups, error vs a peer), `ratios` ours against the peers."""

    config: dict
    cells: dict
    extra: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)


@dataclass
class Suite:
    """The rows of one suite. `columns` are implementation names in display order, `ours` our
    implementation names by priority (the first with a value is compared with the peers), `metric`
    the unit of the cell values, `config_keys` the config entries shown in tables, `extra_columns`
    (key in Row.extra, header, digits) the derived numbers shown after the cells, `digits` the
    decimals of a cell, `show_us` whether a cell also shows its time in microseconds, `peer_ratios`
    whether rows compare ours with peers (ours / best peer, ours / sdpa-flash); a suite whose rows
    compare a feature with its own baseline states its ratios in extra columns instead."""

    name: str
    title: str
    metric: str
    higher_is_better: bool
    columns: list
    ours: list
    config_keys: list
    extra_columns: list = field(default_factory=list)
    digits: int = 1
    show_us: bool = False
    peer_ratios: bool = True
    rows: list = field(default_factory=list)
    noise: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    @property
    def peers(self):
        """The other implementations: neither in `ours` nor one of our own variants (ours-*)."""
        return [name for name in self.columns if name not in self.ours and not name.startswith("ours")]


def advantage(ours, peer, higher_is_better):
    """How many times better `ours` is than `peer` (> 1: ours wins), or None without two values."""
    if not (ours.ok and peer.ok) or ours.value <= 0 or peer.value <= 0:
        return None
    return ours.value / peer.value if higher_is_better else peer.value / ours.value


def best_peer(cells, peers, higher_is_better):
    """Name of the best peer with a value, or None."""
    valued = [name for name in peers if name in cells and cells[name].ok]
    if not valued:
        return None
    pick = max if higher_is_better else min
    return pick(valued, key=lambda name: cells[name].value)


def first_ours(cells, ours):
    """The first of our implementations with a value, else the first one present, else None."""
    present = [name for name in ours if name in cells]
    for name in present:
        if cells[name].ok:
            return name
    return present[0] if present else None


def compute_ratios(suite, reference_peer="flash"):
    """Fill each row's ratios: ours over the best peer of the same run, and ours over `reference_peer`
    (SDPA's FlashAttention 2 backend: our acceptance bar)."""
    for row in suite.rows:
        ours = first_ours(row.cells, suite.ours)
        best = best_peer(row.cells, suite.peers, suite.higher_is_better)
        row.ratios = {"ours": ours, "best_peer": best, "ours_over_best_peer": None, "ours_over_reference": None}
        if ours is None:
            continue
        if best is not None:
            row.ratios["ours_over_best_peer"] = advantage(row.cells[ours], row.cells[best], suite.higher_is_better)
        if reference_peer in row.cells:
            row.ratios["ours_over_reference"] = advantage(
                row.cells[ours], row.cells[reference_peer], suite.higher_is_better
            )


def short_text(text, limit=SHORT_ERROR_CHARS):
    """First line of `text`, without characters that break a markdown table, at most `limit` chars."""
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    line = line.replace("|", "/")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _without_exception_type(note):
    """'RuntimeError: No available kernel' -> 'No available kernel': the table has little room."""
    return re.sub(r"^[A-Za-z_.]*(Error|Exception): ", "", note)


def format_value(value, digits=1):
    if value is None:
        return "—"
    return f"{value:.{digits}f}"


def format_cell(cell, digits=1):
    """Markdown text of a cell: its value, or OOM / skip / error: <short message>."""
    if cell is None:
        return ""
    if cell.ok:
        return format_value(cell.value, digits)
    if cell.status == OOM:
        return "OOM"
    if cell.status == SKIPPED:
        return "skip"
    return f"error: {short_text(_without_exception_type(cell.note))}"
