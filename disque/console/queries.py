"""One query function per page: what the page (and its JSON twin) shows.

Each returns plain data (dicts, lists, numbers, text) that a template
renders and ``/api/...`` returns as JSON.  Each asks the nodes as the
session's user, through its :class:`~disque.console.nodes.Pool`; a node
that is down or refuses (``-NOPERM``) shows as such in its row.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

from disque.client import AsyncClient

from .bodies import BodyView, view_body
from .history import History
from .nodes import Answer, Node, Pool, Problem
from .queue_index import QueueFilter, QueueIndex, QueueStat, peeker, shower
from .replies import number, pairs, text
from .shows import body_size, show_one, show_pipeline

__all__ = ["overview", "queues", "queue", "browse_jobs", "job", "dead_letters", "nodes",
           "JOB_ID", "JOB_STATES", "LookupProblem", "parse_size"]

#: A Disque job ID: ``D-`` node prefix, 24 characters of ID, TTL parity.
JOB_ID = re.compile(r"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}")
JOB_STATES = ("queued", "active", "acked", "wait-repl")
#: Memory levels drawn on every node's bar (of maxmemory).
MEMORY_LEVELS = (75, 95, 100)


class LookupProblem(ValueError):
    """A request that names nothing valid (a bad job ID, a bad token); the text says why."""


def parse_size(value: Any) -> int:
    """``maxmemory`` as bytes: ``1073741824``, ``1gb``, ``100mb``, ``0``."""
    raw = text(value).strip().lower()
    units = {"kb": 1024, "mb": 1024**2, "gb": 1024**3, "k": 1000, "m": 1000**2, "g": 1000**3,
             "b": 1}
    for unit, factor in units.items():
        if raw.endswith(unit) and raw[:-len(unit)].isdigit():
            return int(raw[:-len(unit)]) * factor
    return int(raw) if raw.isdigit() else 0


def _problem(problem: Problem | None) -> dict[str, str] | None:
    return None if problem is None else {"kind": problem.kind, "message": problem.message}


# --------------------------------------------------------------------------
# /  (overview)
# --------------------------------------------------------------------------

async def _node_info(client: AsyncClient) -> dict[str, Any]:
    info = await client.info()
    server = info.get("server", {})
    memory = info.get("memory", {})
    if "maxmemory" not in memory:  # the original's INFO has no maxmemory
        try:
            memory["maxmemory"] = parse_size((await client.config_get("maxmemory"))
                                             .get("maxmemory", 0))
        except Exception:  # a user without CONFIG: the bar has no limit
            memory["maxmemory"] = 0
    return info | {"server": server, "memory": memory}


def _node_row(answer: Answer[dict[str, Any]], flags: dict[str, list[str]]) -> dict[str, Any]:
    node = answer.node
    row: dict[str, Any] = {"address": node.address, "id": node.id,
                           "flags": flags.get(node.id or "", []),
                           "problem": _problem(answer.problem)}
    if answer.value is None:
        row["state"] = answer.problem.kind if answer.problem else "error"
        return row
    info = answer.value
    server, memory = info["server"], info["memory"]
    persistence, clients = info.get("persistence", {}), info.get("clients", {})
    used, limit = number(memory.get("used_memory")), number(memory.get("maxmemory"))
    leaving = server.get("cluster_leaving") == "yes" or "leaving" in row["flags"]
    row.update({
        "state": "leaving" if leaving else next(
            (f for f in ("fail", "pfail") if f in row["flags"]), "ok"),
        "leaving": leaving,
        "id": node.id or text(server.get("node_id")) or None,
        "version": text(server.get("disque_version")),
        "implementation": "disque-py" if "disque_implementation" in server else "original",
        "uptime": number(server.get("uptime_in_seconds")),
        "used_memory": used, "maxmemory": limit,
        "memory_pct": round(100.0 * used / limit, 1) if limit else None,
        "jobs": number(info.get("jobs", {}).get("registered_jobs")),
        "queues": number(info.get("queues", {}).get("registered_queues")),
        "clients": number(clients.get("connected_clients")),
        "blocked": number(clients.get("blocked_clients")),
        "aof": {"enabled": bool(number(persistence.get("aof_enabled"))),
                "state": text(persistence.get("aof_state")) or "off",
                "rewriting": bool(number(persistence.get("aof_rewrite_in_progress"))),
                "scheduled": bool(number(persistence.get("aof_rewrite_scheduled"))),
                "last_write": text(persistence.get("aof_last_write_status")),
                "last_rewrite": text(persistence.get("aof_last_bgrewrite_status"))},
    })
    return row


async def _cluster_views(pool: Pool, nodes: list[Node]
                         ) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """Each node's flags (pfail, fail, leaving) as the first node that answers
    sees them, and each node's own links: ``{address: {"up", "total",
    "down": [peer addresses]}}`` from its CLUSTER NODES."""
    answers = await pool.each(lambda c: c.cluster_nodes(), nodes)
    flags: dict[str, list[str]] = {}
    links: dict[str, dict[str, Any]] = {}
    for answer in answers:
        if answer.value is None:
            continue
        if not flags:
            flags = {entry["id"]: [f for f in entry["flags"] if f not in ("myself", "noflags")]
                     for entry in answer.value}
        peers = [e for e in answer.value if "myself" not in e["flags"]]
        down = [f"{e['host']}:{e['port']}" if e["host"] else e["id"][:8] for e in peers
                if e["link_state"] != "connected"]
        links[answer.node.address] = {"up": len(peers) - len(down), "total": len(peers),
                                      "down": down}
    return flags, links


async def overview(pool: Pool, history: History | None, window: float = 300) -> dict[str, Any]:
    nodes = await pool.nodes()
    answers = await pool.each(_node_info, nodes)
    flags, links = await _cluster_views(pool, nodes)
    rows = [_node_row(a, flags) for a in answers]
    for row in rows:
        row["links"] = links.get(row["address"])
    for row in rows:
        pool.extensions.setdefault(row["address"], row.get("implementation") == "disque-py")
    up = [r for r in rows if r.get("used_memory") is not None]
    totals = {"nodes": len(rows), "up": len(up),
              "jobs": sum(r["jobs"] for r in up), "queues": sum(r["queues"] for r in up),
              "clients": sum(r["clients"] for r in up),
              "used_memory": sum(r["used_memory"] for r in up)}
    originals = [r["address"] for r in up if r.get("implementation") == "original"]
    return {"nodes": rows, "totals": totals, "levels": list(MEMORY_LEVELS),
            "charts": charts(history, window) if history is not None and up else None,
            # Nodes without job counters: not in the add/deliver/ACK chart.
            "uncounted": originals,
            "job_rates": not up or len(originals) < len(up)}


def charts(history: History, window: float = 300) -> dict[str, Any]:
    """The overview's rate charts: cluster totals over the last ``window`` seconds.

    Jobs added, delivered and acknowledged come from the job counters of
    this server's nodes (``INFO stats``); original nodes have none and are
    not in those sums (the page says so).
    """
    since = time.time() - window
    series = {
        "added": ("added /s", history.total("added_jobs", since)),
        "delivered": ("delivered /s", history.total("delivered_jobs", since)),
        "acked": ("acked /s", history.total("acked_jobs", since)),
        "commands": ("commands /s", history.total("total_commands_processed", since)),
    }
    return {key: {"label": label, "points": points} for key, (label, points) in series.items()
            if points}


# --------------------------------------------------------------------------
# /queues
# --------------------------------------------------------------------------

async def queues(index: QueueIndex, flt: QueueFilter, fresh: bool = False) -> dict[str, Any]:
    snapshot = await index.get(fresh)
    rows, matched = snapshot.select(flt)
    pages = max(1, -(-matched // flt.per_page))
    ages = await index.next_job_ages(snapshot, rows)
    return {"queues": [r.as_json() | {"next_age": ages.get(r.name)} for r in rows],
            "matched": matched,
            "total": len(snapshot.rows), "page": flt.page, "pages": pages,
            "per_page": flt.per_page, "filter": flt.query(),
            "table_age": round(time.monotonic() - snapshot.taken_at, 1),
            "table_seconds": round(snapshot.duration, 3),
            "problems": {a: _problem(p) for a, p in snapshot.problems.items()}}


# --------------------------------------------------------------------------
# /queues/<name>
# --------------------------------------------------------------------------

def _age(ctime: Any) -> float | None:
    """Seconds since a job's ``ctime`` (SHOW: nanoseconds since the epoch)."""
    value = number(ctime, -1)
    return None if value <= 0 else max(0.0, time.time() - value / 1e9)


async def _heads(pool: Pool, index: QueueIndex, nodes: list[Node], names_on: Callable[
        [Node], list[str]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The next job out of queues, per node: ``{address: {queue: {"id", "age",
    "dead_lettered_from"}}}``.  One pipelined QPEEK per node for its queues
    (``names_on(node)``), then SHOW only of the jobs the console has not
    seen before: a job's creation time and dead-letter origin never change,
    so a page updated every few seconds reads each job's body once through
    SHOW (QPEEK still returns the next job's body each time)."""
    peeked = await asyncio.gather(*(pool.on(n, peeker(names_on(n))) for n in nodes
                                    if names_on(n)))
    unknown: dict[str, list[str]] = {}
    for answer in peeked:
        for job_id in (answer.value or {}).values():
            if job_id is not None and job_id not in index.job_facts:
                unknown.setdefault(answer.node.address, []).append(job_id)
    shown = await asyncio.gather(*(pool.on(n, shower(pool, n, unknown[n.address]))
                                   for n in nodes if n.address in unknown))
    for answer in shown:
        index.learn(answer.value or {})
    heads: dict[str, dict[str, dict[str, Any]]] = {}
    now = time.time()
    for answer in peeked:
        for name, job_id in (answer.value or {}).items():
            if job_id is None:
                continue
            ctime, origin = index.job_facts.get(job_id, (0, None))
            heads.setdefault(answer.node.address, {})[name] = {
                "id": job_id, "age": max(0.0, now - ctime / 1e9) if ctime else None,
                "dead_lettered_from": origin}
    return heads


async def queue(pool: Pool, index: QueueIndex, name: str) -> dict[str, Any]:
    nodes = await pool.nodes()

    async def figures(client: AsyncClient) -> dict[str, Any]:
        raw = await client.execute_command("QSTAT", name)
        return {"stat": QueueStat.from_reply(raw)}

    answers = await pool.each(figures, nodes)
    queued = {a.node.address for a in answers
              if a.value is not None and a.value["stat"] is not None and a.value["stat"].length}
    heads = await _heads(pool, index, nodes,
                         lambda n: [name] if n.address in queued else [])
    per_node = []
    for answer in answers:
        entry: dict[str, Any] = {"address": answer.node.address, "id": answer.node.id,
                                 "problem": _problem(answer.problem)}
        if answer.value is not None:
            stat = answer.value["stat"]
            entry["exists"] = stat is not None
            if stat is not None:
                entry.update({"length": stat.length, "blocked": stat.blocked,
                              "age": stat.age, "idle": stat.idle, "jobs_in": stat.jobs_in,
                              "jobs_out": stat.jobs_out, "pause": stat.pause,
                              "limit": list(stat.limit) if stat.limit else None,
                              "rate_limited": stat.rate_limited,
                              "priorities": dict(stat.priorities),
                              "dead_lettered": stat.dead_lettered,
                              "oldest": heads.get(answer.node.address, {}).get(name)})
        entry["extensions"] = pool.extensions.get(answer.node.address)
        per_node.append(entry)
    # Which nodes take QLIMIT: ask once per node (the original answers
    # "unknown command"), so the page offers the limit only where it works.
    for entry, node in zip(per_node, nodes, strict=True):
        if entry["extensions"] is None and entry["problem"] is None:
            probe = await pool.on(node, lambda c: c.qlimit(name))
            pool.extensions[node.address] = probe.problem is None or probe.problem.kind not in (
                "unsupported",)
            entry["extensions"] = pool.extensions[node.address]
    found = [e for e in per_node if e.get("exists")]
    pauses = {e["pause"] for e in found}
    points = index.observe(name, sum(e["length"] for e in found),
                           sum(e["jobs_in"] for e in found), sum(e["jobs_out"] for e in found))
    return {"name": name, "nodes": per_node,
            "exists": bool(found),
            "length": sum(e["length"] for e in found),
            "blocked": sum(e["blocked"] for e in found),
            "pause": pauses.pop() if len(pauses) == 1 else ("mixed" if pauses else "none"),
            "limit": next((e["limit"] for e in found if e["limit"]), None),
            "qlimit_supported": any(e.get("extensions") for e in per_node),
            "all_original": not any(e.get("extensions") for e in per_node
                                    if e["problem"] is None),
            "chart": [{"t": t, "length": n, "in": i, "out": o} for t, n, i, o in points],
            "states": list(JOB_STATES),
            "noperm": any((e["problem"] or {}).get("kind") == "noperm" for e in per_node),
            "problems": [e for e in per_node if e["problem"]]}


# --------------------------------------------------------------------------
# The job browser of /queues/<name>
# --------------------------------------------------------------------------

def _token(value: str, node_count: int) -> tuple[int, int, int]:
    """``"node:cursor:skip"`` of the next page ("" is the first page): the
    node's index, the JSCAN cursor to ask with, and how many of that call's
    jobs earlier pages showed (a call may return more than a page holds)."""
    if not value:
        return 0, 0, 0
    parts = value.split(":")
    if (len(parts) != 3 or not all(p.isdigit() for p in parts)
            or int(parts[0]) >= max(node_count, 1)):
        raise LookupProblem(f"page token {value[:40]!r} is not one this console made")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _job_summary(fields: dict[str, Any], address: str) -> dict[str, Any]:
    return {"id": text(fields.get("id")), "node": address, "state": text(fields.get("state")),
            "queue": text(fields.get("queue")), "age": _age(fields.get("ctime")),
            "ttl": number(fields.get("ttl")), "retry": number(fields.get("retry")),
            "nacks": number(fields.get("nacks")),
            "deliveries": number(fields.get("additional-deliveries")),
            "priority": number(fields.get("priority")), "size": body_size(fields)}


#: Seconds a page of the job browser keeps calling JSCAN to fill itself.
BROWSE_BUDGET = 0.05
#: The COUNT of each of those calls: about how many jobs the node looks at
#: (whole slices of its job table) before it answers.  ~1,000 jobs hold a
#: node well under a millisecond, and a page can look at tens of
#: thousands within its budget.
BROWSE_COUNT = 1000


async def browse_jobs(pool: Pool, name: str, state: str = "", token: str = "",
                      per_page: int = 25, budget: float = BROWSE_BUDGET) -> dict[str, Any]:
    """One page of the queue's jobs, node after node: their IDs with JSCAN
    (``REPLY id``), then their fields with SHOW (``SHOW id NOBODY`` where
    the node has it: no body is read), pipelined per node.

    JSCAN reads; it never changes a job's state (RabbitMQ's "Get messages"
    browses by consuming and requeueing).  ``JSCAN ... QUEUE q`` walks the
    node's whole job table, whatever the queue, so a queue of 100 jobs
    among a million needs many calls: the page goes on with the cursor
    until it is full or ``budget`` seconds have passed, each call a round
    trip the event loop waits on (other requests go on meanwhile).  When
    the budget runs out first, ``more`` is set and ``next`` resumes exactly
    where the page stopped.
    """
    if state and state not in JOB_STATES:
        raise LookupProblem(f"state must be one of {', '.join(JOB_STATES)}")
    nodes = await pool.nodes()
    index, cursor, skip = _token(token, len(nodes))
    found: list[tuple[Node, str]] = []
    problems: list[dict[str, Any]] = []
    calls = 0
    more = False
    deadline = time.monotonic() + budget
    while index < len(nodes) and len(found) < per_page:
        if calls and time.monotonic() >= deadline:
            more = True
            break
        node = nodes[index]
        args: list[str | int] = ["JSCAN", cursor, "COUNT", BROWSE_COUNT, "QUEUE", name]
        if state:
            args += ["STATE", state]
        args += ["REPLY", "id"]

        async def scan(client: AsyncClient, a: tuple[str | int, ...] = tuple(args)) -> Any:
            return await client.execute_command(*a)

        answer = await pool.on(node, scan)
        calls += 1
        if answer.value is None or not isinstance(answer.value, list) or len(answer.value) != 2:
            problems.append({"address": node.address,
                             "problem": _problem(answer.problem or Problem("error", "odd reply"))})
            index, cursor, skip = index + 1, 0, 0
            continue
        entries = [text(e) for e in (answer.value[1] or [])][skip:]
        room = per_page - len(found)
        if len(entries) > room:  # the rest of this call's jobs start the next page
            found += [(node, job_id) for job_id in entries[:room]]
            skip += room
            break
        found += [(node, job_id) for job_id in entries]
        cursor, skip = number(answer.value[0]), 0
        if cursor == 0:
            index += 1
    next_token = f"{index}:{cursor}:{skip}" if index < len(nodes) else ""
    by_node: dict[str, list[str]] = {}
    for node, job_id in found:
        by_node.setdefault(node.address, []).append(job_id)
    targets = [n for n in nodes if n.address in by_node]
    answers = await asyncio.gather(*(pool.on(n, show_pipeline(pool, n, by_node[n.address]))
                                     for n in targets))
    fields_of: dict[tuple[str, str], dict[str, Any]] = {}
    for answer in answers:
        if answer.value is None:
            problems.append({"address": answer.node.address,
                             "problem": _problem(answer.problem)})
            continue
        for job_id, reply in zip(by_node[answer.node.address], answer.value.replies,
                                 strict=False):
            if (fields := pairs(reply)) is not None:
                fields_of[(answer.node.address, job_id)] = fields
    jobs = [_job_summary(fields_of[(node.address, job_id)], node.address)
            for node, job_id in found if (node.address, job_id) in fields_of]
    return {"queue": name, "state": state, "jobs": jobs, "next": next_token,
            "more": more and bool(next_token), "calls": calls,
            "budget_ms": round(budget * 1000), "problems": problems}


# --------------------------------------------------------------------------
# /jobs/<id>
# --------------------------------------------------------------------------

def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if key == "body":
            continue
        if isinstance(value, list):
            out[key] = [text(v) for v in value]
        elif isinstance(value, bytes):
            out[key] = text(value)
        else:
            out[key] = value
    return out


async def _body_view(pool: Pool, nodes: list[Node], job_id: str, copies: list[dict[str, Any]],
                     raw_bodies: dict[str, bytes], limit: int) -> BodyView | None:
    """The body of the first copy (in ``copies``' order) that gives it: one
    a node without NOBODY sent already, else plain SHOW of one copy."""
    for copy in copies:
        if copy["node"] in raw_bodies:
            return view_body(raw_bodies[copy["node"]], limit)
    for copy in copies:
        node = next(n for n in nodes if n.address == copy["node"])
        read = await pool.on(node, show_one(pool, node, job_id, body=True))
        fields = pairs(read.value) if read.problem is None else None
        if fields is not None and isinstance(fields.get("body"), bytes):
            return view_body(fields["body"], limit)
    return None  # gone meanwhile from every node


async def job(pool: Pool, job_id: str, limit: int, body: bool = True) -> dict[str, Any]:
    """Every copy's fields (``SHOW id NOBODY`` where the node has it), and
    with ``body`` the body from one copy (the creator's first), cut at
    ``limit`` bytes: a page's live updates read no body."""
    if not JOB_ID.fullmatch(job_id):
        raise LookupProblem(f"{job_id[:80]!r} is not a job ID (D-<8 hex>-<24 chars>-<4 hex>)")
    nodes = await pool.nodes()
    answers = await asyncio.gather(*(pool.on(n, show_one(pool, n, job_id)) for n in nodes))
    copies: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    raw_bodies: dict[str, bytes] = {}
    for answer in answers:
        if answer.problem is not None:
            problems.append({"address": answer.node.address,
                             "problem": _problem(answer.problem)})
            continue
        fields = pairs(answer.value)
        if fields is None:
            continue  # this node has no copy (null reply)
        raw = fields.get("body")
        if isinstance(raw, bytes):  # a node without NOBODY sent it anyway
            raw_bodies[answer.node.address] = raw
        copy = _clean(fields)
        copy.pop("body-size", None)
        copy["size"] = body_size(fields)
        copy["node"] = answer.node.address
        copy["node_id"] = answer.node.id
        copy["age"] = _age(fields.get("ctime"))
        copy["extensions"] = pool.extensions.get(answer.node.address, "backoff" in fields
                                                 or "priority" in fields)
        copies.append(copy)
    creator = job_id[2:10]
    copies.sort(key=lambda c: (not (c["node_id"] or "").startswith(creator), c["node"]))
    view = None
    if body and copies:
        view = await _body_view(pool, nodes, job_id, copies, raw_bodies, limit)
    first = copies[0] if copies else {}
    return {"id": job_id, "found": bool(copies), "copies": copies, "problems": problems,
            "queue": first.get("queue"), "state": first.get("state"),
            "group": first.get("group"),  # an ordered group's key (SHOW has it)
            "size": first.get("size"),
            "body": view.as_json() if view else None,
            "nack_delay": any(c.get("extensions") for c in copies),
            "noperm": any(p["problem"]["kind"] == "noperm" for p in problems)}


# --------------------------------------------------------------------------
# /dead-letters
# --------------------------------------------------------------------------

async def dead_letters(pool: Pool, index: QueueIndex, fresh: bool = False) -> dict[str, Any]:
    """Dead-letter queues: ``<queue>:dead`` names, and queues whose jobs say
    ``dead-lettered-from``; with counts, the oldest job's age and the origin."""
    snapshot = await index.get(fresh)
    names = sorted(n for n in snapshot.rows if n.endswith(":dead"))
    origins = {r.name: r.dead_lettered for r in snapshot.rows.values() if r.dead_lettered}
    nodes = await pool.nodes()
    shown = names[:200]  # the page lists at most 200; the table says how many

    def heads_on(node: Node) -> list[str]:
        return [n for n in shown if (stat := snapshot.rows[n].per_node.get(node.address))
                is not None and stat.length > 0]

    heads = await _heads(pool, index, nodes, heads_on)
    out = []
    for name in shown:
        row = snapshot.rows[name]
        oldest = [h[name] for h in heads.values() if name in h]
        ages = [o["age"] for o in oldest if o["age"] is not None]
        origin = next((text(o["dead_lettered_from"]) for o in oldest
                       if o.get("dead_lettered_from")), name[:-len(":dead")])
        out.append({"name": name, "length": row.length,
                    "per_node": {a: s.length for a, s in row.per_node.items()},
                    "oldest_age": max(ages) if ages else None, "origin": origin,
                    "origin_dead_lettered": origins.get(origin, 0)})
    return {"queues": out, "total": len(names),
            "origins": [{"name": n, "dead_lettered": c} for n, c in sorted(origins.items())],
            "problems": {a: _problem(p) for a, p in snapshot.problems.items()}}


# --------------------------------------------------------------------------
# /nodes
# --------------------------------------------------------------------------

async def nodes(pool: Pool) -> dict[str, Any]:
    """Each node's cluster table, its bus counters, leaving and AOF rewrite state."""
    targets = await pool.nodes()

    async def view(client: AsyncClient) -> dict[str, Any]:
        table = await client.cluster_nodes()
        info = await client.cluster_info()
        persistence = (await client.info("persistence")).get("persistence", {})
        return {"table": table, "info": info, "persistence": persistence}

    answers = await pool.each(view, targets)
    out = []
    for answer in answers:
        entry: dict[str, Any] = {"address": answer.node.address, "id": answer.node.id,
                                 "priority": answer.node.priority,
                                 "problem": _problem(answer.problem), "leaving": False,
                                 "table": [], "bus": {}, "aof": {}}
        if answer.value is not None:
            now_ms = time.time() * 1000
            entry["table"] = [{
                "id": e["id"], "address": f"{e['host']}:{e['port']}" if e["host"] else "",
                "flags": e["flags"], "link": e["link_state"],
                "ping_age": round((now_ms - e["ping_sent"]) / 1000, 1) if e["ping_sent"] else None,
                "pong_age": round((now_ms - e["pong_recv"]) / 1000, 1) if e["pong_recv"] else None,
            } for e in answer.value["table"]]
            info = answer.value["info"]
            entry["leaving"] = info.get("cluster_leaving") == "yes" or any(
                "myself" in e["flags"] and "leaving" in e["flags"] for e in answer.value["table"])
            entry["bus"] = {k: v for k, v in info.items() if k.startswith("cluster_")}
            persistence = answer.value["persistence"]
            entry["aof"] = {k: persistence.get(k) for k in (
                "aof_enabled", "aof_state", "aof_rewrite_in_progress", "aof_rewrite_scheduled",
                "aof_last_bgrewrite_status", "aof_last_rewrite_time_sec",
                "aof_last_write_status") if k in persistence}
        out.append(entry)
    return {"nodes": out, "can_admin": any(e["problem"] is None for e in out)}
