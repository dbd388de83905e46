"""Logging in with the nodes' own users, sessions, and what each user sees and may do."""

from __future__ import annotations

import re
from contextlib import closing

import httpx

from disque import Client
from tests.console.conftest import ADMIN_PASSWORD, api, csrf_of, login
from tests.support.process import wait_for


def admin(node) -> Client:
    return Client(f"127.0.0.1:{node.port}", password=ADMIN_PASSWORD, randomize=False)


def test_pages_need_a_login_and_a_wrong_password_is_refused(acl_cluster,
                                                            console_factory) -> None:
    console = console_factory(acl_cluster)
    with httpx.Client(base_url=console.url, timeout=30) as anonymous:
        page = anonymous.get("/queues")
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
        assert anonymous.get("/api/queues").status_code == 401
        form = anonymous.get("/login").text
        token = re.search(r'name="login_token" value="([^"]+)"', form).group(1)
        refused = anonymous.post("/login", data={"login_token": token, "username": "team-a",
                                                 "password": "wrong"})
        assert "invalid%20user%20name%20or%20password" in refused.headers["location"]
        assert "disque_console" not in anonymous.cookies
        assert anonymous.post("/login", data={"username": "team-a", "password": "team-a-pw"}
                              ).headers["location"].startswith("/login?error=")  # no token
        assert "Open console" not in anonymous.get("/login").text  # passwords: not open


def test_session_cookie_is_signed_httponly_strict_and_dies_at_logout(acl_cluster,
                                                                     console_factory) -> None:
    console = console_factory(acl_cluster)
    with closing(login(console.url, "default", ADMIN_PASSWORD)) as web:
        cookie = next(c for c in web.cookies.jar if c.name == "disque_console")
        raw = web.get("/login")  # any response: check how the login set it
        assert raw.status_code == 200
        session_id, mac = cookie.value.split(".")
        assert len(mac) == 64
        reply = httpx.get(f"{console.url}/api/overview", timeout=30,
                          cookies={"disque_console": f"{session_id}.{'0' * 64}"})
        assert reply.status_code == 401  # a forged signature is no session
        assert api(web, "/api/overview")["totals"]["up"] == 3
        token = csrf_of(web)
        assert web.post("/logout", data={"csrf": token}).status_code == 303
        stale = httpx.get(f"{console.url}/api/overview", timeout=30,
                          cookies={"disque_console": cookie.value})
        assert stale.status_code == 401  # the old cookie names no session any more
    # The Set-Cookie header itself: HttpOnly and SameSite=Strict.
    with httpx.Client(base_url=console.url, timeout=30) as fresh:
        form = fresh.get("/login").text
        token = re.search(r'name="login_token" value="([^"]+)"', form).group(1)
        reply = fresh.post("/login", data={"login_token": token, "username": "default",
                                           "password": ADMIN_PASSWORD})
        header = next(v for k, v in reply.headers.multi_items()
                      if k == "set-cookie" and v.startswith("disque_console="))
        assert "HttpOnly" in header and "SameSite=strict" in header and "Path=/" in header


def test_a_restricted_user_sees_only_its_queues_and_noperm_elsewhere(acl_cluster,
                                                                     console_factory) -> None:
    with admin(acl_cluster[0]) as c:
        c.add_job("team-a:orders", b"a", replicate=1)
        c.add_job("team-b:payroll", b"b", replicate=1)
        secret = c.add_job("team-b:payroll", b"salary", replicate=1)
    console = console_factory(acl_cluster, "--data-dir", str(acl_cluster[0].workdir.parent
                                                               / "console-data"))
    with closing(login(console.url, "team-a", "team-a-pw")) as web:
        names = {q["name"] for q in api(web, "/api/queues", fresh=1)["queues"]}
        assert "team-a:orders" in names and not any(n.startswith("team-b") for n in names)
        other = api(web, "/api/queues/team-b:payroll")
        assert other["noperm"] and not other["exists"]
        assert {n["problem"]["kind"] for n in other["nodes"]} == {"noperm"}
        page = web.get("/queues/team-b:payroll")
        assert page.status_code == 200 and "NOPERM" in page.text and 'id="noperm"' in page.text
        job = api(web, f"/api/jobs/{secret}")
        assert not job["found"] and job["noperm"] and job["body"] is None
        token = csrf_of(web)
        denied = web.post("/api/actions/pause", json={"queue": "team-b:payroll",
                                                      "state": "all"},
                          headers={"X-CSRF-Token": token})
        assert denied.status_code == 409
        assert {r["kind"] for r in denied.json()["results"]} == {"noperm"}
        mine = web.post("/api/actions/pause", json={"queue": "team-a:orders", "state": "in"},
                        headers={"X-CSRF-Token": token})
        assert mine.status_code == 200, mine.text
        overview = api(web, "/api/overview")  # INFO is not team-a's: NOPERM per node
        assert {n["state"] for n in overview["nodes"]} == {"noperm"}
        assert web.get("/api/history").status_code == 403
    for node in acl_cluster:
        with admin(node) as c:
            assert c.pause("team-b:payroll") == "none"
            assert c.pause("team-a:orders") == "in"
    audit = (acl_cluster[0].workdir.parent / "console-data" / "audit.log")
    wait_for(lambda: audit.exists() and "user=team-a action=pause target=queue:team-b:payroll"
             in audit.read_text(), 10, message="the audit file's line")
    text = audit.read_text()
    assert "state=all result=failed (noperm)" in text
    assert "user=team-a action=pause target=queue:team-a:orders state=in result=ok" in text


def test_scripts_use_basic_auth_on_the_api(acl_cluster, console_factory) -> None:
    console = console_factory(acl_cluster)
    assert httpx.get(f"{console.url}/api/queues", auth=("team-a", "nope"),
                     timeout=30).status_code == 401
    reply = httpx.get(f"{console.url}/api/queues", auth=("team-a", "team-a-pw"), timeout=30)
    assert reply.status_code == 200
    # An action needs a JSON body: a cross-site form cannot send one.
    form = httpx.post(f"{console.url}/api/actions/pause", auth=("team-a", "team-a-pw"),
                      data={"queue": "team-a:x", "state": "in"}, timeout=30)
    assert form.status_code == 415
    done = httpx.post(f"{console.url}/api/actions/pause", auth=("team-a", "team-a-pw"),
                      json={"queue": "team-a:x", "state": "none"}, timeout=30)
    assert done.status_code == 200


def test_a_user_name_without_its_password_is_not_that_user(cluster, console_factory) -> None:
    # Open nodes (default takes no password) that also have an ACL user:
    # without a password the console sends no AUTH, so the nodes see
    # `default`.  The name typed must not become the session's user, who
    # owns tasks and is named in audit lines.
    for node in cluster:
        with Client(f"127.0.0.1:{node.port}", randomize=False) as c:
            c.execute_command("ACL", "SETUSER", "ops", "on", ">ops-pw", "~*", "+@all")
    console = console_factory(cluster)
    with closing(login(console.url, "ops", "ops-pw")) as ops:
        started = ops.post("/api/actions/bulk", json={"op": "dequeue", "queue": "ops:q"},
                           headers={"X-CSRF-Token": csrf_of(ops)})
        assert started.status_code == 202, started.text
        task = started.json()["id"]
    with httpx.Client(base_url=console.url, timeout=30) as anonymous:
        form = anonymous.get("/login").text
        token = re.search(r'name="login_token" value="([^"]+)"', form).group(1)
        refused = anonymous.post("/login", data={"login_token": token, "username": "ops",
                                                 "password": "", "next": "/"})
        assert "needs%20its%20password" in refused.headers["location"]
        # As an open cluster's visitor it is `default`, and ops' tasks are not its own.
        assert api(anonymous, "/api/tasks")["tasks"] == []
        assert anonymous.get(f"/api/tasks/{task}").status_code == 404
        cancel = anonymous.post("/api/actions/task", json={"id": task, "op": "cancel"},
                                headers={"X-CSRF-Token": csrf_of(anonymous)})
        assert cancel.status_code == 400 and "no task" in cancel.json()["error"]
    basic = httpx.get(f"{console.url}/api/tasks", auth=("ops", ""), timeout=30)
    assert basic.status_code == 401 and "needs its password" in basic.json()["error"]
