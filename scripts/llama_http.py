"""Small HTTP and process helpers shared by the llama.cpp scripts and tests (standard library only):
free loopback ports, JSON requests that return (status, text) instead of raising, waiting for a
server's /health, reading a process's peak RSS, and stopping a server."""
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port():
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, key=None, raw=None, timeout=600):
    """POST `body` as JSON (or `raw` bytes; GET when both are None); returns (status, text)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_healthy(base, proc, seconds=120):
    """Waits until GET base/health answers 200; raises if `proc` exits or time runs out."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            if http(base + "/health", timeout=2)[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise RuntimeError("the server did not become healthy in time")


def peak_rss(pid):
    """The peak resident set (VmHWM) of process `pid`, in bytes (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def stop(proc, seconds=30):
    """Terminates `proc`, killing it if it does not exit in time."""
    proc.terminate()
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
