"""What the KV-transfer tests share (the engines end to end, test_kv_transfer.py; the store and
the scheduler's side without a model, test_kv_connector.py)."""

from __future__ import annotations

import os
import threading

import pytest

NOBODY = 65534  # another user (tests run as root, who can chown to it)


def kv_config(path, role: str, **extra) -> dict:
    return {
        "kv_connector": "SharedStorageConnector",
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(path), **extra},
    }


def call_within(deadline_s: float, fifo: str, fn):
    """``fn()`` in a thread. If it has not returned by the deadline, whatever waits on ``fifo`` (an
    open that wants a writer) is released before the test fails: a hang is a failure, not a stuck
    suite. An exception of ``fn`` is raised here."""
    result: list = []

    def call():
        try:
            result.append((True, fn()))
        except BaseException as e:  # handed to the test's thread
            result.append((False, e))

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        worker.join(deadline_s)
        os.close(fd)
        pytest.fail(f"blocked for {deadline_s:.0f} s on the FIFO at {fifo}")
    ok, value = result[0]
    if not ok:
        raise value
    return value
