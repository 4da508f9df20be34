#!/usr/bin/env python3
"""A real MCP client — the official Python SDK (`pip install mcp`), not flow's own —
driving flow's MCP server for the tests in `tests/it/mcp_server.rs`.

    client.py TARGET STEPS

TARGET is JSON: {"http": URL, "token": T} or {"stdio": [COMMAND, ARG, ...], "env": {...}}.
STEPS is a JSON list run in order; each prints one JSON line on stdout:

    {"op": "list"}                                   -> the tools
    {"op": "call", "tool": N, "args": {...}, "key": K?}  -> the result
    {"op": "twice", "tool": N, "args": {...}, "gap_ms": 3} -> two calls on one session,
        the second sent gap_ms after the first (new JSON-RPC ids), both results
    {"op": "reconnect"}                              -> closes the session, opens another

A result is printed as the SDK parsed it (`model_dump(by_alias=True)`), so the test
sees what an agent would.
"""

import asyncio
import json
import sys

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def connect(target):
    if "http" in target:
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {target['token']}"}, timeout=60
        )
        return Client(streamable_http_client(target["http"], http_client=http))
    command = target["stdio"]
    params = StdioServerParameters(
        command=command[0], args=command[1:], env=target.get("env")
    )
    return Client(params)


def dump(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def call(client, step):
    meta = {"io.flow/idempotency-key": step["key"]} if step.get("key") else None
    return await client.call_tool(step["tool"], step.get("args") or {}, meta=meta)


async def main():
    target = json.loads(sys.argv[1])
    steps = json.loads(sys.argv[2])
    client = connect(target)
    await client.__aenter__()
    try:
        for step in steps:
            op = step["op"]
            if op == "list":
                tools = await client.list_tools()
                out = {"tools": [dump(t) for t in tools.tools]}
            elif op == "call":
                out = dump(await call(client, step))
            elif op == "twice":

                async def later():
                    await asyncio.sleep(step.get("gap_ms", 3) / 1000)
                    return await call(client, step)

                first, second = await asyncio.gather(call(client, step), later())
                out = {"results": [dump(first), dump(second)]}
            elif op == "reconnect":
                await client.__aexit__(None, None, None)
                client = connect(target)
                await client.__aenter__()
                out = {"reconnected": True}
            else:
                raise SystemExit(f"unknown op {op}")
            print(json.dumps(out), flush=True)
    finally:
        await client.__aexit__(None, None, None)


asyncio.run(main())
