#!/usr/bin/env python3
# A scripted model for the agent tests and `scripts/main-job --agent`: the Anthropic Messages API (SSE),
# the OpenAI Responses API (SSE) and the Gemini API (generateContent and
# streamGenerateContent?alt=sse, countTokens), over TLS, replaying a script of tool calls
# (named as the request's tools name them: Claude Code's Bash and
# mcp__loopwright__TOOL, opencode's bash and loopwright_TOOL, Copilot CLI's
# bash and loopwright-TOOL, Gemini CLI's
# run_shell_command and mcp_loopwright_TOOL; Gemini CLI's own JSON
# questions, its model router's, get a value of the schema they ask for)
# and recording every request it receives (method, path, headers, body) as
# one JSON line in /srv/out/requests.jsonl.
#
# The script (LW_SCRIPT, JSON): a list of shell commands.  Turn N of a
# conversation (N = the number of tool results the request carries) runs
# command N; after the last one the model says "done".  A prompt holding
# RESUME-CHECK is answered at once with how many messages the request
# carried, so a test can see that a resumed run sent the earlier ones.
# A prompt holding STATUS-401 is answered 401 (a provider refusing the
# key); one holding HANG-STEP gets the start of an answer and then nothing
# for an hour (an agent that never finishes).  USAGE-IN=N sets the input
# tokens of the answer's usage (default 10; output is 5); NO-STREAM answers
# one JSON message instead of SSE; PAUSE-UNTIL=PATH sends the answer's
# first event (with its usage) and the rest once PATH exists.
#
# LW_MODEL_PORT (8443), LW_MODEL_TLS (1; 0 is plain HTTP on 127.0.0.1) and
# LW_MODEL_OUT (/srv/out/requests.jsonl) let a test run it on the host, as
# the upstream of the model proxy (tests/agent/model_proxy.rs).
#
# A script entry "STOP" ends the turn there ("done"); when the agent goes on
# (a Stop hook blocked its stop), the next entry follows: the turn counts
# the tool results and the "done" answers the conversation carries.  Each
# recorded request has "t", the time it arrived (seconds since the epoch).
import http.server
import json
import os
import re
import ssl
import sys
import threading
import time

SCRIPT = json.loads(os.environ["LW_SCRIPT"])
SEEN = {}    # role -> the turn of its first request holding a step's "until"
ASKED = {}   # role -> requests so far
OUT = os.environ.get("LW_MODEL_OUT", "/srv/out/requests.jsonl")
PORT = int(os.environ.get("LW_MODEL_PORT", "8443"))
TLS = os.environ.get("LW_MODEL_TLS", "1") != "0"
LOCK = threading.Lock()


def record(handler, body, role):
    with LOCK, open(OUT, "a") as f:
        f.write(json.dumps({
            "method": handler.command, "path": handler.path,
            "headers": {k.lower(): v for k, v in handler.headers.items()},
            "body": body.decode("utf-8", "replace"), "t": time.time(), "role": role,
        }) + "\n")


def strings(o):
    """Every string in a decoded request, joined: what the model reads."""
    if isinstance(o, str):
        return o
    if isinstance(o, dict):
        return "\n".join(strings(v) for v in o.values())
    if isinstance(o, list):
        return "\n".join(strings(v) for v in o)
    return ""


def role_of(req):
    if not isinstance(SCRIPT, dict):
        return None
    text = strings(req)
    return next((k for k in SCRIPT if k in text), None)


def script_of(role):
    if isinstance(SCRIPT, dict):
        return SCRIPT.get(role) or []
    return SCRIPT


def has_stop(script):
    return "STOP" in script


def step_at(req, role, turn):
    """The entry for this turn of the role's script (None: done)."""
    script = script_of(role)
    with LOCK:
        ASKED[role] = ASKED.get(role, 0) + 1
        for e in script:
            if isinstance(e, dict) and "until" in e and role not in SEEN and e["until"] in strings(req):
                SEEN[role] = turn
                print("scripted model: %s request %d (turn %d) first holds %s at %.3f" % (
                    role, ASKED[role], turn, e["until"], time.time()), flush=True)
        seen = SEEN.get(role)
    at = 0
    for e in script:
        if isinstance(e, dict) and "repeat" in e:
            n = e.get("max", 60)
            if seen is not None:
                n = min(n, max(0, seen - at))
            if turn < at + n:
                return e["repeat"]
            at += n
        else:
            if turn == at:
                return e
            at += 1
    return None


def sse(events):
    return "".join("event: %s\ndata: %s\n\n" % (e["type"], json.dumps(e)) for e in events).encode()


def input_tokens(last):
    m = re.search(r"USAGE-IN=([0-9]+)", last)
    return int(m.group(1)) if m else 10


def tool_names(req):
    return [t.get("name") for t in req.get("tools") or [] if isinstance(t, dict)]


def mcp_name(req, tool):
    names = tool_names(req)
    # Copilot CLI names them loopwright-TOOL.
    for n in ("mcp__loopwright__" + tool, "loopwright_" + tool, "loopwright-" + tool):
        if n in names:
            return n
    return "mcp__loopwright__" + tool


def anthropic(req, events=False):
    msgs = req.get("messages", [])
    role = role_of(req)
    results = sum(1 for m in msgs if isinstance(m.get("content"), list)
                  for c in m["content"] if c.get("type") == "tool_result")
    if has_stop(script_of(role)):
        results += sum(1 for m in msgs if m.get("role") == "assistant"
                       for c in (m["content"] if isinstance(m.get("content"), list)
                                 else [{"type": "text", "text": m.get("content")}])
                       if c.get("type") == "text" and c.get("text") == "done")
    last = json.dumps(msgs[-1]) if msgs else ""
    model = req.get("model", "scripted")
    start = {"type": "message_start", "message": {
        "id": "msg_%d" % results, "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens(last), "output_tokens": 1}}}
    step = step_at(req, role, results)
    if "RESUME-CHECK" in last or step is None or not req.get("tools") or step == "STOP":
        text = "done" if "RESUME-CHECK" not in last else "resumed with %d messages" % len(msgs)
        block = [{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                 {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
                 {"type": "content_block_stop", "index": 0}]
        stop = "end_turn"
    else:
        if isinstance(step, dict):
            # A tool of the loopwright MCP server (lw-mcp), as the CLI named
            # it: Claude Code's mcp__loopwright__post, opencode's loopwright_post,
            # Copilot CLI's loopwright-post.
            name, args = mcp_name(req, step["mcp"]), json.dumps(step["args"])
        else:
            # Claude Code's Bash; opencode's bash (it takes Bash too, but
            # says so in its answer).
            name = "bash" if "bash" in tool_names(req) else "Bash"
            args = json.dumps({"command": step, "description": "step %d" % results})
        block = [{"type": "content_block_start", "index": 0, "content_block": {
                    "type": "tool_use", "id": "toolu_%d" % results, "name": name, "input": {}}},
                 {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": args}},
                 {"type": "content_block_stop", "index": 0}]
        stop = "tool_use"
    end = [{"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 5}}, {"type": "message_stop"}]
    if events:
        return [start] + block + end
    return sse([start] + block + end)


def openai(req):
    items = req.get("input", [])
    role = role_of(req)
    results = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
    if has_stop(script_of(role)):
        results += sum(1 for i in items if isinstance(i, dict) and i.get("role") == "assistant"
                       and isinstance(i.get("content"), list)
                       for c in i["content"] if c.get("text") == "done")
    last = json.dumps(items[-1]) if items else ""
    rid = "resp_%d" % results
    step = step_at(req, role, results)
    if "RESUME-CHECK" in last or step is None or step == "STOP":
        text = "done" if "RESUME-CHECK" not in last else "resumed with %d items" % len(items)
        item = {"type": "message", "id": "msg_%d" % results, "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
    else:
        item = {"type": "function_call", "id": "fc_%d" % results, "call_id": "call_%d" % results,
                "name": "exec_command", "status": "completed"}
        if isinstance(step, dict):
            # A tool of the loopwright MCP server (lw-mcp), in Codex's namespace.
            item.update(name=step["mcp"], namespace="mcp__loopwright", arguments=json.dumps(step["args"]))
        else:
            item["arguments"] = json.dumps({"cmd": step})
    events = [
        {"type": "response.created", "response": {"id": rid, "status": "in_progress", "output": []}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": {"id": rid, "status": "completed", "output": [item],
            "usage": {"input_tokens": input_tokens(last), "output_tokens": 5,
                      "total_tokens": input_tokens(last) + 5,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}},
    ]
    return sse(events)


def gemini_tool_names(req):
    return [d.get("name") for t in req.get("tools") or [] if isinstance(t, dict)
            for d in t.get("functionDeclarations") or [] if isinstance(d, dict)]


def gemini_parts(req):
    return [p for c in req.get("contents") or [] if isinstance(c, dict)
            for p in c.get("parts") or [] if isinstance(p, dict)]


def filled(schema):
    """A value of a JSON schema (Gemini's: types in capitals or not): the
    CLI's own JSON questions (its model router, its next-speaker check)
    get a valid answer, the first of an enum."""
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    t = str(schema.get("type", "")).upper()
    if t == "OBJECT":
        return {k: filled(v) for k, v in (schema.get("properties") or {}).items()}
    return {"STRING": "scripted", "INTEGER": 1, "NUMBER": 1, "BOOLEAN": False, "ARRAY": []}.get(t)


def gemini(req, stream=True):
    """Gemini's generateContent: one answer (SSE of one chunk when streaming)
    with text or a functionCall, and its usageMetadata."""
    contents = req.get("contents") or []
    role = role_of(req)
    results = sum(1 for p in gemini_parts(req) if "functionResponse" in p)
    if has_stop(script_of(role)):
        results += sum(1 for c in contents if isinstance(c, dict) and c.get("role") == "model"
                       for p in c.get("parts") or [] if isinstance(p, dict) and p.get("text") == "done")
    last = json.dumps(contents[-1]) if contents else ""
    names = gemini_tool_names(req)
    step = step_at(req, role, results) if names else None
    config = req.get("generationConfig") or {}
    if config.get("responseMimeType") == "application/json":
        part = {"text": json.dumps(filled(config.get("responseJsonSchema") or config.get("responseSchema")))}
    elif "RESUME-CHECK" in last or step is None or step == "STOP":
        text = "done" if "RESUME-CHECK" not in last else "resumed with %d contents" % len(contents)
        part = {"text": text}
    elif isinstance(step, dict):
        # A tool of the loopwright MCP server (lw-mcp), as Gemini CLI names
        # it: mcp_loopwright_post (or the bare name of older versions).
        name = next((n for n in ("mcp_loopwright_" + step["mcp"], "loopwright__" + step["mcp"], step["mcp"])
                     if n in names), "mcp_loopwright_" + step["mcp"])
        part = {"functionCall": {"name": name, "args": step["args"]}}
    else:
        part = {"functionCall": {"name": "run_shell_command",
                                 "args": {"command": step, "description": "step %d" % results}}}
    n = input_tokens(last)
    doc = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
           "usageMetadata": {"promptTokenCount": n, "candidatesTokenCount": 5, "totalTokenCount": n + 5},
           "modelVersion": "scripted", "responseId": "r%d" % results}
    if not stream:
        return json.dumps(doc).encode()
    return ("data: %s\r\n\r\n" % json.dumps(doc)).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        path = self.path.split("?")[0]
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            req = {}
        record(self, body, role_of(req))
        if b"STATUS-401" in body:
            out = b'{"type":"error","error":{"type":"authentication_error","message":"scripted: invalid key"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        if b"HANG-STEP" in body:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            ev = b"event: ping\ndata: {\"type\": \"ping\"}\n\n"
            if path.startswith("/v1beta/"):
                ev = b'data: {"candidates": [{"content": {"role": "model", "parts": [{"text": "..."}]}}]}\r\n\r\n'
            self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            self.wfile.flush()
            time.sleep(3600)
            return
        pause = re.search(rb"PAUSE-UNTIL=([^\s\"\\]+)", body)
        if path == "/v1/messages" and (pause or b"NO-STREAM" in body):
            events = anthropic(req, events=True)
            if b"NO-STREAM" in body:
                msg = dict(events[0]["message"], content=[{"type": "text", "text": "done"}],
                           stop_reason="end_turn")
                msg["usage"] = {"input_tokens": msg["usage"]["input_tokens"], "output_tokens": 5}
                out = json.dumps(msg).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i, part in enumerate([sse(events[:1]), sse(events[1:])]):
                if i == 1:
                    while not os.path.exists(pause.group(1).decode()):
                        time.sleep(0.02)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        if path == "/v1/messages":
            out = anthropic(req)
        elif path == "/v1/responses":
            out = openai(req)
        elif re.fullmatch(r"/v1beta/models/[^/:]+:(stream)?[gG]enerateContent", path):
            stream = path.endswith(":streamGenerateContent")
            out = gemini(req, stream)
            if not stream:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return
        elif re.fullmatch(r"/v1beta/models/[^/:]+:countTokens", path):
            out = json.dumps({"totalTokens": len(body) // 4}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        else:
            out = b'{"error":"not scripted"}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_any


srv = http.server.ThreadingHTTPServer(("0.0.0.0" if TLS else "127.0.0.1", PORT), Handler)
srv.daemon_threads = True
if TLS:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain("/srv/tls/server.pem", "/srv/tls/server.key")
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print("scripted model ready on port %d" % srv.server_address[1], flush=True)
srv.serve_forever()
