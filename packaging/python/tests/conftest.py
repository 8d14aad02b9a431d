"""The real appliance for the SDK's tests: the binary (AGENTBAY_BIN, else
the workspace's debug build) serving a fresh data directory over HTTPS on
a manual clock, with its demo (tenant demo, the triage-external release
signed with the data directory's demo key)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
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

    def __init__(self, root: Path) -> None:
        self.root = root
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
            env={**appliance_env(), "AGENTBAY_RUNTIME__RECONCILE_INTERVAL_SECONDS": "3600"},
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
