"""/metrics over several API-server processes (``--api-server-count N``): any one answers the sum.

A scrape lands on whichever API server the kernel picked for the connection, so each one must
answer for all. Each server also listens on a Unix socket of its own in a private directory that
the launcher made (0700, removed at exit); the one scraped asks every other for its own figures
(``/metrics?scope=local``) at scrape time and merges them: counters and histograms are summed,
gauges are this server's (the core's scheduler state, which every server receives with each
step). The core sends each step's counters to one server only (engine/core/frontends.py), so
their sum counts them once. Asking at scrape time rather than sharing files keeps recording as
it is (plain additions, no lock, no file per metric) and a scrape exact: what every server has
counted when it is asked. prometheus_client's multiprocess mode would need every metric rebuilt
on its mmap'd values.

Counters must never go down, yet a killed server's counts die with it (its replacement starts at
zero). So every figure a server contributes to a sum is first written to its snapshot file
(``api-PID.last``, atomically) in the same directory; a server that is gone, or does not answer
within ``PEER_TIMEOUT_S``, counts with its snapshot. A scrape's total is then never below the
previous one's: a dead server's part stays at what the last sum included, and the living only
count up.
"""

from __future__ import annotations

import asyncio
import os
from typing import Iterable, Optional

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

PEER_TIMEOUT_S = 2.0
LOCAL_QUERY = "scope"  # /metrics?scope=local: this process's figures only


def socket_path(fanin_dir: str, pid: Optional[int] = None) -> str:
    return os.path.join(fanin_dir, f"api-{os.getpid() if pid is None else pid}.sock")


def _snapshot_path(fanin_dir: str, pid: int) -> str:
    return os.path.join(fanin_dir, f"api-{pid}.last")


def keep_snapshot(own: bytes, fanin_dir: str) -> None:
    """This server's figures as a sum is about to include them (a few KiB to tmpfs or disk)."""
    path = _snapshot_path(fanin_dir, os.getpid())
    try:
        with open(path + ".tmp", "wb") as f:
            f.write(own)
        os.replace(path + ".tmp", path)
    except OSError:  # the directory is gone: the launcher is shutting down
        pass


def _read_snapshot(fanin_dir: str, pid: int) -> Optional[str]:
    try:
        with open(_snapshot_path(fanin_dir, pid), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


async def _ask(path: str) -> Optional[str]:
    try:
        connector = aiohttp.UnixConnector(path=path)
        timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            async with session.get(f"http://localhost/metrics?{LOCAL_QUERY}=local") as resp:
                return await resp.text() if resp.status == 200 else None
    except (OSError, aiohttp.ClientError, asyncio.TimeoutError) as e:
        if isinstance(e, aiohttp.ClientConnectorError) and isinstance(e.os_error, ConnectionRefusedError):
            try:  # a killed server's socket: nobody will listen on it again (a restart has a new pid)
                os.unlink(path)
            except OSError:
                pass
        return None


async def _figures(fanin_dir: str, pid: int, live: bool) -> Optional[str]:
    answer = await _ask(socket_path(fanin_dir, pid)) if live else None
    return answer if answer is not None else _read_snapshot(fanin_dir, pid)


async def gather(own: bytes, fanin_dir: str) -> bytes:
    """This server's exposition merged with every sibling's, living or gone."""
    keep_snapshot(own, fanin_dir)
    try:
        names = os.listdir(fanin_dir)
    except OSError:
        return own
    live = {int(n[4:-5]) for n in names if n.startswith("api-") and n.endswith(".sock")}
    gone = {int(n[4:-5]) for n in names if n.startswith("api-") and n.endswith(".last")} - live
    others = await asyncio.gather(
        *(_figures(fanin_dir, pid, pid in live) for pid in sorted(live | gone) if pid != os.getpid())
    )
    return merge([own.decode()] + [t for t in others if t is not None]).encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def merge(texts: Iterable[str]) -> str:
    """Prometheus text expositions summed sample by sample (same name, same labels); a gauge
    keeps the first text's value, a ``_created`` sample the earliest."""
    families: dict[str, tuple[str, str, dict]] = {}  # name -> (type, help, {(sample, labels): value})
    for i, text in enumerate(texts):
        for fam in text_string_to_metric_families(text):
            kind, doc, samples = families.setdefault(fam.name, (fam.type, fam.documentation, {}))
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key not in samples:
                    samples[key] = s.value
                elif s.name.endswith("_created"):
                    samples[key] = min(samples[key], s.value)
                elif kind != "gauge":
                    samples[key] += s.value
    lines = []
    for name, (kind, doc, samples) in families.items():
        shown = name + "_total" if kind == "counter" and not any(k[0] == name for k in samples) else name
        lines.append(f"# HELP {shown} {_escape(doc)}")
        lines.append(f"# TYPE {shown} {kind}")
        for (sample, labels), value in samples.items():
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(
                f"{sample}{{{label_text}}} {floatToGoString(value)}" if labels else f"{sample} {floatToGoString(value)}"
            )
    return "\n".join(lines) + "\n"
