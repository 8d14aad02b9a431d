#!/usr/bin/env python3
"""A complete external execution adapter for the triage-external example
release, in the Python standard library only.

It claims attempts of agent `triage`, runs its own small loop (plan, look
up the customer's tickets, page on-call for an outage once a reviewer
approves, report a verified outcome) and lets the appliance enforce the
rest: fencing tokens, the tool closure, approvals, checkpoints, limits and
exactly one outcome.

    AGENTBAY_URL=https://127.0.0.1:8443 AGENTBAY_CA=agentbay-data/tls/ca.pem \
    AGENTBAY_CLIENT_ID=demo.... AGENTBAY_CLIENT_SECRET=... \
    python3 triage_adapter.py [--once]
"""

import base64
import json
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request

URL = os.environ.get("AGENTBAY_URL", "https://127.0.0.1:8443")
TLS = ssl.create_default_context(cafile=os.environ.get("AGENTBAY_CA", "agentbay-data/tls/ca.pem"))
CLIENT = (os.environ["AGENTBAY_CLIENT_ID"], os.environ["AGENTBAY_CLIENT_SECRET"])
SESSION = f"{socket.gethostname()}:{os.getpid()}"


class Refused(Exception):
    """The appliance said no (stale token, interrupted, limit reached...)."""


class Token:
    """A bearer token, renewed a minute before it expires (tokens last 15
    minutes) and whenever the appliance answers 401 (a restart with a new
    signing key, a revoked token)."""

    def __init__(self):
        self.value, self.renew_at = None, 0.0

    def get(self):
        if self.value is None or time.monotonic() >= self.renew_at:
            self.renew()
        return self.value

    def renew(self):
        basic = base64.b64encode(f"{CLIENT[0]}:{CLIENT[1]}".encode()).decode()
        req = urllib.request.Request(f"{URL}/oauth/token", data=b"grant_type=client_credentials",
                                     headers={"Authorization": f"Basic {basic}"})
        with urllib.request.urlopen(req, context=TLS, timeout=30) as r:
            body = json.load(r)
        self.value = body["access_token"]
        self.renew_at = time.monotonic() + max(int(body.get("expires_in", 900)) - 60, 1)


TOKEN = Token()


def call(method, **body):
    """One Connect RPC of agentbay.adapter.v1.Adapter, JSON over HTTPS.

    A 401 renews the token and tries again; while the appliance is down
    (restarting, upgrading) it waits and tries again. Every adapter call is
    safe to repeat: the fencing token and the call ids make a repeat
    return what the first one did."""
    delay = 1
    renewed = False
    while True:
        try:
            req = urllib.request.Request(f"{URL}/agentbay.adapter.v1.Adapter/{method}",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {TOKEN.get()}"})
            with urllib.request.urlopen(req, context=TLS, timeout=90) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            if e.code == 401 and not renewed:
                TOKEN.renew()
                renewed = True
                continue
            if e.code in (502, 503, 504):
                pass  # draining or starting: wait below
            else:
                err = json.load(e)
                raise Refused(f"{method}: {err.get('code')}: {err.get('message')}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            print(f"{method}: appliance unreachable ({e}); trying again in {delay} s", flush=True)
        time.sleep(delay)
        delay = min(delay * 2, 30)
        renewed = False


def fence(ids, begun):
    """The headers every request to a site tool or model server carries for
    a call BeginCall started, as the builtin adapter sends them: a server
    that has seen a higher fencing token for the attempt refuses the call."""
    h = {"Agentbay-Attempt-Id": ids["attemptId"],
         "Agentbay-Fencing-Token": str(begun.get("fencingToken", ids["fencingToken"])),
         "Agentbay-Call-Id": begun["callId"]}
    if begun.get("policyDecisionId"):
        h["Agentbay-Policy-Decision-Id"] = begun["policyDecisionId"]
    return h


def lookup_tickets(customer, headers):
    """A stand-in for the site's ticket service: a real adapter sends
    `headers` with its request (urllib.request.Request(url, headers=headers))."""
    assert headers["Agentbay-Call-Id"], "every outbound call carries its fence"
    return {"open": 2}


def run_attempt(t):
    ids = {"attemptId": t["attemptId"], "fencingToken": int(t["fencingToken"])}
    ticket = json.loads(t.get("inputJson") or "{}")
    call("StartAttempt", **ids, adapterVersion=t["adapterVersion"],
         checkpointFormat=t.get("checkpointFormat", 1))

    # Plan (a stand-in for the model call: the model is the adapter's own).
    text = json.dumps(ticket).lower()
    severity = "high" if ("down" in text or "outage" in text) else "low"
    m = call("BeginCall", **ids, kind="model", target="triage-scripted",
             requestJson=json.dumps({"task": "triage", "ticket": ticket}), contextTokens=800)
    call("CompleteCall", **ids, callId=m["callId"], ok=True,
         resultJson=json.dumps({"severity": severity}),
         receiptJson=json.dumps({"model": "rules-v1"}),
         stateJson=json.dumps({"severity": severity}))

    # Look up the customer's tickets (a read tool: allowed without asking).
    customer = ticket.get("customer", "unknown")
    c = call("BeginCall", **ids, kind="tool", target="lookup-ticket",
             requestJson=json.dumps({"customer": customer}))
    tickets = lookup_tickets(customer, fence(ids, c))
    call("CompleteCall", **ids, callId=c["callId"], ok=True,
         resultJson=json.dumps(tickets), receiptJson=json.dumps({"db": "tickets"}),
         stateJson=json.dumps({"severity": severity, "looked_up": True}))

    # Page on-call for an outage: shared-write, so a reviewer approves first.
    paged = False
    if severity == "high":
        page = json.dumps({"message": f"outage reported by {customer}"})
        b = call("BeginCall", **ids, kind="tool", target="page-oncall", requestJson=page)
        if b.get("outcome") == "APPROVAL_REQUIRED":
            print(f"waiting for approval {b['approvalId']} (decision {b['decisionId']})", flush=True)
            status = "pending"
            while status == "pending":
                d = call("AwaitDecision", **ids, decisionId=b["decisionId"], waitSeconds=30)
                status = d.get("status", "pending")
            if status != "approved":
                print(f"page not approved ({status}); the attempt is {d.get('attemptState')}")
                return
            b = call("BeginCall", **ids, kind="tool", target="page-oncall", requestJson=page,
                     approvalId=b["approvalId"])
        call("CompleteCall", **ids, callId=b["callId"], ok=True,
             resultJson=json.dumps({"paged": True}), receiptJson=json.dumps({"pager": "ok"}))
        paged = True

    # Report the one outcome; the appliance verifies it against the contract.
    out = {"severity": severity, "summary": f"{severity} severity ticket from {customer}",
           "paged": paged}
    r = call("ReportOutcome", **ids, succeeded=True, outputJson=json.dumps(out))
    print(f"attempt {t['attemptId']}: {r.get('verdict')} -> {r.get('state')}", flush=True)


def main():
    once = "--once" in sys.argv
    while True:
        claimed = call("ClaimAttempt", agentId="triage", session=SESSION, waitSeconds=30)
        if "attempt" in claimed:
            try:
                run_attempt(claimed["attempt"])
            except Refused as e:
                print(f"stopped: {e}", flush=True)
            if once:
                return
        elif once:
            print("nothing to claim", flush=True)
            return


if __name__ == "__main__":
    main()
