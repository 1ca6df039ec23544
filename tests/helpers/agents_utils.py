"""The OpenAI Agents SDK against ``ringllm serve`` on the default model: the weather tool its agents
call, the server they run on (hermes tool parser, auto tool choice) and a streamed run."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Callable, Iterator

import openai
from agents import Agent, Runner, function_tool

from tests.helpers.openai_server_utils import RemoteServer


def weather_tool(cities: list[str]):
    """A ``get_weather`` function tool that appends each city it is asked about to ``cities``."""

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        cities.append(city)
        return f"It is 18 degrees and sunny in {city}."

    return get_weather


@contextlib.contextmanager
def agent_server() -> Iterator[tuple[RemoteServer, str]]:
    """(server, its served model name): the default model with auto tool choice and the hermes parser."""
    with RemoteServer("--max-model-len", "2048", "--enable-auto-tool-choice", "--tool-call-parser", "hermes") as remote:
        yield remote, openai.OpenAI(base_url=remote.base_url, api_key="unused").models.list().data[0].id


def async_client(remote: RemoteServer) -> openai.AsyncOpenAI:
    """An async client of ``remote`` (it belongs to one event loop: make one per run)."""
    return openai.AsyncOpenAI(base_url=remote.base_url, api_key="unused", max_retries=0)


def run_streamed(agent: Callable[[], Agent], prompt: str, max_turns: int = 4):
    """``agent()`` (built inside the run's event loop) run streamed on ``prompt`` to its end; the run."""

    async def streamed():
        run = Runner.run_streamed(agent(), prompt, max_turns=max_turns)
        async for _ in run.stream_events():
            pass
        return run

    return asyncio.run(streamed())
