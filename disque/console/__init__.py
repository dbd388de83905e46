"""``disque-console``: a web console over a Disque cluster's commands.

A separate process beside :mod:`disque.cli`: it imports the client's public
API and its web stack (Starlette, uvicorn, Jinja2), never the node's rooms,
so it adds nothing to a node's hot path, can be restarted alone and works
against original Disque nodes (what they cannot answer is hidden).

The rooms, bottom to top:

* :mod:`~disque.console.settings`: the options, one frozen value;
* :mod:`~disque.console.replies`: RESP encoding for pipelines and the
  parsing of raw replies (no I/O);
* :mod:`~disque.console.nodes`: one pinned client per node and user, and
  the cluster found through HELLO;
* :mod:`~disque.console.queue_index`: the merged queue table, filtered,
  sorted and paged in memory;
* :mod:`~disque.console.history`: the sampler and its bounded, persisted
  window of per-node counters;
* :mod:`~disque.console.queries`: one query function per page;
* :mod:`~disque.console.audit`: the audit log, one line per action whatever
  its values hold;
* :mod:`~disque.console.actions`: what a user may do, each audited;
* :mod:`~disque.console.sessions`: users, signed cookies, CSRF tokens;
* :mod:`~disque.console.web`: the Starlette routes, pages, JSON API and SSE;
* :mod:`~disque.console.main`: the program (``disque-console``).

See docs/CONSOLE.md.
"""

from .main import main

__all__ = ["main"]
