"""The clients against the real appliance: an offline install from the
wheels the packages ship, the CA pinned by file or fingerprint, sync and
async calls, refusals as typed exceptions with their facts, a token
renewed after the appliance's signing key changed, and a call that waits
out a restart."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import urllib.request
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT

import agentbay
from agentbay import AsyncClient, Client
from agentbay.capacity.v1 import capacity_pb2
from agentbay.runs.v1 import runs_pb2


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """The wheels the .deb ships (PY_AGENTBAY_WHEELS), else built now."""
    given = os.environ.get("PY_AGENTBAY_WHEELS")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([str(ROOT / "packaging/python/build-wheels.sh"), str(out)], check=True, capture_output=True)
    return out


def test_the_wheel_installs_offline_into_a_fresh_environment_and_calls_the_appliance(appliance, tmp_path, wheels, operator):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing but the venv
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-index", "--find-links", str(wheels), "agentbay"],
        capture_output=True, text=True, env={**clean, "PIP_CONFIG_FILE": os.devnull},
    )
    assert install.returncode == 0, install.stdout + install.stderr
    cred = appliance.client_credential("demo", "factory.runs.read")
    script = (
        "import agentbay, json\n"
        "from agentbay.runs.v1 import runs_pb2\n"
        "c = agentbay.Client.from_env()\n"
        "r = c.runs.list_runs(runs_pb2.ListRunsRequest())\n"
        "print(json.dumps({'runs': len(r.runs), 'file': agentbay.__file__}))\n"
    )
    env = {k: v for k, v in appliance.env(cred).items() if k != "PYTHONPATH"}  # the installed SDK only
    r = subprocess.run([str(py), "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["runs"] >= 1  # the demo's runs
    assert got["file"].startswith(str(venv)), got
    assert (Path(got["file"]).parent / "py.typed").exists()

    # The frameworks' extras install from the same wheels, offline too.
    extras = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-index", "--find-links", str(wheels),
         "agentbay[langgraph,openai-agents,pydantic-ai]"],
        capture_output=True, text=True, env={**clean, "PIP_CONFIG_FILE": os.devnull},
    )
    assert extras.returncode == 0, extras.stdout + extras.stderr
    r = subprocess.run(
        [str(py), "-c", "import agentbay.langgraph, agentbay.openai_agents, agentbay.pydantic_ai, agents, pydantic_ai;"
                        "print(agents.__version__ if hasattr(agents, '__version__') else 'agents')"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr


def test_the_ca_is_pinned_by_its_file_or_the_printed_fingerprint(appliance, adapter_cred):
    by_fingerprint = Client(appliance.url, fingerprint=appliance.fingerprint,
                            client_id=adapter_cred.client_id, client_secret=adapter_cred.client_secret)
    assert by_fingerprint.ca_pem == Path(appliance.ca).read_bytes()
    by_fingerprint.tokens.get()
    wrong = "sha256:" + "0" * 64
    with pytest.raises(agentbay.AgentbayError) as e:
        Client(appliance.url, fingerprint=wrong, client_id=adapter_cred.client_id, client_secret=adapter_cred.client_secret)
    assert e.value.code == "unauthenticated" and "not the pinned" in e.value.message
    with pytest.raises(agentbay.AgentbayError) as e:
        Client(appliance.url, client_id="x", client_secret="y")
    assert "no CA" in e.value.message


def test_refusals_are_typed_and_carry_their_facts(appliance, operator):
    with pytest.raises(agentbay.InvalidArgument) as e:
        operator.runs.get_run(runs_pb2.GetRunRequest(run_id="not-a-uuid"))
    assert e.value.field == "runId"
    assert e.value.field_violations[0].field == "runId"
    assert "UUID" in e.value.field_violations[0].description
    with pytest.raises(agentbay.NotFound):
        operator.runs.get_run(runs_pb2.GetRunRequest(run_id="01a243a3-6d32-724c-897f-cf903cc447c6"))
    # A lease larger than the project's quota allows is denied: the
    # refusal names the quota and the lease.
    admin = appliance.client(appliance.admin)
    tls = ssl.create_default_context(cafile=appliance.ca)
    put = urllib.request.Request(
        f"{appliance.url}/factory/capacity/quotas/project.demo.support", method="PUT",
        data=json.dumps({"cpuPerAttempt": 1}).encode(),
        headers={"Authorization": f"Bearer {admin.tokens.get()}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(put, context=tls) as r:
        assert r.status == 200
    lessee = appliance.client_credential("demo", "factory.capacity.lease")
    with appliance.client(lessee) as c:
        with pytest.raises(agentbay.ResourceExhausted) as e:
            c.capacity.acquire_lease(capacity_pb2.AcquireLeaseRequest(
                project_id="support", holder_kind="sandbox", holder_id="sdk-test", cpu=2, memory_gb=1,
            ))
    assert e.value.limiting_quota, e.value.facts
    assert e.value.lease_id, e.value.facts


def test_the_async_client_makes_the_same_calls(appliance, adapter_cred, operator):
    cred = appliance.client_credential("demo", "factory.runs.read")

    async def main():
        async with AsyncClient(appliance.url, ca=appliance.ca, client_id=cred.client_id,
                               client_secret=cred.client_secret) as c:
            runs = await c.runs.list_runs(runs_pb2.ListRunsRequest())
            with pytest.raises(agentbay.InvalidArgument):
                await c.runs.get_run(runs_pb2.GetRunRequest(run_id="nope"))
            return runs

    runs = asyncio.run(main())
    sync = operator.runs.list_runs(runs_pb2.ListRunsRequest())
    assert {r.run_id for r in runs.runs} == {r.run_id for r in sync.runs}


def test_a_call_waits_out_a_restart_and_a_new_signing_key(appliance):
    cred = appliance.client_credential("demo", "factory.runs.read")
    c = appliance.client(cred, retry_within=120)
    before = c.runs.list_runs(runs_pb2.ListRunsRequest())
    old_token = c.tokens.get()
    appliance.stop()
    # Every token issued before no longer verifies after this.
    appliance.cli("rotate-token-key")
    result: dict = {}

    def read():
        try:
            result["runs"] = c.runs.list_runs(runs_pb2.ListRunsRequest())
        except Exception as e:  # reported below
            result["error"] = e

    t = threading.Thread(target=read)
    t.start()
    t.join(1.0)
    assert t.is_alive(), f"the call gave up while the appliance was down: {result}"
    appliance.start()
    t.join(120)
    assert "error" not in result, result["error"]
    assert len(result["runs"].runs) == len(before.runs)
    assert c.tokens.get() != old_token


def test_a_rate_limited_credential_says_when_to_try_again(appliance):
    """Wrong secrets for one client id: the token endpoint refuses them,
    then limits the name and says when to try again (Retry-After)."""
    cred = appliance.client_credential("demo", "factory.runs.read")
    c = Client(appliance.url, ca=appliance.ca, client_id=cred.client_id, client_secret="wrong")
    seen = []
    for _ in range(30):
        try:
            c.tokens.get()
        except agentbay.Unauthenticated as e:
            seen.append(e)
            continue
        except agentbay.ResourceExhausted as e:
            assert e.retry_after is not None and e.retry_after > 0, e.facts
            assert seen, "refused as unauthenticated before it was limited"
            return
    pytest.fail(f"never rate-limited after {len(seen)} refusals")
