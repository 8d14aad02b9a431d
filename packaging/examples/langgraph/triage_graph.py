#!/usr/bin/env python3
"""The triage agent as a LangGraph graph, run durably on agentbay.

It runs the triage-external example release (agent `triage`): a model call
through the site's routing (the release's scripted model in the demo), the
tool calls the model asks for through the appliance's gate, and a
reviewer's sign-off as LangGraph's `interrupt()` — an agentbay decision in
the console's inbox, whose answer resumes the graph. Every super-step is a
checkpoint of the attempt: kill the worker between two nodes and another
one resumes from the last checkpoint without calling the model again.

    pip install '/usr/share/agentbay/python/agentbay-*.whl[langgraph]'
    AGENTBAY_URL=https://127.0.0.1:8443 AGENTBAY_CA=agentbay-data/tls/ca.pem \
    AGENTBAY_CLIENT_ID=demo.... AGENTBAY_CLIENT_SECRET=... \
    python3 triage_graph.py [--once]
"""

import json
import logging
import sys

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt

from agentbay.langgraph import ChatAgentbay, agentbay_tools, run_graph


@tool("lookup-ticket")
def lookup_ticket(customer: str) -> dict:
    """Recent tickets of a customer."""
    return {"customer": customer, "open": 2, "latest": "checkout slow since 09:10"}


# Each call of the tool goes through BeginCall / CompleteCall as the
# release's tool of the same name, with its side-effect class.
TOOLS = agentbay_tools([lookup_ticket], {"lookup-ticket": "read"})


class Triage(MessagesState):
    verdict: dict


def plan(state: Triage) -> dict:
    """One model turn: the answer, or the tools it asks for."""
    model = ChatAgentbay().bind_tools(TOOLS)
    return {"messages": [model.invoke(state["messages"])]}


def after_plan(state: Triage) -> str:
    return "tools" if state["messages"][-1].tool_calls else "review"


def review(state: Triage) -> dict:
    """A reviewer confirms the severity before the outcome is reported."""
    verdict = json.loads(state["messages"][-1].content)
    answer = interrupt({
        "question": f"Confirm severity {verdict['severity']}: {verdict['summary']}",
        "options": ["confirm", "escalate"],
        "recommendation": "confirm",
    })
    if answer["choice"] == "escalate":
        verdict["severity"] = "high"
    return {"verdict": verdict}


def build() -> StateGraph:
    g = StateGraph(Triage)
    g.add_node("plan", plan)
    g.add_node("tools", ToolNode(TOOLS))
    g.add_node("review", review)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", after_plan, ["tools", "review"])
    g.add_edge("tools", "plan")
    g.add_edge("review", END)
    return g


def to_messages(ticket: dict) -> dict:
    return {"messages": [
        SystemMessage("Triage the support ticket: look up the customer, then answer with "
                      "JSON {severity, summary, paged}."),
        HumanMessage(json.dumps(ticket)),
    ]}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run_graph(build().compile(), agent="triage", input=to_messages, output=lambda values: values["verdict"],
              max_attempts=1 if "--once" in sys.argv else None)


if __name__ == "__main__":
    main()
