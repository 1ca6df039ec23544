"""The OpenAI Agents SDK against ``ringllm serve`` on the default model: an agent with one function
tool, made to call it on its first turn (``tool_choice="required"``). The SDK runs the tool, sends
its result back, resets the choice to auto (``reset_tool_choice``, hence the hermes parser), and
the run must end with a final output; once with whole replies, once streamed. Tracing is off:
nothing leaves loopback."""

from __future__ import annotations

import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from pydantic import BaseModel
from tests.helpers.agents_utils import agent_server, async_client, run_streamed, weather_tool


@pytest.mark.model
@pytest.mark.slow
def test_agent_calls_its_tool_then_gives_a_final_output():
    set_tracing_disabled(True)
    cities: list[str] = []
    get_weather = weather_tool(cities)

    with agent_server() as (remote, name):

        def agent() -> Agent:  # an async client belongs to one event loop: one per run
            return Agent(
                name="weather",
                instructions="You answer questions about the weather.",
                tools=[get_weather],
                model=OpenAIChatCompletionsModel(model=name, openai_client=async_client(remote)),
                model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=96),
            )

        result = Runner.run_sync(agent(), "What is the weather in Paris?", max_turns=4)
        assert len(cities) >= 1 and all(isinstance(city, str) and city for city in cities)
        assert isinstance(result.final_output, str) and result.final_output.strip()

        called_before = len(cities)
        run = run_streamed(agent, "What is the weather in Rome?")
    assert len(cities) > called_before
    assert isinstance(run.final_output, str) and run.final_output.strip()


class WeatherReport(BaseModel):
    city: str
    sunny: bool


@pytest.mark.model
@pytest.mark.slow
def test_agent_with_a_required_tool_and_an_output_type_ends_with_that_type():
    """The SDK sends ``tool_choice="required"`` with the output type's ``response_format``
    (json_schema, strict) on the first turn: the forced call's grammar takes the format's place
    (vLLM's rule; before, a 400 "not both"); after the tool ran the choice is auto again and the
    format shapes the final answer, which the SDK reads as a ``WeatherReport``."""
    set_tracing_disabled(True)
    cities: list[str] = []
    get_weather = weather_tool(cities)

    with agent_server() as (remote, name):
        client = async_client(remote)
        agent = Agent(
            name="weather",
            instructions="You report the weather.",
            tools=[get_weather],
            output_type=WeatherReport,
            model=OpenAIChatCompletionsModel(model=name, openai_client=client),
            model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=200),
        )
        result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert cities and all(isinstance(city, str) and city for city in cities)
    assert isinstance(result.final_output, WeatherReport)
