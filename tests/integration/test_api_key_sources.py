"""The API key without the command line: from VLLM_API_KEY or --api-key-file (private files
only), never in any process's command line, the EngineCore's included, nor in the core's
environment. --api-key still works, with a warning. Real ``ringllm serve`` processes.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess

import pytest

from engine.entrypoints.cli_args import add_server_args, server_settings_from
from tests.helpers.openai_server_utils import RINGLLM, TINY_SERVE_ARGS, RemoteServer

KEY = "sk-test-7d1f0c9a2b"


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _assert_key_works_and_is_hidden(remote: RemoteServer) -> None:
    assert remote.get("/v1/models")[0] == 401
    assert remote.get("/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200
    cores = remote.core_pids()
    assert cores, "the server runs its EngineCore in a child process"
    for pid in [remote.proc.pid, *cores]:
        assert KEY.encode() not in _read(f"/proc/{pid}/cmdline"), f"the key is in the cmdline of pid {pid}"
    for pid in cores:
        assert KEY.encode() not in _read(f"/proc/{pid}/environ"), "the EngineCore inherited the key"


def _key_file(tmp_path, mode: int) -> str:
    path = str(tmp_path / "api-key")
    with open(path, "w") as f:
        f.write(KEY + "\n")
    os.chmod(path, mode)
    return path


@pytest.mark.slow
def test_the_key_from_vllm_api_key_guards_the_api_and_is_in_no_cmdline(tiny_model_dir):
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, env={"VLLM_API_KEY": KEY}) as remote:
        _assert_key_works_and_is_hidden(remote)


@pytest.mark.slow
def test_the_key_from_a_private_key_file_guards_the_api_and_is_in_no_cmdline(tiny_model_dir, tmp_path):
    with RemoteServer(tiny_model_dir, *TINY_SERVE_ARGS, "--api-key-file", _key_file(tmp_path, 0o600)) as remote:
        _assert_key_works_and_is_hidden(remote)


@pytest.mark.parametrize("mode", [0o644, 0o620])  # world-readable; group-writable
def test_a_key_file_others_can_read_or_write_is_refused_naming_it(tiny_model_dir, tmp_path, mode):
    path = _key_file(tmp_path, mode)
    out = subprocess.run(
        [*RINGLLM, "serve", tiny_model_dir, *TINY_SERVE_ARGS, "--api-key-file", path],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode != 0
    assert path in out.stderr and f"{mode:04o}" in out.stderr and "chmod 600" in out.stderr
    assert "Traceback" not in out.stderr


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    return parser.parse_args(argv)


def test_key_sources_take_the_flags_first_then_the_environment(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert server_settings_from(_parse()).api_key == "from-env"
    assert server_settings_from(_parse("--api-key-file", _key_file(tmp_path, 0o400))).api_key == KEY
    with caplog.at_level(logging.WARNING):
        assert server_settings_from(_parse("--api-key", "from-argv")).api_key == "from-argv"
    assert "--api-key puts the key on the command line" in caplog.text
    monkeypatch.delenv("VLLM_API_KEY")
    assert server_settings_from(_parse()).api_key is None


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "No such file"),
        (lambda p: open(p, "w").close() or os.chmod(p, 0o600), "holds no key"),
        (lambda p: os.symlink("/etc/hostname", p), "api-key"),
    ],
)
def test_a_missing_empty_or_symlinked_key_file_is_refused_naming_it(tmp_path, setup, message):
    path = str(tmp_path / "api-key")
    setup(path)
    with pytest.raises(ValueError, match=message) as info:
        server_settings_from(_parse("--api-key-file", path))
    assert path in str(info.value)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o606])
def test_a_key_file_group_or_others_can_read_is_refused(tmp_path, mode):
    path = _key_file(tmp_path, mode)
    with pytest.raises(ValueError, match=f"--api-key-file {path}: mode {mode:04o}"):
        server_settings_from(_parse("--api-key-file", path))


def test_both_key_flags_at_once_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        server_settings_from(_parse("--api-key", "a", "--api-key-file", _key_file(tmp_path, 0o600)))
