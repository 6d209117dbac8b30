"""An MCP client for lw-mcp's tests, on the official Python SDK (`mcp` on PyPI).

Usage: client.py SCENARIO [options] -- SERVER-COMMAND [ARGS...]

It starts SERVER-COMMAND as an MCP stdio server through the SDK, runs one
scenario and prints one JSON object with what it saw; the Rust test decides
what is right.  Scenarios:

  flow    initialize, tools/list, whoami, post (good and refused), an unknown
          tool, a cancelled wait, a wait woken by --hook, show, ack twice,
          inbox --all.
  posts   --count N posts of kind status; prints the ids whose results arrived
          and the latency of each call (used by the benchmarks and the
          concurrency and kill tests; a dead server ends the run early).
  wake    --count N rounds of: wait, then --hook delivers; prints for each
          the time from the file's arrival in inbox/new (--inbox DIR, its
          ctime) to the result reaching the client.  With --watcher BIN,
          each round also runs the peer: BIN watches inbox/new, --hook
          delivers, and the time until BIN names the message is taken the
          same way (the message then moved to cur/); rounds alternate
          which of the two goes first.
  killposts  like posts, but starts a new server whenever the one in use
          dies (the test kills it with SIGKILL).
  latency --count N posts through the tool and N runs of --lw-post BIN as a
          process, in rounds of 20 alternating which goes first; prints each
          call's time.
  idle    initialize, tools/list, whoami, one second idle: the server's RSS.
  bell    resources/list, resources/subscribe to inbox://, then rounds of
          --hook (run as `sh -c HOOK sh N`, delivering message N): after
          each, the resources/updated notifications counted once the
          expected one arrived and a ping went round; reads inbox:// after
          the first, acks it before the third, unsubscribes before the
          fourth; a subscribe and a read of an unknown URI.
"""

import argparse
import json
import os
import sys
import time

import anyio
from anyio.streams.text import TextReceiveStream
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


# notifications/resources/updated as the session surfaced them: (uri, time).
UPDATED = []
_updated_send, _updated_recv = anyio.create_memory_object_stream(100)


async def on_message(m):
    root = getattr(m, "root", m)
    if getattr(root, "method", "") == "notifications/resources/updated":
        UPDATED.append((str(root.params.uri), time.time()))
        await _updated_send.send(len(UPDATED))


def structured(result):
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


def text(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def call(session, name, args):
    """A tool call: ("ok", value) / ("refused", text) / ("error", code, message)."""
    try:
        r = await session.call_tool(name, args)
    except Exception as e:  # the SDK raises MCPError for JSON-RPC errors
        err = getattr(e, "error", None)
        code = getattr(err, "code", None) if err is not None else getattr(e, "code", None)
        return {"error": code, "message": str(e)}
    if r.is_error:
        return {"refused": text(r)}
    return {"ok": structured(r)}


async def flow(session, opts, out):
    init = await session.initialize()
    out["protocol"] = init.protocol_version
    out["server"] = init.server_info.name
    tools = await session.list_tools()
    out["tools"] = sorted(t.name for t in tools.tools)
    out["whoami"] = await call(session, "whoami", {})
    out["post"] = await call(
        session,
        "post",
        {"kind": "status", "subject": "hello over mcp", "body": "posted by the python sdk\n",
         "refs": ["src/api/schema.json"]},
    )
    out["post_request"] = await call(
        session, "post",
        {"kind": "request", "subject": "please look", "to": [opts.peer], "body": "from mcp"},
    )
    out["post_bad_kind"] = await call(session, "post", {"kind": "gossip", "subject": "x"})
    out["post_big"] = await call(
        session, "post", {"kind": "status", "subject": "big", "body": "x" * (10 * 1024 * 1024)}
    )
    out["post_bad_type"] = await call(session, "post", {"kind": "status", "subject": 5})
    out["unknown_tool"] = await call(session, "teleport", {})

    # A wait the client abandons: the SDK sends notifications/cancelled.
    t0 = time.monotonic()
    with anyio.move_on_after(0.3):
        await session.call_tool("wait", {"timeout": 30})
    out["cancelled_after_s"] = round(time.monotonic() - t0, 3)

    # A wait woken by a delivery the hook makes while it blocks.
    got = {}

    async def waiter():
        got["wait"] = await call(session, "wait", {"timeout": 30})
        got["at"] = time.time()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.3)
        proc = await anyio.run_process(opts.hook, check=False)
        out["hook_status"] = proc.returncode
        out["hook_stderr"] = proc.stderr.decode(errors="replace")
    out["wait"] = got["wait"]
    msgs = got["wait"].get("ok", {}).get("messages", [])
    if msgs:
        mid = msgs[0]["id"]
        out["show"] = await call(session, "show", {"id": mid})
        out["ack"] = await call(session, "ack", {"id": mid})
        out["ack_again"] = await call(session, "ack", {"id": mid})
    out["inbox_all"] = await call(session, "inbox", {"all": True})
    out["inbox_new"] = await call(session, "inbox", {})


async def posts(session, opts, out):
    await session.initialize()
    ids, lat = [], []
    out["ids"], out["latency_ms"] = ids, lat
    for i in range(opts.start, opts.start + opts.count):
        if opts.progress:
            print(f"sent {i}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            r = await session.call_tool(
                "post", {"kind": "status", "subject": f"{opts.tag} {i}", "body": f"n={i}"}
            )
        except Exception as e:
            out["stopped"] = str(e)
            return
        lat.append((time.perf_counter() - t0) * 1e3)
        if r.is_error:
            out.setdefault("refused", []).append(text(r))
            continue
        ids.append(structured(r)["id"])
        if opts.progress:
            # One line per received result, flushed: a killer reading this
            # knows exactly which results reached the client.
            print(f"got {i} {structured(r)['id']}", file=sys.stderr, flush=True)


async def killposts(params, opts, out):
    """Posts --count messages, starting a new server whenever the one in use
    dies (the test kills it); an unanswered post is never sent again."""
    i, end = opts.start, opts.start + opts.count
    out["sessions"] = 0
    while i < end:
        out["sessions"] += 1
        try:
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w) as session:
                    await session.initialize()
                    while i < end:
                        print(f"sent {i}", file=sys.stderr, flush=True)
                        i += 1
                        res = await session.call_tool(
                            "post",
                            {"kind": "status", "subject": f"{opts.tag} {i - 1}"},
                            read_timeout_seconds=30,
                        )
                        if res.is_error:
                            out.setdefault("refused", []).append(text(res))
                            continue
                        print(f"got {i - 1} {structured(res)['id']}", file=sys.stderr, flush=True)
        except Exception:
            continue


async def wake(session, opts, out):
    await session.initialize()
    out["wake_ms"], out["watcher_ms"] = [], []
    for i in range(opts.count):
        sides = [wake_mcp, wake_watcher] if opts.watcher else [wake_mcp]
        for side in sides if i % 2 == 0 else sides[::-1]:
            if not await side(session, opts, out):
                return


async def wake_mcp(session, opts, out):
    got = {}

    async def waiter():
        got["r"] = await call(session, "wait", {"timeout": 30})
        got["at"] = time.time()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.5)  # the wait is blocking in the server by then
        await anyio.run_process(opts.hook, check=True)
    msgs = got["r"].get("ok", {}).get("messages", [])
    if not msgs:
        out["error"] = got["r"]
        return False
    arrived = os.stat(os.path.join(opts.inbox, "new", msgs[0]["id"])).st_ctime
    out["wake_ms"].append((got["at"] - arrived) * 1e3)
    await call(session, "ack", {"id": msgs[0]["id"]})
    return True


async def wake_watcher(session, opts, out):
    """The peer: --watcher BIN (scripts/bench.d/wake.c) on inbox/new."""
    new = os.path.join(opts.inbox, "new")
    async with await anyio.open_process([opts.watcher, new]) as w:
        lines = TextReceiveStream(w.stdout)
        buf = ""
        while "\n" not in buf:
            buf += await lines.receive()
        if not buf.startswith("ready"):
            out["error"] = f"watcher: {buf!r}"
            return False
        buf = buf.split("\n", 1)[1]
        await anyio.run_process(opts.hook, check=True)
        while "\n" not in buf:
            buf += await lines.receive()
        at = time.time()
        await w.wait()
    name = buf.split("\n", 1)[0]
    arrived = os.stat(os.path.join(new, name)).st_ctime
    out["watcher_ms"].append((at - arrived) * 1e3)
    os.rename(os.path.join(new, name), os.path.join(opts.inbox, "cur", name))
    return True


async def latency(session, opts, out):
    """--count posts through the tool and --count runs of lw-post (--lw-post
    BIN, same mailbox) as a process, in alternating rounds of 20."""
    await session.initialize()
    mcp_ms, proc_ms = [], []
    env = dict(os.environ)

    async def by_mcp(r):
        for i in range(r, min(r + 20, opts.count)):
            t0 = time.perf_counter()
            res = await session.call_tool("post", {"kind": "status", "subject": f"mcp {i}", "body": "x"})
            mcp_ms.append((time.perf_counter() - t0) * 1e3)
            assert not res.is_error, text(res)

    async def by_process(r):
        for i in range(r, min(r + 20, opts.count)):
            t0 = time.perf_counter()
            await anyio.run_process([opts.lw_post, "-k", "status", "-s", f"proc {i}", "x"], env=env, check=True)
            proc_ms.append((time.perf_counter() - t0) * 1e3)

    for r in range(0, opts.count, 20):
        for side in (by_mcp, by_process) if r // 20 % 2 == 0 else (by_process, by_mcp):
            await side(r)
    out["mcp_ms"], out["proc_ms"] = mcp_ms, proc_ms


def child_pid():
    me = str(os.getpid())
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = stat[stat.rindex(")") + 2 :].split()[1]
        if ppid == me and name == "lw-mcp":
            return int(d)
    return None


async def idle(session, opts, out):
    await session.initialize()
    await session.list_tools()
    await call(session, "whoami", {})
    await anyio.sleep(1.0)
    pid = child_pid()
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1])


async def until_updated(n, timeout=20.0):
    """Waits for the n-th resources/updated notification (False on timeout)."""
    with anyio.move_on_after(timeout):
        while len(UPDATED) < n:
            await _updated_recv.receive()
        return True
    return False


async def protocol_error(coro):
    try:
        await coro
    except Exception as e:
        err = getattr(e, "error", None)
        return {"error": getattr(err, "code", None) if err is not None else getattr(e, "code", None),
                "message": str(e)}
    return {"ok": True}


async def bell(session, opts, out):
    import warnings

    warnings.simplefilter("ignore")  # resources/subscribe is the 2025 protocols' way
    init = await session.initialize()
    out["protocol"] = init.protocol_version
    caps = init.capabilities.resources
    out["subscribe_capability"] = bool(caps and caps.subscribe)
    listed = await session.list_resources()
    out["resources"] = [str(r.uri) for r in listed.resources]
    out["mime"] = [r.mime_type for r in listed.resources]
    out["subscribe_unknown"] = await protocol_error(session.subscribe_resource("outbox://"))
    out["read_unknown"] = await protocol_error(session.read_resource("outbox://"))
    await session.subscribe_resource("inbox://")
    rounds = out["rounds"] = []
    for i in range(4):
        if i == 2:
            first = out["read1"]["messages"][0]["id"]
            out["ack"] = await call(session, "ack", {"id": first})
        if i == 3:
            await session.unsubscribe_resource("inbox://")
        t0 = time.time()
        proc = await anyio.run_process(["sh", "-c", opts.hook, "sh", str(i)], check=False)
        done = time.time()
        r = {"hook_status": proc.returncode, "hook_stderr": proc.stderr.decode(errors="replace")}
        if i < 3:
            r["arrived"] = await until_updated(i + 1)
            r["latency_s"] = round(UPDATED[-1][1] - done, 3) if r["arrived"] else None
        else:
            # Unsubscribed: the wait tool sees the delivery; the bell must not.
            r["wait"] = await call(session, "wait", {"timeout": 20})
        await session.send_ping()
        r["updated"] = len(UPDATED)
        r["hook_s"] = round(done - t0, 3)
        rounds.append(r)
        if i == 0:
            got = await session.read_resource("inbox://")
            c = got.contents[0]
            out["read1_mime"] = c.mime_type
            out["read1"] = json.loads(c.text)
    out["uris"] = sorted({u for u, _ in UPDATED})


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["flow", "posts", "wake", "killposts", "latency", "idle", "bell"])
    p.add_argument("--lw-post", default="lw-post")
    p.add_argument("--hook", default="true")
    p.add_argument("--peer", default="mediator")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--tag", default="post")
    p.add_argument("--inbox", default="")
    p.add_argument("--watcher", default="")
    p.add_argument("--progress", action="store_true")
    argv = sys.argv[1:]
    if "--" not in argv:
        p.error("give the server command after --")
    cut = argv.index("--")
    opts = p.parse_args(argv[:cut])
    server = argv[cut + 1 :]
    params = StdioServerParameters(command=server[0], args=server[1:], env=dict(os.environ))
    out = {}
    if opts.scenario == "killposts":
        await killposts(params, opts, out)
        print(json.dumps(out), flush=True)
        return
    try:
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w, message_handler=on_message) as session:
                scenarios = {"flow": flow, "posts": posts, "wake": wake, "latency": latency, "idle": idle,
                             "bell": bell}
                await scenarios[opts.scenario](session, opts, out)
    except Exception as e:
        import traceback

        traceback.print_exc()
        out.setdefault("client_error", repr(e))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    anyio.run(main)
