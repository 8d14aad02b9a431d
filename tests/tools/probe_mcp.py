#!/usr/bin/env python3
"""An MCP server over stdio (standard library only) whose tools probe what
the process that runs them may do: the tests run it as a release's tool and
read back what it saw. Newline-delimited JSON-RPC, as MCP's stdio
transport is."""

import ctypes
import errno
import json
import os
import socket
import sys
import time

TOOLS = {
    "meta": "Returns the request's _meta",
    "whoami": "Returns the process's pid, cgroups, working directory and network interfaces",
    "alloc": "Allocates `mb` megabytes and holds them",
    "spawn": "Starts a child that sleeps `seconds` and outlives this call; returns its pid",
    "spin": "Busy-loops for `seconds`; returns the CPU seconds it got",
    "connect": "Opens a TCP connection to `host`:`port`",
    "read": "Reads the file at `path`",
    "write": "Writes `text` to the file at `path`",
    "hang": "Writes its pid to hang.pid in its working directory, then never answers",
    "processes": "Lists the processes it sees and tries to signal `pid`",
    "forks": "Starts up to `n` children that sleep; returns how many started",
    "unix": "Connects to the Unix-domain socket at `path`",
    "listdir": "Lists the directory at `path`",
    "families": "Opens a socket of each address family in `families` (AF_NETLINK, ...)",
    "ptrace": "Attaches to its parent (or `pid`) with ptrace",
    "ids": "Returns its uid, gid and groups as it sees them",
}


def pidns():
    """The PID namespace this process is in (the host's pid is found by it)."""
    return os.readlink("/proc/self/ns/pid")


def started(pid="self"):
    """When the process started (clock ticks since boot, as the host sees
    it too): with its namespace and pid, it names one process, however
    soon a namespace's number is used again."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def interfaces():
    """The network interfaces it sees, from /proc (netlink is refused to it)."""
    try:
        with open("/proc/net/dev") as f:
            return sorted(l.split(":")[0].strip() for l in f.read().splitlines()[2:])
    except OSError as e:
        return [f"unknown: {e}"]


def answer(result):
    return {
        "content": [{"type": "text", "text": json.dumps(result)}],
        "structuredContent": result,
    }


def call(name, args, meta):
    if name == "meta":
        return answer({"meta": meta})
    if name == "whoami":
        with open("/proc/self/cgroup") as f:
            cgroups = f.read().splitlines()
        return answer({
            "pid": os.getpid(),
            "pidns": pidns(),
            "started": started(),
            "path": os.environ.get("PATH"),
            "cgroups": cgroups,
            "cwd": os.getcwd(),
            "interfaces": interfaces(),
        })
    if name == "alloc":
        mb = int(args.get("mb", 64))
        held = [bytearray(1024 * 1024) for _ in range(mb)]
        for block in held:
            block[::4096] = b"x" * len(block[::4096])
        return answer({"allocated_mb": len(held)})
    if name == "spawn":
        pid = os.fork()
        if pid == 0:
            os.setsid()
            time.sleep(float(args.get("seconds", 300)))
            os._exit(0)
        return answer({"child": pid, "pidns": pidns(), "started": started(pid)})
    if name == "spin":
        seconds = float(args.get("seconds", 3))
        start, cpu = time.monotonic(), time.process_time()
        while time.monotonic() - start < seconds:
            pass
        return answer({"cpu_seconds": time.process_time() - cpu,
                       "wall_seconds": time.monotonic() - start})
    if name == "connect":
        try:
            with socket.create_connection((args["host"], int(args["port"])), timeout=2):
                return answer({"connected": True})
        except OSError as e:
            return answer({"connected": False, "error": str(e)})
    if name == "read":
        try:
            with open(args["path"], "rb") as f:
                return answer({"read": len(f.read())})
        except OSError as e:
            return answer({"read": None, "error": str(e)})
    if name == "write":
        try:
            with open(args["path"], "w") as f:
                f.write(args.get("text", ""))
            return answer({"written": True})
        except OSError as e:
            return answer({"written": False, "error": str(e)})
    if name == "hang":
        with open("hang.pid", "w") as f:  # in its working directory
            f.write(f"{os.getpid()} {pidns()} {started()}")
        while True:
            time.sleep(60)
    if name == "processes":
        seen = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        try:
            os.kill(int(args["pid"]), 0)
            signalled = None
        except OSError as e:
            signalled = str(e)
        return answer({"pids": seen, "signal_error": signalled})
    if name == "forks":
        children, error = [], None
        for _ in range(int(args.get("n", 64))):
            try:
                pid = os.fork()
            except OSError as e:
                error = str(e)
                break
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        return answer({"started": len(children), "error": error})
    if name == "unix":
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(args["path"])
            return answer({"connected": True})
        except OSError as e:
            return answer({"connected": False, "errno": e.errno, "error": str(e)})
    if name == "listdir":
        try:
            return answer({"entries": sorted(os.listdir(args.get("path", "/")))})
        except OSError as e:
            return answer({"entries": None, "errno": e.errno, "error": str(e)})
    if name == "families":
        out = {}
        for family in args.get("families", ["AF_NETLINK", "AF_PACKET", "AF_VSOCK"]):
            kind = socket.SOCK_RAW if family in ("AF_NETLINK", "AF_PACKET") else socket.SOCK_STREAM
            try:
                socket.socket(getattr(socket, family), kind).close()
                out[family] = {"opened": True}
            except OSError as e:
                out[family] = {"opened": False, "errno": e.errno, "error": str(e)}
        return answer(out)
    if name == "ptrace":
        libc = ctypes.CDLL(None, use_errno=True)
        target = int(args.get("pid", os.getppid()))
        PTRACE_ATTACH = 16
        r = libc.ptrace(PTRACE_ATTACH, target, None, None)
        err = ctypes.get_errno()
        return answer({"target": target, "attached": r == 0, "errno": err,
                       "error": os.strerror(err) if r != 0 else None})
    if name == "ids":
        return answer({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                       "cwd_owner": os.stat(".").st_uid})
    raise ValueError(f"unknown tool {name}")


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "id" not in msg:
            continue  # a notification
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "probe", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [
                {"name": n, "description": d, "inputSchema": {"type": "object"}}
                for n, d in TOOLS.items()
            ]}
        elif method == "tools/call":
            try:
                result = call(params["name"], params.get("arguments") or {},
                              params.get("_meta") or {})
            except Exception as e:  # the tool's failure, as MCP reports it
                result = {"content": [{"type": "text", "text": f"{type(e).__name__}: {e}"}],
                          "isError": True}
        elif method == "ping":
            result = {}
        else:
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": {
                "code": -32601, "message": f"no method {method}"}}) + "\n")
            sys.stdout.flush()
            continue
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
