"""The report: a table per fault schedule, and a timeline PNG when matplotlib is there."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faults.history import FAIL, INFO, OK, History
from faults.run import Outcome

COLUMNS = ("schedule", "nodes", "faults", "overlaps", "ops", "adds ok", "delivered", "lost",
           "dups", "dup causes", "after ack", "after GC", "max unavail", "defects")


def row(outcome: Outcome) -> list[str]:
    r = outcome.result
    causes = ", ".join(f"{k} {v}" for k, v in sorted(r.duplicates.items())) or "-"
    lost = str(len(r.lost)) + (f" (+{len(r.lost_excused)} excused)" if r.lost_excused else "")
    return [
        f"{outcome.schedule.kind} {outcome.schedule.seconds:g}s",
        str(outcome.schedule.nodes),
        f"{r.faults_with_effect}/{r.faults}",
        str(len(r.overlaps)),
        str(r.ops),
        f"{r.adds['sync ok']}+{r.adds['async ok']}a",
        str(r.delivered_jobs),
        lost,
        str(r.duplicate_count),
        causes,
        str(r.delivered_after_ack),
        str(len(r.delivered_after_gc)),
        f"{r.max_unavailable_s:.1f}s",
        str(len(r.defects())),
    ]


#: Added when a schedule had ordered groups (``--groups``): the group jobs
#: delivered, and the deliveries out of order and overlapping, by cause.
GROUP_COLUMNS = ("group jobs", "out of order", "overlapping")


def _by_cause(counts: dict[str, int]) -> str:
    return (f"{sum(counts.values())} (" + ", ".join(f"{k} {v}" for k, v in sorted(
        counts.items())) + ")") if counts else "0"


def group_cells(outcome: Outcome) -> list[str]:
    g = outcome.result.groups
    return [f"{g.jobs} in {g.keys} groups", _by_cause(g.out_of_order),
            _by_cause(g.overlapping)]


def table(outcomes: Sequence[Outcome]) -> str:
    """A Markdown table, one row per schedule (also fine on a terminal)."""
    columns = list(COLUMNS)
    rows = [row(o) for o in outcomes]
    if any(o.result.groups.keys for o in outcomes):
        columns[-1:-1] = GROUP_COLUMNS
        for r, o in zip(rows, outcomes, strict=True):
            r[-1:-1] = group_cells(o)
    rows.insert(0, columns)
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
             for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


#: RSS growth is fitted from this long after a node (re)started: before,
#: the node's 300 s windows (acked IDs, IDMP keys) are still filling.
GROWTH_AFTER_S = 900.0
#: ... over at least this long, else the run is too short to tell.
GROWTH_MIN_SPAN_S = 1200.0


def rss_growth_per_hour(samples: Sequence[dict[str, Any]], node: str) -> float | None:
    """MB per hour by which ``node``'s RSS grew over the heals: a least-squares
    fit over the longest stretch without a restart (an RSS drop of more than
    2 MB), from :data:`GROWTH_AFTER_S` after it began; None for a run too
    short to tell."""
    stretches: list[list[tuple[float, float]]] = [[]]
    for sample in samples:
        data = sample.get(node)
        if data is None or sample["phase"] not in ("healed", "collected"):
            continue
        current = stretches[-1]
        if current and data["rss"] < current[-1][1] - 2e6:
            stretches.append(current := [])
        current.append((sample["t"], data["rss"]))
    best: list[tuple[float, float]] = []
    for index, stretch in enumerate(stretches):
        began = 0.0 if index == 0 else stretch[0][0]  # windows fill again after a restart
        kept = [(t, rss) for t, rss in stretch if t >= began + GROWTH_AFTER_S]
        if kept and (not best or kept[-1][0] - kept[0][0] > best[-1][0] - best[0][0]):
            best = kept
    if len(best) < 5 or best[-1][0] - best[0][0] < GROWTH_MIN_SPAN_S:
        return None
    mean_t = sum(t for t, _ in best) / len(best)
    mean_rss = sum(rss for _, rss in best) / len(best)
    slope = (sum((t - mean_t) * (rss - mean_rss) for t, rss in best)
             / sum((t - mean_t) ** 2 for t, _ in best))
    return slope * 3600 / 1e6


def memory_table(outcomes: Sequence[Outcome]) -> str:
    """Per schedule and node: RSS and used_memory at the start, after the
    first and the last heal, and once collected (MB), with the jobs and
    IDMP keys still held at the end, and on long runs the RSS growth once
    the node's windows are full (:func:`rss_growth_per_hour`)."""
    lines = []
    for outcome in outcomes:
        samples = outcome.result.memory
        healed = [m for m in samples if m["phase"] == "healed"]
        picks = [m for m in (samples[0] if samples else None,
                             healed[0] if healed else None,
                             healed[-1] if len(healed) > 1 else None,
                             samples[-1] if samples else None) if m is not None]
        if len(picks) < 2:
            continue
        nodes = sorted(k for k in picks[-1] if k not in ("t", "phase"))
        for node in nodes:
            cells = []
            for m in picks:
                data = m.get(node)
                cells.append("-" if data is None else
                             f"{m['phase']}@{m['t']:.0f}s rss {data['rss'] / 1e6:.1f} "
                             f"used {data['used_memory'] / 1e6:.1f}")
            end = picks[-1].get(node) or {}
            growth = rss_growth_per_hour(samples, node)
            lines.append(f"| {outcome.schedule.kind} | {node} | " + " | ".join(cells)
                         + f" | jobs {end.get('registered_jobs', '?')}, idmp "
                           f"{end.get('idmp_keys', '?')} | "
                         + ("-" if growth is None else f"rss {growth:+.2f} MB/h") + " |")
    if not lines:
        return ""
    return ("memory (MB): start | first heal | last heal | collected | held at the end | "
            "RSS growth once the windows are full\n" + "\n".join(lines))


def details(outcome: Outcome) -> str:
    """The faults applied, their effects, and every defect, for one schedule."""
    r = outcome.result
    lines = [f"## {outcome.schedule.kind}"]
    for f in outcome.history.faults:
        end = f"{f.end:.1f}" if f.end is not None else "?"
        lines.append(f"  {f.start:6.1f}-{end:>6}s {f.kind}: {f.description}"
                     + (f" [{'; '.join(f.effects)}]" if f.effects else " [no effect seen]"))
    lines.append(f"  adds: {dict(r.adds)}; deliveries {r.deliveries} of {r.delivered_jobs} "
                 f"jobs; ASYNC never delivered: {len(r.async_undelivered)}; TTL jobs "
                 f"expired undelivered: {len(r.expired_undelivered)}")
    if r.lost_excused:
        lines.append(f"  losses excused: {dict(r.excused_by)}")
    g = r.groups
    if g.keys:
        lines.append(f"  groups: {g.jobs} jobs in {g.keys} groups ({g.resent} re-sent by the "
                     f"client), {g.deliveries} deliveries; first deliveries in add order in "
                     f"{g.in_order} of {g.delivered} groups; out of order "
                     f"{_by_cause(g.out_of_order)}; overlapping {_by_cause(g.overlapping)}")
        lines += [f"  group: {line}" for line in g.examples]
    for a, b in r.overlaps:
        lines.append(f"  overlap: {a}  WITH  {b}")
    for job_id, shown in r.queued_twice_shown.items():
        lines.append(f"  queued twice: {job_id}: "
                     + "; ".join(f"{node} {text}" for node, text in shown.items()))
    for note in outcome.notes:
        lines.append(f"  note: {note}")
    for defect in r.defects():
        lines.append(f"  DEFECT: {defect}")
    return "\n".join(lines)


_COLOURS = {OK: "tab:green", FAIL: "tab:red", INFO: "tab:orange"}
_FAULT_COLOURS = {"partition": "tab:purple", "pause": "tab:blue", "kill": "tab:red",
                  "lossy": "tab:olive", "slow": "tab:cyan", "clock": "tab:brown",
                  "disk": "tab:pink"}


def timeline(outcomes: Sequence[Outcome], path: Path) -> Path | None:
    """One panel per schedule: each process's operations on its lane, faults shaded.

    Returns None (and draws nothing) without matplotlib: it is optional.
    """
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(outcomes), 1, figsize=(14, 3.2 * len(outcomes)),
                             squeeze=False)
    for ax, outcome in zip(axes[:, 0], outcomes, strict=True):
        _panel(ax, outcome.history, outcome.schedule.kind)
    axes[-1, 0].set_xlabel("seconds since the start of the schedule")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _panel(ax, history: History, title: str) -> None:
    lanes = sorted({o.process for o in history.ops if o.kind != "gc"},
                   key=lambda p: (p[0] != "p", p))
    y = {p: i for i, p in enumerate(lanes)}
    for fault in history.faults:
        end = fault.end if fault.end is not None else history.now()
        ax.axvspan(fault.start, end, color=_FAULT_COLOURS.get(fault.kind, "grey"), alpha=0.15)
        ax.text(fault.start, len(lanes) - 0.4, fault.description.split(":")[0][:18],
                fontsize=6, va="top")
    for outcome, colour in _COLOURS.items():
        # One call per lane and colour: a long run has tens of thousands of ops.
        for process, lane in y.items():
            bars = [(o.start, max(o.end - o.start, 0.01)) for o in history.ops
                    if o.process == process and o.outcome == outcome
                    and not o.extra.get("empty")]
            if bars:
                ax.broken_barh(bars, (lane - 0.35, 0.7), color=colour, linewidth=0)
    for name, t in history.marks.items():
        ax.axvline(t, color="black", linewidth=0.6, linestyle=":")
        ax.text(t, -0.9, name, fontsize=6, rotation=0)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=7)
    ax.set_ylim(-1, len(lanes))
    ax.set_title(f"{title}: operations (green ok, red error, orange unknown), faults shaded",
                 fontsize=9)
