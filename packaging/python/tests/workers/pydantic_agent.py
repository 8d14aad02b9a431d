"""A Pydantic AI agent on agentbay: a triage agent that looks up the
customer's tickets (a tool that requires approval, calling the site's
ticket service with its fence) and writes the verdict. With
KILL_AFTER_TOOL set, the worker stops dead once the tool call has
completed (the test kills it there): between two steps."""

import json
import logging
import os
import sys
import threading
import urllib.request

from pydantic_ai import Agent, Tool

from agentbay import Worker, current_fence
from agentbay.pydantic_ai import AgentbayAgent, handler

SERVICE = os.environ["TICKETS_URL"]
STOP = bool(os.environ.get("KILL_AFTER_TOOL"))


def lookup_ticket(customer: str) -> dict:
    """Recent tickets of a customer."""
    request = urllib.request.Request(
        f"{SERVICE}/tickets", data=json.dumps({"customer": customer}).encode(),
        headers={"Content-Type": "application/json", **current_fence().headers()},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


agent = Agent(
    instructions="Look up the customer's tickets, then write the verdict as JSON: severity, summary, paged.",
    tools=[Tool(lookup_ticket, name="lookup-ticket", requires_approval=True)],
)
durable = AgentbayAgent(agent, side_effect_classes={"lookup-ticket": "read"})


class StopAfterTool(logging.Handler):
    """Stops the worker dead once the tool call is recorded (the Worker
    logs each completed call at debug level)."""

    def emit(self, record):
        if record.getMessage().endswith("of lookup-ticket completed"):
            print("KILL-POINT", flush=True)
            threading.Event().wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    if STOP:
        logging.getLogger("agentbay.worker").setLevel(logging.DEBUG)
        logging.getLogger("agentbay.worker").addHandler(StopAfterTool())
    Worker(agent="triage").run(handler(durable), max_attempts=1)
    print("WORKER DONE", flush=True)
