"""Failed logins are throttled per client address and user (pages and Basic auth alike)."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from disque import Client
from disque.console.sessions import LoginThrottle
from tests.console.conftest import ADMIN_PASSWORD, ConsoleProcess
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


def test_guesses_sent_at_once_are_throttled_as_if_sent_one_by_one(acl_cluster,
                                                                 console_factory) -> None:
    # The wait was checked before the nodes answered and the failure counted
    # after: guesses sent together all passed the check while the first was
    # still with the nodes.  The seed the console asks first sleeps, so that
    # twenty guesses are with the nodes at once.
    console = console_factory(acl_cluster)
    seed = f"127.0.0.1:{acl_cluster[0].port}"

    def sleep() -> None:
        with Client(seed, password=ADMIN_PASSWORD, randomize=False,
                    socket_timeout=30) as c:
            c.execute_command("DEBUG", "SLEEP", "3")

    def asleep() -> bool:
        try:
            with Client(seed, password=ADMIN_PASSWORD, randomize=False, socket_timeout=0.2,
                        max_retries=0, reconnect_timeout=0) as c:
                c.ping()
        except Exception:
            return True
        return False

    sleeper = threading.Thread(target=sleep)
    sleeper.start()
    try:
        wait_for(asleep, 10, interval=0.05, message="the seed to sleep")
        with ThreadPoolExecutor(30) as pool:
            guesses = [pool.submit(try_login, console, "team-a", f"guess-{n}")
                       for n in range(20)]
            # A script's requests sent at once with the right password: one
            # check, so none of them is throttled for the others.
            scripts = [pool.submit(lambda: httpx.get(f"{console.url}/api/queues", timeout=30,
                                                     auth=("team-b", "team-b-pw")).status_code)
                       for _ in range(10)]
            outcomes = [g.result() for g in guesses]
            assert [s.result() for s in scripts] == [200] * 10
    finally:
        sleeper.join()
    invalid = [o for o in outcomes if o == "invalid user name or password"]
    assert len(invalid) <= 6, outcomes  # five free failures, and the sixth try
    assert all(o.startswith("too many failed logins") for o in outcomes
               if o not in invalid), outcomes
    # The guesses that were throttled, and the right password after them,
    # still count as they should: it waits its turn, then gets in.
    wait_for(lambda: try_login(console, "team-a", "team-a-pw") == "", 15, interval=0.3,
             message="team-a to log in once its wait is over")
