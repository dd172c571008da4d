"""Kernels of a sandgate bundle through jupyter_client's KernelManager, driven line by line
by the Rust test (crates/sandgate/tests/jupyter_e2e.rs).

argv: BUNDLE RUNTIME. Kernelspecs come from BUNDLE/kernels only; each kernel gets what
Jupyter Server gives it in a bundle (jupyter/config/jupyter_server_config.py): the ipc
transport, its connection file RUNTIME/kernel-ID.json and its sockets in that path + ".d".
stdin: one JSON object per line:
  {"start": KERNEL_NAME, "as": A}          -> {"pid", "connection_file", "seconds"}
  {"exec": A, "code": C, "timeout": S}     -> {"stdout", "stderr", "error", "seconds"}
  {"interrupt": A, "code": C}              -> the exec result of C, interrupted after 1 s
  {"restart": A}                           -> {"pid"}
  {"stop": A}                              -> {}
stdout: one JSON object per command. Every wait is bounded.
"""
import json
import os
import sys
import time
import uuid

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

bundle, runtime = sys.argv[1], sys.argv[2]
# Kernels inherit stdout (their banners would land in the protocol): the answers get a
# descriptor of their own, and everything else goes to stderr.
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
specs = KernelSpecManager(kernel_dirs=[os.path.join(bundle, "kernels")], ensure_native_kernel=False)
kernels = {}


def start(name):
    connection_file = os.path.join(runtime, "kernel-%s.json" % uuid.uuid4())
    os.mkdir(connection_file + ".d", 0o700)
    km = KernelManager(
        kernel_name=name,
        kernel_spec_manager=specs,
        transport="ipc",
        connection_file=connection_file,
        ip=connection_file + ".d/ipc",
    )
    started = time.monotonic()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=30)
    return km, kc, {"pid": km.provisioner.pid, "connection_file": connection_file,
                    "seconds": time.monotonic() - started}


def execute(kc, code, timeout=20, interrupt_km=None):
    out = {"stdout": "", "stderr": "", "error": None}

    def hook(msg):
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out[content["name"]] += content["text"]
        elif kind == "error":
            out["error"] = "%s: %s" % (content["ename"], content["evalue"])
        elif kind in ("execute_result", "display_data"):
            out["stdout"] += content.get("data", {}).get("text/plain", "") + "\n"

    started = time.monotonic()
    if interrupt_km is None:
        kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    else:
        msg_id = kc.execute(code)
        time.sleep(1)
        interrupt_km.interrupt_kernel()
        deadline = time.monotonic() + timeout
        while True:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            hook(msg)
    out["seconds"] = time.monotonic() - started
    return out


def main():
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if "start" in cmd:
                km, kc, info = start(cmd["start"])
                kernels[cmd["as"]] = (km, kc)
                out = info
            elif "exec" in cmd:
                out = execute(kernels[cmd["exec"]][1], cmd["code"], cmd.get("timeout", 20))
            elif "interrupt" in cmd:
                km, kc = kernels[cmd["interrupt"]]
                out = execute(kc, cmd["code"], 20, interrupt_km=km)
            elif "restart" in cmd:
                km, kc = kernels[cmd["restart"]]
                km.restart_kernel(now=False)
                kc.wait_for_ready(timeout=30)
                out = {"pid": km.provisioner.pid}
            elif "stop" in cmd:
                km, kc = kernels.pop(cmd["stop"])
                kc.stop_channels()
                km.shutdown_kernel(now=False)
                out = {}
            else:
                out = {"driver_error": "unknown command"}
        except Exception as e:  # the test looks at it
            out = {"driver_error": "%s: %s" % (type(e).__name__, e)}
        print(json.dumps(out), file=answers, flush=True)
    for km, kc in kernels.values():
        kc.stop_channels()
        km.shutdown_kernel(now=True)


main()
