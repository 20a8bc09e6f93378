"""report.md from report-context.json (pure, deterministic): the default generator's template.

Plain Markdown (headings, tables, one fenced block for the sparkline) so it reads the same in a
terminal and in a browser. Every figure comes from the context; nothing is computed from records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BARS = "▁▂▃▄▅▆▇█"
MISSING = "·"
LEVEL_MARK = {"NORMAL": "▁", "WARNING": "▅", "CRITICAL": "█"}


def num(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def duration(seconds: float) -> str:
    """``2h 05m 00s``, ``4m 30s``, ``12.5s``."""
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h {m:02d}m {s:02d}s"
    if m:
        return f"{m}m {s:02d}s"
    return f"{seconds:g}s"


def clock(kst: str | None) -> str:
    """``14:05:00`` from a KST ISO time (the report's day is implied); ``—`` when open."""
    return "—" if kst is None else kst[11:19]


def when(kst: str | None, utc: str | None) -> str:
    return "—" if kst is None or utc is None else f"{kst[11:19]} ({utc[11:19]}Z)"


def sparkline(values: Sequence[float | None], *, top: float = 100.0) -> str:
    """One character per hour: a bar for its value (0..top), ``·`` for a missing hour."""
    out = []
    for v in values:
        if v is None:
            out.append(MISSING)
        else:
            out.append(BARS[min(len(BARS) - 1, int(max(0.0, v) / top * len(BARS)))])
    return "".join(out)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "|".join("---" for _ in header) + "|", *(line(r) for r in rows)]


def _hour_axis() -> str:
    return (
        "".join(str(h // 10) if h % 6 == 0 else " " for h in range(24))
        + "\n"
        + "".join(str(h % 10) if h % 6 == 0 else " " for h in range(24))
    )


def _timeline_block(facts: Mapping[str, Any], value_of: Any, legend: str) -> list[str]:
    chars = []
    for row in facts["timeline"]:
        if row["status"] == "future":
            chars.append(" ")
        elif row["status"] == "missing":
            chars.append(MISSING)
        else:
            chars.append(value_of(row))
    return ["```", "".join(chars), _hour_axis(), "```", legend]


def _heading(facts: Mapping[str, Any], title: str) -> list[str]:
    head = facts["headline"]
    level = head["worst_level"] or "NO DATA"
    lines = [f"# {title}: {facts['report_date']} (KST)", ""]
    lines.append(f"**Status: {level}**: " + _headline_text(facts))
    lines.append("")
    span = (
        f"Window {facts['window_start_utc']} to {facts['window_end_utc']} "
        f"(KST {facts['report_date']} 00:00 to 24:00)."
    )
    if not facts["complete_day"]:
        span += f" **Today so far**, as of {clock(facts['as_of_kst'])} KST."
    lines += [span, ""]
    return lines


def _headline_text(facts: Mapping[str, Any]) -> str:
    head = facts["headline"]
    parts = [
        f"{head['incidents']} incident(s)"
        + (f", {head['critical_incidents']} critical" if head["critical_incidents"] else "")
    ]
    if facts["kind"] == "factory":
        parts.append(f"max risk score {num(head['max_score'], 0)}")
        parts.append(f"data completeness {pct(head['completeness'])}")
    else:
        parts.append(f"{head['checks_below_full_availability']} check(s) below 100 % availability")
        parts.append("drift found" if head["drift_found"] else "no drift")
    if head["missing_hours"]:
        parts.append(f"{head['missing_hours']} hour(s) missing")
    return "; ".join(parts) + "."


def _reasons(reasons: Sequence[Mapping[str, Any]]) -> str:
    shown = []
    for r in reasons:
        peak = f" {num(r['peak_value'])}" if r["peak_value"] is not None else ""
        limit = f" (limit {num(r['threshold'])})" if r["threshold"] is not None else ""
        shown.append(f"{r['code']}{peak}{limit}")
    return ", ".join(shown) or "—"


def _incident_rows(found: Sequence[Mapping[str, Any]], tier: bool) -> list[list[str]]:
    rows = []
    for n, i in enumerate(found, 1):
        crit = ", ".join(
            f"{clock(c['start_kst'])}-{clock(c['end_kst'])}" for c in i["critical_periods"]
        )
        row = [str(n)] + ([i["tier"]] if tier else [])
        row += [
            i["level"],
            when(i["start_kst"], i["start_utc"]),
            "ongoing" if i["ongoing"] else when(i["end_kst"], i["end_utc"]),
            duration(i["duration_s"]),
        ]
        if not tier:
            row.append(num(i["peak_score"], 0))
        row += [_reasons(i["reasons"]), crit or "—"]
        rows.append(row)
    return rows


def _incidents(facts: Mapping[str, Any], *, tier: bool = False) -> list[str]:
    lines = ["## Incidents", ""]
    found = facts["incidents"]
    if not found:
        return [*lines, "No WARNING or CRITICAL period.", ""]
    header = ["#"] + (["tier"] if tier else []) + ["level", "start KST (UTC)", "end KST (UTC)"]
    header += ["duration"] + ([] if tier else ["peak score"]) + ["reasons (peak)", "critical"]
    return [*lines, *table(header, _incident_rows(found, tier)), ""]


def _answer(r: Mapping[str, Any]) -> str:
    if not r["acknowledged"]:
        return "unacknowledged"
    via = f" via {r['acknowledged_via']}" if r["acknowledged_via"] else ""
    return f"{r['acknowledged_by']}{via} after {duration(r['time_to_acknowledge_s'])}"


def _resolution(r: Mapping[str, Any]) -> str:
    if r["open"]:
        return f"open ({r['state']})"
    by = (
        "the data" if r["resolved_via"] == "data" else f"{r['resolved_by']} via {r['resolved_via']}"
    )
    return f"after {duration(r['time_to_resolve_s'])} by {by}"


def _told(r: Mapping[str, Any]) -> str:
    told = ", ".join(f"{name} x{n}" for name, n in r["receivers"].items()) or "nobody"
    failed = f"; {r['failed_notifications']} failed" if r["failed_notifications"] else ""
    return f"{r['notifications']}: {told}{failed}"


def mean_line(alerts: Mapping[str, Any]) -> str:
    """``MTTA 4m 00s over 2 acknowledged (1 unacknowledged, left out); MTTR ...``."""
    c = alerts["counts"]
    mtta = "—" if alerts["mtta_s"] is None else duration(alerts["mtta_s"])
    mttr = "—" if alerts["mttr_s"] is None else duration(alerts["mttr_s"])
    return (
        f"MTTA {mtta} over {alerts['mtta_over']} acknowledged ({c['unacknowledged']} "
        f"unacknowledged, left out); MTTR {mttr} over {alerts['mttr_over']} resolved "
        f"({c['open']} still open)."
    )


def _alert_incidents(facts: Mapping[str, Any]) -> list[str]:
    """What was paged that day and how it was answered."""
    alerts = facts.get("alert_incidents")
    lines = ["## Alert incidents", ""]
    if not alerts or not alerts["items"]:
        return [*lines, "No alert was paged.", ""]
    c = alerts["counts"]
    lines += [
        f"{c['total']} incident(s): {c['critical']} critical, {c['warning']} warning; "
        f"{c['open']} open, {c['resolved']} resolved; {c['escalated']} escalated.",
        "",
        mean_line(alerts),
        "",
    ]
    rows = [
        [
            str(n),
            when(r["triggered_kst"], r["triggered_utc"]),
            r["severity"],
            r["reason"],
            _answer(r),
            _resolution(r),
            r["resolution_note"] or "—",
            _told(r),
        ]
        for n, r in enumerate(alerts["items"], 1)
    ]
    header = ["#", "triggered KST (UTC)", "severity", "reason", "acknowledged", "resolved"]
    header += ["note", "notifications"]
    return [*lines, *table(header, rows), ""]


def _gaps(complete: Mapping[str, Any]) -> list[str]:
    if not complete["gaps"]:
        return [f"No gap longer than {num(complete['gap_threshold_s'], 0)} s.", ""]
    rows = [
        [
            when(g["start_kst"], g["start_utc"]),
            when(g["end_kst"], g["end_utc"]),
            duration(g["duration_s"]),
            g["kind"],
        ]
        for g in complete["gaps"]
    ]
    return [*table(["from KST (UTC)", "to KST (UTC)", "length", "kind"], rows), ""]


def render_factory(context: Mapping[str, Any]) -> str:
    f = context["facts"]
    lines = _heading(f, f"Daily report {f['target']}")
    lines += ["## Risk timeline (max score per KST hour)", ""]
    lines += _timeline_block(
        f,
        lambda row: (
            sparkline([row.get("max_score")]) if row.get("max_score") is not None else MISSING
        ),
        f"Scores 0-100 as ▁-█; {MISSING} an hour without data; blank: not yet.",
    )
    lines.append("")
    rows = [
        [
            f"{r['kst_hour']:02d}",
            r["status"] if r["status"] != "ok" else (r.get("worst_level") or "no risk data"),
            num(r.get("max_score"), 0) if r["status"] == "ok" else "—",
            str(r.get("factory_records", "—")) if r["status"] == "ok" else "—",
        ]
        for r in f["timeline"]
        if r["status"] != "future"
    ]
    lines += [*table(["KST hour", "worst level", "max score", "factory_state"], rows), ""]
    lines += _incidents(f)
    lines += _alert_incidents(f)

    lines += ["## Sensors", ""]
    if f["sensors"]:
        rows = [
            [
                name,
                num(s["min"]),
                num(s["avg"]),
                num(s["max"]),
                num(s.get("p95")),
                ", ".join(f"{h:02d}" for h in s["hours_out_of_range"]) or "—",
            ]
            for name, s in f["sensors"].items()
        ]
        lines += table(["sensor", "min", "avg", "max", "p95", "KST hours out of range"], rows)
        lines += ["", f"_{f['p95_method']}._", ""]
    else:
        lines += ["No factory_state records.", ""]

    lines += ["## AI detections", ""]
    if f["detections"]:
        rows = [
            [
                label,
                str(d["count"]),
                num(d["max_confidence"]),
                ", ".join(f"{c} ({n})" for c, n in d["cameras"].items()),
            ]
            for label, d in f["detections"].items()
        ]
        lines += [*table(["label", "detections", "max confidence", "cameras"], rows), ""]
    else:
        lines += ["None.", ""]

    c = f["completeness"]
    lines += ["## Data completeness", ""]
    lines.append(
        f"- factory_state received: {c['received']:,} of {c['expected']:,} expected "
        f"({pct(c['ratio'])}; one every {num(c['cadence_s'], 1)} s, {c['cadence_source']})"
        if c["expected"]
        else f"- factory_state received: {c['received']:,} (no cadence to expect from)"
    )
    missing = ", ".join(f"{h:02d}" for h in c["missing_hours"]) or "none"
    lines.append(f"- missing KST hours (no objects at all): {missing}")
    if c["hours_without_factory_state"]:
        only = ", ".join(f"{h:02d}" for h in c["hours_without_factory_state"])
        lines.append(f"- KST hours with objects but no factory_state: {only}")
    lines.append(
        f"- stale {duration(c['stale_s'])}, offline {duration(c['offline_s'])}"
        + (f"; {c['skipped_objects']} unreadable object(s) skipped" if c["skipped_objects"] else "")
    )
    lines += ["", *_gaps(c)]

    infra = f["infra"]
    lines += ["## Edge infrastructure", ""]
    if infra["records"]:
        rows = [
            [name, num(s["min"]), num(s["avg"]), num(s["max"])]
            for name, s in infra["series"].items()
        ]
        lines += [*table(["figure", "min", "avg", "max"], rows), ""]
        cams = [
            f"{cam} offline in {v['offline']} of {v['observations']} reports"
            for cam, v in infra["cameras"].items()
            if v["offline"]
        ]
        lines.append("- cameras: " + ("; ".join(cams) if cams else "all online in every report"))
        stages = ", ".join(f"{s} x{n}" for s, n in infra["pipeline_not_ok"].items())
        lines += [f"- pipeline stages not ok: {stages or 'none'}", ""]
    else:
        lines += ["No infra_state records.", ""]

    img = f["images"]
    lines += ["## Image snapshots", ""]
    if img["count"]:
        per = ", ".join(f"{c} ({n})" for c, n in img["cameras"].items())
        lines += [f"{img['count']} snapshot(s), {img['bytes']:,} bytes: {per}.", ""]
    else:
        lines += ["None.", ""]
    return "\n".join(lines).rstrip() + "\n"


def render_cloud(context: Mapping[str, Any]) -> str:
    f = context["facts"]
    lines = _heading(f, "Daily report cloud infrastructure")
    lines += ["## Status by KST hour", ""]
    lines += _timeline_block(
        f,
        lambda row: LEVEL_MARK.get(row.get("worst_level") or "", MISSING),
        f"▁ NORMAL, ▅ WARNING, █ CRITICAL (worst run of the hour); {MISSING} no collector run.",
    )
    lines += ["", "## Collector runs", ""]
    rows = [
        [
            tier,
            str(t["snapshots"]),
            ", ".join(f"{k} {v}" for k, v in t["status_counts"].items()),
            clock(t["first_kst"]),
            clock(t["last_kst"]),
        ]
        for tier, t in f["tiers"].items()
    ]
    lines += [*table(["tier", "runs", "statuses", "first KST", "last KST"], rows), ""]
    lines += _incidents(f, tier=True)
    lines += _alert_incidents(f)
    lines += ["## Availability per check", ""]
    rows = [
        [
            name,
            str(c["runs"]),
            pct(c["availability"]),
            str(c["warning"]),
            str(c["critical"]),
            f"{num(c['worst_value'])} {c['unit'] or ''}".strip(),
            ", ".join(f"{r} x{n}" for r, n in c["reasons"].items()) or "—",
        ]
        for name, c in f["availability"].items()
    ]
    header = ["check", "runs", "ok", "warning", "critical", "worst value", "reasons"]
    lines += [*table(header, rows), "", "## Worst latencies", ""]
    if f["worst_latencies"]:
        rows = [
            [r["check"], num(r["worst_ms"], 1), clock(r["worst_kst"])] for r in f["worst_latencies"]
        ]
        lines += [*table(["check", "worst ms", "at KST"], rows), ""]
    else:
        lines += ["No latency measured.", ""]
    lines += ["## Drift", ""]
    if f["drift"]:
        rows = [
            [name, str(d["runs"]), clock(d["first_kst"]), clock(d["last_kst"]), d["detail"]]
            for name, d in f["drift"].items()
        ]
        lines += [*table(["check", "runs", "first KST", "last KST", "detail"], rows), ""]
    else:
        lines += ["The bucket and table matched the storage contract in every run.", ""]
    missing = ", ".join(f"{h:02d}" for h in f["completeness"]["missing_hours"]) or "none"
    lines += [f"Missing KST hours (no collector run at all): {missing}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def render(context: Mapping[str, Any]) -> str:
    facts = context["facts"]
    return render_factory(context) if facts["kind"] == "factory" else render_cloud(context)
