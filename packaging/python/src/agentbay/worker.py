"""An external adapter in a few lines: a :class:`Worker` claims the
attempts of one agent and runs a handler for each, and the handler's
:class:`Context` makes every move through the appliance, so that fencing,
the tool closure, policy and approvals, checkpoints, limits and exactly one
outcome hold without the handler doing anything for them.

    from agentbay import Worker

    def triage(ctx):
        state = ctx.state or {}
        if "tickets" not in state:
            state["tickets"] = ctx.call("lookup-ticket", {"customer": "acme"},
                                        side_effect_class="read", fn=lookup)
            ctx.checkpoint(state)
        return {"severity": "low", "summary": "...", "paged": False}

    Worker(agent="triage").run(triage)

A handler is written to resume: it starts again from ``ctx.state`` (the
state of the attempt's last checkpoint) whenever the attempt comes back to
a worker — after a crash of the worker that held it (on any worker), after a
human answered a question (the worker was free meanwhile), or in a re-run
from a checkpoint. Calls whose effect was confirmed are not made again:
:meth:`Context.call` and :meth:`Context.model` answer a repeated call of
the same target and arguments from the checkpointed record.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from . import errors
from .adapter.v1 import adapter_pb2 as pb
from .client import Client

log = logging.getLogger("agentbay.worker")

STATE_FORMAT = "agentbay-python/1"
# The adapter version and checkpoint format this SDK's handlers are, as a
# release names them (`"adapter": {"kind": "external", "version": "1"}`).
ADAPTER_VERSION = "external/1"
WRITE_CLASSES = frozenset({"shared-write", "external", "production"})
SAFE_CLASSES = frozenset({"read", "workspace-write"})


class Failed(Exception):
    """Raised by a handler to end its attempt Failed with a class (one of
    validation, infrastructure, transient, policy, budget, agent) and a
    reason. Infrastructure and transient failures get a new attempt, up to
    the release's maxAttempts; agent failures only when the release's
    contract says retryAgentFailures. Any other exception a handler raises
    is reported as an agent failure with its type, message and traceback."""

    CLASSES = ("validation", "infrastructure", "transient", "policy", "budget", "agent")

    def __init__(self, failure_class: str, reason: str) -> None:
        if failure_class not in self.CLASSES:
            raise ValueError(f"failure class {failure_class!r} is not one of {', '.join(self.CLASSES)}")
        super().__init__(f"{failure_class}: {reason}")
        self.failure_class = failure_class
        self.reason = reason


class _Suspended(Exception):
    """The attempt waits for a human: the handler stops, the worker is
    free, and the answer resumes it."""

    def __init__(self, decision_id: str) -> None:
        super().__init__(decision_id)
        self.decision_id = decision_id


class _Stopping(Exception):
    """The worker stops (SIGTERM): the handler stops at its next call and
    the attempt is handed back (its lease lapses and another worker resumes
    it from its last checkpoint)."""


@dataclass(frozen=True)
class Fence:
    """What a started call carries to the server that serves it: a server
    that has seen a higher fencing token for the attempt refuses it."""

    attempt_id: str
    fencing_token: int
    call_id: str
    policy_decision_id: str = ""

    def headers(self) -> dict[str, str]:
        h = {
            "Agentbay-Attempt-Id": self.attempt_id,
            "Agentbay-Fencing-Token": str(self.fencing_token),
            "Agentbay-Call-Id": self.call_id,
        }
        if self.policy_decision_id:
            h["Agentbay-Policy-Decision-Id"] = self.policy_decision_id
        return h


@dataclass(frozen=True)
class ToolCall:
    """A tool call a model asked for."""

    id: str
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ModelReply:
    """A model's answer, with the usage the appliance recorded."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    input_tokens: int
    output_tokens: int
    model: str
    served_by: str
    call_id: str
    replayed: bool = False
    cached_tokens: int = 0

    def message(self) -> dict[str, Any]:
        """The answer as an OpenAI assistant message, for the conversation."""
        m: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            m["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.tool, "arguments": json.dumps(c.arguments)},
                }
                for c in self.tool_calls
            ]
        return m


@dataclass(frozen=True)
class Answer:
    """A human's decision: ``status`` is approved, rejected, answered,
    expired or cancelled; ``choice`` the option chosen, ``value`` the
    answer's JSON."""

    status: str
    choice: str
    value: Any
    reason: str
    answered_by: str
    # An approval given with changed arguments: the arguments approved.
    arguments: Any = None
    # A rejection that responds: the reviewer's reason is their answer.
    responded: bool = False

    @property
    def approved(self) -> bool:
        return self.status in ("approved", "answered")


#: A prefix of the record keys of the calls made under it: a graph's task,
#: so that a later node's identical call is a call of its own (set by
#: :mod:`agentbay.langgraph`).
record_scope: contextvars.ContextVar[str] = contextvars.ContextVar("agentbay_record_scope", default="")

_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar("agentbay_context", default=None)
_fence: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("agentbay_fence", default=None)


def current_context() -> Context:
    """The attempt whose handler is running (set by the :class:`Worker`
    around each handler call): what a framework's model, tools and
    questions (LangGraph, the OpenAI Agents SDK, Pydantic AI) move
    through."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("not inside an agentbay attempt: run the agent from a Worker's handler")
    return ctx


def current_fence() -> Fence:
    """The fence of the tool call under way, inside a tool that
    :meth:`Context.call` runs (directly, or wrapped by a framework
    integration): send ``current_fence().headers()`` with each request to a
    site service, which refuses a fencing token lower than one it has seen
    for the attempt."""
    fence = _fence.get()
    if fence is None:
        raise RuntimeError("no tool call under way: the tool is not one agentbay runs")
    return fence


def _one_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def move(self: Context, *args: Any, **kwargs: Any) -> Any:
        with self._turn:
            return method(self, *args, **kwargs)

    return move


def _key(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _doc(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


class _Hold:
    """One attempt this worker holds: its fence, and a heartbeat thread
    that keeps the attempt lease and notices interrupts."""

    def __init__(self, client: Client, attempt_id: str, token: int, every: float) -> None:
        self.client = client
        self.attempt_id = attempt_id
        self.token = token
        self.interrupt: str | None = None
        self.lost: str | None = None
        self.every = every
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{attempt_id[:8]}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._done.wait(self.every):
            try:
                s = self.client.adapter.heartbeat(
                    pb.HeartbeatRequest(attempt_id=self.attempt_id, fencing_token=self.token)
                )
                if s.interrupt_requested:
                    self.interrupt = s.interrupt_reason or "interrupted"
            except errors.Aborted as e:
                self.lost = e.message
                return
            except Exception as e:  # the next beat tries again
                log.warning("heartbeat of attempt %s: %s", self.attempt_id, e)

    def release(self) -> None:
        self._done.set()


#: What a :class:`TextStream` yields when the model server failed in the
#: middle of the answer and the turn is asked again: discard the text of
#: this turn so far.
RESTART = object()


class TextStream:
    """A model turn's answer as the model writes it: iterate for its text
    (``str`` pieces, and :data:`RESTART` when the server failed mid-answer
    and the turn starts over), then read :attr:`reply` (the whole
    :class:`ModelReply`, recorded like :meth:`Context.model`'s). The turn
    runs on a thread of its own, holding the attempt's turn, so the pieces
    may be read from any thread."""

    _END = object()

    def __init__(self, ctx: Context | None, key: str, request: Any) -> None:
        self._pieces: queue.Queue[Any] = queue.Queue()
        self._reply: ModelReply | None = None
        self._error: BaseException | None = None
        if ctx is None:
            return
        run = contextvars.copy_context()
        threading.Thread(target=run.run, args=(self._drive, ctx, key, request), daemon=True).start()

    @classmethod
    def whole(cls, reply: ModelReply) -> TextStream:
        """A turn already answered (from the records): its text at once."""
        s = cls(None, "", None)
        s._reply = reply
        if reply.content:
            s._pieces.put(reply.content)
        s._pieces.put(cls._END)
        return s

    def _drive(self, ctx: Context, key: str, request: Any) -> None:
        def on_text(piece: Any) -> None:
            if piece.kind == "text":
                self._pieces.put(piece.text)
            elif piece.kind == "superseded":
                self._pieces.put(RESTART)

        try:
            with ctx._turn:
                self._reply = ctx._model_turn(key, request, on_text)
        except BaseException as e:  # handed to the reader
            self._error = e
        self._pieces.put(self._END)

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> Any:
        piece = self._pieces.get()
        if piece is self._END:
            self._pieces.put(self._END)  # later reads end too
            if self._error is not None:
                raise self._error
            raise StopIteration
        return piece

    @property
    def reply(self) -> ModelReply:
        """The whole answer (reads the rest of the text first)."""
        for _ in self:
            pass
        assert self._reply is not None
        return self._reply


class Context:
    """A handler's view of its attempt and the moves it makes. Every
    method raises :class:`~agentbay.errors.Interrupted` once the attempt
    was interrupted or cancelled (or its fence went stale)."""

    def __init__(self, worker: Worker, ticket: pb.AttemptTicket, hold: _Hold, doc: dict[str, Any]) -> None:
        self._worker = worker
        self._client = worker.client
        self._hold = hold
        self.ticket = ticket
        self.attempt_id: str = ticket.attempt_id
        self.run_id: str = ticket.run_id
        self.step_id: str = ticket.step_id
        self.release_id: str = ticket.release_id
        self.input: Any = json.loads(ticket.input_json) if ticket.input_json else None
        self.resumed: bool = ticket.resumed or bool(doc.get("state") is not None)
        self.state: Any = doc.get("state")
        #: Set when the output failed verification: what the validator said.
        self.feedback: str | None = None
        # What this attempt's calls and questions came to. A document that
        # another attempt wrote (a re-run starts from its source's
        # checkpoint) brings none: a re-run makes its calls anew, and the
        # appliance answers the effects its source confirmed (REPLAYED).
        own = doc.get("attempt") in (None, ticket.attempt_id)
        self._records: dict[str, Any] = dict(doc.get("records") or {}) if own else {}
        self._seen: dict[str, int] = {}
        # One move at a time: the appliance keeps at most one call of an
        # attempt open, and the records travel with every checkpoint.
        # Parallel branches of a graph (a node's tool calls) take turns.
        self._turn = threading.RLock()

    # -- the fence -------------------------------------------------------

    @property
    def fencing_token(self) -> int:
        return self._hold.token

    def _ids(self) -> dict[str, Any]:
        self._check()
        return {"attempt_id": self.attempt_id, "fencing_token": self._hold.token}

    def _check(self) -> None:
        if self._worker._stopping.is_set():
            raise _Stopping()
        if self._hold.lost is not None:
            raise errors.Interrupted(f"the attempt is no longer this worker's: {self._hold.lost}")
        if self._hold.interrupt is not None:
            raise errors.Interrupted(self._hold.interrupt)

    def _rpc(self, fn: Callable[..., Any], request: Any) -> Any:
        try:
            return fn(request)
        except errors.Aborted as e:
            raise errors.Interrupted(e.message) from e

    def _document(self, state: Any) -> str:
        return _doc({"format": STATE_FORMAT, "attempt": self.attempt_id, "state": state, "records": self._records})

    def _occurrence(self, base: str) -> str:
        """The record key of the n-th identical call in this run of the
        handler: the same call made twice is two calls."""
        base = f"{record_scope.get()}/{base}"
        n = self._seen.get(base, 0)
        self._seen[base] = n + 1
        return f"{base}.{n}"

    # -- moves -----------------------------------------------------------

    @_one_at_a_time
    def checkpoint(self, state: Any, phase: str = "") -> int:
        """Makes `state` (any JSON value) the point this attempt resumes
        from; answers the checkpoint's sequence."""
        self.state = state
        r = self._rpc(
            self._client.adapter.checkpoint,
            pb.CheckpointRequest(**self._ids(), state_json=self._document(state), phase=phase),
        )
        return int(r.sequence)

    @_one_at_a_time
    def call(
        self,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        side_effect_class: str | None = None,
        fn: Callable[..., Any] | None = None,
        receipt: Mapping[str, Any] | None = None,
        require_approval: bool = False,
    ) -> Any:
        """Calls a tool of the release through the appliance's gate:
        BeginCall (closure, input schema, policy; an approval when the
        policy wants one), then ``fn(args, fence)`` (or the worker's tool of
        that name), then CompleteCall with its result. A tool that raises
        is recorded as a failed call and the exception propagates — unless
        its side-effect class is shared-write or above (or not given): then
        its effect is unknown, the call stays open, and :class:`~agentbay.
        errors.Uncertain` is raised; the appliance settles the attempt
        Uncertain and nothing tries the call again. ``require_approval``
        asks a reviewer to approve this call (with these arguments) even
        when the release's policy allows it."""
        args = dict(args or {})
        impl = fn or self._worker.tools.get(tool)
        if impl is None:
            raise ValueError(f"no implementation for tool {tool!r}: pass fn= or Worker(tools=...)")
        key = self._occurrence(_key("tool", tool, args))
        done = self._records.get(key)
        if done is not None and "result" in done:
            return done["result"]
        begun, args = self._begin("tool", tool, args, key, require_approval=require_approval)
        if begun.outcome == pb.REPLAYED:
            result = json.loads(begun.result_json) if begun.result_json else None
            self._records[key] = {"result": result}
            return result
        fence = Fence(self.attempt_id, begun.fencing_token or self._hold.token, begun.call_id, begun.policy_decision_id)
        started = time.monotonic()
        published = _fence.set(fence)
        try:
            result = impl(args, fence)
        except Exception as e:
            cls = side_effect_class or "unknown"
            if cls not in SAFE_CLASSES:
                raise errors.Uncertain(
                    begun.call_id,
                    f"tool {tool} ({cls}) raised {e!r} after it was issued: its effect cannot be confirmed",
                ) from e
            self._rpc(
                self._client.adapter.complete_call,
                pb.CompleteCallRequest(
                    **self._ids(), call_id=begun.call_id, ok=False, error=f"{type(e).__name__}: {e}"[:2000],
                    receipt_json=_doc({"tool": tool, "durationMs": int((time.monotonic() - started) * 1000)}),
                    state_json=self._document(self.state),
                ),
            )
            raise
        finally:
            _fence.reset(published)
        self._records[key] = {"result": result}
        self._rpc(
            self._client.adapter.complete_call,
            pb.CompleteCallRequest(
                **self._ids(), call_id=begun.call_id, ok=True, result_json=_doc(result),
                receipt_json=_doc(dict(receipt) if receipt else {"tool": tool, "durationMs": int((time.monotonic() - started) * 1000)}),
                state_json=self._document(self.state),
            ),
        )
        log.debug("attempt %s: call %s of %s completed", self.attempt_id, begun.call_id, tool)
        return result

    def _begin(
        self, kind: str, target: str, request: Any, key: str, *, require_approval: bool = False,
    ) -> tuple[pb.BeginCallResponse, Any]:
        """BeginCall; an approval the policy asks for suspends the attempt
        and, once decided, is used for exactly this call — with the
        arguments the reviewer approved, when they changed them. Returns
        the call begun and the request it carries."""
        pending = self._records.get(key) or {}
        approval_id = ""
        if "decisionId" in pending:
            answer = self._decision(pending["decisionId"])
            if answer.status == "pending":
                raise _Suspended(pending["decisionId"])
            if answer.status != "approved":
                self._records[key] = {"refused": answer.status}
                if answer.responded:
                    # The reviewer answered instead of approving: the call
                    # is not made; a handler may catch this and go on.
                    raise errors.Refused(target, f"declined by {answer.answered_by}, who answered: {answer.reason}")
                raise errors.Refused(target, f"{answer.status} by {answer.answered_by or 'nobody'}: {answer.reason}")
            approval_id = pending["approvalId"]
            if answer.arguments is not None:
                log.info("attempt %s: %s approved with arguments changed by %s", self.attempt_id, target, answer.answered_by)
                request = answer.arguments
        delay = 0.5
        while True:
            try:
                begun = self._rpc(
                    self._client.adapter.begin_call,
                    pb.BeginCallRequest(
                        **self._ids(), kind=kind, target=target, request_json=_doc(request),
                        approval_id=approval_id, state_json=self._document(self.state),
                        require_approval=require_approval,
                    ),
                )
                break
            except errors.Unavailable as e:
                # The appliance said not now (the attempt is paused, or
                # waits for capacity again after a long decision): nothing
                # was issued; ask again until it may call or is stopped.
                if e.local:
                    raise
                log.info("attempt %s waits before %s: %s", self.attempt_id, target, e.message)
                self._worker._stopping.wait(delay)
                delay = min(delay * 2, 10.0)
        if begun.outcome == pb.REFUSED:
            raise errors.Refused(target, begun.reason)
        if begun.outcome == pb.APPROVAL_REQUIRED:
            self._records[key] = {"decisionId": begun.decision_id, "approvalId": begun.approval_id}
            self.checkpoint(self.state)
            raise _Suspended(begun.decision_id)
        return begun, request

    def _decision(self, decision_id: str, wait: int = 0) -> Answer:
        d = self._rpc(
            self._client.adapter.await_decision,
            pb.AwaitDecisionRequest(**self._ids(), decision_id=decision_id, wait_seconds=wait),
        )
        return Answer(
            status=d.status or "pending",
            choice=d.choice,
            value=json.loads(d.answer_json) if d.answer_json else None,
            reason=d.reason,
            answered_by=d.answered_by,
            arguments=json.loads(d.approved_arguments_json) if d.approved_arguments_json else None,
            responded=d.responded,
        )

    def _ask(
        self, kind: str, question: Any, summary: str, options: list[str], recommendation: str, key: str | None,
        schema: Mapping[str, Any] | None = None,
    ) -> Answer:
        rkey = self._occurrence(key or _key("ask", kind, question, summary, options))
        pending = self._records.get(rkey) or {}
        if "answer" in pending:
            return Answer(**pending["answer"])
        if "decisionId" in pending:
            answer = self._decision(pending["decisionId"])
            if answer.status == "pending":
                raise _Suspended(pending["decisionId"])
            self._records[rkey] = {"decisionId": pending["decisionId"], "answer": answer.__dict__}
            self.checkpoint(self.state)
            return answer
        r = self._rpc(
            self._client.adapter.request_decision,
            pb.RequestDecisionRequest(
                **self._ids(), kind=kind, question_json=_doc(question), summary=summary,
                options=options, recommendation=recommendation,
                answer_schema_json=_doc(dict(schema)) if schema is not None else "",
            ),
        )
        self._records[rkey] = {"decisionId": r.decision_id}
        self.checkpoint(self.state)
        raise _Suspended(r.decision_id)

    @_one_at_a_time
    def ask_input(self, schema: Mapping[str, Any], summary: str, *, question: str = "", key: str | None = None) -> Any:
        """Asks a human for input matching the JSON `schema`. The attempt
        waits (the console's inbox shows the question); the worker is free
        meanwhile, and the answer resumes the handler, which gets it here."""
        # The question as text and the schema apart, as the builtin loop
        # asks: the inbox shows the text and answers with the schema's form.
        # (The record key keeps the shape earlier versions asked in, so an
        # attempt resumed by this version finds its question.)
        text = question or summary
        key = key or _key("ask", "input", {"question": text, "schema": dict(schema)}, summary, [])
        answer = self._ask("input", text, summary, [], "", key, schema=schema)
        if answer.status != "answered":
            raise errors.Refused("input", f"the question was {answer.status}: {answer.reason}")
        return answer.value

    @_one_at_a_time
    def ask_approval(self, summary: str, *, options: tuple[str, ...] = ("approve", "reject"),
                     recommendation: str = "", context: Any = None, key: str | None = None) -> Answer:
        """Asks a human to choose among `options` (an escalation). The
        attempt waits; the answer resumes the handler, which gets it here."""
        return self._ask("escalation", {"question": summary, "context": context}, summary,
                         list(options), recommendation, key)

    def model(
        self,
        messages: list[Mapping[str, Any]],
        tools: list[Mapping[str, Any]] | None = None,
        *,
        context_tokens: int = 0,
        stream: bool = False,
    ) -> Any:
        """A chat completion through the site's routing (``Adapter/
        CallModel``): the appliance checks the limits, calls the model
        server the site maps the release's profile to, and records the
        usage. A model turn already completed (same conversation) is
        answered from the checkpoint, never billed twice.

        With ``stream=True`` it answers a :class:`TextStream` at once:
        iterate it for the answer's text as the model writes it
        (``Adapter/StreamModel``), then read its ``reply``."""
        with self._turn:
            key = self._occurrence(_key("model", messages, tools))
            done = self._records.get(key)
            if done is not None:
                reply = ModelReply(**{**done, "tool_calls": tuple(ToolCall(**c) for c in done["tool_calls"]), "replayed": True})
                return TextStream.whole(reply) if stream else reply
            request = pb.CallModelRequest(
                **self._ids(), messages_json=_doc(list(messages)),
                tools_json=_doc(list(tools)) if tools else "", context_tokens=context_tokens,
                state_json=self._document(self.state),
            )
            if not stream:
                return self._model_turn(key, request, None)
        return TextStream(self, key, request)

    def _model_turn(self, key: str, request: pb.CallModelRequest,
                    on_text: Callable[[Any], None] | None) -> ModelReply:
        """One model turn (CallModel, or StreamModel handing each piece of
        text to `on_text`), recorded and checkpointed."""
        tries = 0
        while True:
            tries += 1
            try:
                if on_text is None:
                    r = self._rpc(self._client.adapter.call_model, request)
                else:
                    r = None
                    try:
                        for update in self._client.adapter.stream_model(request):
                            if update.HasField("text"):
                                on_text(update.text)
                            elif update.HasField("reply"):
                                r = update.reply
                    except errors.Aborted as e:
                        raise errors.Interrupted(e.message) from e
                    if r is None:
                        # The stream broke before the answer: whether the
                        # turn was made (and billed) is not known here.
                        lost = errors.Unavailable("unavailable", "the model stream ended without an answer")
                        lost.local = True
                        raise lost
                break
            except errors.Unavailable as e:
                # The appliance recorded the model server's failure: worth
                # another call. A lost answer (local) is not: the turn may
                # have been billed.
                if e.local or tries >= 3:
                    raise
                time.sleep(0.5 * tries)
        if r.outcome == pb.REFUSED:
            raise errors.Refused("model", r.reason)
        calls = tuple(ToolCall(c["id"], c["tool"], c.get("arguments") or {}) for c in json.loads(r.tool_calls_json or "[]"))
        reply = ModelReply(
            content=r.content or None, tool_calls=calls, input_tokens=r.input_tokens,
            output_tokens=r.output_tokens, model=r.model, served_by=r.served_by, call_id=r.call_id,
            replayed=r.outcome == pb.REPLAYED, cached_tokens=r.cached_tokens,
        )
        self._records[key] = {k: v for k, v in reply.__dict__.items() if k != "replayed"} | {
            "tool_calls": [c.__dict__ for c in calls]
        }
        # The answer is durable before the handler goes on: a crash after
        # this never bills the turn again.
        self.checkpoint(self.state)
        return reply

    @_one_at_a_time
    def model_call(
        self,
        messages: list[Mapping[str, Any]],
        call: Callable[[Fence], Any],
        *,
        context_tokens: int = 0,
    ) -> Any:
        """A model call the adapter makes itself, to a server it reaches:
        BeginCall (the attempt's limits, ``maxTotalTokens`` and the
        ``tokensPerDay`` quota are checked before it is made), then
        ``call(fence)``, then CompleteCall with the tokens its answer
        reports (:func:`usage_of`: an OpenAI chat completion, or the chunks
        of a streamed one, whose final chunk carries the usage) and the
        time it took. Answers what ``call`` returned. A turn already
        completed (same conversation) is answered from the checkpoint."""
        key = self._occurrence(_key("own-model", messages))
        done = self._records.get(key)
        if done is not None and "result" in done:
            return done["result"]
        profile = self.ticket.model_profile_id
        begun = self._begin_model(profile, list(messages), key, context_tokens)
        if begun.outcome == pb.REPLAYED:
            result = json.loads(begun.result_json) if begun.result_json else None
            self._records[key] = {"result": result}
            return result
        fence = Fence(self.attempt_id, begun.fencing_token or self._hold.token, begun.call_id, begun.policy_decision_id)
        started = time.monotonic()
        try:
            answer = call(fence)
        except Exception as e:
            self._rpc(
                self._client.adapter.complete_call,
                pb.CompleteCallRequest(
                    **self._ids(), call_id=begun.call_id, ok=False, error=f"{type(e).__name__}: {e}"[:2000],
                    state_json=self._document(self.state),
                    latency_ms=int((time.monotonic() - started) * 1000),
                ),
            )
            raise
        latency_ms = int((time.monotonic() - started) * 1000)
        if not isinstance(answer, (dict, list, str, int, float, bool, type(None))):
            answer = _plain(answer)
        input_tokens, output_tokens, cached_tokens = usage_of(answer)
        self._records[key] = {"result": answer}
        self._rpc(
            self._client.adapter.complete_call,
            pb.CompleteCallRequest(
                **self._ids(), call_id=begun.call_id, ok=True, result_json=_doc(answer),
                receipt_json=_doc({"schema": "model-invocation-v1", "inputTokens": input_tokens,
                                   "outputTokens": output_tokens, "cachedTokens": cached_tokens,
                                   "latencyMs": latency_ms, "servedBy": "the adapter's own model client"}),
                state_json=self._document(self.state),
                usage=pb.ModelUsage(input_tokens=input_tokens, output_tokens=output_tokens, cached_tokens=cached_tokens),
                latency_ms=latency_ms,
            ),
        )
        return answer

    def _begin_model(self, profile: str, messages: list[Any], key: str, context_tokens: int) -> pb.BeginCallResponse:
        r = self._rpc(
            self._client.adapter.begin_call,
            pb.BeginCallRequest(
                **self._ids(), kind="model", target=profile, request_json=_doc({"messages": messages}),
                context_tokens=context_tokens, state_json=self._document(self.state),
            ),
        )
        if r.outcome == pb.REFUSED:
            self._records[key] = {"refused": r.reason}
            raise errors.Refused("model", r.reason)
        return r

    @_one_at_a_time
    def delegate(self, release_id: str, input: Any, *, wait_seconds: int = 30) -> Any:
        """Runs a sub-agent (a child run of `release_id` on `input`) and
        answers its output; a child that failed raises :class:`~agentbay.
        errors.Refused`."""
        key = self._occurrence(_key("delegate", release_id, input))
        done = self._records.get(key)
        if done is not None and "result" in done:
            return done["result"]
        call_id = (done or {}).get("callId")
        if call_id is None:
            begun, _ = self._begin("sub-agent", release_id, input, key)
            call_id = begun.call_id
            self._records[key] = {"callId": call_id}
            self.checkpoint(self.state)  # a resume waits for this child, never starts another
        while True:
            r = self._rpc(
                self._client.adapter.await_call,
                pb.AwaitCallRequest(**self._ids(), call_id=call_id, wait_seconds=wait_seconds),
            )
            if r.status == "completed":
                result = json.loads(r.result_json) if r.result_json else None
                self._records[key] = {"callId": call_id, "result": result}
                return result
            if r.status in ("failed", "abandoned", "uncertain"):
                raise errors.Refused(release_id, f"the sub-agent run {r.status}: {r.error}")


Handler = Callable[[Context], Any]


@dataclass
class _Job:
    ticket: pb.AttemptTicket
    hold: _Hold
    doc: dict[str, Any] = field(default_factory=dict)
    fresh: bool = True
    suspended: bool = False


class Worker:
    """Claims the attempts of `agent` and runs a handler for each, up to
    `concurrency` at once.

    ``client`` defaults to :meth:`Client.from_env`; ``tools`` maps tool ids
    to ``fn(args, fence)`` for :meth:`Context.call`; ``session`` names this
    process in the attempts' timelines (default host:pid)."""

    def __init__(
        self,
        agent: str,
        *,
        client: Client | None = None,
        concurrency: int = 1,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        session: str | None = None,
        wait_seconds: int = 30,
        heartbeat_seconds: float | None = None,
        stop_grace: float = 30.0,
        adapter_version: str = ADAPTER_VERSION,
        checkpoint_format: int = 1,
    ) -> None:
        self.agent = agent
        self.stop_grace = stop_grace
        #: What this worker's handler is: checked against the release and,
        #: resuming, the last checkpoint (StartAttempt refuses a mismatch).
        self.adapter_version = adapter_version
        self.checkpoint_format = checkpoint_format
        self._own_client = client is None
        self.client = client or Client.from_env()
        self.concurrency = max(1, concurrency)
        self.tools = dict(tools or {})
        self.session = session or f"{socket.gethostname()}:{os.getpid()}"
        self.wait_seconds = wait_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self._stopping = threading.Event()
        self._jobs: queue.Queue[_Job] = queue.Queue()
        # Attempts queued or running here. The claimer claims only below
        # `concurrency`; an answered question resumes its attempt at once
        # (it may go over for a while: it was this worker's already).
        self._load = 0
        # Attempts claimed here and not ended (a suspended one too).
        self._owned: set[str] = set()
        self._lock = threading.Condition()
        #: Attempts that reached an outcome in this process.
        self.finished: list[tuple[str, str]] = []
        #: Attempts handed back as the worker stopped.
        self.handed_back = 0

    # -- control ---------------------------------------------------------

    def stop(self) -> None:
        """Stops claiming; handlers stop at their next call and hand their
        attempts back (another worker resumes them from their last
        checkpoint once their lease lapses)."""
        self._stopping.set()

    def run(self, handler: Handler, *, max_attempts: int | None = None) -> None:
        """Runs until :meth:`stop` (or SIGTERM / SIGINT in the main
        thread), or until `max_attempts` attempts reached an outcome."""
        _visible(log)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        log.info(
            "worker for agent %s: claiming up to %d attempt%s at once from %s%s", self.agent, self.concurrency,
            "" if self.concurrency == 1 else "s", self.client.url,
            f", {max_attempts} in all" if max_attempts is not None else "",
        )
        runners = [
            threading.Thread(target=self._runner, args=(handler, max_attempts), name=f"agentbay-runner-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for t in runners:
            t.start()
        # The long poll runs beside the main thread, so that a signal is
        # seen at once: a claim that answers after the stop is not started
        # (its lease lapses and another worker takes it).
        claimer = threading.Thread(target=self._claim, args=(max_attempts,), name="agentbay-claimer", daemon=True)
        claimer.start()
        try:
            while not self._stopping.wait(0.5):
                if max_attempts is not None and len(self.finished) >= max_attempts:
                    self.stop()
        finally:
            self.stop()
            # Handlers stop at their next move; one busy in its own code
            # gets `stop_grace` seconds, then the process goes and its
            # attempt's lease lapses as any other's.
            deadline = time.monotonic() + self.stop_grace
            for t in runners:
                t.join(max(0.0, deadline - time.monotonic()))
            with self._lock:
                ended, held = len(self.finished), self.handed_back + len(self._owned)
            log.info(
                "worker for agent %s stops: %d attempt%s reached an outcome here%s", self.agent, ended,
                "" if ended == 1 else "s",
                f"; {held} handed back, resumed by another worker from their last checkpoint" if held else "",
            )
            if self._own_client and not any(t.is_alive() for t in runners):
                self.client.close()

    def _claim(self, max_attempts: int | None) -> None:
        while not self._stopping.is_set():
            with self._lock:
                # Bounded by max_attempts: no more claims than attempts
                # still to finish, counting those it holds or waits for.
                needed = max_attempts is None or len(self.finished) + len(self._owned) < max_attempts
                if self._load >= self.concurrency or not needed:
                    self._lock.wait(0.5)
                    continue
            # A worker bounded by max_attempts polls in short waits, so that
            # it claims nothing more once its last attempt ended.
            wait = self.wait_seconds if max_attempts is None else min(self.wait_seconds, 1)
            try:
                got = self.client.adapter.claim_attempt(
                    pb.ClaimAttemptRequest(agent_id=self.agent, session=self.session, wait_seconds=wait)
                )
            except Exception as e:  # the appliance is away longer than retry_within
                log.warning("claim: %s", e)
                self._stopping.wait(2)
                continue
            if not got.HasField("attempt"):
                continue
            t = got.attempt
            if self._stopping.is_set():
                # Answered after the stop: not started. Its lease lapses and
                # the appliance settles it and starts the step again.
                log.warning("attempt %s was claimed as the worker stopped; it is not started", t.attempt_id)
                continue
            with self._lock:
                self._owned.add(t.attempt_id)
            log.info(
                "claimed attempt %s of run %s (release %s)%s", t.attempt_id, t.run_id, t.release_id,
                f", resuming from checkpoint {t.checkpoint_sequence}" if t.resumed else "",
            )
            self._enqueue(_Job(t, _Hold(self.client, t.attempt_id, t.fencing_token, self._every(t))))

    def _every(self, t: pb.AttemptTicket) -> float:
        if self.heartbeat_seconds:
            return self.heartbeat_seconds
        try:
            expires = datetime.fromisoformat(t.lease_expires_at.replace("Z", "+00:00"))
            left = (expires - datetime.now(timezone.utc)).total_seconds()
            return max(1.0, min(left / 3, 20.0))
        except ValueError:
            return 10.0

    # -- attempts --------------------------------------------------------

    def _runner(self, handler: Handler, max_attempts: int | None) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=0.5)
            except queue.Empty:
                if self._stopping.is_set():
                    return
                continue
            try:
                self._attempt(handler, job)
            except Exception:
                log.exception("attempt %s", job.ticket.attempt_id)
            finally:
                with self._lock:
                    self._load -= 1
                    self._lock.notify_all()

    def _enqueue(self, job: _Job) -> None:
        with self._lock:
            self._load += 1
        self._jobs.put(job)

    def _attempt(self, handler: Handler, job: _Job) -> None:
        t, hold = job.ticket, job.hold
        try:
            if job.fresh:
                self.client.adapter.start_attempt(
                    pb.StartAttemptRequest(
                        attempt_id=t.attempt_id, fencing_token=t.fencing_token,
                        adapter_version=self.adapter_version,
                        checkpoint_format=self.checkpoint_format,
                    )
                )
                job.doc = _parse_state(t.state_json)
            ctx = Context(self, t, hold, job.doc)
            self._drive(handler, ctx, job)
        except _Stopping:
            with self._lock:
                self.handed_back += 1
            log.info("attempt %s handed back (stopping)", t.attempt_id)
        except errors.Interrupted as e:
            log.info("attempt %s stopped: %s", t.attempt_id, e.reason)
        except errors.Uncertain as e:
            log.error("attempt %s: %s; it stays open for an operator to settle", t.attempt_id, e)
        except errors.Aborted as e:
            log.info("attempt %s is no longer this worker's: %s", t.attempt_id, e.message)
        except Exception as e:
            # The worker's own moves failed (StartAttempt refused, a report
            # refused, the appliance gone for longer than retry_within):
            # report what is known; the attempt's lease is given up either way.
            log.exception("attempt %s", t.attempt_id)
            try:
                self.client.adapter.report_outcome(pb.ReportOutcomeRequest(
                    attempt_id=t.attempt_id, fencing_token=hold.token, succeeded=False,
                    failure_class="infrastructure", reason=f"the worker failed: {type(e).__name__}: {e}"[:2000],
                ))
            except Exception as report_error:
                log.warning("attempt %s: its failure could not be reported: %s", t.attempt_id, report_error)
        finally:
            # A suspended attempt has a new hold once answered.
            hold.release()
            if not job.suspended:
                self._disown(t.attempt_id)

    def _disown(self, attempt_id: str) -> None:
        with self._lock:
            self._owned.discard(attempt_id)
            self._lock.notify_all()

    def _drive(self, handler: Handler, ctx: Context, job: _Job) -> None:
        hold = job.hold
        while True:
            try:
                output = _as_current(ctx, handler)
            except _Suspended as s:
                # The worker is free while a human decides; the answer
                # resumes the attempt here (or, if this process is gone by
                # then, on another worker once the lease lapses).
                log.info("attempt %s waits for decision %s; the worker is free meanwhile", ctx.attempt_id, s.decision_id)
                hold.release()
                job.doc = {"attempt": ctx.attempt_id, "state": ctx.state, "records": ctx._records}
                threading.Thread(target=self._await, args=(job, s.decision_id), daemon=True).start()
                job.suspended = True
                return
            except (errors.Interrupted, errors.Uncertain, _Stopping, errors.Aborted):
                raise
            except Failed as f:
                self._report(ctx, succeeded=False, failure_class=f.failure_class, reason=f.reason)
                hold.release()
                return
            except errors.Refused as e:
                self._report(ctx, succeeded=False, failure_class="policy", reason=str(e))
                hold.release()
                return
            except Exception as e:
                # A bug in the agent's code: the appliance keeps its type,
                # message and traceback, and does not retry it as if the
                # machine had failed.
                log.exception("handler of attempt %s raised", ctx.attempt_id)
                self._report(
                    ctx, succeeded=False, failure_class="agent",
                    reason=f"the agent's handler raised {type(e).__name__}: {e}",
                    error=e,
                )
                hold.release()
                return
            r = self._report(ctx, succeeded=True, output=output)
            if r is not None and r.verdict == pb.CORRECT:
                ctx.feedback = r.feedback
                ctx._seen.clear()
                continue
            hold.release()
            return

    def _report(
        self, ctx: Context, *, succeeded: bool, output: Any = None, failure_class: str = "", reason: str = "",
        error: BaseException | None = None,
    ) -> pb.ReportOutcomeResponse | None:
        detail = {}
        if error is not None:
            trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            detail = {
                "error_type": type(error).__qualname__[:200],
                "error_message": str(error)[:2000],
                # The appliance keeps the last 64 KiB: where the error is.
                "traceback": trace[-64 * 1024:],
            }
        r = ctx._rpc(
            self.client.adapter.report_outcome,
            pb.ReportOutcomeRequest(
                **ctx._ids(), succeeded=succeeded, output_json=_doc(output) if succeeded else "",
                failure_class=failure_class, reason=reason[:2000], **detail,
            ),
        )
        if r.verdict != pb.CORRECT:
            with self._lock:
                self.finished.append((ctx.attempt_id, r.state))
            log.info(
                "attempt %s reported %s: %s -> %s", ctx.attempt_id,
                "its output" if succeeded else f"a failure ({failure_class}: {reason[:200]})",
                pb.Verdict.Name(r.verdict), r.state,
            )
        return r

    def _await(self, job: _Job, decision_id: str) -> None:
        t = job.ticket
        while not self._stopping.is_set():
            try:
                d = self.client.adapter.await_decision(
                    pb.AwaitDecisionRequest(attempt_id=t.attempt_id, fencing_token=job.hold.token,
                                            decision_id=decision_id, wait_seconds=self.wait_seconds)
                )
            except errors.Aborted:
                self._disown(t.attempt_id)
                return  # resumed elsewhere, or ended
            except errors.AgentbayError as e:
                log.warning("waiting for decision %s: %s", decision_id, e)
                self._stopping.wait(2)
                continue
            if d.status and d.status != "pending":
                log.info(
                    "attempt %s: decision %s %s%s", t.attempt_id, decision_id, d.status,
                    f" by {d.answered_by}" if d.answered_by else "",
                )
                if d.attempt_state not in ("Running", "Claimed", "WaitingForDecision", "Paused", ""):
                    self._disown(t.attempt_id)
                    return  # the answer ended the attempt
                hold = _Hold(self.client, t.attempt_id, job.hold.token, job.hold.every)
                log.info("attempt %s resumes with the answer", t.attempt_id)
                self._enqueue(_Job(t, hold, job.doc, fresh=False))
                return


def _as_current(ctx: Context, handler: Handler) -> Any:
    token = _current.set(ctx)
    try:
        return handler(ctx)
    finally:
        _current.reset(token)


def _visible(logger: logging.Logger) -> None:
    """Makes the worker's lines visible when the program configured no
    logging at all (Python shows only warnings then): one line each, on
    stderr. A program that configures logging decides for itself."""
    if logging.getLogger().handlers or logging.getLogger("agentbay").handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("agentbay")
    root.addHandler(handler)
    if root.level == logging.NOTSET:
        root.setLevel(logging.INFO)


def _parse_state(text: str) -> dict[str, Any]:
    """The SDK's checkpoint document, or a foreign adapter's state as is."""
    if not text:
        return {}
    value = json.loads(text)
    if isinstance(value, dict) and value.get("format") == STATE_FORMAT:
        return value
    return {"state": value}


def _plain(value: Any) -> Any:
    """An SDK object (an OpenAI ``ChatCompletion``, a chunk) as plain JSON
    values: its ``model_dump()``, else its ``dict()``."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, (list, tuple)) or hasattr(value, "__iter__") and not isinstance(value, Mapping):
        return [_plain(v) for v in value]
    if hasattr(value, "__dict__"):
        return dict(value.__dict__)
    return value


def usage_of(answer: Any) -> tuple[int, int, int]:
    """Prompt, completion and cached tokens an OpenAI-compatible answer
    reports: a chat completion's ``usage``; for a streamed answer (a list
    of chunks) the last chunk that carries one (ask for it with
    ``stream_options={"include_usage": True}``); a LangChain message's
    ``usage_metadata``. Nothing reported: zeros."""
    answer = _plain(answer)
    if isinstance(answer, list):
        found = (0, 0, 0)
        for chunk in answer:
            got = usage_of(chunk)
            if got != (0, 0, 0):
                found = got
        return found
    if not isinstance(answer, Mapping):
        return (0, 0, 0)
    usage = answer.get("usage")
    if isinstance(usage, Mapping):
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else 0
        return (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), int(cached or 0))
    meta = answer.get("usage_metadata")
    if isinstance(meta, Mapping):
        details = meta.get("input_token_details") or {}
        cached = details.get("cache_read") if isinstance(details, Mapping) else 0
        return (int(meta.get("input_tokens") or 0), int(meta.get("output_tokens") or 0), int(cached or 0))
    return (0, 0, 0)

