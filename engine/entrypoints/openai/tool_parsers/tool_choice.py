"""What a chat request's ``tools`` and ``tool_choice`` ask for, checked as vLLM checks them.

- ``none`` (the default without tools): the tools still reach the chat template; the reply is
  plain content.
- ``auto`` (the default with tools): the model decides, and the server's ``--tool-call-parser``
  reads its calls; without ``--enable-auto-tool-choice`` it is a 400, as in vLLM.
- ``required`` and a named function: the reply is generated under a JSON-schema constraint, so
  any model (the default one too) produces well-formed calls: an array of
  ``{"name": <one of the tools>, "parameters": <its schema>}`` (at most one with
  ``parallel_tool_calls=false``), or the named function's arguments object. Free whitespace is
  left out of that grammar: the arguments are re-spelled canonically anyway, and a small model
  under a constraint that allows it can spend its whole budget on newlines. So are properties a
  schema does not name (as xgrammar's strict mode, vLLM's default, leaves them out): the default
  model otherwise fills calls with invented keys until it runs out of tokens. That grammar takes
  the place of a ``response_format`` (which shapes a reply in text, as with ``auto`` and
  ``none``): the Agents SDK sends both for an agent with a required tool and an output type.
  ``structured_outputs`` or ``guided_*`` beside a forced call cannot both hold: a 400.

A 400 names the field at fault (``tools``, ``tool_choice``, a second constraint) with vLLM's message.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional

import msgspec

from engine.entrypoints.openai.errors import OpenAIError
from engine.entrypoints.openai.http_bodies import ChatCompletionRequest, ChatCompletionToolsParam, NamedToolChoice
from engine.entrypoints.openai.reasoning_parsers.abstract_reasoning_parser import ReasoningParser
from engine.entrypoints.openai.structured_outputs import explicit_constraint_field
from engine.entrypoints.openai.tool_parsers.abstract_tool_parser import ExtractedToolCalls, ToolParser
from engine.entrypoints.openai.tool_parsers.forced import NamedToolCallParser, RequiredToolCallParser
from engine.entrypoints.openai.partial_json import MAX_DEPTH, nesting
from engine.sampling_params import SamplingParams, StructuredOutputsParams

_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolServing:
    """The server's reading of replies: tool calling (``--enable-auto-tool-choice``,
    ``--tool-call-parser``) and the ``--reasoning-parser`` whose split comes first."""

    enable_auto_tool_choice: bool = False
    parser_cls: Optional[type[ToolParser]] = None
    reasoning_parser_cls: Optional[type[ReasoningParser]] = None


@dataclass(frozen=True)
class ToolCallPlan:
    mode: str  # "none", "auto", "required" or "named"
    tools: Optional[list[dict[str, Any]]]  # for the chat template
    parallel: bool = True
    name: Optional[str] = None  # the named function
    schema: Optional[dict[str, Any]] = None  # the constraint of "required" and named choices
    auto_parser: Optional[type[ToolParser]] = None

    @property
    def max_calls(self) -> Optional[int]:
        return None if self.parallel else 1

    def new_parser(self, tokenizer: Any) -> Optional[ToolParser]:
        """A fresh parser for one reply (parsers keep state while streaming); None: no calls."""
        if self.mode == "named":
            return NamedToolCallParser(self.name, tokenizer)
        if self.mode == "required":
            return RequiredToolCallParser(tokenizer)
        if self.mode == "auto":
            return self.auto_parser(tokenizer)
        return None

    def constrain(self, params: SamplingParams) -> SamplingParams:
        """``params`` with what the calls need: their JSON-schema constraint, or the special
        tokens an auto parser reads kept in the text. A forced call's grammar takes the place
        of a ``response_format`` (vLLM's rule: that format shapes a reply in text, and a forced
        reply is a call); ``plan_tool_calls`` has refused any other constraint beside it."""
        if self.schema is not None:
            constraint = StructuredOutputsParams(
                json=self.schema, disable_any_whitespace=True, disable_additional_properties=True
            )
            return msgspec.structs.replace(params, structured_outputs=constraint)
        if self.mode == "auto" and self.auto_parser.keeps_special_tokens:
            return msgspec.structs.replace(params, skip_special_tokens=False)
        return params

    def finish_reason(self, extracted: Optional[ExtractedToolCalls], finish_reason: Optional[str]) -> Optional[str]:
        """OpenAI's: ``tool_calls`` when an auto or required reply stops after whole calls; a
        reply that ends inside a call keeps the engine's reason (``length``, or ``stop``); a
        named choice keeps ``stop`` (vLLM and OpenAI both answer so). Streamed and whole
        replies both ask here, with the whole reply's ``extracted`` calls."""
        if (
            extracted is not None
            and extracted.tools_called
            and not extracted.unfinished
            and self.mode in ("auto", "required")
            and finish_reason == "stop"
        ):
            return "tool_calls"
        return finish_reason


def plan_tool_calls(body: ChatCompletionRequest, serving: ToolServing) -> ToolCallPlan:
    """The request's tool calling, or a 400 naming the field vLLM would name."""
    tools, choice = body.tools, body.tool_choice
    if tools is not None and not tools:
        raise _bad(
            "tools", "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely."
        )
    for index, tool in enumerate(tools or ()):
        _check_parameters(tool, index)
    if choice is None:
        choice = "auto" if tools else "none"
    tool_dicts = msgspec.to_builtins(tools) if tools else None
    if choice == "none":
        return ToolCallPlan("none", tool_dicts)
    if tools is None:
        raise _bad("tool_choice", "When using `tool_choice`, `tools` must be set.")
    if choice == "required" or isinstance(choice, NamedToolChoice):
        _refuse_a_second_constraint(body, choice)
    if isinstance(choice, NamedToolChoice):
        tool = next((t for t in tools if t.function.name == choice.function.name), None)
        if tool is None:
            raise _bad("tool_choice", "The tool specified in `tool_choice` does not match any of the specified `tools`")
        return ToolCallPlan("named", tool_dicts, body.parallel_tool_calls, tool.function.name, _parameters(tool))
    if choice == "required":
        return ToolCallPlan(
            "required", tool_dicts, body.parallel_tool_calls, schema=required_schema(tools, body.parallel_tool_calls)
        )
    if not (serving.enable_auto_tool_choice and serving.parser_cls is not None):
        raise _bad(
            "tool_choice", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    return ToolCallPlan("auto", tool_dicts, body.parallel_tool_calls, auto_parser=serving.parser_cls)


def _refuse_a_second_constraint(body: ChatCompletionRequest, choice: Any) -> None:
    """A forced call is generated under its own grammar: ``structured_outputs`` or a
    ``guided_*`` field asks for a second one, which cannot be honoured with it (vLLM refuses
    it beside a named choice and drops it beside ``required``; a field is a promise here, so
    both are a 400). ``response_format`` gives way instead (``ToolCallPlan.constrain``)."""
    field = explicit_constraint_field(body)
    if field is not None:
        shown = "required" if choice == "required" else f"the function {choice.function.name!r}"
        raise _bad(
            field,
            "You can only either use constraints for structured outputs or tools, not both: "
            f"{field} cannot be combined with tool_choice {shown} (a forced tool call is generated "
            "under the tool's schema; response_format gives way to it)",
        )


def required_schema(tools: list[ChatCompletionToolsParam], parallel: bool) -> dict[str, Any]:
    """vLLM's schema for ``required``: a non-empty array of calls, each naming one tool and
    matching its parameters. Each tool's ``$defs`` move to the top, where its ``#/$defs/...``
    references now point; two tools defining one name differently is a 400."""
    defs: dict[str, Any] = {}
    branches = []
    for tool in tools:
        parameters = _parameters(tool)
        for name, definition in parameters.pop("$defs", {}).items():
            if name in defs and defs[name] != definition:
                raise _bad("tools", f"Tool definition '{name}' has multiple schemas, which is not supported.")
            defs[name] = definition
        branches.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [tool.function.name]}, "parameters": parameters},
                "required": ["name", "parameters"],
            }
        )
    # (vLLM writes {"type": "object", "anyOf": ...}: each branch is an object already, and a
    # closed outer object without properties would admit none.)
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": branches}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _parameters(tool: ChatCompletionToolsParam) -> dict[str, Any]:
    return copy.deepcopy(tool.function.parameters) if tool.function.parameters else dict(_EMPTY_PARAMETERS)


def _check_parameters(tool: ChatCompletionToolsParam, index: int) -> None:
    """A function's parameters describe its arguments object (OpenAI refuses any other type),
    nested no deeper than the parsers read arguments (``partial_json.MAX_DEPTH``): the schema
    is copied, constrained and rendered by code that recurses once per level."""
    kind = (tool.function.parameters or {}).get("type", "object")
    if kind != "object":
        raise _bad(
            "tools",
            f"Invalid schema for function {tool.function.name!r} (tools.{index}): parameters must "
            f'be a JSON Schema of type "object", got {kind!r}',
        )
    if nesting(tool.function.parameters) > MAX_DEPTH:
        raise _bad(
            "tools",
            f"Invalid schema for function {tool.function.name!r} (tools.{index}): parameters are "
            f"nested deeper than {MAX_DEPTH} levels",
        )


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value")
