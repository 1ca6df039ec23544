"""A chat completion's stream of chunks, retold as a Response and its stream events.

The Responses API is served on the chat machinery (serving_responses.py), so its whole answer and
its stream come from one place: ``ResponseEvents`` reads the chat chunks (content deltas, tool-call
deltas, the finish reason, the usage chunk) and says each as the Responses events, in OpenAI's
order: ``response.created``, ``response.in_progress``; per output item ``output_item.added``, then a
message's ``content_part.added``, ``output_text.delta``... ``output_text.done``,
``content_part.done``, a reasoning item's (``--reasoning-parser``: the chunks' ``reasoning_content``)
``content_part.added``, ``reasoning_text.delta``... ``reasoning_text.done``, ``content_part.done``
(its part a ``reasoning_text``, as vLLM sends them), or a call's ``function_call_arguments.delta``... ``.done``; then
``output_item.done``; last ``response.completed``, as vLLM ends every stream (the response's
``status`` says ``incomplete`` when the token limit cut the answer; OpenAI would send
``response.incomplete``, which the ``openai`` package's stream helper does not accept). Every
event carries its ``sequence_number``. A non-streamed request drains the same events and answers
with ``response``, so the two cannot disagree. Events hold copies of the items as they were when
said (the items go on changing).
"""

from __future__ import annotations

import uuid
from typing import Any, Optional, Union

import msgspec

from engine.entrypoints.openai.http_bodies import ChatCompletionChunk
from engine.entrypoints.openai.responses_bodies import (
    ArgumentsDelta,
    ArgumentsDone,
    ContentPartAdded,
    ContentPartDone,
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    OutputItemAdded,
    OutputItemDone,
    OutputMessage,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    ReasoningItem,
    ReasoningText,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseCompleted,
    ResponseCreated,
    ResponseInProgress,
    ResponseObject,
    ResponseUsage,
)


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseEvents:
    def __init__(self, response: ResponseObject) -> None:
        self.response = response
        self.sequence = 0
        self.current: Union[OutputMessage, FunctionCallItem, ReasoningItem, None] = None
        self.finish_reason: Optional[str] = None

    def _say(self, cls: type, **fields: Any) -> Any:
        event = cls(sequence_number=self.sequence, **fields)
        self.sequence += 1
        return event

    def _snapshot(self) -> ResponseObject:
        return msgspec.structs.replace(self.response, output=list(self.response.output))

    def start(self) -> list:
        self.response.status = "in_progress"
        return [
            self._say(ResponseCreated, response=self._snapshot()),
            self._say(ResponseInProgress, response=self._snapshot()),
        ]

    def feed(self, chunk: ChatCompletionChunk) -> list:
        """The events one chat chunk says (none for the opening role chunk)."""
        events: list = []
        if chunk.usage is not None and not chunk.choices:  # the last chunk: include_usage
            usage = chunk.usage
            self.response.usage = ResponseUsage(
                input_tokens=usage.prompt_tokens,
                output_tokens=usage.completion_tokens,
                total_tokens=usage.prompt_tokens + usage.completion_tokens,
                input_tokens_details=InputTokensDetails(self._cached(usage)),
            )
        for choice in chunk.choices:
            delta = choice.delta
            if delta.reasoning_content:
                events += self._reasoning(delta.reasoning_content)
            if delta.content:
                events += self._text(delta.content)
            for call in delta.tool_calls or ():
                if call.id is not None:  # a call's first delta: its id and whole name
                    events += self._open_call(call.id, call.function.name)
                piece = call.function.arguments if call.function is not None else None
                if piece and isinstance(self.current, FunctionCallItem):
                    self.current.arguments += piece
                    events.append(
                        self._say(ArgumentsDelta, item_id=self.current.id, output_index=self._index(), delta=piece)
                    )
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        return events

    @staticmethod
    def _cached(usage: Any) -> int:
        details = usage.prompt_tokens_details
        return details.cached_tokens if details is not None else 0

    def finish(self) -> list:
        """The closing events: the open item done, then ``response.completed``."""
        events = self._close()
        self.response.status = "completed"
        if self.finish_reason == "length":
            self.response.status = "incomplete"
            self.response.incomplete_details = IncompleteDetails("max_output_tokens")
        return events + [self._say(ResponseCompleted, response=self._snapshot())]

    # ---- items ----

    def _index(self) -> int:
        return len(self.response.output) - 1

    def _text(self, piece: str) -> list:
        events = []
        if not isinstance(self.current, OutputMessage):
            events += self._close()
            self.current = OutputMessage(id=item_id("msg"), status="in_progress", content=[OutputText(text="")])
            self.response.output.append(self.current)
            events.append(
                self._say(
                    OutputItemAdded, output_index=self._index(), item=msgspec.structs.replace(self.current, content=[])
                )
            )
            events.append(
                self._say(
                    ContentPartAdded,
                    item_id=self.current.id,
                    output_index=self._index(),
                    content_index=0,
                    part=OutputText(text=""),
                )
            )
        self.current.content[0].text += piece
        events.append(
            self._say(
                OutputTextDelta, item_id=self.current.id, output_index=self._index(), content_index=0, delta=piece
            )
        )
        return events

    def _reasoning(self, piece: str) -> list:
        events = []
        if not isinstance(self.current, ReasoningItem):
            events += self._close()
            self.current = ReasoningItem(id=item_id("rs"), status="in_progress", content=[ReasoningText(text="")])
            self.response.output.append(self.current)
            events.append(
                self._say(
                    OutputItemAdded, output_index=self._index(), item=msgspec.structs.replace(self.current, content=[])
                )
            )
            events.append(
                self._say(
                    ContentPartAdded,
                    item_id=self.current.id,
                    output_index=self._index(),
                    content_index=0,
                    part=ReasoningText(text=""),
                )
            )
        self.current.content[0].text += piece
        events.append(
            self._say(
                ReasoningTextDelta, item_id=self.current.id, output_index=self._index(), content_index=0, delta=piece
            )
        )
        return events

    def _open_call(self, call_id: str, name: Optional[str]) -> list:
        events = self._close()
        self.current = FunctionCallItem(
            id=item_id("fc"), call_id=call_id, name=name or "", arguments="", status="in_progress"
        )
        self.response.output.append(self.current)
        events.append(
            self._say(OutputItemAdded, output_index=self._index(), item=msgspec.structs.replace(self.current))
        )
        return events

    def _close(self) -> list:
        item, self.current = self.current, None
        if item is None:
            return []
        index = self.response.output.index(item)
        item.status = "incomplete" if self.finish_reason == "length" else "completed"
        if isinstance(item, (OutputMessage, ReasoningItem)):
            part = item.content[0]
            done = OutputTextDone if isinstance(item, OutputMessage) else ReasoningTextDone
            events = [
                self._say(done, item_id=item.id, output_index=index, content_index=0, text=part.text),
                self._say(
                    ContentPartDone,
                    item_id=item.id,
                    output_index=index,
                    content_index=0,
                    part=msgspec.structs.replace(part),
                ),
            ]
        else:
            events = [
                self._say(ArgumentsDone, item_id=item.id, output_index=index, name=item.name, arguments=item.arguments)
            ]
        snapshot = (
            msgspec.structs.replace(item, content=[msgspec.structs.replace(p) for p in item.content])
            if isinstance(item, (OutputMessage, ReasoningItem))
            else msgspec.structs.replace(item)
        )
        return events + [self._say(OutputItemDone, output_index=index, item=snapshot)]
