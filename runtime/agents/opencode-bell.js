// The bell for opencode (crates/mailbox/src/bell.rs), written by lw-sandbox
// into the agent's HOME as ~/.config/opencode/plugin/loopwright-bell.js.
//
// opencode has no command hooks; its plugins run inside it and may change a
// tool's result before the model reads it (`tool.execute.after`).  After
// every tool call this asks `lw-inbox --hook opencode` what is new, as
// Claude Code's PostToolUse hook does, and appends the answer's
// additionalContext to the tool's output: the next request carries it.
// The first call of a session in this process is a SessionStart (startup
// for a session opencode made in this process, resume for one it
// continued), so a new session is told again what is unread.  opencode has
// no stop that a plugin can refuse: the bell never blocks one.  Whatever
// fails, the tool's result is left as it was.
import { spawnSync } from "node:child_process";

const INBOX = "/usr/local/bin/lw-inbox";
const MAX_BLOCKS = "@MAX_BLOCKS@";

export const LoopwrightBell = async () => {
  const created = new Set();
  const begun = new Set();
  const ask = (event, sessionID) => {
    const input = { hook_event_name: event, session_id: sessionID };
    if (event === "SessionStart") input.source = created.has(sessionID) ? "startup" : "resume";
    const r = spawnSync(INBOX, ["--hook", "opencode", "--max-blocks", MAX_BLOCKS], {
      input: JSON.stringify(input),
      encoding: "utf8",
      timeout: 10000,
    });
    try {
      const a = JSON.parse(r.stdout || "null");
      const text = a && a.hookSpecificOutput && a.hookSpecificOutput.additionalContext;
      return typeof text === "string" ? text : "";
    } catch {
      return "";
    }
  };
  return {
    event: async ({ event }) => {
      if (event && event.type === "session.created") {
        const id = event.properties && event.properties.info && event.properties.info.id;
        if (id) created.add(id);
      }
    },
    "tool.execute.after": async (input, output) => {
      try {
        const id = input.sessionID;
        let told = "";
        if (!begun.has(id)) {
          begun.add(id);
          told = ask("SessionStart", id);
        }
        const more = ask("PostToolUse", id);
        told = [told, more].filter((t) => t).join("\n");
        if (told && output && typeof output.output === "string") {
          output.output += "\n\n" + told;
        }
      } catch {
        // The agent goes on without the bell.
      }
    },
  };
};
