"""README's "Write an agent in Python" example, pasted as a reader would:
the block is written to my_agent.py and run against the appliance."""

import json

from conftest import ROOT, attempts, spawn, submit
from test_worker import waiting

from agentbay.runs.v1 import runs_pb2
from agentbay.runtime.v1 import runtime_pb2


def readme_block(name: str) -> str:
    text = (ROOT / "README.md").read_text()
    after = text[text.index(f"<!-- readme-test: {name} -->"):]
    body = after.split("```python\n", 1)[1]
    return body.split("\n```", 1)[0]


def test_the_readme_agent_runs_as_pasted(appliance, adapter_cred, operator, tmp_path):
    script = tmp_path / "my_agent.py"
    script.write_text(readme_block("python-agent"))
    run_id = submit(operator, customer="initech", text="the printer is on fire")
    worker = spawn(script, appliance.env(adapter_cred))
    try:
        question = waiting(operator, run_id, "input")
        assert question.pending_decision.summary == "Which support tier is the customer on?"
        operator.runtime.answer_decision(runtime_pb2.AnswerDecisionRequest(
            attempt_id=question.attempt_id, decision_id=question.pending_decision_id, answer_json=json.dumps("gold"),
        ))
        out, _ = worker.communicate(timeout=60)
    finally:
        worker.kill()
    assert worker.returncode == 0, out
    run = operator.runs.get_run(runs_pb2.GetRunRequest(run_id=run_id)).run
    assert run.state == "Succeeded", out
    summary = json.loads(run.output_json)["summary"]
    assert summary.startswith("2 open tickets, tier gold: "), summary
    (attempt,) = attempts(operator, run_id)
    assert (attempt.model_calls, attempt.tool_calls) == (1, 1)
