"""Replicas of ``ringllm serve`` on separate hosts behind vllm-router (PyPI), as a deployment runs them.

Each replica runs the tiny dummy-weight model in a network namespace of its own (tests/helpers/netns_hosts.py);
vllm-router and the load generator (tests/helpers/router_workload.py) run in a third. ringllm's part is to
be a good model server for the router: the OpenAI routes it forwards, /health it probes, and the
vLLM-named prefix-cache counters a deployment reads to see what the routing bought. Without
CAP_NET_ADMIN the same tests run with every replica on loopback, on its own port.

Shown: every request of a shared-prefix workload (8 system prompts x 6 questions) is answered; the
cache-aware policy gets a higher prefix-cache hit rate on the replicas' own counters than
round-robin on the same workload shape; a replica killed mid-run costs at most the requests it had
in flight (errors, never hangs), and the other replica keeps serving.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from tests.helpers.openai_server_utils import RINGLLM, TINY_SERVE_ARGS, free_port
from tests.helpers.process_utils import live_children

from tests.helpers import ROOT, netns_hosts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROUTER = os.path.join(os.path.dirname(sys.executable), "vllm-router")
WORKLOAD = os.path.join(ROOT, "tests", "helpers", "router_workload.py")
_WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november".split()


def shared_prefix_prompts(tag: str, systems: int = 8, questions: int = 6, seed: int = 0) -> list[str]:
    """``systems`` long system prompts (~100 tokens: several full KV blocks), each asked
    ``questions`` short questions, in a seeded shuffled order."""
    rng = random.Random(seed)
    heads = [
        f"System {tag}-{k}: you are assistant number {k}. " + " ".join(rng.choice(_WORDS) for _ in range(90))
        for k in range(systems)
    ]
    prompts = [f"{head}\nQuestion {q}: what is {q} plus {k}?" for k, head in enumerate(heads) for q in range(questions)]
    rng.shuffle(prompts)
    return prompts


class Deployment:
    """Two replicas on two hosts and, per ``route`` call, a vllm-router in front of them."""

    def __init__(self, hosts, model_dir: str, log_dir: str) -> None:
        self.hosts, self.model_dir, self.log_dir = hosts, model_dir, log_dir
        loopback = isinstance(hosts, netns_hosts.LoopbackHosts)
        self.ports = [free_port() if loopback else 8000 for _ in hosts.host_addrs]
        self.urls = [f"http://{a}:{p}" for a, p in zip(hosts.host_addrs, self.ports)]
        self.replicas: list[subprocess.Popen] = []

    def start(self) -> "Deployment":
        for i, (addr, port) in enumerate(zip(self.hosts.host_addrs, self.ports)):
            argv = [*RINGLLM, "serve", self.model_dir, *TINY_SERVE_ARGS, "--host", addr, "--port", str(port)]
            with open(os.path.join(self.log_dir, f"replica{i}.log"), "ab") as log:
                self.replicas.append(
                    subprocess.Popen(
                        self.hosts.on_host(i, argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        return self

    def route(
        self,
        policy: str,
        prompts: list[str],
        *,
        concurrency: int,
        max_tokens: int,
        kill_replica: int | None = None,
        kill_after: int = 0,
    ) -> dict:
        """Run the workload through a fresh router with ``policy``; the workload's result."""
        port = free_port() if isinstance(self.hosts, netns_hosts.LoopbackHosts) else 8100
        url = f"http://{self.hosts.client_addr}:{port}"
        live = [u for u, proc in zip(self.urls, self.replicas) if proc.poll() is None]
        argv = [
            ROUTER,
            "--host",
            self.hosts.client_addr,
            "--port",
            str(port),
            "--policy",
            policy,
            "--worker-urls",
            *live,
            "--log-level",
            "warning",
            # its own metrics listener, on a port of its own (the default one may be taken)
            "--prometheus-host",
            self.hosts.client_addr,
            "--prometheus-port",
            str(free_port()),
        ]
        with open(os.path.join(self.log_dir, f"router-{policy}.log"), "ab") as log:
            router = subprocess.Popen(
                self.hosts.in_client(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        job = {
            "router": url,
            "replicas": live,
            "model": self.model_dir,
            "prompts": prompts,
            "max_tokens": max_tokens,
            "concurrency": concurrency,
            "request_timeout_s": 60,
            "ready_timeout_s": 240,
            "kill_pid": self.replicas[kill_replica].pid if kill_replica is not None else None,
            "kill_after": kill_after,
        }
        try:
            done = subprocess.run(
                self.hosts.in_client([sys.executable, WORKLOAD]),
                input=json.dumps(job),
                capture_output=True,
                text=True,
                timeout=480,
            )
        finally:
            router.send_signal(signal.SIGTERM)
            try:
                router.wait(30)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait()
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        for proc in self.replicas:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.replicas:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(params=["netns", "loopback"])
def hosts(request):
    if request.param == "netns":
        reason = netns_hosts.available()
        if reason:
            pytest.skip(f"network namespaces unavailable ({reason}); the loopback variant runs instead")
        made = netns_hosts.NetnsHosts(2)
    else:
        if netns_hosts.available() is None:
            pytest.skip("namespaces are available: the netns variant covers this")
        made = netns_hosts.LoopbackHosts(2)
    with made:
        yield made


@pytest.fixture
def deployment(hosts, tiny_model_dir, tmp_path):
    if not os.path.exists(ROUTER):
        pytest.fail(f"vllm-router is not installed beside {sys.executable} (setup.py's test extras)")
    before = set(live_children())
    dep = Deployment(hosts, tiny_model_dir, str(tmp_path)).start()
    try:
        yield dep
    finally:
        dep.stop()
    deadline = time.monotonic() + 60
    while set(live_children()) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(live_children()) <= before


def hit_rate(result: dict) -> float:
    hits = sum(result["after"][u]["hits"] - result["before"][u]["hits"] for u in result["after"])
    queries = sum(result["after"][u]["queries"] - result["before"][u]["queries"] for u in result["after"])
    assert queries > 0, "the replicas counted no prefix-cache queries"
    return hits / queries


def test_cache_aware_routing_beats_round_robin_on_the_replicas_own_prefix_cache_counters(deployment):
    rates = {}
    for tag, policy in (("rr", "round_robin"), ("ca", "cache_aware")):  # distinct prompts: no carried-over cache
        prompts = shared_prefix_prompts(tag)
        result = deployment.route(policy, prompts, concurrency=2, max_tokens=2)
        assert (result["answered"], result["errors"], result["hung"]) == (len(prompts), [], 0)
        rates[policy] = hit_rate(result)
    assert rates["cache_aware"] > rates["round_robin"], rates


def test_a_replica_killed_mid_run_costs_only_its_in_flight_requests(deployment):
    prompts = shared_prefix_prompts("kill", systems=8, questions=8)
    concurrency = 4
    result = deployment.route(
        "power_of_two", prompts, concurrency=concurrency, max_tokens=24, kill_replica=1, kill_after=12
    )
    assert result["killed"] and result["hung"] == 0
    assert result["answered"] + len(result["errors"]) == len(prompts)
    assert len(result["errors"]) <= concurrency, result["errors"]  # at most what was in flight on it
    assert deployment.replicas[1].wait(30) == -signal.SIGKILL
    # a fresh router in front of the one replica left (power_of_two needs two workers)
    survivor = deployment.route(
        "round_robin", shared_prefix_prompts("after", systems=2, questions=2), concurrency=2, max_tokens=2
    )
    assert (survivor["answered"], survivor["hung"]) == (4, 0)
