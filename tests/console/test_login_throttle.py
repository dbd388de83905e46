"""Failed logins are throttled per client address and user (pages and Basic auth alike)."""

from __future__ import annotations

import re

import httpx

from disque.console.sessions import LoginThrottle
from tests.console.conftest import ConsoleProcess
from tests.support.process import wait_for


def try_login(console: ConsoleProcess, user: str, password: str) -> str:
    """The login form's outcome: "" when in, else the error it showed."""
    with httpx.Client(base_url=console.url, timeout=30) as web:
        form = web.get("/login").text
        token = re.search(r'name="login_token" value="([^"]+)"', form).group(1)
        reply = web.post("/login", data={"login_token": token, "username": user,
                                         "password": password, "next": "/"})
        location = reply.headers["location"]
        match = re.search(r"error=([^&]+)", location)
        return httpx.QueryParams(f"e={match.group(1)}")["e"] if match else ""


def test_guessing_a_password_is_slowed_down_and_audited(acl_cluster, console_factory) -> None:
    console = console_factory(acl_cluster)
    for _ in range(6):
        assert try_login(console, "team-a", "guess") == "invalid user name or password"
    # Past five failures, even the right password must wait its turn.
    assert try_login(console, "team-a", "team-a-pw").startswith(
        "too many failed logins: try again in")
    # Another user from the same address is not locked out by team-a's guesses.
    assert try_login(console, "team-b", "team-b-pw") == ""
    assert httpx.get(f"{console.url}/api/queues", auth=("team-a", "guess"),
                     timeout=30).status_code == 429
    # The wait is short at first (a second, doubling with each failure).
    wait_for(lambda: try_login(console, "team-a", "team-a-pw") == "", 10, interval=0.3,
             message="team-a to log in once its wait is over")
    wait_for(lambda: "user=team-a action=login target=console from=127.0.0.1 "
             "result=failed (throttled)" in console.log(), 10, message="the audit line")


def test_the_throttle_doubles_its_wait_and_forgets_old_failures() -> None:
    throttle = LoginThrottle(free=2, window=900, longest=8)
    for _ in range(2):
        throttle.failed("10.0.0.1", "alice")
    assert throttle.wait("10.0.0.1", "alice") == 0  # two free failures
    waits = []
    for _ in range(6):
        throttle.failed("10.0.0.1", "alice")
        waits.append(round(throttle.wait("10.0.0.1", "alice")))
    assert waits == [1, 2, 4, 8, 8, 8]  # doubling, up to the longest
    assert throttle.wait("10.0.0.2", "alice") == 0  # another address
    throttle.succeeded("10.0.0.1", "alice")
    assert throttle.wait("10.0.0.1", "alice") == 0
    # The address as a whole: free * 4 failures over any users.
    many = LoginThrottle(free=2)
    for n in range(9):
        many.failed("10.0.0.9", f"user{n}")
    assert many.wait("10.0.0.9", "someone-else") > 0
    bounded = LoginThrottle(entries=10)
    for n in range(50):
        bounded.failed(f"10.1.0.{n}", "x")
    assert len(bounded._failures) <= 10
