"""An OpenAI Agents SDK agent on agentbay: a triage agent that looks up
the customer's tickets (a tool that needs approval, calling the site's
ticket service with its fence) and hands off to a reporter that writes
the verdict. With KILL_AFTER_TOOL set, the worker stops dead once the
tool call has completed (the test kills it there): between two steps."""

import json
import logging
import os
import sys
import threading
import urllib.request

from agents import Agent, RunHooks, function_tool

from agentbay import Worker, current_fence
from agentbay.openai_agents import handler

SERVICE = os.environ["TICKETS_URL"]


@function_tool(name_override="lookup-ticket", needs_approval=True)
def lookup_ticket(customer: str) -> str:
    """Recent tickets of a customer."""
    request = urllib.request.Request(
        f"{SERVICE}/tickets", data=json.dumps({"customer": customer}).encode(),
        headers={"Content-Type": "application/json", **current_fence().headers()},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return r.read().decode()


reporter = Agent(name="reporter", instructions="Write the verdict as JSON: severity, summary, paged.")
triage = Agent(
    name="triage",
    instructions="Look up the customer's tickets, then hand off to the reporter.",
    tools=[lookup_ticket],
    handoffs=[reporter],
)


class StopAfterTool(RunHooks):
    async def on_tool_end(self, context, agent, tool, result):
        print("KILL-POINT", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    hooks = StopAfterTool() if os.environ.get("KILL_AFTER_TOOL") else None
    Worker(agent="triage").run(
        handler(triage, side_effect_classes={"lookup-ticket": "read"}, hooks=hooks), max_attempts=1,
    )
    print("WORKER DONE", flush=True)
