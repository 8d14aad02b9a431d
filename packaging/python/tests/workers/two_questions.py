"""A graph whose one node asks two questions in turn (two interrupt()s)
and reports both answers."""

import logging
import sys
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from agentbay.langgraph import run_graph


class State(TypedDict, total=False):
    customer: str
    verdict: dict


def ask(state: State) -> dict:
    first = interrupt({"question": "First question?", "schema": {"type": "string"}})
    second = interrupt({"question": "Second question?", "schema": {"type": "string"}})
    return {"verdict": {"severity": "low", "summary": f"{first}/{second}", "paged": False}}


def build():
    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g.compile()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    run_graph(build(), agent="triage", input=lambda ticket: {"customer": ticket["customer"]},
              output=lambda values: values["verdict"], max_attempts=1)
