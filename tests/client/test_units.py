"""Pure logic of the client (no server): parsing, errors, node choice, CLI text."""

from __future__ import annotations

import random

import pytest

import disque
from disque import exceptions as exc
from disque.cli.format import Status, format_raw, format_reply, format_tty, quote
from disque.cli.prompt import split_args
from disque.client import _wire as w
from disque.client._cluster import (
    Affinity,
    GroupRouter,
    JobRouter,
    NodeTable,
    job_node_prefix,
    job_node_prefixes,
    parse_address,
    parse_addresses,
)
from disque.client._wire import Hello, Job, NodeInfo

NODE_A = "a" * 8 + "0" * 32
NODE_B = "b" * 8 + "0" * 32
NODE_C = "c" * 8 + "0" * 32


# ---------------------------------------------------------------- exceptions

@pytest.mark.parametrize(("text", "cls"), [
    ("NOJOB Job not known in the context of this node.", exc.NoJob),
    ("BADID Invalid Job ID format.", exc.BadId),
    ("NOREPL Not enough reachable nodes for the requested replication level", exc.NoRepl),
    ("PAUSED Queue paused in input, try later", exc.Paused),
    ("LEAVING This node is leaving the cluster, please connect to a different one",
     exc.Leaving),
    ("MAXLEN Queue is already longer than the specified MAXLEN count", exc.MaxLen),
    ("TOOLATE Half of job TTL already elapsed", exc.TooLate),
    ("OOM command not allowed when used memory > 'maxmemory'.", exc.OutOfMemory),
    ("ACKED Job already acknowledged.", exc.Acked),
    ("LOADING Disque is loading the dataset in memory", exc.Loading),
    ("MISCONF Errors writing to the AOF file: No space left", exc.Misconf),
    ("NOAUTH Authentication required.", exc.NoAuth),
    ("WRONGPASS invalid username-password pair", exc.AuthError),
    ("ERR invalid password", exc.AuthError),
    ("ERR Client sent AUTH, but no password is set", exc.AuthError),
    ("ERR unknown command 'FOO'", exc.ResponseError),
    ("ERR DELAY time must be a non negative number", exc.ResponseError),
    ("SOMETHINGNEW whatever", exc.ResponseError),
])
def test_error_from_reply_maps_the_first_word(text: str, cls: type) -> None:
    err = exc.error_from_reply(text)
    assert type(err) is cls
    assert isinstance(err, exc.ResponseError) and isinstance(err, exc.DisqueError)
    assert err.message == text == str(err)
    assert err.code == text.split()[0]


def test_exception_tree() -> None:
    assert issubclass(exc.NoAuth, exc.AuthError)
    failed = exc.ConnectionFailed("down", {"h:1": OSError("refused")})
    assert isinstance(failed, ConnectionError) and isinstance(failed, exc.DisqueError)
    assert "h:1" in failed.errors
    assert not issubclass(exc.ProtocolError, exc.ResponseError)
    # Every class is documented in the one docstring and exported from disque.
    for name in exc.__all__:
        if name[0].isupper() and name != "ERROR_CLASSES":
            assert name in exc.__doc__
            assert getattr(disque, name) is getattr(exc, name)


# ------------------------------------------------------------------ encoding

def test_encode_arg() -> None:
    assert w.encode_arg("é") == "é".encode()
    assert w.encode_arg(b"\x00\xff") == b"\x00\xff"
    assert w.encode_arg(bytearray(b"x")) == b"x"
    assert w.encode_arg(memoryview(b"yz")) == b"yz"
    assert w.encode_arg(-5) == b"-5"
    assert w.encode_arg("\udcff") == b"\xff"  # surrogateescape round trip
    with pytest.raises(TypeError):
        w.encode_arg(True)
    with pytest.raises(TypeError):
        w.encode_arg(1.5)  # type: ignore[arg-type]


def test_text_is_lossless_for_any_bytes() -> None:
    raw = b"q\xff\xfe"
    assert w.encode_arg(w.text(raw)) == raw


def test_add_job_request_options() -> None:
    req = w.add_job("q", b"b", 100, replicate=2, delay=1, retry=3, ttl=60, maxlen=9,
                    async_=True)
    assert req.args == (b"ADDJOB", b"q", b"b", b"100", b"REPLICATE", b"2", b"DELAY", b"1",
                        b"RETRY", b"3", b"TTL", b"60", b"MAXLEN", b"9", b"ASYNC")
    assert req.wait == 0.0
    assert w.add_job("q", b"b").wait is None  # ms-timeout 0: may block forever
    assert w.add_job("q", b"b", 1500).wait == 1.5


def test_get_jobs_request() -> None:
    req = w.get_jobs(["a", "b"], count=3, timeout_ms=250, with_counters=True)
    assert req.args == (b"GETJOB", b"TIMEOUT", b"250", b"COUNT", b"3", b"WITHCOUNTERS",
                        b"FROM", b"a", b"b")
    assert req.wait == 0.25
    assert w.get_jobs(["a"]).wait is None
    assert w.get_jobs(["a"], nohang=True).wait == 0.0
    assert w.get_jobs(["a"], nohang=True).args == (b"GETJOB", b"NOHANG", b"FROM", b"a")
    with pytest.raises(ValueError):
        w.get_jobs([])


def test_scan_requests() -> None:
    assert w.qscan_page(5, 10, True, 1, 2, 3).args == (
        b"QSCAN", b"5", b"COUNT", b"10", b"BUSYLOOP", b"MINLEN", b"1", b"MAXLEN", b"2",
        b"IMPORTRATE", b"3")
    assert w.jscan_page(0, None, False, "q", ["queued", "active"], "all").args == (
        b"JSCAN", b"0", b"QUEUE", b"q", b"STATE", b"queued", b"STATE", b"active",
        b"REPLY", b"all")
    with pytest.raises(ValueError):
        w.jscan_page(0, reply="full")


# ------------------------------------------------------------------- replies

def test_parse_jobs_with_and_without_counters() -> None:
    assert w.parse_jobs(None) == []
    plain, counted = w.parse_jobs([
        [b"q", b"D-1", b"body"],
        [b"q", b"D-2", b"\x00", b"nacks", 2, b"additional-deliveries", 3],
    ])
    assert plain == Job("q", "D-1", b"body")
    assert plain.nacks is None and plain.additional_deliveries is None
    assert (counted.nacks, counted.additional_deliveries, counted.body) == (2, 3, b"\x00")
    with pytest.raises(exc.ProtocolError):
        w.parse_jobs(b"nope")
    with pytest.raises(exc.ProtocolError):
        w.parse_jobs([[b"q", b"id"]])


def test_parse_show_keeps_body_bytes() -> None:
    shown = w.parse_show([b"id", b"D-x", b"state", b"queued", b"repl", 1,
                          b"nodes-delivered", [b"n1", b"n2"], b"next-awake-within", None,
                          b"body", b"caf\xc3\xa9"])
    assert shown == {"id": "D-x", "state": "queued", "repl": 1,
                     "nodes-delivered": ["n1", "n2"], "next-awake-within": None,
                     "body": b"caf\xc3\xa9"}
    assert w.parse_show(None) is None
    with pytest.raises(exc.ProtocolError):
        w.parse_show([b"odd"])


def test_parse_hello() -> None:
    hello = w.parse_hello([1, NODE_A.encode(), [NODE_A.encode(), b"10.0.0.1", b"7711", b"1"],
                           [NODE_B.encode(), b"10.0.0.2", b"7712", b"100"]])
    assert hello.version == 1 and hello.node_id == NODE_A
    assert hello.nodes[1] == NodeInfo(NODE_B, "10.0.0.2", 7712, 100)
    assert hello.myself == NodeInfo(NODE_A, "10.0.0.1", 7711, 1)
    assert hello.nodes[1].address == "10.0.0.2:7712"
    for bad in (b"OK", [b"x"], {"server": "redis"}, [1, b"id", [b"short"]]):
        with pytest.raises(exc.ProtocolError):
            w.parse_hello(bad)


def test_parse_info() -> None:
    text = (b"# Server\r\ndisque_version:1.0.0\r\ntcp_port:7711\r\n\r\n"
            b"# Memory\r\nmem_fragmentation_ratio:1.25\r\nmaxmemory_policy:acks\r\n")
    assert w.parse_info(text) == {
        "server": {"disque_version": "1.0.0", "tcp_port": 7711},
        "memory": {"mem_fragmentation_ratio": 1.25, "maxmemory_policy": "acks"},
    }


def test_parse_cluster_nodes() -> None:
    reply = f"{NODE_A} 127.0.0.1:7711 myself,leaving 0 0 connected\n".encode()
    (node,) = w.cluster_nodes().parse(reply)
    assert node["id"] == NODE_A and node["port"] == 7711
    assert node["flags"] == ["myself", "leaving"] and node["link_state"] == "connected"


# ----------------------------------------------------------------- addresses

def test_parse_address_forms() -> None:
    assert parse_address("h:1") == ("h", 1)
    assert parse_address("h") == ("h", 7711)
    assert parse_address("[::1]:7712") == ("::1", 7712)
    assert parse_address("::1") == ("::1", 7711)
    assert parse_address(("h", 3)) == ("h", 3)
    with pytest.raises(ValueError):
        parse_address("h:port")
    with pytest.raises(ValueError):
        parse_address(":1")
    assert parse_addresses("a:1, b:2,a:1") == [("a", 1), ("b", 2)]
    assert parse_addresses(("a", 1)) == [("a", 1)]
    assert parse_addresses(["a:1", ("b", 2)]) == [("a", 1), ("b", 2)]
    with pytest.raises(ValueError):
        parse_addresses([])


# ---------------------------------------------------------------- node table

def _hello(me: str, *nodes: tuple[str, int, int]) -> Hello:
    return Hello(1, me, tuple(NodeInfo(n, "127.0.0.1", port, prio) for n, port, prio in nodes))


def test_candidates_prefer_low_priority_and_avoid_last() -> None:
    table = NodeTable([("127.0.0.1", 1)], randomize=False)
    table.learn(("127.0.0.1", 1), _hello(NODE_A, (NODE_A, 1, 1), (NODE_B, 2, 10),
                                         (NODE_C, 3, 1)))
    assert table.candidates() == [("127.0.0.1", 1), ("127.0.0.1", 3), ("127.0.0.1", 2)]
    assert table.candidates(avoid=("127.0.0.1", 1)) == [("127.0.0.1", 3), ("127.0.0.1", 2),
                                                          ("127.0.0.1", 1)]
    table.mark_leaving(NODE_C)
    assert table.candidates()[-1] == ("127.0.0.1", 3)
    # Only the node's own HELLO clears what we saw ourselves.
    table.learn(("127.0.0.1", 1), _hello(NODE_A, (NODE_C, 3, 1)))
    assert table.priority(NODE_C) == 100
    table.learn(("127.0.0.1", 3), _hello(NODE_C, (NODE_C, 3, 1)))
    assert table.priority(NODE_C) == 1


def test_candidates_merge_seed_and_hello_entry_of_one_node() -> None:
    table = NodeTable([("localhost", 1), ("localhost", 9)], randomize=False)
    table.learn(("localhost", 1), _hello(NODE_A, (NODE_A, 1, 1)))
    # NODE_A is reachable as localhost:1 and 127.0.0.1:1: listed once.
    assert table.candidates() == [("localhost", 1), ("localhost", 9)]


def test_candidates_random_order_covers_all() -> None:
    seeds = [("h", port) for port in range(1, 6)]
    table = NodeTable(seeds, randomize=True, rng=random.Random(7))
    orders = {tuple(table.candidates()) for _ in range(30)}
    assert len(orders) > 1
    assert all(sorted(order) == seeds for order in orders)


def test_original_server_empty_ip_uses_the_address_we_dialed() -> None:
    table = NodeTable([("10.1.1.1", 7711)])
    table.learn(("10.1.1.1", 7711), Hello(1, NODE_A, (NodeInfo(NODE_A, "", 7711, 1),)))
    assert table.address_of(NODE_A) == ("10.1.1.1", 7711)


def test_affinity_picks_the_dominant_known_producer() -> None:
    table = NodeTable([("127.0.0.1", 1)], randomize=False)
    table.learn(("127.0.0.1", 1), _hello(NODE_A, (NODE_A, 1, 1), (NODE_B, 2, 1)))
    affinity = Affinity(window=10, threshold=0.6)
    affinity.observe([f"D-{NODE_B[:8]}-x-05a1"] * 5)
    assert affinity.pick(NODE_A, table) is None  # not enough jobs seen yet
    affinity.observe([f"D-{NODE_B[:8]}-x-05a1"] * 5)
    assert affinity.pick(NODE_A, table) == NODE_B
    assert affinity.pick(NODE_B, table) is None  # already there
    table.mark_leaving(NODE_B)
    assert affinity.pick(NODE_A, table) is None  # never move to a leaving node
    affinity.reset()
    affinity.observe([f"D-{NODE_C[:8]}-x-05a1"] * 10)
    assert affinity.pick(NODE_A, table) is None  # unknown from HELLO
    affinity.reset()
    affinity.observe([f"D-{NODE_B[:8]}-x-05a1"] * 5 + [f"D-{NODE_A[:8]}-x-05a1"] * 5)
    table.overrides.clear()
    assert affinity.pick(NODE_A, table) is None  # 50% is below the threshold
    with pytest.raises(ValueError):
        Affinity(window=0)


def _job(node: str, tail: str = "8YL1NT17e9+wsA/09NqxscQI-05a1") -> str:
    return f"D-{node[:8]}-{tail}"


@pytest.mark.parametrize("job_id, prefix", [
    (_job(NODE_B), NODE_B[:8]),
    (_job(NODE_B).encode(), NODE_B[:8]),
    (memoryview(_job(NODE_B).encode()), NODE_B[:8]),
    ("D-" + "X" * 8 + "-rest", None),           # not hex
    ("D-abc", None),                             # too short
    ("Q-" + NODE_B[:8] + "-rest", None),         # not a job ID
    (12345, None),
])
def test_job_node_prefix(job_id: object, prefix: str | None) -> None:
    assert job_node_prefix(job_id) == prefix  # type: ignore[arg-type]


def test_job_router_targets_the_creator_unless_it_is_us_unknown_or_down() -> None:
    table = NodeTable([("127.0.0.1", 1)], randomize=False)
    table.learn(("127.0.0.1", 1), _hello(NODE_A, (NODE_A, 1, 1), (NODE_B, 2, 1),
                                         (NODE_C, 3, 100)))
    now = [1000.0]
    router = JobRouter(table, retry_after=5.0, clock=lambda: now[0])
    assert router.target(_job(NODE_B), NODE_A) == NODE_B
    assert router.target(_job(NODE_A), NODE_A) is None      # the connected node
    assert router.target(_job("f" * 40), NODE_A) is None    # unknown to HELLO
    assert router.target(_job(NODE_C), NODE_A) is None      # failing or leaving
    router.failed(NODE_B)
    assert router.target(_job(NODE_B), NODE_A) is None      # failed lately
    now[0] += 5.1
    assert router.target(_job(NODE_B), NODE_A) == NODE_B    # worth a new try
    ids = [_job(NODE_B, "a" * 24 + "-0001"), _job(NODE_A), _job(NODE_B)]
    assert router.group(ids, NODE_A) == {NODE_B: [0, 2], None: [1]}
    # One malformed ID keeps the command whole, for the node's -BADID.
    assert router.group([*ids, "bogus"], NODE_A) == {None: [0, 1, 2, 3]}


def test_group_router_ranks_usable_nodes_by_rendezvous_hashing() -> None:
    from disque.rendezvous import ranking, score

    table = NodeTable([("127.0.0.1", 1)], randomize=False)
    table.learn(("127.0.0.1", 1), _hello(NODE_A, (NODE_A, 1, 1), (NODE_B, 2, 5),
                                         (NODE_C, 3, 1)))
    now = [1000.0]
    router = GroupRouter(table, retry_after=5.0, clock=lambda: now[0])
    homes = {key: router.homes(key) for key in (b"k%d" % i for i in range(40))}
    for key, ranked in homes.items():
        assert ranked == ranking(key, [NODE_A, NODE_B, NODE_C])
        assert score(key, ranked[0]) >= score(key, ranked[1]) >= score(key, ranked[2])
    assert {ranked[0] for ranked in homes.values()} == {NODE_A, NODE_B, NODE_C}
    # A node that failed us moves its groups to their next node, and only those.
    key_of_c = next(key for key, ranked in homes.items() if ranked[0] == NODE_C)
    router.failed(NODE_C)
    for key, ranked in homes.items():
        assert router.homes(key) == [n for n in ranked if n != NODE_C]
    now[0] += 5.1
    assert router.homes(key_of_c)[0] == NODE_C  # worth a new try
    # A node that refused GROUP (an original) is never a home; nor one that
    # HELLO says may be failing, or failing, or leaving.
    router.refused(NODE_C)
    table.learn(("127.0.0.1", 1), _hello(NODE_A, (NODE_A, 1, 1), (NODE_B, 2, 10)))
    assert router.homes(key_of_c) == [NODE_A]
    # The score is the same in every process and every version (no
    # randomized hash()): clients and nodes of different releases must agree.
    assert score(b"order-42", NODE_A) == 1040622804552299296


def test_job_node_prefixes_checks_joined_ids_like_one_at_a_time() -> None:
    good = [_job(NODE_A), _job(NODE_B), _job(NODE_A, "x")]
    assert job_node_prefixes(good) == [NODE_A[:8], NODE_B[:8], NODE_A[:8]]
    for bad in ["D-" + "X" * 8 + "-rest", "D-abc", "Q-" + NODE_B[:8] + "-rest"]:
        assert job_node_prefixes([*good, bad]) == [*job_node_prefixes(good), None]
    # A newline inside an ID must not make two IDs of it (nor hide a bad one).
    for odd in [_job(NODE_A) + "\n" + _job(NODE_B), _job(NODE_A) + "\nbogus"]:
        ids = [*good, odd]
        assert job_node_prefixes(ids) == [job_node_prefix(i) for i in ids]
    mixed = [_job(NODE_A).encode(), _job(NODE_B), 7]
    assert job_node_prefixes(mixed) == [NODE_A[:8], NODE_B[:8], None]
    assert job_node_prefixes([]) == []


def test_job_router_groups_ids_of_one_node_at_once() -> None:
    table = NodeTable([("127.0.0.1", 1)], randomize=False)
    table.learn(("127.0.0.1", 1), _hello(NODE_A, (NODE_A, 1, 1), (NODE_B, 2, 1)))
    router = JobRouter(table)
    assert router.group([_job(NODE_B)] * 3, NODE_A) == {NODE_B: [0, 1, 2]}
    assert router.group([_job(NODE_A)] * 2, NODE_A) == {None: [0, 1]}


def test_working_requests_match_working() -> None:
    from disque.client import _wire as w

    ids = [_job(NODE_A), _job(NODE_B).encode()]
    fast = w.working_requests(ids)
    assert [r.args for r in fast] == [w.working(i).args for i in ids]
    assert fast[0].parse(5) == 5


# ------------------------------------------------------------------ CLI text

def test_format_tty_like_redis_cli() -> None:
    reply = [b"name", b"foo", b"len", 56520, b"import-from", [b"dcb8", b"4377"],
             b"pause", b"none", b"a", b"b", b"c", b"d"]
    assert format_tty(reply) == (
        ' 1) "name"\n 2) "foo"\n 3) "len"\n 4) (integer) 56520\n 5) "import-from"\n'
        ' 6) 1) "dcb8"\n    2) "4377"\n 7) "pause"\n 8) "none"\n 9) "a"\n10) "b"\n'
        '11) "c"\n12) "d"\n')
    assert format_tty(None) == "(nil)\n"
    assert format_tty([]) == "(empty array)\n"
    assert format_tty(Status(b"OK")) == "OK\n"
    assert format_tty(exc.error_from_reply("ERR x")) == "(error) ERR x\n"
    assert format_tty([[b"q", b"id", b"b"]]) == '1) 1) "q"\n   2) "id"\n   3) "b"\n'
    assert quote(b'a"b\\c\n\x00\xff') == '"a\\"b\\\\c\\n\\x00\\xff"'


def test_format_raw() -> None:
    assert format_raw([b"a", 1, None, [b"x", b"y"]]) == b"a\n1\n\nx\ny"
    assert format_reply(Status(b"OK"), raw=True) == b"OK\n"
    assert format_reply(exc.error_from_reply("NOJOB x"), raw=True) == b"NOJOB x\n"


@pytest.mark.parametrize(("line", "args"), [
    ("addjob q body 0", [b"addjob", b"q", b"body", b"0"]),
    ('  addjob   "my queue"  "a\\nb"  ', [b"addjob", b"my queue", b"a\nb"]),
    ('set "\\x41\\x00"', [b"set", b"A\x00"]),
    ("echo 'it\\'s' ''", [b"echo", b"it's", b""]),
    ("", []),
    ('echo "unterminated', None),
    ('echo "a"b', None),
    ("echo 'x", None),
])
def test_split_args(line: str, args: list[bytes] | None) -> None:
    assert split_args(line) == args


def test_pack_commands_matches_resp() -> None:
    """The client's own packer gives the exact RESP a server parses, binary-safe."""
    from disque.protocol import CommandParser

    commands = [(b"PING",), (b"ECHO", b""), (b"ADDJOB", b"q", bytes(range(256)) * 300, b"0"),
                (b"ACKJOB", *[b"D-%08x-%s-05a1" % (i, b"A" * 24) for i in range(50)])]
    packed = w.pack_commands(commands)
    assert packed.startswith(b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$0\r\n\r\n*4\r\n")
    assert CommandParser().feed(packed) == [list(c) for c in commands]
    assert w.pack_commands([]) == b""
