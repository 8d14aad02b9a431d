#!/usr/bin/env python3
"""The triage agent written with Pydantic AI, run durably on agentbay.

It runs the triage-external example release (agent `triage`):
`AgentbayAgent` sends the agent's model requests through the site's
routing (the release's scripted model in the demo) and its tool through
the appliance's gate as the release's `lookup-ticket` (a read the agent
declares `requires_approval`: a reviewer approves the call, with its
arguments, in the console's inbox). Kill the worker after the tool call
and another one finishes the run without calling the model or the tool
again.

    pip install --no-index --find-links /usr/share/agentbay/python 'agentbay[pydantic-ai]'
    AGENTBAY_URL=https://127.0.0.1:8443 AGENTBAY_CA=agentbay-data/tls/ca.pem \
    AGENTBAY_CLIENT_ID=demo.... AGENTBAY_CLIENT_SECRET=... \
    python3 triage_agent.py [--once]
"""

import logging
import sys

from pydantic_ai import Agent, Tool

from agentbay import Worker, current_fence
from agentbay.pydantic_ai import AgentbayAgent, handler


def lookup_ticket(customer: str) -> dict:
    """Recent tickets of a customer."""
    # A real tool sends the call's fence to the ticket service, which
    # refuses a fencing token lower than one it has seen for the attempt.
    assert current_fence().headers()["Agentbay-Call-Id"]
    return {"customer": customer, "open": 2, "latest": "checkout slow since 09:10"}


agent = Agent(
    instructions="Look up the customer's recent tickets, then answer with the verdict as JSON: "
                 "severity (low, medium or high), summary, paged.",
    tools=[Tool(lookup_ticket, name="lookup-ticket", requires_approval=True)],
)
durable = AgentbayAgent(agent, side_effect_classes={"lookup-ticket": "read"})


def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    Worker(agent="triage").run(handler(durable), max_attempts=1 if "--once" in sys.argv else None)


if __name__ == "__main__":
    main()
