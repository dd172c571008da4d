"""A real MCP client (the Python `mcp` SDK) driven line by line by the Rust test.

argv: MODE SERVER_COMMAND...  (MODE: legacy, auto, or a protocol version; the server's
command line, e.g. sandgate mcp --config FILE, possibly behind setpriv)
stdin: one JSON object per line, {"call": TOOL, "args": {...}}; {"list": true}; or
{"parallel": [{"call": ...}, ...]} to make the calls at once.
stdout: first the session ({"protocol_version", "server_info"}), then one JSON object per
line per command: the result as the client saw it.
Every elicitation is accepted at once, as a headless client would: an accept must never
count as an approval. SANDGATE_TEST_CLIENT_NAME, when set, is the name the client declares
(its clientInfo), else the SDK's own ("mcp").
"""
import asyncio
import json
import os
import sys

import mcp_types as types
from mcp.client.client import Client
from mcp import StdioServerParameters

elicited = []


async def accept_everything(context, params):
    elicited.append(params.model_dump(mode="json", by_alias=True, exclude_none=True))
    if getattr(params, "mode", None) == "url":
        return types.ElicitResult(action="accept")
    return types.ElicitResult(action="accept", content={})


async def call(client, cmd):
    try:
        res = await client.call_tool(cmd["call"], cmd.get("args", {}))
        return {
            "is_error": bool(res.is_error),
            "structured": res.structured_content,
            "text": "".join(getattr(c, "text", "") for c in res.content),
        }
    except Exception as e:  # a protocol error is a result the test looks at
        return {"protocol_error": str(e)}


async def main():
    mode, command = sys.argv[1], sys.argv[2:]
    server = StdioServerParameters(command=command[0], args=command[1:])
    name = os.environ.get("SANDGATE_TEST_CLIENT_NAME")
    info = types.Implementation(name=name, version="1.0") if name else None
    async with Client(server, mode=mode, elicitation_callback=accept_everything, client_info=info) as client:
        info = client.server_info
        print(
            json.dumps(
                {
                    "protocol_version": client.protocol_version,
                    "server_info": info.model_dump(mode="json", exclude_none=True) if info else None,
                }
            ),
            flush=True,
        )
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            if cmd.get("parallel"):
                results = await asyncio.gather(*(call(client, c) for c in cmd["parallel"]))
                out = {"results": list(results)}
            elif cmd.get("list"):
                tools = await client.list_tools()
                out = {
                    "tools": [
                        {"name": t.name, "input_schema": t.input_schema, "output_schema": t.output_schema}
                        for t in tools.tools
                    ]
                }
            else:
                out = await call(client, cmd)
            out["elicited"] = list(elicited)
            print(json.dumps(out), flush=True)


asyncio.run(main())
