#!/usr/bin/env python3
"""Measures the Python SDK against the real appliance and prints the figures:

1. checkpoints per second of AgentbaySaver against LangGraph's own
   SqliteSaver, on the same graph (a counter node that loops STEPS times,
   durability="sync": every super-step's checkpoint is on disk before the
   next starts), alternating rounds;
2. the SDK's per-call overhead against a raw HTTP client (http.client with
   keep-alive, Connect JSON) on the same RPCs: Runs/GetRun (a read) and
   Adapter/Checkpoint (a durable write), alternating rounds (goal: <= 10 %);
3. the per-step overhead of each framework integration (the OpenAI Agents
   SDK, Pydantic AI) against the same agent on the bare framework: one
   model server and ticket service (tests/conftest.py's ModelSite) for
   both; on agentbay every model turn goes through CallModel and every
   tool call through the gate, each durable; alternating rounds.

    target/python-test/bin/python packaging/python/bench.py
    AGENTBAY_BIN=target/release/agentbay BENCH_ROUNDS=5 BENCH_CALLS=2000 BENCH_STEPS=300 ...
    BENCH_PARTS=frameworks BENCH_RUNS=10 ...   # the frameworks' rows alone

It starts its own appliance (AGENTBAY_BIN, default the release build) on a
temporary data directory.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tests"))
sys.path.insert(0, str(HERE / "src"))
os.environ.setdefault("AGENTBAY_BIN", str(HERE.parents[1] / "target" / "release" / "agentbay"))

from conftest import Appliance, ModelSite, submit  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from agentbay import Context, Worker  # noqa: E402
from agentbay.adapter.v1 import adapter_pb2  # noqa: E402
from agentbay.langgraph import AgentbaySaver  # noqa: E402
from agentbay.runs.v1 import runs_pb2  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
#: Runs of each agent a framework round makes.
RUNS = int(os.environ.get("BENCH_RUNS", "10"))
CALLS = int(os.environ.get("BENCH_CALLS", "1000"))
STEPS = int(os.environ.get("BENCH_STEPS", "200"))


class Count(TypedDict):
    n: int
    notes: list[str]


def counter_graph() -> StateGraph:
    def step(state: Count) -> dict[str, Any]:
        return {"n": state["n"] + 1, "notes": state["notes"][-4:] + [f"step {state['n'] + 1}"]}

    g = StateGraph(Count)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: END if s["n"] >= STEPS else "step", ["step", END])
    return g


class Counting:
    """Counts a saver's durable writes (put and put_writes)."""

    def __init__(self) -> None:
        self.writes = 0

    def wrap(self, saver: Any) -> Any:
        put, put_writes = saver.put, saver.put_writes

        def counted_put(*a: Any, **k: Any) -> Any:
            self.writes += 1
            return put(*a, **k)

        def counted_put_writes(*a: Any, **k: Any) -> Any:
            self.writes += 1
            return put_writes(*a, **k)

        saver.put, saver.put_writes = counted_put, counted_put_writes
        return saver


def run_graph_with(saver: Any, thread: str) -> tuple[int, float]:
    counting = Counting()
    graph = counter_graph().compile(checkpointer=counting.wrap(saver))
    start = time.perf_counter()
    graph.invoke({"n": 0, "notes": []}, {"configurable": {"thread_id": thread}, "recursion_limit": STEPS * 3},
                 durability="sync")
    return counting.writes, time.perf_counter() - start


def sqlite_round(tmp: Path, i: int) -> float:
    import sqlite3

    conn = sqlite3.connect(tmp / f"lg-{i}.sqlite", check_same_thread=False)
    try:
        writes, seconds = run_graph_with(SqliteSaver(conn), f"t{i}")
    finally:
        conn.close()
    return writes / seconds


def with_attempt(appliance: Appliance, cred: Any, operator: Any, body: Any) -> Any:
    """Runs `body(ctx)` inside a claimed attempt; answers what it returned."""
    submit(operator, customer="bench", text="bench")
    result: dict[str, Any] = {}

    def handler(ctx: Context) -> Any:
        result["value"] = body(ctx)
        return {"severity": "low", "summary": "bench", "paged": False}

    Worker("triage", client=appliance.client(cred)).run(handler, max_attempts=1)
    return result["value"]


def agentbay_round(appliance: Appliance, cred: Any, operator: Any) -> float:
    def body(ctx: Context) -> float:
        writes, seconds = run_graph_with(AgentbaySaver(ctx), ctx.step_id)
        return writes / seconds

    return with_attempt(appliance, cred, operator, body)


class RawConnect:
    """Connect JSON over one keep-alive HTTPS connection, by hand."""

    def __init__(self, appliance: Appliance, token: str) -> None:
        self.host, self.port = "127.0.0.1", appliance.port
        self.tls = ssl.create_default_context(cafile=appliance.ca)
        self.token = token
        self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.tls)

    def call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        self.conn.request("POST", f"/{method}", body=json.dumps(body), headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.token}",
        })
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method}: {r.status} {data[:200]!r}")
        return json.loads(data)


def per_call(fn: Any, n: int) -> float:
    """Mean microseconds per call of `fn` over `n` calls (after a warm-up)."""
    for _ in range(20):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def overhead_rounds(appliance: Appliance, cred: Any, operator: Any, reader: Any) -> dict[str, list[tuple[float, float]]]:
    run_id = submit(operator, customer="bench", text="bench")
    rows: dict[str, list[tuple[float, float]]] = {"Runs/GetRun": [], "Adapter/Checkpoint": []}
    sdk_reader = appliance.client(reader)
    raw_reader = RawConnect(appliance, sdk_reader.tokens.get())
    get_sdk = lambda: sdk_reader.runs.get_run(runs_pb2.GetRunRequest(run_id=run_id))  # noqa: E731
    get_raw = lambda: raw_reader.call("agentbay.runs.v1.Runs/GetRun", {"runId": run_id})  # noqa: E731

    def body(ctx: Context) -> None:
        raw = RawConnect(appliance, ctx._client.tokens.get())
        state = json.dumps({"bench": "x" * 200})
        req = adapter_pb2.CheckpointRequest(attempt_id=ctx.attempt_id, fencing_token=ctx.fencing_token, state_json=state)
        cp_sdk = lambda: ctx._client.adapter.checkpoint(req)  # noqa: E731
        cp_raw = lambda: raw.call("agentbay.adapter.v1.Adapter/Checkpoint", {  # noqa: E731
            "attemptId": ctx.attempt_id, "fencingToken": str(ctx.fencing_token), "stateJson": state})
        for r in range(ROUNDS):
            first, second = (get_sdk, get_raw) if r % 2 == 0 else (get_raw, get_sdk)
            a, b = per_call(first, CALLS), per_call(second, CALLS)
            rows["Runs/GetRun"].append((a, b) if r % 2 == 0 else (b, a))
            first, second = (cp_sdk, cp_raw) if r % 2 == 0 else (cp_raw, cp_sdk)
            a, b = per_call(first, CALLS // 4), per_call(second, CALLS // 4)
            rows["Adapter/Checkpoint"].append((a, b) if r % 2 == 0 else (b, a))

    with_attempt(appliance, cred, operator, body)
    return rows


def lookup(site: ModelSite) -> Any:
    """The agents' tool: the ticket service, with the call's fence when
    agentbay runs it."""
    import urllib.request

    from agentbay import current_fence

    def lookup_ticket(customer: str) -> str:
        """Recent tickets of a customer."""
        try:
            fence = current_fence().headers()
        except RuntimeError:
            fence = {}
        request = urllib.request.Request(f"{site.url}/tickets", data=json.dumps({"customer": customer}).encode(),
                                         headers={"Content-Type": "application/json", **fence})
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.read().decode()

    return lookup_ticket


def framework_agents(site: ModelSite) -> dict[str, tuple[Any, Any, int]]:
    """Each framework's agent: (run it bare, run it in an attempt, steps
    a run makes: model turns and tool calls)."""
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI
    from pydantic_ai import Agent as PAgent
    from pydantic_ai import Tool
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from agentbay import openai_agents
    from agentbay.pydantic_ai import AgentbayAgent

    prompt = '{"customer": "acme", "text": "checkout is slow"}'
    tool = function_tool(lookup(site), name_override="lookup-ticket")
    reporter = Agent(name="reporter", instructions="Write the verdict.")
    triage = Agent(name="triage", instructions="Look up the tickets, then hand off.", tools=[tool], handoffs=[reporter])
    bare_model = OpenAIChatCompletionsModel(model="site-model", openai_client=AsyncOpenAI(base_url=f"{site.url}/v1", api_key="x"))

    def oa_bare() -> Any:
        return Runner.run_sync(triage, prompt, run_config=RunConfig(model=bare_model, tracing_disabled=True))

    def oa_durable(ctx: Context) -> Any:
        return openai_agents.run(triage, prompt, ctx=ctx, side_effect_classes={"lookup-ticket": "read"})

    agent = PAgent(instructions="Look up the tickets, then write the verdict.",
                   tools=[Tool(lookup(site), name="lookup-ticket")])
    provider_model = OpenAIChatModel("site-model", provider=OpenAIProvider(base_url=f"{site.url}/v1", api_key="x"))
    durable = AgentbayAgent(agent, side_effect_classes={"lookup-ticket": "read"})

    def pa_bare() -> Any:
        return agent.run_sync(prompt, model=provider_model)

    def pa_durable(ctx: Context) -> Any:
        return durable.run_sync(prompt)

    return {
        # 3 model turns (the handoff's among them) and a tool call.
        "OpenAI Agents SDK": (oa_bare, oa_durable, 4),
        # 2 model turns and a tool call.
        "Pydantic AI": (pa_bare, pa_durable, 3),
    }


def framework_rounds(tmp: Path) -> None:
    site = ModelSite()
    # The server answers at once, streamed or not: only the agents differ.
    site.pause = 0
    appliance = Appliance(Path(tmp) / "frameworks", env={"AGENTBAY_RUNTIME__NETWORK_ALLOW": f"127.0.0.1:{site.port}"})
    try:
        site.map_profile(appliance)
        cred = appliance.client_credential("demo", "factory.runs.execute")
        op = appliance.client(appliance.client_credential("demo", "factory.runs.read", "factory.runs.write"))
        for name, (bare, durable, steps) in framework_agents(site).items():
            def bare_round() -> float:
                start = time.perf_counter()
                for _ in range(RUNS):
                    bare()
                return (time.perf_counter() - start) / RUNS

            def durable_round() -> float:
                took = []
                for _ in range(RUNS):
                    took.append(with_attempt(appliance, cred, op, lambda ctx: _timed(durable, ctx)))
                return sum(took) / RUNS

            bare(), with_attempt(appliance, cred, op, lambda ctx: durable(ctx))  # warm-up
            rows = []
            for r in range(ROUNDS):
                if r % 2 == 0:
                    ours, theirs = durable_round(), bare_round()
                else:
                    theirs, ours = bare_round(), durable_round()
                rows.append((ours, theirs))
            ours_m = statistics.median(o for o, _ in rows)
            theirs_m = statistics.median(t for _, t in rows)
            print(f"{name}: a run of {steps} steps takes {ours_m * 1e3:,.1f} ms on agentbay, {theirs_m * 1e3:,.1f} ms bare: "
                  f"{(ours_m - theirs_m) / steps * 1e3:+,.2f} ms per step (each durable) [rounds: "
                  + ", ".join(f"{o * 1e3:,.1f}/{t * 1e3:,.1f}" for o, t in rows) + "]", flush=True)
    finally:
        appliance.stop()
        site.close()


def _timed(run: Any, ctx: Context) -> float:
    """How long `run(ctx)` took, from inside the attempt."""
    start = time.perf_counter()
    run(ctx)
    return time.perf_counter() - start


def main() -> None:
    if os.environ.get("BENCH_PARTS") == "frameworks":
        with tempfile.TemporaryDirectory() as tmp:
            framework_rounds(Path(tmp))
        return
    with tempfile.TemporaryDirectory() as tmp:
        appliance = Appliance(Path(tmp) / "appliance")
        try:
            cred = appliance.client_credential("demo", "factory.runs.execute")
            op = appliance.client_credential("demo", "factory.runs.read", "factory.runs.write")
            operator = appliance.client(op)
            print(f"agentbay SDK bench: {os.environ['AGENTBAY_BIN']}, {ROUNDS} rounds, "
                  f"graph of {STEPS} steps, {CALLS} calls a row", flush=True)
            saver_rows: list[tuple[float, float]] = []
            for r in range(ROUNDS):
                if r % 2 == 0:
                    ours = agentbay_round(appliance, cred, operator)
                    theirs = sqlite_round(Path(tmp), r)
                else:
                    theirs = sqlite_round(Path(tmp), r)
                    ours = agentbay_round(appliance, cred, operator)
                saver_rows.append((ours, theirs))
                print(f"  round {r + 1}: AgentbaySaver {ours:,.0f} checkpoints/s, SqliteSaver {theirs:,.0f} checkpoints/s",
                      flush=True)
            ours_m = statistics.median(o for o, _ in saver_rows)
            theirs_m = statistics.median(t for _, t in saver_rows)
            print(f"checkpoints/s (median): AgentbaySaver {ours_m:,.0f} (each a durable checkpoint of the attempt, "
                  f"over HTTPS) vs SqliteSaver {theirs_m:,.0f} (a local file): {ours_m / theirs_m:.2f}x")
            rows = overhead_rounds(appliance, cred, operator, op)
            for method, pairs in rows.items():
                sdk_m = statistics.median(s for s, _ in pairs)
                raw_m = statistics.median(r for _, r in pairs)
                over = (sdk_m / raw_m - 1) * 100
                print(f"{method}: SDK {sdk_m:,.0f} us/call, raw HTTP {raw_m:,.0f} us/call: overhead {over:+.1f} % "
                      f"(goal <= 10 %) [rounds: " + ", ".join(f"{s:,.0f}/{r:,.0f}" for s, r in pairs) + "]")
        finally:
            appliance.stop()
        framework_rounds(Path(tmp))


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    threading.current_thread().name = "bench"
    main()
