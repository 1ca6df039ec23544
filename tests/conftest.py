"""Shared pytest fixtures and markers (several engineers append here: keep each part small)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from tests.helpers.process_utils import live_children


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The tiny dummy-weight Llama (2 layers, hidden 64) with the default model's tokenizer."""
    from engine.models.default_model import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-model")))


# ---------------------------------------------------------------- nothing left behind (transport)
# After every test: no /dev/shm entry of ours and no child process that the test started. The
# pytest process is made a child subreaper, so orphaned grandchildren (e.g. an EngineCore whose
# parent was killed) are re-parented to it and caught here too.
_SHM_PREFIX = "ringllm-"


def _shm_entries() -> set[str]:
    """Our /dev/shm entries, and the private ipc:// socket directories (shm_transport/ipc_dir.py)
    in this session's own runtime directory (see ``_private_runtime_dir``)."""
    out = set()
    for d in {"/dev/shm", os.environ.get("XDG_RUNTIME_DIR") or "/dev/shm"}:
        try:
            out |= {os.path.join(d, n) for n in os.listdir(d) if n.startswith(_SHM_PREFIX)}
        except FileNotFoundError:
            pass
    return out


@pytest.fixture(scope="session", autouse=True)
def _private_runtime_dir():
    """A runtime directory of this session's own, inherited by every process it starts: the ipc://
    socket directories land there, so another test run on the machine can neither collide with
    nor be mistaken for ours."""
    import tempfile

    path = tempfile.mkdtemp(prefix="pytest-run-")  # short: socket paths have a 108-byte limit
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = path
    yield path
    if old is None:
        os.environ.pop("XDG_RUNTIME_DIR", None)
    else:
        os.environ["XDG_RUNTIME_DIR"] = old
    import shutil

    shutil.rmtree(path, ignore_errors=True)  # empty, or a leak was already reported


@pytest.fixture(scope="session", autouse=True)
def _adopt_orphans(_private_runtime_dir):
    from shm_transport import set_child_subreaper

    set_child_subreaper(True)
    yield


@pytest.fixture(autouse=True)
def _nothing_left_behind(_adopt_orphans):
    shm_before, children_before = _shm_entries(), set(live_children())
    sigint_before = signal.getsignal(signal.SIGINT)
    yield
    sigint_after = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, sigint_before)  # later tests rely on Ctrl-C raising
    deadline = time.monotonic() + 5.0  # let children that are already shutting down finish
    while True:
        left = {p: c for p, c in live_children().items() if p not in children_before}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    # A segment's name lives only inside its create call (shm_transport/segment.py), so a name
    # seen once may be another test run's (pytest-xdist workers share /dev/shm): a leak is one
    # that is still there after the deadline.
    shm_left = _shm_entries() - shm_before
    while shm_left and time.monotonic() < deadline + 5.0:
        time.sleep(0.05)
        shm_left &= _shm_entries()
    assert not shm_left, f"/dev/shm entries or ipc socket directories left behind: {sorted(shm_left)}"
    assert not left, f"child processes left behind (killed now): {left}"
    assert sigint_after == sigint_before, f"SIGINT handler left changed (restored now): {sigint_after!r}"


# ---------------------------------------------------------------- exit status, not teardown
# PyTorch's C++ static destructors can abort an interpreter on its way out after every test has
# passed ("terminate called without an active exception", exit 134: a known class of torch
# teardown crash, seen once in CI). The runner's exit status is pytest's verdict, so a process
# that ran tests on torch leaves with it, once everything pytest writes is written. Under
# pytest-xdist (the default, pytest.ini) the workers have reported their results by then and
# the controller imports no torch; this covers ``-n 0`` and ``-p no:xdist`` runs.
_exit_status: list[int] = []


def pytest_sessionfinish(session, exitstatus) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    import sys

    if _exit_status and "torch" in sys.modules and not hasattr(config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
