"""Agents written with the OpenAI Agents SDK and Pydantic AI, run durably
on the real appliance: model turns through the site's model server (the
release's profile mapped to it), tools through the gate to a site service
that checks fences, approvals as decisions, a worker killed between two
steps and its attempt finished by another with no model turn or tool call
made twice (counted at the model server and the service)."""

from __future__ import annotations

import json

import pytest
from conftest import TESTS, attempts, kill_at, run_of, sign_in, spawn, submit, wait_for

from agentbay.runs.v1 import runs_pb2


def waiting(operator, run_id: str, kind: str, worker=None):
    def check():
        if worker is not None and worker.poll() is not None:
            raise AssertionError(f"the worker ended: {worker.stdout.read()}")
        for a in attempts(operator, run_id):
            if a.state == "WaitingForDecision" and a.pending_decision.kind == kind:
                return a
        return None

    return wait_for(f"a {kind} decision", check)


def approve(operator, run_id: str, tool: str, arguments: dict, worker) -> None:
    a = waiting(operator, run_id, "approval", worker)
    assert a.pending_decision.proposed_call.target == tool, a.pending_decision
    assert json.loads(a.pending_decision.proposed_call.arguments_json) == arguments
    operator.runs.decide_approval(
        runs_pb2.DecideApprovalRequest(decision_id=a.pending_decision_id, approve=True, reason="looks right")
    )


def finished(operator, run_id: str, worker, site, turns_before: int) -> None:
    out, _ = worker.communicate(timeout=120)
    assert "WORKER DONE" in out, out
    run = wait_for("the run to end", lambda: (r := run_of(operator, run_id)).state in ("Succeeded", "Failed") and r)
    assert run.state == "Succeeded", (run.state, out)
    assert json.loads(run.output_json) == site.VERDICT
    (a,) = attempts(operator, run_id)
    return a, out


@pytest.fixture(scope="module")
def site_env(site_appliance, model_site) -> dict[str, str]:
    """A worker's environment: an adapter credential and the ticket service."""
    cred = site_appliance.client_credential("demo", "factory.runs.execute")
    return {**site_appliance.env(cred), "TICKETS_URL": model_site.url}


@pytest.fixture(scope="module")
def site_operator(site_appliance):
    """A reviewer's credential: reads, submits and decides."""
    return site_appliance.client_credential("demo", "factory.runs.read", "factory.runs.write", "factory.runs.decide")


FRAMEWORKS = [
    pytest.param("openai_agent.py", 3, id="openai-agents"),
    pytest.param("pydantic_agent.py", 2, id="pydantic-ai"),
]


@pytest.mark.parametrize("script,turns", FRAMEWORKS)
def test_an_agent_runs_through_a_tool_an_approval_and_model_turns_to_one_outcome(
    site_appliance, site_env, site_operator, model_site, script, turns
):
    pytest.importorskip("agents" if script.startswith("openai") else "pydantic_ai")
    appliance, env, operator_cred = site_appliance, site_env, site_operator
    with appliance.client(operator_cred) as operator:
        run_id = submit(operator, customer="acme", text="checkout is slow")
        turns_before, tools_before = model_site.completed_turns(), len(model_site.tool_calls)
        worker = spawn(TESTS / "workers" / script, env)
        try:
            # The tool needs approval (the agent says so; the policy allows
            # reads): the reviewer approves this exact call.
            approve(operator, run_id, "lookup-ticket", {"customer": "acme"}, worker)
            a, out = finished(operator, run_id, worker, model_site, turns_before)
        finally:
            worker.kill()
        assert (a.model_calls, a.tool_calls) == (turns, 1), a
        assert model_site.completed_turns() - turns_before == turns
        (call,) = model_site.tool_calls[tools_before:]
        # The service saw the call's fence.
        assert call["attempt"] == a.attempt_id and call["token"] == a.fencing_token and call["call"]
        run = run_of(operator, run_id)
        assert [s.state for s in run.steps] == ["Succeeded"]
        if script.startswith("openai"):
            # The handoff is in the attempt's state, with the agent in charge.
            state = last_state(appliance, operator, a.attempt_id)
            assert state["state"]["openai_agents"] == {
                "agent": "reporter", "handoffs": [{"from": "triage", "to": "reporter"}],
            }, state["state"]


def last_state(appliance, client, attempt_id: str) -> dict:
    """The adapter state of the attempt's last checkpoint (over the REST
    API, as a reader with runs.read)."""
    import ssl
    import urllib.request

    tls = ssl.create_default_context(cafile=appliance.ca)
    headers = {"Authorization": f"Bearer {client.tokens.get()}"}

    def get(path: str) -> bytes:
        return urllib.request.urlopen(urllib.request.Request(f"{appliance.url}{path}", headers=headers),
                                      context=tls).read()

    listed = json.loads(get(f"/runtime/attempts/{attempt_id}/checkpoints"))
    last = max(listed["checkpoints"], key=lambda c: c["sequence"])
    return json.loads(get(f"/runtime/artifacts/{last['adapterStateRef']}"))


@pytest.mark.parametrize("script,turns", FRAMEWORKS)
def test_an_agent_killed_between_two_steps_resumes_on_another_worker_repeating_nothing(
    site_appliance, site_env, site_operator, model_site, script, turns
):
    pytest.importorskip("agents" if script.startswith("openai") else "pydantic_ai")
    appliance, env, operator_cred = site_appliance, site_env, site_operator
    with appliance.client(operator_cred) as operator:
        run_id = submit(operator, customer="acme", text="checkout is slow")
        turns_before, tools_before = model_site.completed_turns(), len(model_site.tool_calls)
        first = spawn(TESTS / "workers" / script, {**env, "KILL_AFTER_TOOL": "1"})
        try:
            approve(operator, run_id, "lookup-ticket", {"customer": "acme"}, first)
        finally:
            kill_at(first)
        (a,) = attempts(operator, run_id)
        assert (a.model_calls, a.tool_calls) == (1, 1), a

        second = spawn(TESTS / "workers" / script, env)
        try:
            appliance.advance(61)  # the killed worker's lease lapses
            a, out = finished(operator, run_id, second, model_site, turns_before)
        finally:
            second.kill()
        # Every model turn and the tool call were made once, across both
        # workers: the second answered the first's from the records.
        assert (a.model_calls, a.tool_calls) == (turns, 1), a
        assert model_site.completed_turns() - turns_before == turns
        assert len(model_site.tool_calls) - tools_before == 1
        assert a.fencing_token == 2


def assembled(pieces) -> dict[str, str]:
    """Each model call's text as a reader puts it together: a superseded
    call's text dropped."""
    calls: dict[str, str] = {}
    for p in pieces:
        if p.kind == "text":
            calls[p.call_id] = calls.get(p.call_id, "") + p.text
        elif p.kind == "superseded":
            calls.pop(p.call_id, None)
    return calls


def test_a_model_turn_streams_as_it_is_written_and_a_reader_resumes_from_an_offset(site_appliance, model_site):
    import threading

    appliance = site_appliance
    cred = appliance.client_credential("demo", "factory.runs.execute")
    reader_cred = appliance.client_credential("demo", "factory.runs.read", "factory.runs.write")
    with appliance.client(reader_cred) as operator:
        run_id = submit(operator, customer="acme", text="tell a story")
        (a,) = wait_for("the attempt", lambda: attempts(operator, run_id))
        # The model server breaks off its first answer in the middle: the
        # appliance records the call failed, the worker asks again.
        model_site.break_after = 30
        first_read: list = []
        follower = threading.Thread(target=lambda: first_read.extend(operator.follow(a.attempt_id, 0)), daemon=True)
        follower.start()
        worker = spawn(TESTS / "workers" / "stream_turn.py", appliance.env(cred))
        out, _ = worker.communicate(timeout=120)
        assert "WORKER DONE" in out, out
        follower.join(timeout=60)
        assert not follower.is_alive(), "the stream did not end with the attempt"
        assert wait_for("the run to succeed", lambda: run_of(operator, run_id).state == "Succeeded")

    said = json.loads(out.split("STREAMED ", 1)[1].splitlines()[0])
    story = model_site.STORY
    # The worker read the turn as it was written: the broken-off try, then
    # a restart, then the whole answer, which is the reply.
    assert said == {"read": story, "reply": story, "restarts": 1}, said

    kinds = [p.kind for p in first_read]
    assert "superseded" in kinds, kinds
    (broken,) = [p for p in first_read if p.kind == "superseded"]
    final = assembled(first_read)
    assert list(final.values()) == [story], final
    (call_id,) = final
    assert broken.call_id != call_id
    # Coalesced: far fewer pieces than the server's 4-character chunks.
    texts = [p for p in first_read if p.kind == "text" and p.call_id == call_id]
    assert 2 <= len(texts) < len(story) / 4 / 3, len(texts)
    assert [p.kind for p in first_read if p.call_id == call_id][-1] == "ended"

    # A reader that lost its connection after some of the answer follows
    # again from the offset after the last piece it had.
    middle = texts[len(texts) // 2 - 1 if len(texts) > 1 else 0]
    had = "".join(p.text for p in texts[: texts.index(middle) + 1])
    with appliance.client(reader_cred) as operator:
        again = list(operator.follow(a.attempt_id, middle.end))
    assert again and again[0].offset == middle.end, again[:2]
    rest = "".join(p.text for p in again if p.kind == "text" and p.call_id == call_id)
    assert had + rest == story

    # The console's attempt page shows each turn's text (the stream's, as
    # it stands), and its text events follow from an offset.
    import html
    import urllib.request

    opener, cookie = sign_in(appliance)
    page = opener.open(urllib.request.Request(f"{appliance.url}/attempts/{a.attempt_id}",
                                              headers={"Cookie": cookie})).read().decode()
    panel = page.split('id="model-text"', 1)[1].split("</section>", 1)[0]
    assert f'<pre class="turn" data-call="{call_id}">{html.escape(story, quote=True)}</pre>' in panel, panel[:2000]
    assert broken.call_id not in panel, "a superseded try is not shown"
    events = opener.open(urllib.request.Request(f"{appliance.url}/attempts/{a.attempt_id}/text?from={middle.end}",
                                                headers={"Cookie": cookie}), timeout=30).read().decode()
    assert events.startswith("event: text\n") or "\nevent: text\n" in events, events[:500]
    pieces = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: {")]
    assert "".join(p["text"] for p in pieces if p["kind"] == "text") == rest
    assert f"id: {len(story.encode()) + broken_len(first_read, broken)}" in events, events[-500:]
    assert events.rstrip().endswith("data: terminal"), events[-200:]


def broken_len(pieces, broken) -> int:
    """Bytes the superseded try took in the stream (before the answer)."""
    return sum(len(p.text.encode()) for p in pieces if p.kind == "text" and p.call_id == broken.call_id)


@pytest.mark.parametrize("example", ["openai_agents", "pydantic_ai"])
def test_the_example_agent_runs_against_the_demo_s_scripted_model(appliance, adapter_cred, operator, example):
    pytest.importorskip("agents" if example == "openai_agents" else "pydantic_ai")
    from conftest import EXAMPLES

    run_id = submit(operator, customer="acme-corp", text="checkout is slow")
    worker = spawn(EXAMPLES / example / "triage_agent.py", appliance.env(adapter_cred), "--once")
    try:
        approve(operator, run_id, "lookup-ticket", {"customer": "acme-corp"}, worker)
        out, _ = worker.communicate(timeout=120)
    finally:
        worker.kill()
    run = wait_for("the run to end", lambda: (r := run_of(operator, run_id)).state in ("Succeeded", "Failed") and r)
    assert run.state == "Succeeded", out
    assert json.loads(run.output_json) == {
        "severity": "medium", "summary": "Checkout latency for one customer; no outage.", "paged": False,
    }
    (a,) = attempts(operator, run_id)
    assert (a.model_calls, a.tool_calls) == (2, 1), a


@pytest.mark.parametrize("framework", ["openai-agents", "pydantic-ai"])
def test_a_framework_s_streamed_run_reads_the_turn_as_it_is_written(site_appliance, model_site, framework):
    pytest.importorskip("agents" if framework == "openai-agents" else "pydantic_ai")
    appliance = site_appliance
    cred = appliance.client_credential("demo", "factory.runs.execute")
    reader = appliance.client_credential("demo", "factory.runs.read", "factory.runs.write")
    with appliance.client(reader) as operator:
        run_id = submit(operator, customer="acme", text="tell a story")
        worker = spawn(TESTS / "workers" / "stream_agents.py", appliance.env(cred), framework)
        out, _ = worker.communicate(timeout=120)
        assert "WORKER DONE" in out, out
        (a,) = wait_for("the attempt to end", lambda: [x for x in attempts(operator, run_id)
                                                        if x.state in ("Succeeded", "Failed")])
        assert a.state == "Succeeded", out
    said = json.loads(out.split("STREAMED ", 1)[1].splitlines()[0])
    assert said["read"] == model_site.STORY and said["final"] == model_site.STORY, said
    assert said["pieces"] >= 2, said  # it came in pieces, not at the end
