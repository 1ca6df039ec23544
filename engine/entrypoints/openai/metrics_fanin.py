"""/metrics over several API-server processes (``--api-server-count N``): any one answers the sum.

A scrape lands on whichever API server the kernel picked for the connection, so each one must
answer for all. Each server also listens on a Unix socket of its own in a private directory that
the launcher made (0700, removed at exit); the one scraped asks every other for its own figures
(``/metrics?scope=local``) at scrape time and merges them: counters and histograms are summed,
gauges are this server's (the core's scheduler state, which every server receives with each
step). The core sends each step's counters to one server only (engine/core/frontends.py), so
their sum counts them once. Asking at scrape time rather than sharing files keeps recording as
it is (plain additions, no lock, no file per metric) and a scrape exact: what every server has
counted when it is asked. A server that does not answer within ``PEER_TIMEOUT_S`` is left out.
prometheus_client's multiprocess mode would need every metric rebuilt on its mmap'd values.
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


async def gather(own: bytes, fanin_dir: str) -> bytes:
    """This server's exposition merged with every sibling's."""
    mine = socket_path(fanin_dir)
    try:
        paths = [os.path.join(fanin_dir, n) for n in sorted(os.listdir(fanin_dir)) if n.endswith(".sock")]
    except OSError:
        return own
    others = await asyncio.gather(*(_ask(p) for p in paths if p != mine))
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
            lines.append(f"{sample}{{{label_text}}} {floatToGoString(value)}" if labels else
                         f"{sample} {floatToGoString(value)}")
    return "\n".join(lines) + "\n"
