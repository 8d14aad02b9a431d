"""What the framework integrations share: a tool call through the gate
made from a framework's async code, and a framework's run whose
exceptions give back the attempt's own moves (a decision to wait for, a
stop, an interrupt) as they were raised."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from . import errors
from .worker import _Stopping, _Suspended, current_context

T = TypeVar("T")

#: The attempt's moves: they leave a framework's run as they are, whatever
#: the framework wrapped them in.
_MOVES = (_Suspended, _Stopping, errors.Interrupted, errors.Uncertain, errors.Refused)


async def gated_call(
    tool: str,
    args: Mapping[str, Any],
    invoke: Callable[[dict[str, Any]], Awaitable[Any]],
    *,
    side_effect_class: str | None = None,
    require_approval: bool = False,
) -> Any:
    """Calls `tool` through the appliance's gate from async code: the
    attempt's moves block a thread, the tool (``invoke(arguments)``, with
    the arguments the reviewer approved) runs on the caller's loop, with
    its call's fence as :func:`~agentbay.worker.current_fence`."""
    loop = asyncio.get_running_loop()
    ctx = current_context()

    def run(approved: Mapping[str, Any], fence: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(invoke(dict(approved)), loop).result()

    return await asyncio.to_thread(
        ctx.call, tool, dict(args), side_effect_class=side_effect_class, fn=run, require_approval=require_approval,
    )


def _move_in(e: BaseException, seen: set[int] | None = None) -> BaseException | None:
    """The attempt's own move inside an exception a framework raised (as
    its cause or context, or in an exception group, however deep)."""
    seen = set() if seen is None else seen
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, _MOVES):
            return cur
        seen.add(id(cur))
        if isinstance(cur, BaseExceptionGroup):
            for inner in cur.exceptions:
                if (move := _move_in(inner, seen)) is not None:
                    return move
        cur = cur.__cause__ or cur.__context__
    return None


def run_to_end(run: Coroutine[Any, Any, T]) -> T:
    """Runs a framework's async run to its end on a loop of its own."""
    try:
        return asyncio.run(run)
    except Exception as e:
        move = _move_in(e)
        if move is not None and move is not e:
            raise move from None
        raise


def as_output(final: Any) -> Any:
    """A framework's final output as the attempt's: a pydantic model as
    JSON, a JSON object the text holds, else ``{"text": ...}``."""
    if hasattr(final, "model_dump"):
        return final.model_dump(mode="json")
    if isinstance(final, str):
        try:
            parsed = json.loads(final)
        except ValueError:
            parsed = None
        return parsed if isinstance(parsed, dict) else {"text": final}
    return final
