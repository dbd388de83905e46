"""Links from the charts to Prometheus (``--prometheus-url``): rendered, and
naming series a real node exports on its ``metrics-port``."""

from __future__ import annotations

import html
import json
import re
from contextlib import closing
from urllib.parse import parse_qs, quote, urlsplit

import httpx

from disque import Client
from disque.console.prometheus import promql_string
from tests.support.metrics import scrape
from tests.support.process import free_port

PROMETHEUS = "http://prometheus.example:9090"
QUEUE = 'orders "eu"\\1'


def links(page: str) -> dict[str, list[str]]:
    """``{link id: [PromQL expressions]}`` of a page's Prometheus links."""
    found: dict[str, list[str]] = {}
    for href, link_id in re.findall(r'<a href="([^"]+)" id="(prometheus-[a-z]+)"', page):
        url = urlsplit(html.unescape(href))
        assert f"{url.scheme}://{url.netloc}" == PROMETHEUS and url.path == "/graph"
        query = parse_qs(url.query)
        found[link_id] = [query[f"g{i}.expr"][0] for i in range(len(query) // 3)]
    return found


def test_charts_link_to_the_series_the_nodes_export(server_factory, console_factory) -> None:
    port = free_port()
    node = server_factory("--metrics-port", str(port))
    with Client(f"127.0.0.1:{node.port}", randomize=False) as c:
        job_id = c.add_job(QUEUE, b"x")
        c.get_jobs(QUEUE, count=1)
        c.ack(job_id)
        c.add_job(QUEUE, b"y")
    console = console_factory([node], "--prometheus-url", PROMETHEUS + "/")
    with closing(httpx.Client(base_url=console.url, timeout=30)) as web:
        overview = links(web.get("/").text)
        queue = links(web.get("/queues/" + quote(QUEUE, safe="")).text)
        assert api_links(web) == (True, True)
    assert overview == {
        "prometheus-flow": ["sum(rate(disque_jobs_added_total[1m]))",
                            "sum(rate(disque_jobs_delivered_total[1m]))",
                            "sum(rate(disque_jobs_acked_total[1m]))"],
        "prometheus-commands": ["sum(rate(disque_commands_processed_total[1m]))"]}
    selector = '{queue="orders \\"eu\\"\\\\1"}'
    assert promql_string(QUEUE) == selector[7:-1]
    assert queue == {"prometheus-queue": [
        f"sum(disque_queue_length{selector})",
        f"sum(rate(disque_queue_enqueued_total{selector}[1m]))",
        f"sum(rate(disque_queue_dequeued_total{selector}[1m]))"]}
    # Every series named is one the node exports, the queue's with its label.
    samples = scrape(port)
    exported = {name for name, _ in samples}
    for expr in [*overview["prometheus-flow"], *overview["prometheus-commands"],
                 *queue["prometheus-queue"]]:
        metric = re.search(r"disque_[a-z_]+", expr)
        assert metric and metric.group() in exported, expr
        if "queue=" in expr:
            label = json.loads(expr[expr.index("queue=") + 6:expr.index("}")])
            assert (metric.group(), (("queue", label),)) in samples, expr
    assert samples[("disque_jobs_acked_total", ())] == 1


def api_links(web: httpx.Client) -> tuple[bool, bool]:
    overview = web.get("/api/overview").json()
    return "flow" in overview.get("prometheus", {}), "prometheus" not in web.get(
        "/api/nodes").json()


def test_without_the_option_no_chart_links(open_console) -> None:
    with closing(httpx.Client(base_url=open_console.url, timeout=30)) as web:
        for path in ("/", "/queues/anything"):
            page = web.get(path)
            assert page.status_code == 200 and 'class="prometheus"' not in page.text, path
        assert "prometheus" not in web.get("/api/overview").json()
