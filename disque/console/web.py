"""The console's HTTP side: pages, their live parts (SSE), actions and the JSON API.

Each page is a route, a template and one query function
(:mod:`~disque.console.queries`); ``/api/<page>`` returns the same data as
JSON, and ``/events/<page>`` streams the page's live parts as server-sent
events (the same partial templates, re-rendered, sent when they change).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from disque.client import AsyncClient, AuthError, DisqueError

from . import prometheus, queries
from .actions import DESTRUCTIVE, Actions, Outcome
from .audit import audit_log
from .bulk import KINDS, SpecError, Task, TaskManager, TaskSpec
from .history import History, Sampler
from .nodes import Credentials, Pool, probe_open
from .queue_index import FilterError, QueueFilter, QueueIndex
from .render import environment
from .sessions import COOKIE, LoginThrottle, Session, SessionStore, load_key
from .settings import Settings, host_allowed, is_loopback

__all__ = ["Console", "create_app"]

log = logging.getLogger("disque.console")
STATIC = __file__.rsplit("/", 1)[0] + "/static"
#: The largest form or JSON body an action takes.
MAX_FORM = 64 * 1024
INVALID_LOGIN = "invalid user name or password"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                               "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class Page(HTMLResponse):
    """A page.  Queue names and bodies are whatever bytes a producer sent: a
    name that is not UTF-8 reaches a template with surrogates (the replies'
    ``surrogateescape``), shown as ``\\udcff`` rather than failing the page."""

    def render(self, content: Any) -> bytes | memoryview:
        if isinstance(content, str):
            return content.encode(self.charset, "backslashreplace")
        return super().render(content)


class Json(JSONResponse):
    """JSON in ASCII: such a name comes out as ``"\\udcff"``, which a script's
    JSON parser reads back as the same string (the starlette default,
    UTF-8, cannot encode it and failed the whole reply)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False,
                          separators=(",", ":")).encode("ascii")


class OpenHostGuard:
    """In front of open nodes, only requests addressed to this machine
    (:func:`~disque.console.settings.host_allowed`): a web page that made
    its own name resolve to 127.0.0.1 would otherwise be the console's own
    origin for the browser, and could read its pages and act."""

    def __init__(self, app: ASGIApp, console: Console) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.console.open:
            host = Headers(scope=scope).get("host", "")
            if host and not host_allowed(host, self.console.settings):
                response = PlainTextResponse(
                    "this console is open (its nodes take no password): it answers only "
                    "requests addressed to an IP address, localhost or a name given with "
                    "--allowed-hosts", 403, headers=SECURITY_HEADERS)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class HttpProblem(Exception):
    """A request the console refuses, with the status and the message to show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class UserPool:
    """A pool and its queue table, shared by the sessions of one user."""

    pool: Pool
    index: QueueIndex
    last_used: float


class Console:
    """The console's state: settings, sessions, pools, history and the sampler."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.templates = environment()
        key = load_key(settings.data_dir)
        self.sessions = SessionStore(key, settings.session_idle_seconds,
                                     settings.session_lifetime_seconds, settings.max_sessions,
                                     settings.max_anonymous_sessions)
        self.throttle = LoginThrottle()
        self.pools: dict[tuple[str, str], UserPool] = {}
        path = settings.data_dir / "history.jsonl" if settings.data_dir else None
        self.history = History(settings.history_seconds, settings.sample_interval, path)
        #: True: the nodes take anybody (no password); False: they need one;
        #: None: no node answered yet.
        self.open: bool | None = None
        self.sampler: Sampler | None = None
        #: Bulk actions and redrives (journaled in the data directory).
        self.tasks = TaskManager(settings, settings.data_dir / "tasks" if settings.data_dir
                                 else None)
        self._tasks: list[asyncio.Task[None]] = []
        self._verified: dict[tuple[str, str], float] = {}
        #: (address, user, password digest) -> the outcome of its check under way.
        self._checking: dict[tuple[str, str, str], asyncio.Future[str | None]] = {}

    @property
    def refusing(self) -> str | None:
        """Why the console serves nobody now, or None.  It refuses to start
        on an address outside loopback in front of nodes without a password
        (unless --allow-open); nodes that lose their password later bring it
        to the same state, and then it refuses every page and login."""
        if self.open and not is_loopback(self.settings.bind) and not self.settings.allow_open:
            return (f"the nodes take no password now, and this console serves "
                    f"{self.settings.bind}, outside loopback, without --allow-open: anybody "
                    "reaching it could act on the cluster, so it refuses every page and login "
                    "until the nodes have passwords again (or it is restarted on 127.0.0.1, "
                    "or with --allow-open)")
        return None

    # -------------------------------------------------------------- pools

    def user_pool(self, credentials: Credentials) -> UserPool:
        entry = self.pools.get(credentials.key)
        if entry is None:
            pool = Pool(tuple(self.settings.nodes), credentials, self.settings)
            entry = self.pools[credentials.key] = UserPool(pool, QueueIndex(pool), time.monotonic())
        entry.last_used = time.monotonic()
        return entry

    async def check_login(self, credentials: Credentials, address: str) -> str | None:
        """:meth:`verify`, throttled per client address and user: None if
        the nodes accept ``credentials``, else why not."""
        if credentials.username not in (None, "default") and not credentials.password:
            # Without a password the console sends no AUTH: the nodes would
            # see ``default``, while the session, its tasks and its audit
            # lines would carry the name typed.
            return f"user {credentials.username[:80]!r} needs its password"
        # The same user and password from the same address, while they are
        # being checked (a script's first requests sent at once): one check.
        key = (address, *credentials.key)
        pending = self._checking.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        wait = self.throttle.wait(address, credentials.user)
        if wait > 0:
            return (f"too many failed logins: try again in {wait:.0f} s" if wait >= 1
                    else "too many failed logins: try again in a second")
        # Counted as failed before the nodes answer, so that guesses sent at
        # once cannot all pass the wait above while the first is checked;
        # taken back when it was not a wrong password.
        self.throttle.failed(address, credentials.user)
        outcome: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._checking[key] = outcome
        problem: str | None = "the login was interrupted: try again"
        try:
            problem = await self.verify(credentials)
            if problem is None and credentials.password is None:
                # In without a password: the nodes take anybody now.
                self.open = True
                problem = self.refusing
        finally:
            if problem != INVALID_LOGIN:
                self.throttle.forgive(address, credentials.user)
            if problem is None:
                self.throttle.succeeded(address, credentials.user)
            del self._checking[key]
            outcome.set_result(problem)
        return problem

    async def verify(self, credentials: Credentials) -> str | None:
        """None if the nodes accept ``credentials``, else why not."""
        for seed in self.settings.nodes:
            client = AsyncClient(seed, username=credentials.username if credentials.password
                                 else None, password=credentials.password, max_retries=0,
                                 reconnect_timeout=0, connect_timeout=2.0,
                                 socket_timeout=self.settings.node_timeout)
            try:
                await client.hello()
                return None
            except AuthError:
                return INVALID_LOGIN
            except (DisqueError, OSError):
                continue
            finally:
                await client.close()
        return "no node answered: check that the nodes run"

    # --------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.open = await probe_open(self.settings.nodes, self.settings)
        sample = Credentials(self.settings.sample_user, self.settings.sample_password)
        if self.open or sample.password is not None:
            entry = self.user_pool(sample)
            self.sampler = Sampler(entry.pool, self.history, self.settings.sample_interval)
            self._tasks.append(asyncio.create_task(self.sampler.run()))
        self._tasks.append(asyncio.create_task(self._janitor()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.tasks.close()
        for entry in self.pools.values():
            await entry.index.close()
            await entry.pool.close()

    async def _janitor(self) -> None:
        """Expire sessions, close pools nobody uses, notice the nodes' password state."""
        while True:
            await asyncio.sleep(self.settings.probe_seconds)
            try:
                self.sessions.expire()
                live = self.sessions.users()
                if self.sampler is not None:
                    live.add(self.sampler.pool.credentials.key)
                for key, entry in list(self.pools.items()):
                    if key not in live and time.monotonic() - entry.last_used > 300:
                        del self.pools[key]
                        await entry.index.close()
                        await entry.pool.close()
                probed = await probe_open(self.settings.nodes, self.settings)
                if probed is not None:
                    self.open = probed
            except Exception as exc:  # the janitor must keep running
                log.warning("janitor: %r", exc)

    # ------------------------------------------------------------ sessions

    def session_of(self, request: Request) -> Session | None:
        return self.sessions.find(request.cookies.get(COOKIE))

    async def basic_auth(self, request: Request) -> Session | None:
        """A one-request session for ``Authorization: Basic`` (scripts on /api)."""
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise HttpProblem(401, "malformed Authorization header") from None
        credentials = Credentials(user or None, password or None)
        if time.monotonic() - self._verified.get(credentials.key, -1e9) > 60:
            address = request.client.host if request.client else "?"
            problem = await self.check_login(credentials, address)
            if problem is not None:
                raise HttpProblem(429 if problem.startswith("too many") else 401, problem)
            self._verified[credentials.key] = time.monotonic()
        return Session("basic", credentials)


def _cookie(response: Response, value: str, request: Request, max_age: int | None) -> None:
    response.set_cookie(COOKIE, value, max_age=max_age, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")


def create_app(settings: Settings) -> Starlette:
    """The console's ASGI application."""
    console = Console(settings)
    env = console.templates

    # ---------------------------------------------------------- plumbing

    async def session_for(request: Request, api: bool = False) -> tuple[Session, Response | None]:
        """The request's session; an open cluster's visitor gets one as
        ``default`` (a page's visitor a kept one, with its cookie; a script
        calling the API without a cookie one for this request only)."""
        refusing = console.refusing
        if refusing is not None:
            raise HttpProblem(503, refusing)
        session = console.session_of(request)
        if session is not None:
            return session, None
        if api:
            basic = await console.basic_auth(request)
            if basic is not None:
                return basic, None
        if console.open and api:
            # Nothing kept: its CSRF token matches nothing, so such a
            # request reads; acting takes a page's session (or Basic).
            return Session("anonymous", Credentials()), None
        if console.open:
            session, cookie = console.sessions.create(Credentials())
            response = Response()
            _cookie(response, cookie, request, None)
            return session, response
        raise HttpProblem(401, "log in first")

    def page(template: str, request: Request, session: Session, status: int = 200,
             **context: Any) -> Page:
        html = env.get_template(template).render(
            request_path=request.url.path, query=str(request.url.query), session=session,
            user=session.user, csrf=session.csrf, open=console.open,
            flashes=session.take_flashes(), settings=settings, **context)
        return Page(html, status, headers=SECURITY_HEADERS)

    def with_cookie(response: Response, extra: Response | None) -> Response:
        if extra is not None and "set-cookie" in extra.headers:
            response.headers.append("set-cookie", extra.headers["set-cookie"])
        return response

    async def read_form(request: Request) -> dict[str, str]:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                raise HttpProblem(413, "the form is too large")
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind == "application/json":
            try:
                data = json.loads(body or b"{}")
            except ValueError:
                raise HttpProblem(400, "the body is not JSON") from None
            if not isinstance(data, dict):
                raise HttpProblem(400, "the body must be a JSON object")
            return {str(k): "" if v is None else str(v) for k, v in data.items()}
        if kind != "application/x-www-form-urlencoded":
            raise HttpProblem(415, "send a form or JSON")
        return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))

    def problem_response(request: Request, exc: HttpProblem, session: Session | None,
                         api: bool) -> Response:
        if api:
            return Json({"error": exc.message}, exc.status, headers=SECURITY_HEADERS)
        if exc.status == 401:
            target = quote(request.url.path + ("?" + request.url.query if request.url.query
                                               else ""))
            return RedirectResponse(f"/login?next={target}", 303)
        if session is None:
            return PlainTextResponse(exc.message, exc.status, headers=SECURITY_HEADERS)
        return page("error.html", request, session, exc.status, message=exc.message,
                    title="Error")

    def handler(api: bool = False) -> Callable[[Callable[..., Awaitable[Response]]],
                                               Callable[[Request], Awaitable[Response]]]:
        """Wrap a view: session, errors shown as pages (or JSON), never a crash."""
        def wrap(view: Callable[..., Awaitable[Response]]) -> Callable[[Request],
                                                                        Awaitable[Response]]:
            async def endpoint(request: Request) -> Response:
                session: Session | None = None
                try:
                    session, extra = await session_for(request, api)
                    return with_cookie(await view(request, session), extra)
                except HttpProblem as exc:
                    return problem_response(request, exc, session, api)
                except (queries.LookupProblem, FilterError, SpecError) as exc:
                    return problem_response(request, HttpProblem(400, str(exc)), session, api)
                except AuthError as exc:
                    return problem_response(request, HttpProblem(401, str(exc)), session, api)
                except Exception as exc:  # a page fails alone; the console goes on
                    log.exception("error serving %s", request.url.path)
                    return problem_response(
                        request, HttpProblem(500, f"the console could not build this page: "
                                                  f"{type(exc).__name__}: {exc}"), session, api)
            return endpoint
        return wrap

    def pool_of(session: Session) -> UserPool:
        return console.user_pool(session.credentials)

    def tasks_of(session: Session, queue: str | None = None,
                 kinds: tuple[str, ...] = KINDS) -> list[dict[str, Any]]:
        return [t.as_json() for t in console.tasks.visible(session.user, queue)
                if t.spec.kind in kinds]

    # ----------------------------------------------------------- queries

    async def q_overview(request: Request, session: Session) -> dict[str, Any]:
        raw = request.query_params.get("window", "") or "300"
        try:
            window = float(raw)
        except ValueError:
            raise FilterError(f"window must be a number of seconds, not {raw[:40]!r}") from None
        if not 1 <= window <= 7 * 86400:  # NaN fails too
            raise FilterError("window must be between 1 and 604800 seconds")
        data = await queries.overview(pool_of(session).pool, console.history, window)
        if settings.prometheus_url:
            data["prometheus"] = prometheus.overview_links(settings.prometheus_url)
        return data

    async def q_queues(request: Request, session: Session) -> dict[str, Any]:
        flt = QueueFilter.parse(request.query_params)
        fresh = request.query_params.get("fresh") == "1"
        return await queries.queues(pool_of(session).index, flt, fresh)

    async def q_queue(request: Request, session: Session) -> dict[str, Any]:
        name = request.path_params.get("name") or request.query_params.get("name", "")
        entry = pool_of(session)
        data = await queries.queue(entry.pool, entry.index, name)
        params = request.query_params
        per_page = params.get("per_page", "25")
        if not per_page.isdigit() or not 1 <= int(per_page) <= 200:
            raise FilterError("per_page must be between 1 and 200")
        data["browser"] = await queries.browse_jobs(
            entry.pool, name, params.get("state", ""), params.get("token", ""), int(per_page),
            settings.browse_budget)
        data["tasks"] = tasks_of(session, name)
        if settings.prometheus_url:
            data["prometheus"] = prometheus.queue_links(settings.prometheus_url, name)
        return data

    async def q_queue_live(request: Request, session: Session) -> dict[str, Any]:
        """The queue's figures only: what its live part shows.  Not the job
        browser, whose JSCANs walk the nodes' job tables (up to its time
        budget) and whose table the updates do not redraw."""
        name = request.path_params.get("name") or request.query_params.get("name", "")
        entry = pool_of(session)
        return await queries.queue(entry.pool, entry.index, name)

    async def q_job(request: Request, session: Session) -> dict[str, Any]:
        return await queries.job(pool_of(session).pool, request.path_params["id"],
                                 settings.body_preview_bytes)

    async def q_job_live(request: Request, session: Session) -> dict[str, Any]:
        """The job's copies only (``SHOW id NOBODY`` where the nodes have
        it): its live part shows no body, so the updates read none."""
        return await queries.job(pool_of(session).pool, request.path_params["id"],
                                 settings.body_preview_bytes, body=False)

    async def q_dead(request: Request, session: Session) -> dict[str, Any]:
        entry = pool_of(session)
        data = await queries.dead_letters(entry.pool, entry.index,
                                          request.query_params.get("fresh") == "1")
        data["tasks"] = tasks_of(session, kinds=("redrive",))
        chosen = request.query_params.get("redrive", "")
        names = [q["name"] for q in data["queues"]]
        data["redrive_queue"] = chosen or (names[0] if names else "")
        return data

    async def q_nodes(request: Request, session: Session) -> dict[str, Any]:
        return await queries.nodes(pool_of(session).pool)

    Query = Callable[[Request, Session], Awaitable[dict[str, Any]]]
    #: page -> (query, template, {element id: partial template}, seconds between updates)
    pages: dict[str, tuple[Query, str, dict[str, str], float]] = {
        "overview": (q_overview, "overview.html",
                     {"live-totals": "_totals.html", "live-nodes": "_nodes_table.html"}, 1.0),
        "queues": (q_queues, "queues.html", {"live-queues": "_queues_table.html"}, 2.0),
        "queue": (q_queue, "queue.html", {"live-figures": "_queue_figures.html"}, 2.0),
        "job": (q_job, "job.html", {"live-copies": "_job_copies.html"}, 2.0),
        "dead-letters": (q_dead, "dead_letters.html", {"live-dead": "_dead_table.html"}, 3.0),
        "nodes": (q_nodes, "nodes.html", {"live-cluster": "_cluster.html"}, 2.0),
    }

    def page_view(name: str, title: str) -> Callable[[Request], Awaitable[Response]]:
        query, template, _, _ = pages[name]

        @handler()
        async def view(request: Request, session: Session) -> Response:
            try:
                data = await query(request, session)
            except FilterError as exc:
                if name != "queues":
                    raise
                return page(template, request, session, 400, data=None, error=str(exc),
                            title=title, live=name, flt=QueueFilter().query())
            return page(template, request, session, data=data, error=None, title=title,
                        live=name, flt=data.get("filter", {}))
        return view

    def api_view(name: str) -> Callable[[Request], Awaitable[Response]]:
        query = pages[name][0]

        @handler(api=True)
        async def view(request: Request, session: Session) -> Response:
            data = await query(request, session)
            return Json(data, headers=SECURITY_HEADERS)
        return view

    # --------------------------------------------------------------- SSE

    #: Pages whose live updates need less than the page itself.
    live_queries: dict[str, Query] = {"queue": q_queue_live, "job": q_job_live}

    def events(name: str) -> Callable[[Request], Awaitable[Response]]:
        _, _, partials, interval = pages[name]
        query = live_queries.get(name, pages[name][0])

        @handler()
        async def stream(request: Request, session: Session) -> Response:
            async def messages() -> AsyncIterator[str]:
                sent: dict[str, str] = {}
                yield "retry: 3000\n\n"
                while not await request.is_disconnected():
                    if console.sessions.sessions.get(session.id) is not session:
                        yield "event: expired\ndata: {}\n\n"
                        return
                    try:
                        data = await query(request, session)
                        for target, partial in partials.items():
                            html = env.get_template(partial).render(
                                data=data, csrf=session.csrf, user=session.user,
                                flt=data.get("filter", {}), settings=settings)
                            digest = hashlib.sha1(html.encode()).hexdigest()
                            if sent.get(target) != digest:
                                sent[target] = digest
                                payload = json.dumps({"target": target, "html": html})
                                yield f"event: swap\ndata: {payload}\n\n"
                        chart = data.get("charts") if name == "overview" else data.get("chart")
                        if chart is not None:
                            yield f"event: chart\ndata: {json.dumps(chart)}\n\n"
                    except (queries.LookupProblem, FilterError) as exc:
                        payload = json.dumps({"message": str(exc)})
                        yield f"event: problem\ndata: {payload}\n\n"
                        return
                    except Exception as exc:  # a failed update; the next one may work
                        log.warning("live update of %s failed: %r", name, exc)
                        payload = json.dumps({"message": f"update failed: {exc}"})
                        yield f"event: problem\ndata: {payload}\n\n"
                    yield ": tick\n\n"
                    await asyncio.sleep(interval)

            headers = {**SECURITY_HEADERS, "X-Accel-Buffering": "no"}
            return StreamingResponse(messages(), media_type="text/event-stream",
                                     headers=headers)
        return stream

    # ------------------------------------------------------------ actions

    async def run_action(session: Session, form: dict[str, str]) -> Outcome:
        kind = form.get("action", "")
        actions = Actions(session.user, pool_of(session).pool)
        if kind == "pause":
            return await actions.pause(form.get("queue", ""), form.get("state", ""))
        if kind == "qlimit":
            if form.get("off"):
                return await actions.qlimit(form.get("queue", ""), None, None)
            try:
                max_jobs, period = int(form.get("max", "")), int(form.get("period_ms", ""))
            except ValueError:
                raise queries.LookupProblem(
                    "a rate limit needs whole numbers: jobs and milliseconds") from None
            return await actions.qlimit(form.get("queue", ""), max_jobs, period)
        if kind == "job":
            delay_text = form.get("delay", "").strip()
            if delay_text and not delay_text.isdigit():
                raise queries.LookupProblem("a NACK delay is a whole number of seconds")
            return await actions.job(form.get("op", ""), form.get("id", ""),
                                     int(delay_text) if delay_text else None)
        if kind == "leaving":
            return await actions.leaving(form.get("node", ""), form.get("value") == "yes")
        raise queries.LookupProblem(f"unknown action {kind[:20]!r}")

    def start_task(session: Session, form: dict[str, str]) -> Task:
        """A redrive (``action=redrive``) or a bulk action (``action=bulk``, ``op``)."""
        values = dict(form)
        values["kind"] = "redrive" if form.get("action") == "redrive" else form.get("op", "")
        spec = TaskSpec.parse(values)
        return console.tasks.start(spec, session.credentials)

    def control_task(session: Session, form: dict[str, str]) -> tuple[Task, bool]:
        """Pause, resume or cancel one of the session's user's tasks."""
        task = console.tasks.get(form.get("id", ""), session.user)
        if task is None:
            raise queries.LookupProblem(f"no task {form.get('id', '')[:40]!r} of this user")
        op = form.get("op", "")
        if op == "pause":
            done = task.pause()
        elif op == "resume" and task.state == "paused":
            done = task.resume()
        elif op == "resume":
            if task.active:
                raise queries.LookupProblem(f"task {task.id} is {task.state}: nothing to resume")
            task = console.tasks.resume(task, session.credentials)
            done = True
        elif op == "cancel":
            done = task.cancel()
        else:
            raise queries.LookupProblem("a task can be paused, resumed or cancelled")
        audit_log.info("user=%s action=task-%s target=task:%s result=%s", session.user, op,
                       task.id, "ok" if done else f"failed ({task.state})")
        return task, done

    def needs_confirmation(form: dict[str, str]) -> bool:
        kind = form.get("action", "")
        if kind in ("redrive", "bulk"):
            return form.get("confirm") != "yes"
        if kind == "job":
            return form.get("op", "") in DESTRUCTIVE and form.get("confirm") != "yes"
        if kind == "pause":
            return form.get("state") != "none" and form.get("confirm") != "yes"
        if kind == "leaving":
            return form.get("value") == "yes" and form.get("confirm") != "yes"
        return False

    @handler()
    async def action(request: Request, session: Session) -> Response:
        form = await read_form(request)
        if not session.check_csrf(form.get("csrf")):
            raise HttpProblem(403, "the form's CSRF token does not match this session: "
                                   "reload the page and try again")
        back = form.get("back", "/")
        if not back.startswith("/") or back.startswith("//"):
            back = "/"
        if needs_confirmation(form):
            return page("confirm.html", request, session, form=form, back=back,
                        title="Confirm")
        kind = form.get("action", "")
        try:
            if kind in ("redrive", "bulk"):
                task = start_task(session, form)
                session.flash("ok", f"{task.spec.kind} of {task.spec.queue} started "
                                    f"(task {task.id}): its progress is below")
                return RedirectResponse(back, 303, headers=SECURITY_HEADERS)
            if kind == "task":
                task, done = control_task(session, form)
                session.flash("ok" if done else "error",
                              f"task {task.id}: {form.get('op')} "
                              f"{'done' if done else 'refused: it is ' + task.state}")
                return RedirectResponse(back, 303, headers=SECURITY_HEADERS)
            outcome = await run_action(session, form)
        except (queries.LookupProblem, SpecError) as exc:
            session.flash("error", str(exc))
            return RedirectResponse(back, 303)
        session.flash("ok" if outcome.ok else "error", outcome.summary)
        if form.get("action") == "job" and form.get("op") == "deljob" and outcome.ok:
            back = "/queues"
        return RedirectResponse(back, 303, headers=SECURITY_HEADERS)

    @handler(api=True)
    async def api_action(request: Request, session: Session) -> Response:
        if session.id != "basic":
            token = request.headers.get("x-csrf-token")
            if not session.check_csrf(token):
                raise HttpProblem(403, "missing or wrong X-CSRF-Token header")
        if request.headers.get("content-type", "").split(";")[0] != "application/json":
            # A cross-site form cannot send JSON: with Basic auth this is the CSRF guard.
            raise HttpProblem(415, "actions take a JSON body (Content-Type: application/json)")
        form = await read_form(request)
        form["action"] = request.path_params["kind"]
        if form["action"] in ("redrive", "bulk"):
            try:
                task = start_task(session, form)
            except SpecError as exc:
                raise HttpProblem(400, str(exc)) from None
            return Json(task.as_json(), 202, headers=SECURITY_HEADERS)
        if form["action"] == "task":
            task, done = control_task(session, form)
            return Json(task.as_json(), 200 if done else 409, headers=SECURITY_HEADERS)
        outcome = await run_action(session, form)
        return Json(outcome.as_json(), 200 if outcome.ok else 409, headers=SECURITY_HEADERS)

    # -------------------------------------------------------------- login

    async def login_page(request: Request) -> Response:
        refusing = console.refusing
        if refusing is not None:
            return PlainTextResponse(refusing, 503, headers=SECURITY_HEADERS)
        session = console.session_of(request)
        token = request.cookies.get(f"{COOKIE}_login") or ""
        if len(token) < 20:
            token = Session("login", Credentials()).csrf
        html = env.get_template("login.html").render(
            title="Log in", open=console.open, error=request.query_params.get("error"),
            next=request.query_params.get("next", "/"), login_token=token,
            user=session.user if session else None, request_path="/login", flashes=[],
            csrf=session.csrf if session else "", settings=settings)
        response = Page(html, headers=SECURITY_HEADERS)
        response.set_cookie(f"{COOKIE}_login", token, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path="/login")
        return response

    async def login(request: Request) -> Response:
        try:
            form = await read_form(request)
        except HttpProblem as exc:
            return PlainTextResponse(exc.message, exc.status, headers=SECURITY_HEADERS)
        token = request.cookies.get(f"{COOKIE}_login", "")
        target = form.get("next", "/")
        if not target.startswith("/") or target.startswith("//"):
            target = "/"
        if not token or form.get("login_token") != token:
            return RedirectResponse("/login?error=" + quote(
                "the login form expired: try again") + "&next=" + quote(target), 303)
        user = form.get("username", "").strip() or None
        password = form.get("password", "")
        credentials = Credentials(user if user != "default" or password else None,
                                  password or None)
        address = request.client.host if request.client else "?"
        problem = await console.check_login(credentials, address)
        if problem is not None:
            log.info("login refused for user=%s from %s: %s", credentials.user, address,
                     problem)
            if problem.startswith("too many"):
                audit_log.info("user=%s action=login target=console from=%s "
                               "result=failed (throttled)", credentials.user, address)
            return RedirectResponse("/login?error=" + quote(problem) + "&next="
                                    + quote(target), 303)
        old = console.session_of(request)
        if old is not None:
            console.sessions.drop(old)
        _session, cookie = console.sessions.create(credentials)
        audit_log.info("user=%s action=login target=console result=ok", credentials.user)
        response = RedirectResponse(target, 303, headers=SECURITY_HEADERS)
        _cookie(response, cookie, request, None)
        response.delete_cookie(f"{COOKIE}_login", path="/login")
        return response

    @handler()
    async def logout(request: Request, session: Session) -> Response:
        form = await read_form(request)
        if not session.check_csrf(form.get("csrf")):
            raise HttpProblem(403, "the form's CSRF token does not match this session")
        console.sessions.drop(session)
        audit_log.info("user=%s action=logout target=console result=ok", session.user)
        response = RedirectResponse("/login", 303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -------------------------------------------------------------- tasks

    @handler(api=True)
    async def api_tasks(request: Request, session: Session) -> Response:
        task_id = request.path_params.get("id")
        if task_id:
            task = console.tasks.get(task_id, session.user)
            if task is None:
                raise HttpProblem(404, f"no task {task_id[:40]!r} of this user")
            return Json(task.as_json(), headers=SECURITY_HEADERS)
        queue = request.query_params.get("queue") or None
        return Json({"tasks": tasks_of(session, queue)}, headers=SECURITY_HEADERS)

    @handler()
    async def task_events(request: Request, session: Session) -> Response:
        """The progress of the user's tasks (of a queue, or redrives), twice a second."""
        queue = request.query_params.get("queue") or None
        kinds = ("redrive",) if request.query_params.get("kind") == "redrive" else KINDS
        back = request.query_params.get("back", "/")
        if not back.startswith("/") or back.startswith("//"):
            back = "/"

        async def messages() -> AsyncIterator[str]:
            sent = ""
            yield "retry: 3000\n\n"
            while not await request.is_disconnected():
                if console.sessions.sessions.get(session.id) is not session:
                    yield "event: expired\ndata: {}\n\n"
                    return
                html = env.get_template("_tasks.html").render(
                    tasks=tasks_of(session, queue, kinds), csrf=session.csrf, back=back)
                if html != sent:
                    sent = html
                    yield "event: swap\ndata: " + json.dumps(
                        {"target": "live-tasks", "html": html}) + "\n\n"
                else:
                    yield ": tick\n\n"
                await asyncio.sleep(0.5)

        return StreamingResponse(messages(), media_type="text/event-stream",
                                 headers={**SECURITY_HEADERS, "X-Accel-Buffering": "no"})

    # ---------------------------------------------------------- history

    @handler(api=True)
    async def api_history(request: Request, session: Session) -> Response:
        # History is INFO, read by the sampler: shown to users who may run INFO.
        probe = await pool_of(session).pool.each(lambda c: c.info("server"))
        if not any(a.ok for a in probe):
            raise HttpProblem(403, "this user may not read the nodes' INFO: " + "; ".join(
                str(a.problem) for a in probe if a.problem))
        name = request.query_params.get("series", "used_memory")
        try:
            since = time.time() - float(request.query_params.get("window", "3600"))
        except ValueError:
            raise HttpProblem(400, "window must be a number of seconds") from None
        return Json({"series": name, "nodes": console.history.series(name, since),
                     "total": console.history.total(name, since)}, headers=SECURITY_HEADERS)

    async def health(request: Request) -> Response:
        return Json({"ok": True, "open": console.open, "refusing": console.refusing is not None})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await console.start()
        try:
            yield
        finally:
            await console.stop()

    routes = [
        Route("/", page_view("overview", "Overview")),
        Route("/queues", page_view("queues", "Queues")),
        Route("/queues/{name:path}", page_view("queue", "Queue")),
        Route("/jobs/{id:path}", page_view("job", "Job")),
        Route("/dead-letters", page_view("dead-letters", "Dead letters")),
        Route("/nodes", page_view("nodes", "Nodes")),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/actions", action, methods=["POST"]),
        Route("/events/queue/{name:path}", events("queue")),
        Route("/events/job/{id:path}", events("job")),
        Route("/events/tasks", task_events),
        *(Route(f"/events/{n}", events(n)) for n in ("overview", "queues", "dead-letters",
                                                       "nodes")),
        Route("/api/overview", api_view("overview")),
        Route("/api/queues", api_view("queues")),
        Route("/api/queues/{name:path}", api_view("queue")),
        Route("/api/jobs/{id:path}", api_view("job")),
        Route("/api/dead-letters", api_view("dead-letters")),
        Route("/api/nodes", api_view("nodes")),
        Route("/api/history", api_history),
        Route("/api/tasks", api_tasks),
        Route("/api/tasks/{id}", api_tasks),
        Route("/api/actions/{kind}", api_action, methods=["POST"]),
        Route("/health", health),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(OpenHostGuard, console=console)])
    app.state.console = console
    return app

