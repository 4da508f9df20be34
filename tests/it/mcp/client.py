#!/usr/bin/env python3
"""A real MCP client — the official Python SDK (`pip install mcp`), not flow's own —
driving flow's MCP server for the tests in `tests/it/mcp_server.rs`.

    client.py TARGET STEPS

TARGET is JSON: {"http": URL, "token": T} or {"stdio": [COMMAND, ARG, ...], "env": {...}},
with "tasks": true to declare the tasks extension (SEP-2663): a call the server answers
with a task is then followed with `tasks/get` until it ends, through the SDK's extension
API (`ClientExtension` claiming `resultType: "task"`), as a task-aware agent would.
STEPS is a JSON list run in order; each prints one JSON line on stdout:

    {"op": "list"}                                   -> the tools
    {"op": "call", "tool": N, "args": {...}, "key": K?}  -> the result
    {"op": "twice", "tool": N, "args": {...}, "gap_ms": 3} -> two calls on one session,
        the second sent gap_ms after the first (new JSON-RPC ids), both results
    {"op": "reconnect"}                              -> closes the session, opens another
    {"op": "call", ..., "cancel": true}              -> with tasks: cancels the task at once
    {"op": "call", ..., "may_fail": true}            -> the server may die: prints {"failed": …}
    {"op": "call", ..., "progress": true}            -> asks for progress: {"progress": [...]}

A call answered with a task prints {"task": {...what tasks/get said...}} beside the result.

A result is printed as the SDK parsed it (`model_dump(by_alias=True)`), so the test
sees what an agent would.
"""

import asyncio
import json
import sys

from typing import Any, Literal

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Request, RequestParams, Result, TextContent
from pydantic import ConfigDict, TypeAdapter


class TaskId(RequestParams):
    task_id: str


class GetTask(Request[TaskId, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class CancelTask(Request[TaskId, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class TaskCreated(Result):
    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"]
    task_id: str
    status: str
    status_message: str | None = None


RAW = TypeAdapter(dict[str, Any])


class Tasks(ClientExtension):
    """The tasks extension: follows a task with tasks/get (or cancels it) to its end."""

    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self):
        self.cancel = False
        self.seen = None

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=self.resolve)]

    async def resolve(self, created, ctx):
        seen = {"task_id": created.task_id, "statuses": [created.status],
                "first_message": created.status_message}
        self.seen = seen
        ask = TaskId(task_id=created.task_id)
        if self.cancel:
            await ctx.session.send_request(CancelTask(params=ask), RAW)
        while True:
            got = await ctx.session.send_request(GetTask(params=ask), RAW)
            seen["statuses"].append(got["status"])
            if got["status"] == "completed":
                return CallToolResult.model_validate(got["result"], by_name=False)
            if got["status"] in ("cancelled", "failed"):
                text = f"task {got['status']}"
                return CallToolResult(content=[TextContent(text=text)], is_error=True)
            await asyncio.sleep(got.get("pollIntervalMs", 500) / 1000)


TASKS = Tasks()


def connect(target):
    extensions = [TASKS] if target.get("tasks") else None
    if "http" in target:
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {target['token']}"}, timeout=60
        )
        transport = streamable_http_client(target["http"], http_client=http)
        return Client(transport, extensions=extensions)
    command = target["stdio"]
    params = StdioServerParameters(
        command=command[0], args=command[1:], env=target.get("env")
    )
    return Client(params, extensions=extensions)


def dump(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


PROGRESS = []


async def on_progress(progress, total, message):
    PROGRESS.append({"progress": progress, "total": total, "message": message})


async def call(client, step):
    meta = {"io.flow/idempotency-key": step["key"]} if step.get("key") else None
    callback = on_progress if step.get("progress") else None
    return await client.call_tool(
        step["tool"], step.get("args") or {}, meta=meta, progress_callback=callback
    )


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
            elif op == "call" and step.get("may_fail"):
                # The server may die under this call (a crash test): say how it ended.
                try:
                    out = dump(await call(client, step))
                except Exception as e:  # noqa: BLE001 - any end is an answer here
                    print(json.dumps({"failed": str(e)}), flush=True)
                    return
            elif op == "call":
                TASKS.cancel, TASKS.seen = bool(step.get("cancel")), None
                PROGRESS.clear()
                out = dump(await call(client, step))
                if step.get("progress"):
                    out["progress"] = list(PROGRESS)
                if TASKS.seen is not None:
                    out["task"] = TASKS.seen
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
        try:
            await client.__aexit__(None, None, None)
        except Exception:  # noqa: BLE001 - a server that died closes badly
            pass


asyncio.run(main())
