"""LangGraph graphs run durably on agentbay (extra ``agentbay[langgraph]``).

- :class:`AgentbaySaver` is a LangGraph checkpointer whose checkpoints are
  the agentbay attempt's: every ``put`` and ``put_writes`` is a durable
  checkpoint of the attempt, so the graph's state is the attempt's state,
  listed on its checkpoints page, resumed after a crash and re-run from.
- ``interrupt()`` in a node becomes an agentbay decision (the console's
  inbox shows the question with its context); the answer resumes the graph
  with ``Command(resume=...)``, on whichever worker holds the attempt then.
- :func:`agentbay_tools` wraps LangChain tools so that each call goes
  through BeginCall / CompleteCall with its side-effect class (tool
  closure, policy, approvals, fencing), and hands the call's fence to the
  tool: as its ``fence`` argument when it declares one
  (``fence: Annotated[Fence, InjectedToolArg]``, which the model never
  sees), and always as :func:`current_fence` while it runs; a tool that
  reaches a site service sends ``fence.headers()`` with its requests, so
  the service can refuse a stale worker's late call.
- :class:`ChatAgentbay` is a LangChain chat model whose calls go through
  the site's model routing (``Adapter/CallModel``), usage recorded.
- :func:`run_graph` runs a graph as an agentbay agent: a :class:`~agentbay.
  Worker` whose handler invokes the graph on the step's input.

    from agentbay.langgraph import ChatAgentbay, agentbay_tools, run_graph

    run_graph(graph, agent="triage")   # a compiled graph (or its StateGraph)
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.config import get_config
from langgraph.types import Command

from .client import Client
from .worker import Context, Failed, Fence, Worker, current_context, current_fence, record_scope

log = logging.getLogger("agentbay.langgraph")

def _task_scope() -> str:
    """The running task of the graph (its namespace holds its id): a task
    run again after a crash makes the same calls under the same key and is
    answered from their records; another task's identical call is its own."""
    try:
        return str(get_config().get("configurable", {}).get("checkpoint_ns", ""))
    except RuntimeError:  # not inside a graph
        return ""


def _pack(serde: Any, value: Any) -> list[str]:
    kind, data = serde.dumps_typed(value)
    return [kind, base64.b64encode(data).decode()]


def _unpack(serde: Any, packed: Sequence[str]) -> Any:
    return serde.loads_typed((packed[0], base64.b64decode(packed[1])))


def _readable(value: Any) -> Any:
    """A JSON view of channel values for people (the console); the exact
    values travel serialized beside it."""
    try:
        return json.loads(json.dumps(value, default=lambda o: getattr(o, "content", None) or repr(o)))
    except (TypeError, ValueError):
        return repr(value)


class AgentbaySaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer backed by the checkpoints of one agentbay
    attempt (the :class:`~agentbay.Context` it is given).

    The attempt's state document holds, per checkpoint namespace, the
    graph's latest checkpoint (serialized with the saver's serde, beside a
    readable copy of its values) and the pending writes of its tasks. ``put``
    and ``put_writes`` each write one durable checkpoint of the attempt
    before they return; a resumed attempt (another worker after a crash, a
    re-run from one of its checkpoints) starts from that document.
    ``list`` yields the checkpoints of this attempt that this process has
    seen, newest first; every earlier one is on the attempt's checkpoints
    page and ``GET /runtime/attempts/{id}/checkpoints``.
    """

    def __init__(self, ctx: Context, *, serde: Any = None) -> None:
        super().__init__(serde=serde)
        self.ctx = ctx
        #: The graph's nodes and edges (:func:`graph_shape`), kept with
        #: every checkpoint for the console's attempt page.
        self.graph: dict[str, Any] | None = None
        state = ctx.state if isinstance(ctx.state, dict) else {}
        self._doc: dict[str, Any] = dict(state.get("langgraph") or {})
        # checkpoint_ns -> [entries, oldest first] (this process's history)
        self._history: dict[str, list[dict[str, Any]]] = {
            ns: [entry["latest"]] for ns, entry in self._doc.items() if entry.get("latest")
        }

    def _save(self) -> None:
        state = self.ctx.state if isinstance(self.ctx.state, dict) else {}
        doc = {**state, "langgraph": self._doc}
        if self.graph is not None:
            doc["langgraph_graph"] = self.graph
        self.ctx.checkpoint(doc, phase="Checkpointing")

    def _tuple(self, thread_id: str, ns: str, entry: dict[str, Any], writes: list[Any]) -> CheckpointTuple:
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": entry["id"]}}
        parent = (
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": entry["parent"]}}
            if entry.get("parent")
            else None
        )
        return CheckpointTuple(
            config=config,
            checkpoint=_unpack(self.serde, entry["checkpoint"]),
            metadata=_unpack(self.serde, entry["metadata"]),
            parent_config=parent,
            pending_writes=[(w[0], w[1], _unpack(self.serde, w[2])) for w in writes],
        )

    def story(self, checkpoint_ns: str = "") -> list[dict[str, Any]]:
        """The graph's checkpoints this process has seen, oldest first, for
        people: each one's step, the nodes that ran in it and the state's
        values as JSON (also in every checkpoint the attempt keeps, under
        ``langgraph``)."""
        return [
            {"step": e.get("step"), "nodes": e.get("nodes", []), "values": e.get("values")}
            for e in self._history.get(checkpoint_ns, [])
        ]

    def get_tuple(self, config: Any) -> CheckpointTuple | None:
        thread_id = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        wanted = get_checkpoint_id(config)
        entry = self._doc.get(ns)
        if entry is None:
            return None
        latest = entry["latest"]
        if wanted is None or wanted == latest["id"]:
            return self._tuple(thread_id, ns, latest, entry.get("writes", []))
        for old in self._history.get(ns, []):
            if old["id"] == wanted:
                return self._tuple(thread_id, ns, old, old.get("writes", []))
        return None

    def list(
        self,
        config: Any,
        *,
        filter: dict[str, Any] | None = None,
        before: Any = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        thread_id = (config or {}).get("configurable", {}).get("thread_id", self.ctx.step_id)
        namespaces = [config["configurable"].get("checkpoint_ns", "")] if config and "checkpoint_ns" in config.get("configurable", {}) else list(self._history)
        before_id = get_checkpoint_id(before) if before else None
        n = 0
        for ns in namespaces:
            for entry in reversed(self._history.get(ns, [])):
                if before_id is not None and entry["id"] >= before_id:
                    continue
                t = self._tuple(thread_id, ns, entry, entry.get("writes", []))
                if filter and any(t.metadata.get(k) != v for k, v in filter.items()):
                    continue
                yield t
                n += 1
                if limit is not None and n >= limit:
                    return

    def put(self, config: Any, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions) -> Any:
        thread_id = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        # The nodes that ran in the step this checkpoint ends: those whose
        # seen channel versions moved since the previous checkpoint.
        seen = _readable(checkpoint.get("versions_seen", {}))
        seen = seen if isinstance(seen, dict) else {}
        before = ((self._doc.get(ns) or {}).get("latest") or {}).get("seen") or {}
        entry = {
            "id": checkpoint["id"],
            "parent": config["configurable"].get("checkpoint_id"),
            "checkpoint": _pack(self.serde, checkpoint),
            "metadata": _pack(self.serde, get_checkpoint_metadata(config, metadata)),
            "values": _readable(checkpoint.get("channel_values", {})),
            "step": metadata.get("step"),
            "nodes": sorted(n for n, v in seen.items() if n != "__input__" and v != before.get(n)),
            "seen": seen,
            "writes": [],
        }
        with self.ctx._turn:  # put_writes may run on another thread
            self._doc[ns] = {"latest": entry, "writes": entry["writes"]}
            self._history.setdefault(ns, []).append(entry)
            self._save()
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = config["configurable"]["checkpoint_id"]
        with self.ctx._turn:
            entry = self._doc.get(ns)
            if entry is None or entry["latest"]["id"] != checkpoint_id:
                return
            # As LangGraph's own savers: a write is keyed by its task and
            # its index, and the special channels (error, interrupt,
            # resume) keep only their latest value.
            pending = entry["writes"]
            at = {(w[0], w[4]): i for i, w in enumerate(pending)}
            changed = False
            for idx, (channel, value) in enumerate(writes):
                slot = (task_id, WRITES_IDX_MAP.get(channel, idx))
                packed = [task_id, channel, _pack(self.serde, value), task_path, slot[1]]
                if slot in at:
                    if slot[1] >= 0:
                        continue
                    pending[at[slot]] = packed
                else:
                    at[slot] = len(pending)
                    pending.append(packed)
                changed = True
            if changed:
                self._save()

    def delete_thread(self, thread_id: str) -> None:
        """A thread's checkpoints are the attempt's records: they go with
        the appliance's retention, never from here."""

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: Any, *, filter: dict[str, Any] | None = None, before: Any = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        for t in await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit))):
            yield t

    async def aput(self, config: Any, checkpoint: Checkpoint, metadata: CheckpointMetadata, new_versions: ChannelVersions) -> Any:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)


def agentbay_tools(tools: Sequence[BaseTool], side_effect_classes: Mapping[str, str] | None = None) -> list[BaseTool]:
    """LangChain tools whose every call goes through the appliance's gate
    (BeginCall / CompleteCall) as the release's tool of the same name (a
    tool that reaches a site service sends the fence itself: use
    :meth:`~agentbay.Context.call` with ``fn(args, fence)`` for that); `side_effect_classes` names each tool's class
    (read, workspace-write, shared-write, external, production) as the
    release declares it — a write whose effect cannot be confirmed ends the
    attempt Uncertain, never tried again."""
    classes = dict(side_effect_classes or {})
    wrapped: list[BaseTool] = []
    for tool in tools:
        # A `fence` the tool declares as injected (not in the schema the
        # model sees) is given to it on each call.
        takes_fence = "fence" in _fields(tool.get_input_schema()) and "fence" not in _fields(tool.tool_call_schema)

        def invoke(args: dict[str, Any], fence: Fence, _tool: BaseTool = tool, _takes: bool = takes_fence) -> Any:
            return _tool.invoke({**args, "fence": fence} if _takes else args)

        def run(_tool: BaseTool = tool, _invoke: Callable[..., Any] = invoke, **kwargs: Any) -> Any:
            ctx = current_context()
            scope = record_scope.set(_task_scope())
            try:
                return ctx.call(_tool.name, kwargs, side_effect_class=classes.get(_tool.name), fn=_invoke)
            finally:
                record_scope.reset(scope)

        wrapped.append(
            StructuredTool.from_function(
                func=run,
                name=tool.name,
                description=tool.description,
                args_schema=tool.tool_call_schema,
            )
        )
    return wrapped


def _fields(schema: Any) -> set[str]:
    """The argument names of a tool schema (a pydantic model or a JSON
    Schema)."""
    if isinstance(schema, Mapping):
        return set((schema.get("properties") or {}).keys())
    return set(getattr(schema, "model_fields", {}) or {})


class ChatAgentbay(BaseChatModel):
    """A LangChain chat model served through the site's model routing: the
    appliance calls the model server the site maps the release's model
    profile to (or the release's scripted responses) and records the
    usage; the graph never holds the server's address or key. A model turn
    already completed in this attempt is answered from its record, never
    billed twice."""

    tools_json: list[dict[str, Any]] = []

    @property
    def _llm_type(self) -> str:
        return "agentbay"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ChatAgentbay:  # type: ignore[override]
        return ChatAgentbay(tools_json=[convert_to_openai_tool(t) for t in tools])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        ctx = current_context()
        scope = record_scope.set(_task_scope())
        try:
            reply = ctx.model(convert_to_openai_messages(messages), self.tools_json or None)
        finally:
            record_scope.reset(scope)
        message = AIMessage(
            content=reply.content or "",
            tool_calls=[{"id": c.id, "name": c.tool, "args": c.arguments, "type": "tool_call"} for c in reply.tool_calls],
            usage_metadata={
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
                "total_tokens": reply.input_tokens + reply.output_tokens,
                "input_token_details": {"cache_read": reply.cached_tokens},
            },
            response_metadata={"model": reply.model, "served_by": reply.served_by, "call_id": reply.call_id},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def _ask(ctx: Context, value: Any, interrupt_id: str) -> Any:
    """One ``interrupt(value)`` as an agentbay decision; the value the
    graph resumes with. ``{"question", "options"}`` is an escalation (the
    resume value is the choice), ``{"question", "schema"}`` a request for
    input (the answer), anything else a question answered in free text."""
    key = f"interrupt.{interrupt_id}"
    if isinstance(value, Mapping) and value.get("options"):
        answer = ctx.ask_approval(
            str(value.get("question") or value.get("summary") or "the graph asks"),
            options=tuple(str(o) for o in value["options"]),
            recommendation=str(value.get("recommendation") or ""),
            context=_readable(value),
            key=key,
        )
        return {"choice": answer.choice, "status": answer.status, "reason": answer.reason, "by": answer.answered_by}
    if isinstance(value, Mapping) and value.get("schema"):
        return ctx.ask_input(value["schema"], str(value.get("question") or "the graph asks for input"), key=key)
    return ctx.ask_input({"type": "string"}, str(value)[:500], question=str(value), key=key)


def graph_handler(
    graph: Any,
    *,
    input: Callable[[Any], Any] | None = None,
    output: Callable[[dict[str, Any]], Any] | None = None,
) -> Callable[[Context], Any]:
    """The :class:`~agentbay.Worker` handler that runs `graph` (a compiled
    graph, a ``StateGraph`` builder, or a function from a checkpointer to a
    compiled graph: each attempt runs it with an :class:`AgentbaySaver` of
    its own) on the step's input; `input` maps the step's input to the
    graph's, and `output` the final values to the attempt's output
    (default: the values as they are)."""

    def compile_with(saver: AgentbaySaver) -> Any:
        if hasattr(graph, "compile"):  # a StateGraph builder
            return graph.compile(checkpointer=saver)
        if hasattr(graph, "invoke") and hasattr(graph, "copy"):  # a compiled graph
            return graph.copy(update={"checkpointer": saver})
        return graph(saver)

    def handle(ctx: Context) -> Any:
        if ctx.feedback is not None:
            # The graph ran to its end; running it again gives the same
            # output. The validator's words end the attempt.
            raise Failed("validation", f"the graph's output does not meet the release's contract: {ctx.feedback}")
        saver = AgentbaySaver(ctx)
        compiled = compile_with(saver)
        saver.graph = graph_shape(compiled)
        config = {"configurable": {"thread_id": ctx.step_id}, "recursion_limit": 100}
        started = saver.get_tuple(config) is not None
        first_input = input(ctx.input) if input else ctx.input
        command: Any = None if started else first_input
        while True:
            # durability="sync": each checkpoint is durable before the
            # next step starts, so a crash never loses a finished node.
            result = contextvars.copy_context().run(compiled.invoke, command, config, durability="sync")
            snapshot = compiled.get_state(config)
            interrupts = [i for task in snapshot.tasks for i in task.interrupts]
            if not interrupts:
                values = snapshot.values if isinstance(snapshot.values, dict) else result
                return output(values) if output else _readable(values)
            # One question at a time: the answer resumes the graph.
            first = interrupts[0]
            command = Command(resume={first.id: _ask(ctx, first.value, first.id)})

    return handle


def graph_shape(compiled: Any, *, max_nodes: int = 200, max_edges: int = 500) -> dict[str, Any] | None:
    """A compiled graph's nodes and edges as JSON (``{"nodes": [name],
    "edges": [[from, to, conditional]]}``), bounded; None when the graph
    does not say."""
    try:
        g = compiled.get_graph()
    except Exception:  # a graph that cannot draw itself still runs
        return None
    return {
        "nodes": [str(n) for n in list(g.nodes)[:max_nodes]],
        "edges": [[str(e.source), str(e.target), bool(e.conditional)] for e in list(g.edges)[:max_edges]],
    }


def run_graph(
    graph: Any,
    *,
    agent: str,
    client: Client | None = None,
    input: Callable[[Any], Any] | None = None,
    output: Callable[[dict[str, Any]], Any] | None = None,
    concurrency: int = 1,
    max_attempts: int | None = None,
) -> Worker:
    """Runs `graph` as agentbay agent `agent` until SIGTERM (see
    :func:`graph_handler`); answers the worker once it stopped."""
    worker = Worker(agent, client=client, concurrency=concurrency)
    worker.run(graph_handler(graph, input=input, output=output), max_attempts=max_attempts)
    return worker
