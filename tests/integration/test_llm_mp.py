"""LLM with its EngineCore in another process (the default), on the ring and on zmq:
same results as in-process, backpressure with tiny rings, Ctrl-C, kill -9, clean-up, and
the keyword normalisation LLM does before it builds the engine."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from engine import LLM, SamplingParams
from engine.client import InprocClient
from engine.client.mp_client import SyncMPClient
from engine.config import CompilationConfig
from engine.exceptions import EngineDeadError
from engine.sampling_params import BeamSearchParams
from tests.helpers import ROOT
from tests.helpers.engine_utils import EXIT_DEADLINE_S, TINY, nothing_left_behind, pid_gone, wait_until  # noqa: F401

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = ["Hello, my name is", "The future of AI is", [1, 2, 3], {"prompt": "A story:"}]


@pytest.fixture(scope="module", params=["shm", "zmq"])
def llm(request, tiny_model_dir):
    llm = LLM(model=tiny_model_dir, transport=request.param, **TINY)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def inproc_outputs(tiny_model_dir):
    os.environ["RINGLLM_ENABLE_MULTIPROCESSING"] = "0"
    try:
        llm = LLM(model=tiny_model_dir, **TINY)
    finally:
        del os.environ["RINGLLM_ENABLE_MULTIPROCESSING"]
    assert isinstance(llm.llm_engine.engine_core, InprocClient)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.shutdown()
    return outputs


def test_multiprocess_by_default_with_the_same_outputs_as_in_process(llm, inproc_outputs):
    assert isinstance(llm.llm_engine.engine_core, SyncMPClient)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in inproc_outputs]
    assert [o.outputs[0].text for o in outputs] == [o.outputs[0].text for o in inproc_outputs]


def test_2000_prompts_through_tiny_rings_complete_in_order(llm):
    prompts = [f"prompt {i}" for i in range(2000)]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0), use_tqdm=False)
    assert [o.prompt for o in outputs] == prompts
    assert all(len(o.outputs[0].token_ids) == 4 for o in outputs)


def test_ctrl_c_during_generate_raises_promptly_and_aborts_in_core(llm):
    # Ctrl-C as a script sees it: Python's own SIGINT handler. (In one loaded full-suite run this
    # test saw no KeyboardInterrupt at all, for both transports, as if an earlier test in the
    # process had left another handler installed; it held in isolation under the same load.)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_a_long_generate(llm)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_a_long_generate(llm) -> None:
    fired = []

    def interrupt() -> None:
        fired.append(time.monotonic())
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    timer = threading.Timer(0.3, interrupt)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        llm.generate(
            [f"long {i}" for i in range(200)],
            SamplingParams(max_tokens=240, ignore_eos=True, temperature=0.0),
            use_tqdm=False,
        )
    assert time.monotonic() - fired[0] < 1.0
    stats = llm.llm_engine.get_stats()
    assert stats["num_running_reqs"] == stats["num_waiting_reqs"] == 0
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.generate("still serving", GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 10


def test_ctrl_c_at_random_moments_never_desyncs_the_channel(llm):
    # KeyboardInterrupt used to land anywhere in the client, also halfway through a channel call
    # (a decode from shared memory, a fragment on these tiny rings), after which the live core
    # looked dead. Now it lands only between calls: the engine answers after every interrupt.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    rng = __import__("random").Random(7)
    try:
        for _ in range(12):
            timer = threading.Timer(
                rng.uniform(0.0, 0.05), lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            )
            try:
                timer.start()  # it may fire before start() returns
                llm.generate(
                    [f"p {i}" for i in range(200)],
                    SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.0),
                    use_tqdm=False,
                )
            except KeyboardInterrupt:
                pass
            while timer.is_alive() or not timer.finished.is_set():  # the signal may come after generate returned
                try:
                    timer.join()
                except KeyboardInterrupt:
                    pass
            out = llm.generate("still serving", GREEDY, use_tqdm=False)
            assert len(out[0].outputs[0].token_ids) == 10
        stats = llm.llm_engine.get_stats()
        assert stats["num_running_reqs"] == stats["num_waiting_reqs"] == 0
    finally:
        signal.signal(signal.SIGINT, previous)


def test_beam_search_keeps_the_best_beams(llm):
    outputs = llm.beam_search(
        [{"prompt": "Once upon a time"}], BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True)
    )
    sequences = outputs[0].sequences
    assert len(sequences) == 3
    scores = [s.cum_logprob for s in sequences]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(s.tokens) for s in sequences}) == 3


@pytest.mark.parametrize("transport", ["shm", "zmq"])
def test_kill9_of_core_mid_generate_raises_engine_dead_within_1s(tiny_model_dir, transport):
    llm = LLM(model=tiny_model_dir, transport=transport, **TINY)
    pid = llm.llm_engine.engine_core.ready.pid
    killed = []

    def kill() -> None:
        killed.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)

    threading.Timer(0.3, kill).start()
    with pytest.raises(EngineDeadError, match="SIGKILL"):
        llm.generate(
            [f"long {i}" for i in range(200)],
            SamplingParams(max_tokens=240, ignore_eos=True, temperature=0.0),
            use_tqdm=False,
        )
    assert time.monotonic() - killed[0] < 1.0
    with pytest.raises(EngineDeadError):
        llm.generate("after", GREEDY, use_tqdm=False)
    llm.shutdown()


def test_keyword_normalisation_and_del_frees_the_core_and_its_fds(tiny_model_dir):
    fds = set(os.listdir("/proc/self/fd"))
    with pytest.warns(DeprecationWarning, match="swap_space"), pytest.warns(UserWarning, match="renderer_num_workers"):
        llm = LLM(model=tiny_model_dir, swap_space=4, renderer_num_workers=2, compilation_config=0, **TINY)
    assert llm.llm_engine.config.compilation_config == CompilationConfig(mode=0)
    pid = llm.llm_engine.engine_core.ready.pid
    del llm
    gc.collect()
    wait_until(lambda: pid_gone(pid), timeout=EXIT_DEADLINE_S)
    assert set(os.listdir("/proc/self/fd")) <= fds


@pytest.mark.model
def test_default_model_over_zmq_answers_a_question():
    llm = LLM(transport="zmq", max_model_len=512)
    out = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0.0, max_tokens=24),
        use_tqdm=False,
    )
    llm.shutdown()
    assert "Paris" in out[0].outputs[0].text


@pytest.mark.model
def test_default_model_with_quantization_gguf_runs_from_its_gguf_file():
    # Used to be refused: "quantization must be 'gguf' only with a .gguf model file, got 'gguf'".
    llm = LLM(quantization="gguf", max_model_len=512)
    try:
        assert llm.llm_engine.config.model_config.model_path.endswith(".gguf")
        out = llm.chat(
            [{"role": "user", "content": "What is the capital of France?"}],
            SamplingParams(temperature=0.0, max_tokens=24),
            use_tqdm=False,
        )
    finally:
        llm.shutdown()
    assert "Paris" in out[0].outputs[0].text


@pytest.mark.slow
def test_compilation_mode_1_runs_a_compiled_forward_with_the_eager_outputs(tiny_model_dir, inproc_outputs):
    llm = LLM(model=tiny_model_dir, compilation_config=1, **TINY)
    assert llm.llm_engine.config.compilation_config == CompilationConfig(mode=1)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in inproc_outputs]


def test_data_parallel_is_refused_with_the_route_to_use(tiny_model_dir):
    with pytest.raises(ValueError, match="data-parallel-size"):
        LLM(model=tiny_model_dir, data_parallel_size=2, **TINY)


def run_script(script, **env) -> subprocess.CompletedProcess:
    """Run a user script with this checkout's ``engine`` (a script's own directory, not the
    working directory, heads its sys.path)."""
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT, **env),
    )


def test_script_without_main_guard_runs_and_exits_cleanly(tiny_model_dir, tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(
        textwrap.dedent(f"""
        from engine import LLM, SamplingParams
        llm = LLM(model={tiny_model_dir!r}, **{TINY!r})
        out = llm.generate(["hi"], SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0), use_tqdm=False)
        print(len(out[0].outputs[0].token_ids))
    """)
    )
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["3"]


def test_each_core_log_line_is_printed_once_with_the_core_prefix(tiny_model_dir, tmp_path):
    script = tmp_path / "logs.py"
    script.write_text(
        textwrap.dedent(f"""
        from engine import LLM, SamplingParams
        llm = LLM(model={tiny_model_dir!r}, **{TINY!r})
        llm.generate(["hi"], SamplingParams(max_tokens=2), use_tqdm=False)
        llm.shutdown()
    """)
    )
    done = run_script(script, RINGLLM_LOGGING_LEVEL="INFO")
    assert done.returncode == 0, done.stderr[-3000:]
    # Two messages only the core logs: its KV cache and its readiness.
    lines = [line for line in done.stderr.splitlines() if "KV cache: " in line or "EngineCore ready: " in line]
    assert len(lines) == 2, done.stderr[-3000:]
    assert all(re.match(r"\(EngineCore_0 pid=\d+\) INFO ", line) for line in lines), lines
