"""Chat templates rendered as untrusted code: in Jinja's sandbox, with a time and a size bound.

Why: a chat template, from a model directory or sent with a request, is a program written by
someone else. Jinja's ``ImmutableSandboxedEnvironment`` keeps it away from Python's internals,
but not from running for ever or growing without end: two nested ``range(100000)`` loops run
10^10 iterations, and a string doubled in a loop passes a gigabyte in thirty steps. A render
runs on one thread and cannot be interrupted from outside, so it bounds itself. Every render
here runs under ``TemplateLimits`` and checks them as it goes:

- each loop iteration (its body, and its ``if`` filter), each call (macros included, so a
  recursion is counted) and each filter or operator spends one step: past ``max_iterations``
  steps, or past ``timeout_s``, the render stops;
- its output, and every string or list that an operator, filter or call builds, is at most
  ``max_chars`` long, checked before ``*``, ``**``, ``+``, ``~``, ``%``, ``join``, ``replace``,
  ``tojson``, ``indent`` and ``expandtabs`` build their result, and after every other filter and
  call;
- an integer passed to a filter or a Python function or method is at most
  ``MAX_INT_ARGUMENT`` (Jinja's own range bound), so ``'x'.ljust(10**10)`` is refused before it
  allocates; integer arithmetic stays under ``MAX_INT_BITS``.

Past a bound the render raises ``TemplateLimitError`` (a ValueError: the server answers 400).
What remains: one filter or method call may build up to its input times ``MAX_INT_ARGUMENT``
characters before its result is refused (a format string of many 5-digit widths), and comparisons
of deeply shared structures are not counted; both stay within the time the sandbox allows
their inputs to be built in.

The environment is transformers' chat-template environment (``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, ``{% generation %}`` blocks; the ``tojson`` filter
without HTML escaping; ``raise_exception``, ``strftime_now``, ``dict`` and a ``namespace`` that
refuses underscore names), so a template renders here exactly as ``apply_chat_template``
renders it (the suite compares the two).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache, wraps
from typing import Any, Callable, Iterable, Optional

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.runtime import Macro
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

# An int argument to a filter or a Python callable: the bound Jinja's sandbox puts on range().
MAX_INT_ARGUMENT = MAX_RANGE
# Integer arithmetic results (``**``, ``*``): far beyond any count a template needs.
MAX_INT_BITS = 4096
# A template's source: compiling costs ~0.2 ms per tag here and is not interruptible, so its
# length is bounded (the longest chat templates on the Hugging Face Hub are ~20-30 KB).
MAX_TEMPLATE_CHARS = 128 << 10
# Steps between two reads of the clock (~1 ms of template code).
_CLOCK_STEPS = 1024
# A width in a format string ("{:>N}", "%Ns", strftime's "%NY") of this many digits or more.
_WIDE_FORMAT = re.compile(r"\d{6,}")


@dataclass(frozen=True)
class TemplateLimits:
    """What one render may spend. ``max_chars`` bounds the output and every value built on the
    way (the input processor sets it from what the context can hold)."""

    timeout_s: float = 5.0
    max_chars: int = 16 << 20
    max_iterations: int = 2_000_000
    max_chars_reason: str = "its bound"  # why max_chars is what it is, for the error message


class ChatTemplateError(ValueError):
    """A chat template did not compile or failed while rendering (the caller's input is at fault)."""


class TemplateLimitError(ChatTemplateError):
    """A chat template ran past one of its ``TemplateLimits``."""


class TemplateRaisedError(ChatTemplateError, jinja2.exceptions.TemplateError):
    """The template refused the messages itself (``raise_exception``): a TemplateError, as in
    transformers, and a ValueError, as every refused input here."""


class _Budget:
    """One render's remaining steps and its deadline (a thread has at most one render)."""

    __slots__ = ("limits", "steps", "deadline", "next_clock")

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        self.steps = limits.max_iterations
        self.deadline = time.monotonic() + limits.timeout_s
        self.next_clock = self.steps  # the clock is read every _CLOCK_STEPS steps, not at each

    def spend(self, steps: int = 1) -> None:
        self.steps -= steps
        if self.steps > self.next_clock:
            return
        if self.steps < 0:
            raise TemplateLimitError(
                f"the chat template ran more than {self.limits.max_iterations} loop iterations and calls (its bound)"
            )
        self.next_clock = max(self.steps - _CLOCK_STEPS, -1)  # and at -1: the step bound
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"the chat template ran longer than {self.limits.timeout_s:g} s (its bound)")

    def check_size(self, size: int, what: str = "a value") -> None:
        if size > self.limits.max_chars:
            raise TemplateLimitError(
                f"the chat template built {what} longer than {self.limits.max_chars} "
                f"characters ({self.limits.max_chars_reason})"
            )


_current = threading.local()


def _budget() -> _Budget:
    budget = getattr(_current, "budget", None)
    if budget is None:  # compile-time constant folding: allowed the defaults
        budget = _Budget(TemplateLimits())
    return budget


def _weight(value: Any, budget: _Budget) -> int:
    """Characters ``str(value)``/``json.dumps`` may write for ``value``, walked one step per
    item, so a structure that shares itself to exponential size is stopped by the budget."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        budget.spend(len(value) + 1)
        return sum(_weight(k, budget) + _weight(v, budget) + 2 for k, v in value.items())
    if isinstance(value, (list, tuple)):
        budget.spend(len(value) + 1)
        return sum(_weight(v, budget) + 2 for v in value)
    return 24


def _check_arguments(args: Iterable[Any], budget: _Budget) -> None:
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > MAX_INT_ARGUMENT:
            raise TemplateLimitError(
                f"the chat template passed {arg if arg.bit_length() < 64 else 'an integer'} "
                f"to a function; at most {MAX_INT_ARGUMENT} is allowed"
            )
        if isinstance(arg, (list, tuple, dict)):
            budget.check_size(_weight(arg, budget), "an argument")


def _check_format(fmt: Any) -> None:
    if isinstance(fmt, str) and _WIDE_FORMAT.search(fmt):
        raise TemplateLimitError("the chat template used a format width or number of 6 digits or more")


def _check_result(value: Any, budget: _Budget) -> Any:
    if isinstance(value, (str, list, tuple, dict)):
        budget.check_size(len(value))
    return value


def _predict(name: str, args: tuple, budget: _Budget) -> None:
    """Refuse a ``join``, ``replace``, ``tojson``, ``indent`` or ``expandtabs`` whose result would
    be too long, before building it (their result grows with input times argument)."""
    strings = [a for a in args if isinstance(a, str)]
    if name == "replace" and len(strings) >= 3:
        text, old, new = strings[:3]
        hits = text.count(old) if old else len(text) + 1
        budget.check_size(len(text) + hits * max(0, len(new) - len(old)))
    elif name == "join":
        items = next((a for a in args if isinstance(a, (list, tuple))), None)
        sep = strings[0] if strings else ""
        if items is not None:
            budget.check_size(_weight(list(items), budget) + len(sep) * len(items))
    elif name == "tojson" and args:
        budget.check_size(2 * _weight(args[0], budget))
    elif name == "indent" and args and isinstance(args[0], str):  # the filter: (text, width=4, ...)
        width = args[1] if len(args) > 1 else 4
        width = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        budget.check_size(len(args[0]) + args[0].count("\n") * max(width, 0))
    elif name == "expandtabs" and isinstance(args[-1], str):  # the method: (tabsize=8, owner)
        tabsize = args[0] if len(args) > 1 and isinstance(args[0], int) else 8
        budget.check_size(len(args[-1]) + args[-1].count("\t") * max(tabsize, 0))


# Filters that never write their input out as text: their list arguments need not be weighed
# (``messages|length`` in a loop stays one step).
_NON_WRITING = frozenset(
    {
        "length",
        "count",
        "first",
        "last",
        "default",
        "d",
        "list",
        "reverse",
        "items",
        "attr",
        "map",
        "select",
        "reject",
        "selectattr",
        "rejectattr",
        "sort",
        "dictsort",
        "unique",
        "min",
        "max",
        "batch",
        "slice",
        "groupby",
        "random",
        "abs",
        "int",
        "float",
        "round",
    }
)


def _bounded_filter(name: str, fn: Callable) -> Callable:
    weighs = name not in _NON_WRITING

    @wraps(fn)  # keeps jinja_pass_arg (context, eval_ctx)
    def filter_(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.spend()
        values = [*args, *kwargs.values()]
        _check_arguments(values if weighs else [v for v in values if isinstance(v, int)], budget)
        if name == "format" and args:
            _check_format(next((a for a in args if isinstance(a, str)), None))
        _predict(name, args, budget)
        return _check_result(fn(*args, **kwargs), budget)

    return filter_


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' tojson: JSON without Jinja's HTML escaping."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    _check_format(fmt)
    return datetime.now().strftime(fmt)


def _range(*args: int) -> range:
    values = range(*args)
    if len(values) > MAX_RANGE:
        raise TemplateLimitError(
            f"the chat template asked for a range of {len(values)} items; at most {MAX_RANGE} are allowed"
        )
    return values


class _Dict:
    """``dict(...)`` for templates, without the class object (and its attributes) itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict:
        return dict.fromkeys(*args)


class _Namespace(jinja2.utils.Namespace):
    """A ``namespace()`` whose attributes never start with ``_`` (CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Namespace's signature: namespace(self=...) works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template cannot set {name!r} on a namespace: names starting with '_' are not allowed"
            )


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Callable[[], str]) -> str:
        return caller()


def _step_call(lineno: int) -> nodes.Call:
    return nodes.Call(nodes.EnvironmentAttribute("spend_step"), [], [], None, None, lineno=lineno)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every loop, call, filter and operator spending the render's budget."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=self._finalize,
            extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
        )
        self.filters["tojson"] = _tojson
        self.filters = {name: _bounded_filter(name, fn) for name, fn in self.filters.items()}
        self.globals.update(
            range=_range,
            raise_exception=_raise_exception,
            strftime_now=_strftime_now,
            dict=_Dict(),
            namespace=_Namespace,
        )

    def _parse(self, source: str, name: Optional[str], filename: Optional[str]) -> nodes.Template:
        """The parsed template, with a step spent at each loop iteration and ``~`` bounded."""
        return _Bounding().visit(super()._parse(source, name, filename))

    @staticmethod
    def spend_step() -> bool:
        _budget().spend()
        return True

    @staticmethod
    def concat(*parts: Any) -> str:
        budget = _budget()
        budget.check_size(sum(_weight(p, budget) for p in parts), "a string")
        return "".join(map(str, parts))

    @staticmethod
    def _finalize(value: Any) -> Any:
        if isinstance(value, (list, tuple, dict)):
            budget = _budget()
            budget.check_size(_weight(value, budget), "an output")
        return value

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's)
        budget = _budget()
        budget.spend()
        if isinstance(__obj, Macro):  # template code: counted step by step
            return super().call(__context, __obj, *args, **kwargs)
        if __obj is not _range:
            _check_arguments([*args, *kwargs.values()], budget)
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            _predict(__obj.__name__, (owner, *args) if __obj.__name__ == "replace" else (*args, owner), budget)
        return _check_result(super().call(__context, __obj, *args, **kwargs), budget)

    def wrap_str_format(self, value: Any) -> Optional[Callable[..., str]]:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            _check_format(value.__self__)
        return wrapped

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.spend()
        ints = isinstance(left, int) and isinstance(right, int)
        if operator == "**" and ints and right > 0:
            if max(abs(left), 2).bit_length() * right > MAX_INT_BITS:
                raise TemplateLimitError(f"the chat template computed an integer over {MAX_INT_BITS} bits")
        elif operator == "*" and ints:
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError(f"the chat template computed an integer over {MAX_INT_BITS} bits")
        elif operator == "*":
            count, seq = (left, right) if isinstance(left, int) else (right, left)
            if isinstance(count, int) and isinstance(seq, (str, list, tuple)):
                budget.check_size(max(count, 0) * _weight(seq, budget))
        elif operator == "+" and isinstance(left, (str, list, tuple)):
            budget.check_size(_weight(left, budget) + _weight(right, budget))
        elif operator == "%" and isinstance(left, str):
            _check_format(left)
            _check_arguments(right if isinstance(right, tuple) else (right,), budget)
        return _check_result(super().call_binop(context, operator, left, right), budget)


class _Bounding(NodeTransformer):
    """Rewrites a parsed template: each loop iteration (and each item its ``if`` looks at) spends
    a step, and each ``~`` goes through ``BoundedEnvironment.concat``, which checks the size."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.body.insert(0, nodes.ExprStmt(_step_call(node.lineno), lineno=node.lineno))
        if node.test is not None:  # items the test filters out never reach the body
            node.test = nodes.And(_step_call(node.lineno), node.test, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute("concat"), node.nodes, [], None, None, lineno=node.lineno)


_ENVIRONMENT = BoundedEnvironment()
_ENVIRONMENT_LOCK = threading.Lock()  # Environment's template cache is not documented thread-safe


@lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled (once per distinct text: a model's template is compiled at its first
    request, a request's template at each distinct one, the last 64 kept). Compiling is not
    counted by a render's budget, so the source's length bounds it instead."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(
            f"the chat template is {len(source)} characters long; at most {MAX_TEMPLATE_CHARS} are allowed"
        )
    try:
        with _ENVIRONMENT_LOCK:
            return _ENVIRONMENT.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(
            f"the chat template is not a valid Jinja template: {e.message} (line {e.lineno})"
        ) from None
    except RecursionError:
        raise ChatTemplateError("the chat template is nested too deeply to compile") from None


def render(source: str, variables: dict[str, Any], limits: TemplateLimits) -> str:
    """``source`` rendered with ``variables`` under ``limits``; a ValueError names what failed."""
    template = compile_template(source)
    budget = _Budget(limits)
    previous, _current.budget = getattr(_current, "budget", None), budget
    parts: list[str] = []
    size = 0
    try:
        for part in template.generate(**variables):
            size += len(part)
            budget.check_size(size, "an output")
            budget.spend()
            parts.append(part)
    except ChatTemplateError:
        raise
    except jinja2.exceptions.SecurityError as e:
        raise ChatTemplateError(f"the chat template did something the sandbox forbids: {e.message}") from None
    except jinja2.exceptions.TemplateError as e:  # raise_exception() and undefined values
        raise TemplateRaisedError(f"the chat template refused these messages: {e.message}") from None
    except RecursionError:
        raise TemplateLimitError("the chat template recursed too deeply") from None
    except MemoryError:
        raise TemplateLimitError("the chat template ran out of memory") from None
    except Exception as e:  # the template's own errors (a bad index, a type mismatch)
        raise ChatTemplateError(f"the chat template failed on these messages: {e}") from None
    finally:
        _current.budget = previous
    return "".join(parts)


# Appended to the final message's text with continue_final_message, then cut off again with
# all that the template wrote after it (the end of turn): transformers' marker.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def render_chat(
    source: str,
    conversation: list[dict],
    *,
    special_tokens: dict[str, str],
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    tools: Optional[list] = None,
    documents: Optional[list] = None,
    variables: Optional[dict[str, Any]] = None,
    limits: TemplateLimits = TemplateLimits(),
) -> str:
    """One conversation as transformers' ``apply_chat_template(tokenize=False)`` renders it, under
    ``limits``. ``variables`` (vLLM's ``chat_template_kwargs``) reach the template after the
    special tokens and override them. ``continue_final_message``: the text ends inside the last
    message, with no end of turn, so the model continues that message."""
    from transformers.utils.chat_template_utils import (
        _alias_reasoning_fields,
        _normalize_chat_messages,
        _plain_template_data,
        get_json_schema,
    )

    if not conversation:
        raise ValueError("messages: the conversation is empty; give at least one message")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    chat = _alias_reasoning_fields(_plain_template_data(_normalize_chat_messages(conversation)))
    final = _mark_final_message(chat, source) if continue_final_message else None
    if tools is not None:
        tools = [tool if isinstance(tool, dict) else get_json_schema(tool) for tool in tools]
    if documents is not None and not all(isinstance(d, dict) for d in documents):
        raise ValueError("documents: each document must be a dict with 'title' and 'text'")
    values = {**special_tokens, **_plain_template_data(variables or {})}
    text = render(
        source,
        {
            **values,
            "messages": chat,
            "tools": _plain_template_data(tools),
            "documents": _plain_template_data(documents),
            "add_generation_prompt": add_generation_prompt,
        },
        limits,
    )
    return text if final is None else _cut_after_final_message(text, final)


def _mark_final_message(chat: list[dict], source: str) -> str:
    """Tags the final message's (last) text; returns that text."""
    last = chat[-1]
    content = last.get("content")
    if "content" not in source:
        raise ValueError("continue_final_message: the chat template never writes a message's 'content'")
    if isinstance(content, str):
        last["content"] = content + _CONTINUE_TAG
        return content
    if isinstance(content, list):
        for block in reversed(content):
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                text = block["text"]
                block["text"] = text + _CONTINUE_TAG
                return text
    raise ValueError("continue_final_message: the final message has no text to continue")


def _cut_after_final_message(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ValueError(
            "continue_final_message: the chat template does not write the final message as given, "
            "so it cannot be continued"
        )
    at = text.rindex(tag)
    # A template that strips the message's trailing space lost the tag's too: strip what it left.
    return text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
