"""The real appliance for the SDK's tests: the binary (AGENTBAY_BIN, else
the workspace's debug build) serving a fresh data directory over HTTPS on
a manual clock, with its demo (tenant demo, the triage-external release
signed with the data directory's demo key)."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "packaging" / "examples"
TESTS = Path(__file__).resolve().parent
# The SDK under test is the source tree, here and in the workers the tests
# start; the shipped wheel is tested by test_client's offline install.
SRC = str(ROOT / "packaging" / "python" / "src")
sys.path.insert(0, SRC)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)


def binary() -> str:
    return os.environ.get("AGENTBAY_BIN") or str(ROOT / "target" / "debug" / "agentbay")


def appliance_env() -> dict[str, str]:
    """The environment of the appliance and its CLI: none of the caller's
    AGENTBAY_* settings (the appliance refuses keys it does not know)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENTBAY_")}


@dataclass
class Credential:
    client_id: str
    client_secret: str

    def env(self) -> dict[str, str]:
        return {"AGENTBAY_CLIENT_ID": self.client_id, "AGENTBAY_CLIENT_SECRET": self.client_secret}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Appliance:
    """One appliance process on its own data directory and port."""

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.extra_env = dict(env or {})
        self.data_dir = root / "data"
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        out = self.cli("init", "--json")
        self.admin = Credential(**{k: out[k] for k in ("client_id", "client_secret")})
        self.start()

    @property
    def ca(self) -> str:
        return str(self.data_dir / "tls" / "ca.pem")

    def cli(self, *args: str) -> dict:
        r = subprocess.run(
            [binary(), *args, "--data-dir", str(self.data_dir)],
            capture_output=True, text=True, timeout=120, env=appliance_env(),
        )
        assert r.returncode == 0, f"agentbay {' '.join(args)}: {r.stderr}"
        return json.loads(r.stdout) if "--json" in args else {"out": r.stdout}

    def start(self) -> None:
        info = self.data_dir / "run" / "appliance.json"
        log = open(self.root / "serve.log", "ab")
        self.proc = subprocess.Popen(
            [binary(), "serve", "--manual-clock", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data_dir)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            # A worker's attempt is taken over once its lease lapses (the
            # tests move the clock 61 s past it); the reconciler, which
            # settles attempts nobody took over, waits for an hour of the
            # manual clock, so that no sum of moves makes it race them.
            env={**appliance_env(), "AGENTBAY_RUNTIME__RECONCILE_INTERVAL_SECONDS": "3600", **self.extra_env},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                got = json.loads(info.read_text())
                if got.get("pid") == self.proc.pid:
                    self.fingerprint = got.get("certificateFingerprint") or got.get("certificate_fingerprint")
                    return
            except (OSError, ValueError):
                pass
            assert self.proc.poll() is None, (self.root / "serve.log").read_text()[-3000:]
            time.sleep(0.05)
        raise AssertionError("the appliance did not start within 60 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)
            self.proc = None

    def client_credential(self, tenant: str, *scopes: str) -> Credential:
        args = ["client", "create", "--tenant", tenant, "--json"]
        for s in scopes:
            args += ["--scope", s]
        out = self.cli(*args)
        return Credential(out["client_id"], out["client_secret"])

    def env(self, cred: Credential) -> dict[str, str]:
        return {**os.environ, "AGENTBAY_URL": self.url, "AGENTBAY_CA": self.ca, **cred.env()}

    def client(self, cred: Credential, **kw):
        from agentbay import Client

        return Client(self.url, ca=self.ca, client_id=cred.client_id, client_secret=cred.client_secret, **kw)

    def advance(self, seconds: int) -> None:
        """Moves the appliance's manual clock forward."""
        from agentbay.admin.v1 import admin_pb2

        with self.client(self.admin) as c:
            c.admin.advance_clock(admin_pb2.AdvanceClockRequest(seconds=seconds))


@pytest.fixture(scope="module")
def appliance(tmp_path_factory):
    a = Appliance(tmp_path_factory.mktemp("appliance"))
    yield a
    a.stop()


@pytest.fixture(scope="module")
def adapter_cred(appliance) -> Credential:
    return appliance.client_credential("demo", "factory.runs.execute")


@pytest.fixture(scope="module")
def operator(appliance):
    cred = appliance.client_credential(
        "demo", "factory.runs.read", "factory.runs.write", "factory.runs.decide", "factory.runs.operate"
    )
    with appliance.client(cred) as c:
        yield c


def spawn(script: Path | str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """A Python process (a worker) with the SDK importable."""
    return subprocess.Popen(
        [sys.executable, str(script), *args], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def kill_at(proc: subprocess.Popen[str], marker: str = "KILL-POINT") -> None:
    """Kills a worker with SIGKILL once it prints `marker` (it stops dead
    there, at the point the test chose)."""
    try:
        for line in proc.stdout:
            if line.startswith(marker):
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()


def wait_for(what: str, check, timeout: float = 60.0, every: float = 0.1):
    """Polls `check` until it answers something true (a condition of the
    appliance seen from outside, not a duration)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def sign_in(appliance) -> tuple[urllib.request.OpenerDirector, str]:
    """A reviewer's console session (a real sign-in over HTTPS)."""
    password = appliance.root / "operator.pw"
    if not password.exists():  # once per appliance (the module's)
        password.write_text("correct horse battery staple\n")
        appliance.cli("user", "create", "--tenant", "demo", "--username", "olga", "--role", "Operator",
                      "--password-file", str(password))
    tls = ssl.create_default_context(cafile=appliance.ca)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=tls), NoRedirect)
    body = urllib.parse.urlencode({"username": "olga", "password": "correct horse battery staple", "next": "/"}).encode()
    try:
        opener.open(urllib.request.Request(f"{appliance.url}/signin", data=body))
    except urllib.error.HTTPError as e:
        assert e.code == 303, e.read()
        cookie = e.headers["Set-Cookie"].split(";")[0]
    return opener, cookie


def submit(operator, **ticket) -> str:
    """A run of the triage-external example release on `ticket`."""
    from agentbay.runs.v1 import runs_pb2

    r = operator.runs.submit_run(
        runs_pb2.SubmitRunRequest(project_id="support", release_id="triage-external-1.0.0", input_json=json.dumps(ticket))
    )
    return r.run.run_id


def run_of(operator, run_id: str):
    from agentbay.runs.v1 import runs_pb2

    return operator.runs.get_run(runs_pb2.GetRunRequest(run_id=run_id)).run


def attempts(operator, run_id: str):
    return [a for s in run_of(operator, run_id).steps for a in s.attempts]


class ModelSite:
    """The site's services for a framework's agent: an OpenAI-compatible
    chat-completions server (what the site maps the release's model
    profile to) and a ticket service the agent's tool calls, each counting
    what it was asked. The model answers from the conversation alone, so a
    turn asked again gets the same answer: look up the customer's tickets,
    hand off to the reporter when the agents offer it, then the verdict
    (as the ``final_result`` tool when the agent asks for structured
    output). A streamed answer comes in pieces of a few characters."""

    VERDICT = {"severity": "low", "summary": "Slow checkout for acme; tickets looked up.", "paged": False}
    #: What the model writes when asked for a story (a long answer, streamed
    #: in pieces of 4 characters).
    STORY = " ".join(f"Once upon a time the checkout of customer {n} was slow, and it was fixed." for n in range(8))

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.turns: list[dict] = []
        self.tool_calls: list[dict] = []
        self.lock = threading.Lock()
        self.highest_fence: dict[str, int] = {}
        #: Chunks the next streamed answer breaks off after (an error
        #: event in the middle of the answer), when set.
        self.break_after: int | None = None
        #: The pause between two pieces of a streamed answer (a model
        #: writing), seconds.
        self.pause = 0.005
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path.endswith("/chat/completions"):
                    site.model(self, body)
                elif self.path.startswith("/tickets"):
                    site.tickets(self, body)
                else:
                    self.send_error(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, body: dict) -> dict:
        messages = body.get("messages") or []
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        asked = [c["function"]["name"] for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
        customer = "acme" if "acme" in json.dumps(messages) else "unknown"
        if "story" in str((messages[-1] if messages else {}).get("content")):
            return {"content": self.STORY}
        if "lookup-ticket" in offered and "lookup-ticket" not in asked:
            return {"tool_calls": [{"id": f"call_{len(asked) + 1}", "type": "function",
                                    "function": {"name": "lookup-ticket", "arguments": json.dumps({"customer": customer})}}]}
        handoff = next((n for n in offered if n.startswith("transfer_to_")), None)
        if handoff and handoff not in asked:
            return {"tool_calls": [{"id": f"call_{len(asked) + 1}", "type": "function",
                                    "function": {"name": handoff, "arguments": "{}"}}]}
        if "final_result" in offered:
            return {"tool_calls": [{"id": f"call_{len(asked) + 1}", "type": "function",
                                    "function": {"name": "final_result", "arguments": json.dumps(self.VERDICT)}}]}
        return {"content": json.dumps(self.VERDICT)}

    def model(self, request, body: dict) -> None:
        message = {"role": "assistant", "content": None, **self.answer(body)}
        with self.lock:
            self.turns.append(body)
        usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
        if not body.get("stream"):
            reply = json.dumps({"id": "x", "object": "chat.completion", "model": "site-model", "usage": usage,
                                "choices": [{"index": 0, "finish_reason": "stop", "message": message}]}).encode()
            request.send_response(200)
            request.send_header("Content-Type", "application/json")
            request.send_header("Content-Length", str(len(reply)))
            request.end_headers()
            request.wfile.write(reply)
            return
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.end_headers()

        def send(delta: dict, **more) -> None:
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": "site-model",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **more}
            request.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            request.wfile.flush()

        text = message.get("content") or ""
        with self.lock:
            breaks, self.break_after = self.break_after, None
        for n, i in enumerate(range(0, len(text), 4)):
            if breaks is not None and n == breaks:
                request.wfile.write(b'data: {"error": {"message": "the server restarted"}}\n\n')
                request.wfile.flush()
                return
            send({"content": text[i:i + 4]})
            time.sleep(self.pause)
        for n, c in enumerate(message.get("tool_calls") or []):
            send({"tool_calls": [{"index": n, **c}]})
        send({}, usage=usage)
        request.wfile.write(b"data: [DONE]\n\n")
        request.wfile.flush()

    def tickets(self, request, body: dict) -> None:
        """The ticket service: refuses a fencing token lower than one it
        has seen for the attempt, as a site service should."""
        attempt = request.headers.get("Agentbay-Attempt-Id", "")
        token = int(request.headers.get("Agentbay-Fencing-Token") or 0)
        with self.lock:
            stale = token < self.highest_fence.get(attempt, 0)
            if not stale:
                self.highest_fence[attempt] = token
                self.tool_calls.append({"attempt": attempt, "token": token, "call": request.headers.get("Agentbay-Call-Id"), **body})
        reply = json.dumps({"error": "stale fencing token"} if stale else {"open": 2, "customer": body.get("customer")}).encode()
        request.send_response(409 if stale else 200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(reply)))
        request.end_headers()
        request.wfile.write(reply)

    def completed_turns(self) -> int:
        with self.lock:
            return len(self.turns)

    def map_profile(self, appliance, tenant: str = "demo", profile: str = "triage-scripted") -> None:
        """Maps the release's model profile to this server, as a site does."""
        from agentbay.admin.v1 import admin_pb2

        with appliance.client(appliance.admin) as c:
            c.admin.put_model_profile(admin_pb2.PutModelProfileRequest(
                profile_id=profile, tenant_id=tenant, endpoint=f"{self.url}/v1", model="site-model",
            ))

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def model_site():
    site = ModelSite()
    yield site
    site.close()


@pytest.fixture(scope="module")
def site_appliance(tmp_path_factory, model_site):
    """An appliance whose site allows the model server and the ticket
    service (loopback, by their exact host:port), the release's model
    profile mapped to that server."""
    a = Appliance(tmp_path_factory.mktemp("site"),
                  env={"AGENTBAY_RUNTIME__NETWORK_ALLOW": f"127.0.0.1:{model_site.port}"})
    model_site.map_profile(a)
    yield a
    a.stop()
