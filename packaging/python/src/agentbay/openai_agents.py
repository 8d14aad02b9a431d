"""OpenAI Agents SDK agents run durably on agentbay (extra
``agentbay[openai-agents]``, openai-agents 0.25.0).

An agent written with the SDK runs unchanged as an agentbay external
adapter; the integration uses the SDK's own extension points:

- **A model provider** (:class:`AgentbayModelProvider`): every model turn
  goes through ``Adapter/CallModel``, so the site's routing, its model
  servers' limits, the release's limits and the tenant's token ledger
  apply; the worker never holds a model server's address or key.
- **Tool wrappers**: each function tool of the agent (and of every agent it
  hands off to) is called through the appliance's gate as the release's
  tool of the same name (BeginCall / CompleteCall: closure, input schema,
  policy, fencing). A tool marked ``needs_approval`` becomes an approval
  decision bound to its exact arguments; the reviewer answers in the
  console's inbox and the run goes on from there, on whichever worker then
  holds the attempt. While a tool runs, :func:`~agentbay.worker.
  current_fence` is its call's fence (send ``fence.headers()`` to a site
  service).
- **Run hooks**: each handoff is recorded in the attempt's checkpoints
  (``openai_agents.handoffs``) and the agent in charge named.

Durable resume: a worker killed mid-run leaves its attempt to another
worker, which runs the agent again from the step's input; every model turn
and tool call already completed is answered from the attempt's records, so
none is made (or billed) twice.

    from agents import Agent, function_tool
    from agentbay.openai_agents import handler
    from agentbay import Worker

    @function_tool
    def lookup_ticket(customer: str) -> dict: ...

    agent = Agent(name="triage", instructions="...", tools=[lookup_ticket])
    Worker(agent="triage").run(handler(agent))

The SDK's tracing export (to OpenAI's servers) is off in these runs: the
appliance's timeline is the trace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from agents import Agent, FunctionTool, Handoff, ModelProvider, RunConfig, RunHooks, Runner, Usage
from agents.items import ModelResponse
from agents.models.chatcmpl_converter import Converter
from agents.models.fake_id import FAKE_RESPONSES_ID
from agents.models.interface import Model, ModelTracing
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.responses import Response, ResponseCompletedEvent, ResponseTextDeltaEvent, ResponseUsage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from ._frameworks import as_output, gated_call, run_to_end
from .worker import RESTART, Context, Failed, current_context

log = logging.getLogger("agentbay.openai_agents")

class AgentbayModel(Model):
    """A model of the SDK whose turns are the attempt's ``CallModel``
    calls: the conversation in chat-completions form, the tools and
    handoffs as function definitions. The site decides which server and
    model answer (the release names a model profile, not a model)."""

    def __init__(self, ctx: Context | None = None) -> None:
        self._ctx = ctx

    def _context(self) -> Context:
        return self._ctx or current_context()

    def _turn(self, system_instructions: str | None, input: Any, tools: list[Any], handoffs: list[Any],
              on_text: Callable[[str], None] | None) -> ModelResponse:
        messages: list[Any] = list(Converter.items_to_messages(input))
        if system_instructions:
            messages.insert(0, {"role": "system", "content": system_instructions})
        definitions = [Converter.tool_to_openai(t) for t in tools] + [Converter.convert_handoff_tool(h) for h in handoffs]
        ctx = self._context()
        if on_text is None:
            reply = ctx.model(messages, definitions or None)
        else:
            stream = ctx.model(messages, definitions or None, stream=True)
            for piece in stream:
                # Text handed on cannot be taken back: a try started over
                # goes on after what was shown (the reply is the answer).
                if piece is not RESTART:
                    on_text(piece)
            reply = stream.reply
        message = ChatCompletionMessage(
            role="assistant",
            content=reply.content,
            tool_calls=[
                ChatCompletionMessageFunctionToolCall(
                    id=c.id, type="function", function=Function(name=c.tool, arguments=json.dumps(c.arguments)),
                )
                for c in reply.tool_calls
            ] or None,
        )
        output = Converter.message_to_output_items(message, provider_data={"model": reply.model})
        usage = Usage(
            requests=1, input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
            total_tokens=reply.input_tokens + reply.output_tokens,
        )
        return ModelResponse(output=output, usage=usage, response_id=None)

    async def get_response(
        self, system_instructions: str | None, input: Any, model_settings: Any, tools: list[Any],
        output_schema: Any, handoffs: list[Any], tracing: ModelTracing, *, previous_response_id: str | None = None,
        conversation_id: str | None = None, prompt: Any = None,
    ) -> ModelResponse:
        # The attempt's moves are blocking calls; the loop stays free for
        # the agent's other tasks meanwhile.
        return await asyncio.to_thread(self._turn, system_instructions, input, tools, handoffs, None)

    async def stream_response(
        self, system_instructions: str | None, input: Any, model_settings: Any, tools: list[Any],
        output_schema: Any, handoffs: list[Any], tracing: ModelTracing, *, previous_response_id: str | None = None,
        conversation_id: str | None = None, prompt: Any = None,
    ) -> AsyncIterator[Any]:
        """The turn's text as it is written (``Runner.run_streamed``), then
        the whole response."""
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[Any] = asyncio.Queue()

        def on_text(text: str) -> None:
            loop.call_soon_threadsafe(pieces.put_nowait, text)

        turn = asyncio.ensure_future(
            asyncio.to_thread(self._turn, system_instructions, input, tools, handoffs, on_text)
        )
        turn.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, None))
        n = 0
        while (text := await pieces.get()) is not None:
            yield ResponseTextDeltaEvent(
                content_index=0, delta=text, item_id=FAKE_RESPONSES_ID, output_index=0,
                type="response.output_text.delta", sequence_number=n, logprobs=[],
            )
            n += 1
        answered = await turn
        response = Response(
            id=FAKE_RESPONSES_ID, created_at=0, model="agentbay", object="response", output=answered.output,
            tool_choice="auto", tools=[], parallel_tool_calls=False,
            usage=ResponseUsage(
                input_tokens=answered.usage.input_tokens, output_tokens=answered.usage.output_tokens,
                total_tokens=answered.usage.total_tokens,
                input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
                output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
            ),
        )
        yield ResponseCompletedEvent(response=response, type="response.completed", sequence_number=n)


class AgentbayModelProvider(ModelProvider):
    """Every model name the agents use resolves to the attempt's model
    (the release's profile, served as the site routes it)."""

    def __init__(self, ctx: Context | None = None) -> None:
        self._ctx = ctx

    def get_model(self, model_name: str | None) -> Model:
        return AgentbayModel(self._ctx)


def _gated(tool: FunctionTool, side_effect_class: str | None) -> FunctionTool:
    """`tool` called through the gate as the release's tool of its name."""
    original = tool.on_invoke_tool
    needs_approval = tool.needs_approval

    async def on_invoke_tool(tool_context: Any, arguments: str) -> Any:
        args = json.loads(arguments) if arguments else {}
        if callable(needs_approval):
            asked = needs_approval(tool_context, args, getattr(tool_context, "tool_call_id", ""))
            asked = bool(await asked) if inspect.isawaitable(asked) else bool(asked)
        else:
            asked = bool(needs_approval)

        async def invoke(approved: dict[str, Any]) -> Any:
            return await original(tool_context, json.dumps(approved))

        return await gated_call(
            tool.name, args, invoke, side_effect_class=side_effect_class, require_approval=asked,
        )

    # The gate asks for the approval (bound to the call's arguments), so the
    # SDK's own interruption is not used.
    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=False)


def durable(agent: Agent[Any], side_effect_classes: Mapping[str, str] | None = None) -> Agent[Any]:
    """A copy of `agent` (and of every agent it hands off to) whose
    function tools go through the appliance's gate. `side_effect_classes`
    names each tool's class as the release declares it (read,
    workspace-write, shared-write, external, production): a write that
    raises after it was issued ends the attempt Uncertain, never tried
    again."""
    classes = dict(side_effect_classes or {})
    done: dict[int, Agent[Any]] = {}

    def copy(a: Agent[Any]) -> Agent[Any]:
        if id(a) in done:
            return done[id(a)]
        clone = a.clone()
        done[id(a)] = clone
        clone.tools = [_gated(t, classes.get(t.name)) if isinstance(t, FunctionTool) else t for t in a.tools]
        clone.handoffs = [copy(h) if isinstance(h, Agent) else _handing(h) for h in a.handoffs]
        return clone

    def _handing(h: Any) -> Any:
        if not isinstance(h, Handoff):
            return h
        target = h.on_invoke_handoff

        async def on_invoke_handoff(context: Any, arguments: str) -> Any:
            return copy(await target(context, arguments))

        return dataclasses.replace(h, on_invoke_handoff=on_invoke_handoff)

    return copy(agent)


class _Recorder(RunHooks[Any]):
    """Records each handoff in the attempt's state (a checkpoint names the
    agent in charge); a run made again after a crash records none twice.
    The caller's own hooks are called as well."""

    def __init__(self, ctx: Context, hooks: RunHooks[Any] | None) -> None:
        self._ctx = ctx
        self._hooks = hooks or RunHooks()
        self._made = 0

    async def on_llm_start(self, *args: Any) -> None:
        await self._hooks.on_llm_start(*args)

    async def on_llm_end(self, *args: Any) -> None:
        await self._hooks.on_llm_end(*args)

    async def on_agent_start(self, *args: Any) -> None:
        await self._hooks.on_agent_start(*args)

    async def on_agent_end(self, *args: Any) -> None:
        await self._hooks.on_agent_end(*args)

    async def on_tool_start(self, *args: Any) -> None:
        await self._hooks.on_tool_start(*args)

    async def on_tool_end(self, *args: Any) -> None:
        await self._hooks.on_tool_end(*args)

    async def on_handoff(self, context: Any, from_agent: Agent[Any], to_agent: Agent[Any]) -> None:
        await self._hooks.on_handoff(context, from_agent, to_agent)
        self._made += 1
        state = dict(self._ctx.state or {})
        mine = dict(state.get("openai_agents") or {})
        handoffs = list(mine.get("handoffs") or [])
        if len(handoffs) >= self._made:
            return  # recorded by the run this one makes again
        handoffs.append({"from": from_agent.name, "to": to_agent.name})
        state["openai_agents"] = {**mine, "agent": to_agent.name, "handoffs": handoffs}
        await asyncio.to_thread(self._ctx.checkpoint, state, "Planning")


def run(agent: Agent[Any], input: Any, *, ctx: Context | None = None,
        side_effect_classes: Mapping[str, str] | None = None, max_turns: int = 10,
        run_config: RunConfig | None = None, context: Any = None, hooks: RunHooks[Any] | None = None,
        on_text: Callable[[str], None] | None = None) -> Any:
    """Runs `agent` on `input` (a string, or the SDK's input items) inside
    the attempt: the model provider is the attempt's, its tools gated, its
    handoffs recorded (`hooks`, the caller's run hooks, are called too).
    With `on_text` the run is streamed (``Runner.run_streamed``) and each
    piece of the model's text is handed to it as it is written. Answers
    the SDK's run result."""
    ctx = ctx or current_context()
    config = run_config or RunConfig()
    config = dataclasses.replace(config, model_provider=AgentbayModelProvider(ctx), tracing_disabled=True)
    wrapped = durable(agent, side_effect_classes)
    prompt = input if isinstance(input, (str, list)) else json.dumps(input)
    recorder = _Recorder(ctx, hooks)
    if on_text is None:
        return run_to_end(Runner.run(wrapped, prompt, context=context, max_turns=max_turns,
                                     run_config=config, hooks=recorder))

    async def streamed() -> Any:
        result = Runner.run_streamed(wrapped, prompt, context=context, max_turns=max_turns,
                                     run_config=config, hooks=recorder)
        async for event in result.stream_events():
            data = getattr(event, "data", None)
            if event.type == "raw_response_event" and isinstance(data, ResponseTextDeltaEvent):
                on_text(data.delta)
        return result

    return run_to_end(streamed())


def handler(
    agent: Agent[Any],
    *,
    side_effect_classes: Mapping[str, str] | None = None,
    input: Callable[[Any], Any] | None = None,
    output: Callable[[Any], Any] | None = None,
    max_turns: int = 10,
    hooks: RunHooks[Any] | None = None,
) -> Callable[[Context], Any]:
    """The :class:`~agentbay.Worker` handler that runs `agent` on the step's
    input. `input` maps the step's input to the agent's (default: the
    input as JSON text); `output` maps the final output to the attempt's
    (default: a JSON object the final text holds, else ``{"text": ...}``)."""

    def handle(ctx: Context) -> Any:
        if ctx.feedback is not None:
            raise Failed("validation", f"the agent's output does not meet the release's contract: {ctx.feedback}")
        given = input(ctx.input) if input else ctx.input
        result = run(agent, given, ctx=ctx, side_effect_classes=side_effect_classes, max_turns=max_turns,
                     hooks=hooks)
        final = result.final_output
        return output(final) if output is not None else as_output(final)

    return handle


__all__ = ["AgentbayModel", "AgentbayModelProvider", "durable", "handler", "run"]
