"""A handler that runs a small graph with ainvoke on AgentbaySaver (its
async forms: aput, aput_writes, aget_tuple, alist) and reports what the
saver read back."""

import asyncio
import logging
import sys
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from agentbay import Worker
from agentbay.langgraph import AgentbaySaver


class Count(TypedDict):
    n: int


def build(saver):
    g = StateGraph(Count)
    g.add_node("step", lambda s: {"n": s["n"] + 1})
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: END if s["n"] >= 5 else "step", ["step", END])
    return g.compile(checkpointer=saver)


def handler(ctx):
    saver = AgentbaySaver(ctx)
    config = {"configurable": {"thread_id": ctx.step_id}}

    async def main():
        await build(saver).ainvoke({"n": 0}, config, durability="sync")
        latest = await saver.aget_tuple(config)
        listed = [t async for t in saver.alist(config)]
        return latest.checkpoint["channel_values"]["n"], len(listed), listed[0].config == latest.config

    n, listed, newest_first = asyncio.run(main())
    story = " ".join(f"{e['step']}:{'+'.join(e['nodes']) or '-'}:{(e['values'] or {}).get('n', '-')}" for e in saver.story())
    return {"severity": "low", "summary": f"n={n} listed={listed} newest_first={newest_first} story={story}", "paged": False}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    Worker(agent="triage").run(handler, max_attempts=1)
