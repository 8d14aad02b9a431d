#!/usr/bin/env python3
"""Runs one builtin attempt whose release has an MCP stdio tool on an
installed appliance, as the package runs it, and prints what bound the
tool (its call's receipt). Standard library only.

Usage: test-tool-run.py URL CA_FILE TOKEN WORK_DIR

WORK_DIR is a scratch directory. The release is the triage example with the
probe MCP server (tests/tools/probe_mcp.py) among its own files, signed with
a publisher key made here and trusted for tenant `site` only; the run goes
in tenant `site`, project `ops`. Exits non-zero, saying why, unless the run
Succeeded with its tool call completed."""

import io
import json
import os
import shutil
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.request

URL, CA, TOKEN, WORK = sys.argv[1:5]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTEXT = ssl.create_default_context(cafile=CA)
RELEASE = "site-tools-1.0.0"


def fail(why):
    sys.exit(f"FAIL: {why}")


def call(path, body=None, content_type="application/json", method=None):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    request = urllib.request.Request(
        URL + path, data=data, method=method or ("POST" if data is not None else "GET"),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, context=CONTEXT, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def rpc(method, body):
    status, answer = call(f"/{method}", body)
    if status != 200:
        fail(f"{method}: {status} {answer}")
    return answer


# The release: the triage example, the probe among its files, a scripted
# model that calls the probe once and then answers.
bundle = os.path.join(WORK, "release")
shutil.copytree(os.path.join(ROOT, "packaging/examples/releases/triage"), bundle)
os.makedirs(os.path.join(bundle, "tools"))
shutil.copy(os.path.join(ROOT, "tests/tools/probe_mcp.py"), os.path.join(bundle, "tools"))
answer = json.dumps({"severity": "low", "summary": "checked", "paged": False})
with open(os.path.join(bundle, "model/responses.json"), "w") as f:
    json.dump({"responses": [
        {"content": "look", "toolCalls": [{"tool": "whoami", "arguments": {}}]},
        {"content": answer},
    ]}, f)
with open(os.path.join(bundle, "manifest.json")) as f:
    manifest = json.load(f)
manifest["releaseId"] = RELEASE
manifest["tenantId"] = "site"
manifest["tools"] = [{
    "id": "whoami", "name": "whoami", "description": "Who runs this tool",
    "sideEffectClass": "read", "transport": "mcp-stdio",
    "command": ["/usr/bin/python3", "release/tools/probe_mcp.py"],
    "inputSchema": {"type": "object"}}]
manifest["toolFiles"] = [{"path": "tools/probe_mcp.py", "sha256": "sha256:" + "0" * 64}]
with open(os.path.join(bundle, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=2)
key = os.path.join(WORK, "site-ci")
subprocess.run(["agentbay", "release", "keygen", "--out", key], check=True,
               stdout=subprocess.DEVNULL)
subprocess.run(["agentbay", "release", "sign", bundle, "--key", key + ".key",
                "--update-hashes"], check=True, stdout=subprocess.DEVNULL)
with open(key + ".pub") as f:
    public = f.read().strip()

rpc("agentbay.admin.v1.Admin/PutProject", {"tenantId": "site", "projectId": "ops"})
rpc("agentbay.admin.v1.Admin/TrustPublisherKey",
    {"name": "site-ci", "publicKey": public, "tenants": ["site"]})
packed = io.BytesIO()
with tarfile.open(fileobj=packed, mode="w:gz") as tar:
    tar.add(bundle, arcname=".")
status, imported = call("/runtime/releases", packed.getvalue(), "application/gzip")
if status not in (200, 201):
    fail(f"import: {status} {imported}")

run = rpc("agentbay.runs.v1.Runs/SubmitRun", {
    "tenantId": "site", "projectId": "ops", "releaseId": RELEASE,
    "inputJson": json.dumps({"customer": "acme", "text": "checkout is slow"})})["run"]
for _ in range(600):
    run = rpc("agentbay.runs.v1.Runs/GetRun", {"runId": run["runId"], "tenantId": "site"})["run"]
    if run["state"] in ("Succeeded", "Failed", "Cancelled"):
        break
    time.sleep(0.1)
attempt = run["steps"][0]["attempts"][0]["attemptId"]
status, timeline = call(f"/runtime/attempts/{attempt}?tenant=site")
if status != 200:
    fail(f"timeline: {status} {timeline}")
tools = [c for c in timeline["calls"] if c["kind"] == "tool"]
if run["state"] != "Succeeded" or not tools:
    fail(f"the run ended {run['state']}: {json.dumps(timeline)[:2000]}")
status, detail = call(f"/runtime/attempts/{attempt}/calls/{tools[0]['callId']}?tenant=site")
if tools[0]["status"] != "completed":
    fail(f"the tool call {tools[0]['status']}: {json.dumps(detail)[:2000]}")
bound = detail["content"]["receipt"]["json"]["confinement"]
# As installed, the tool has a network of its own (no egress), processes
# of its own, and, where the service has a delegated subtree, a cgroup.
if bound["network"] != "loopback-only" or bound["processes"] != "own-namespace":
    fail(f"the tool was not isolated: {json.dumps(bound)}")
# Its world was built for it, its system calls are filtered, and it runs
# as a uid of the package's subordinate range for the agentbay account,
# never the appliance's.
if not bound.get("filesystem", "").startswith("own-root"):
    fail(f"the tool saw the host's filesystem: {json.dumps(bound)}")
if not bound.get("syscalls", "").startswith("seccomp filter"):
    fail(f"the tool's system calls were not filtered: {json.dumps(bound)}")
if "of the subordinate range of agentbay" not in bound["user"]:
    fail(f"the tool did not run as a subordinate uid of agentbay: {json.dumps(bound)}")
if os.environ.get("EXPECT_CGROUP", "0") != "0" and not bound["mechanism"].startswith("cgroup"):
    fail(f"the delegated subtree did not bound the tool: {json.dumps(bound)}")
print(f"tool run: Succeeded; the MCP stdio tool was bound by {bound['mechanism']}, "
      f"network {bound['network']}, processes {bound['processes']}, user {bound['user']}; "
      f"filesystem: {bound['filesystem']}; files: {bound['files']}; syscalls: {bound['syscalls']}")
