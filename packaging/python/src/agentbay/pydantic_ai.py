"""Pydantic AI agents run durably on agentbay (extra
``agentbay[pydantic-ai]``, pydantic-ai-slim 2.78.0).

:class:`AgentbayAgent` wraps an agent the way Pydantic AI's own durable
integrations do (``TemporalAgent``, ``DBOSAgent``): the agent is written as
usual, and the wrapper moves its model requests and tool calls into the
appliance:

- model requests go through ``Adapter/CallModel`` (:class:`AgentbayModel`):
  the site's routing, model server limits, the release's limits and the
  tenant's token ledger apply; the worker holds no model key;
- tool calls go through the gate as the release's tools of the same name
  (:class:`AgentbayToolset`): closure, input schema, policy, fencing; a
  tool's :func:`~agentbay.worker.current_fence` is its call's fence;
- a tool declared ``requires_approval=True`` (a deferred tool awaiting
  approval) becomes an approval decision bound to its exact arguments: the
  reviewer answers in the inbox, and the run goes on from there instead of
  ending with ``DeferredToolRequests``;
- a tool's ``ModelRetry`` is recorded as the call's result, so a resumed
  run tells the model the same thing without calling the tool again.

Durable resume: a worker killed mid-run leaves its attempt to another
worker, which runs the agent again from the step's input; every model
request and tool call already completed is answered from the attempt's
records, none made (or billed) twice.

    from pydantic_ai import Agent
    from agentbay.pydantic_ai import AgentbayAgent, handler
    from agentbay import Worker

    agent = Agent(instructions="...", tools=[...])
    Worker(agent="triage").run(handler(AgentbayAgent(agent)))
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.agent import WrapperAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.usage import RequestUsage

from ._frameworks import as_output, gated_call, run_to_end
from .worker import RESTART, Context, Failed, current_context

#: A tool's ModelRetry, recorded as the call's result.
_RETRY = "agentbay.modelRetry"


def _chat(messages: Sequence[ModelMessage], instructions: str | None) -> list[dict[str, Any]]:
    """Pydantic AI's messages as an OpenAI chat conversation."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, SystemPromptPart):
                    out.append({"role": "system", "content": part.content})
                elif isinstance(part, UserPromptPart):
                    content = part.content if isinstance(part.content, str) else json.dumps(part.content, default=str)
                    out.append({"role": "user", "content": content})
                elif isinstance(part, ToolReturnPart):
                    out.append({"role": "tool", "tool_call_id": part.tool_call_id, "content": part.model_response_str()})
                elif isinstance(part, RetryPromptPart):
                    if part.tool_name:
                        out.append({"role": "tool", "tool_call_id": part.tool_call_id, "content": part.model_response()})
                    else:
                        out.append({"role": "user", "content": part.model_response()})
        elif isinstance(message, ModelResponse):
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            calls = [
                {"id": p.tool_call_id, "type": "function", "function": {"name": p.tool_name, "arguments": p.args_as_json_str()}}
                for p in message.parts if isinstance(p, ToolCallPart)
            ]
            turn: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
    return out


def _definitions(info: AgentInfo) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                          "parameters": t.parameters_json_schema}}
        for t in [*info.function_tools, *info.output_tools]
    ]


class AgentbayModel(FunctionModel):
    """A Pydantic AI model whose requests are the attempt's ``CallModel``
    calls (the conversation in chat-completions form, the function and
    output tools as function definitions); the site decides which server
    and model answer."""

    def __init__(self, ctx: Context | None = None) -> None:
        self._ctx = ctx
        super().__init__(self._request, stream_function=self._stream, model_name="agentbay")

    def _context(self) -> Context:
        return self._ctx or current_context()

    def _reply(self, messages: list[ModelMessage], info: AgentInfo, stream: bool = False) -> Any:
        definitions = _definitions(info)
        return self._context().model(_chat(messages, info.instructions), definitions or None, stream=stream)

    def _request(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        reply = self._reply(messages, info)
        parts: list[Any] = [TextPart(reply.content)] if reply.content else []
        parts += [ToolCallPart(c.tool, c.arguments, tool_call_id=c.id) for c in reply.tool_calls]
        return ModelResponse(
            parts=parts, model_name=reply.model or "agentbay",
            usage=RequestUsage(input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                               cache_read_tokens=reply.cached_tokens),
        )

    async def _stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        """The request's text as it is written, then its tool calls."""
        stream = await asyncio.to_thread(self._reply, messages, info, True)
        while (piece := await asyncio.to_thread(next, stream, None)) is not None:
            # Text handed on cannot be taken back: a try started over goes
            # on after what was shown (the reply is the answer).
            if piece is not RESTART:
                yield piece
        calls = {
            n: DeltaToolCall(name=c.tool, json_args=json.dumps(c.arguments), tool_call_id=c.id)
            for n, c in enumerate(stream.reply.tool_calls)
        }
        if calls:
            yield calls


@dataclasses.dataclass
class AgentbayToolset(WrapperToolset[Any]):
    """A toolset whose every call goes through the appliance's gate as the
    release's tool of the same name. Tools that need approval are called
    once a reviewer approved the call with these arguments."""

    side_effect_classes: Mapping[str, str] = dataclasses.field(default_factory=dict)

    async def get_tools(self, ctx: Any) -> dict[str, Any]:
        tools = await self.wrapped.get_tools(ctx)
        # A tool awaiting approval is called directly: the gate asks.
        return {
            name: dataclasses.replace(t, tool_def=dataclasses.replace(t.tool_def, kind="function",
                                                                    metadata={**(t.tool_def.metadata or {}), "agentbay.approval": True}))
            if t.tool_def.kind == "unapproved" else t
            for name, t in tools.items()
        }

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        asked = bool((tool.tool_def.metadata or {}).get("agentbay.approval"))

        async def invoke(approved: dict[str, Any]) -> Any:
            run_ctx = dataclasses.replace(ctx, tool_call_approved=True) if asked else ctx
            try:
                return await self.wrapped.call_tool(name, approved, run_ctx, tool)
            except ModelRetry as retry:
                return {_RETRY: retry.message}

        result = await gated_call(
            name, tool_args, invoke, side_effect_class=self.side_effect_classes.get(name), require_approval=asked,
        )
        if isinstance(result, dict) and set(result) == {_RETRY}:
            raise ModelRetry(result[_RETRY])
        return result


class AgentbayAgent(WrapperAgent[Any, Any]):
    """`wrapped`, run inside an agentbay attempt: its model requests
    through ``CallModel``, its tools (those it was built with) through the
    gate. Outside a Worker's handler it cannot run (there is no attempt to
    move through). `side_effect_classes` names each tool's class as the
    release declares it: a write that raises after it was issued ends the
    attempt Uncertain, never tried again."""

    def __init__(self, wrapped: Agent[Any, Any], *, side_effect_classes: Mapping[str, str] | None = None) -> None:
        super().__init__(wrapped)
        classes = dict(side_effect_classes or {})
        self._toolsets = [AgentbayToolset(t, side_effect_classes=classes) for t in wrapped.toolsets]

    @asynccontextmanager
    async def iter(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        with self.wrapped.override(model=AgentbayModel(), toolsets=self._toolsets, tools=[]):
            async with self.wrapped.iter(*args, **kwargs) as run:
                yield run

    def run_sync(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Runs the agent to its end (in the attempt's handler thread)."""
        return run_to_end(self.run(*args, **kwargs))


def handler(
    agent: AgentbayAgent | Agent[Any, Any],
    *,
    input: Callable[[Any], Any] | None = None,
    output: Callable[[Any], Any] | None = None,
) -> Callable[[Context], Any]:
    """The :class:`~agentbay.Worker` handler that runs `agent` (wrapped in
    :class:`AgentbayAgent` when it is not yet) on the step's input. `input`
    maps the step's input to the user prompt (default: the input as JSON
    text); `output` maps the run's output to the attempt's (default: a
    pydantic model as JSON, a JSON object the text holds, else
    ``{"text": ...}``)."""
    durable = agent if isinstance(agent, AgentbayAgent) else AgentbayAgent(agent)

    def handle(ctx: Context) -> Any:
        if ctx.feedback is not None:
            raise Failed("validation", f"the agent's output does not meet the release's contract: {ctx.feedback}")
        given = input(ctx.input) if input else ctx.input
        prompt = given if isinstance(given, str) else json.dumps(given)
        final = durable.run_sync(prompt).output
        return output(final) if output is not None else as_output(final)

    return handle


__all__ = ["AgentbayAgent", "AgentbayModel", "AgentbayToolset", "handler"]
