//! What an agent is told at create: its context file and its MCP registration.
//!
//! Both are written into the agent's HOME (`/work/home`, on the sandbox's
//! own volume), never into the repository, so they are not committed and
//! not seen by other sandboxes.  The context file is the one the kit names
//! (`~/.claude/CLAUDE.md`, `~/.codex/AGENTS.md`: each CLI reads it as the
//! user's own instructions); it says who the agent is (sandbox, branch,
//! scopes, peers from the registry) and how to use the door.  The MCP
//! registration names `/usr/local/bin/lw-mcp`; a CLI that cannot start it
//! (an older toolkit without lw-mcp) reports the server as failed and goes on.
//! `~/.claude/settings.json` (Claude Code) or `~/.codex/hooks.json` (Codex)
//! installs the bell (crates/mailbox/src/bell.rs): `lw-inbox --hook CLI` after every tool
//! call, before each prompt, at session start, and at a stop.  opencode has
//! no command hooks: a plugin (runtime/agents/opencode-bell.js, in
//! `~/.config/opencode/plugin/`) asks `lw-inbox --hook opencode` after every
//! tool call and appends the answer to the tool's result.  Copilot CLI
//! reads user-level hooks from `~/.copilot/hooks/*.json` ([`copilot_hooks`]).
//! Gemini CLI's
//! hooks (`~/.gemini/settings.json`, beside its MCP servers) take the same
//! answers under its own event names: `lw-inbox --hook gemini` at
//! `SessionStart`, `BeforeAgent`, `AfterTool` and `AfterAgent`.

use std::fmt::Write as _;

use super::kit::{Kit, McpFormat};
use super::{Credential, proxy};
use mailbox::registry;
use wall::{HOME, REPO};

/// The MCP server every agent gets.
pub const MCP_COMMAND: &str = "/usr/local/bin/lw-mcp";

/// The bell every Claude Code agent gets, run by its hooks.
pub const INBOX_COMMAND: &str = "/usr/local/bin/lw-inbox";

/// opencode's user configuration directory, under HOME.
pub const OPENCODE_DIR: &str = ".config/opencode";

/// The bell as an opencode plugin; `@MAX_BLOCKS@` is replaced.
const OPENCODE_BELL: &str = include_str!("../../../runtime/agents/opencode-bell.js");

/// opencode's user configuration: the MCP server, and with the proxy
/// credential its anthropic provider pointed at the model proxy with the
/// placeholder key (`{env:VAR}` is read from the agent's environment).
fn opencode_config(kit: &Kit, credential: Credential) -> String {
    let mut v = serde_json::json!({
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": false,
        "share": "disabled",
        "mcp": {"loopwright": {"type": "local", "command": [MCP_COMMAND], "enabled": true}},
    });
    if credential == Credential::Proxy {
        v["provider"] = serde_json::json!({"anthropic": {"options": {
            "baseURL": format!("{}/v1", proxy::url()),
            "apiKey": format!("{{env:{}}}", kit.key_env),
        }}});
    }
    serde_json::to_string_pretty(&v).expect("JSON values serialise") + "\n"
}

/// Gemini CLI's user settings: an API key (the placeholder, or the
/// agent's own with `credential = env`), no usage statistics or update
/// checks (hosts the sandbox cannot reach), lw-mcp trusted (its tools run
/// without asking; --yolo would approve them anyway), and the bell as its
/// hooks: the events are Gemini's names for Claude Code's (BeforeAgent for
/// UserPromptSubmit, AfterTool for PostToolUse, AfterAgent for Stop), the
/// answers the same.  A hook's timeout is in milliseconds.
fn gemini_settings(max_blocks: u32) -> String {
    let hook = serde_json::json!([{"hooks": [{
        "type": "command",
        "name": "loopwright-bell",
        "command": format!("{INBOX_COMMAND} --hook gemini --max-blocks {max_blocks}"),
        "timeout": 10000,
    }]}]);
    let v = serde_json::json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": false},
        "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
        "mcpServers": {"loopwright": {"command": MCP_COMMAND, "args": [], "trust": true}},
        "hooks": {
            "SessionStart": hook.clone(),
            "BeforeAgent": hook.clone(),
            "AfterTool": [{"matcher": "*", "hooks": hook[0]["hooks"].clone()}],
            "AfterAgent": hook,
        },
    });
    serde_json::to_string_pretty(&v).expect("JSON values serialise") + "\n"
}

/// The bell's hooks (crates/mailbox/src/bell.rs) for `cli`: Claude Code's user settings,
/// or Codex's `hooks.json`, which has the same shape (Codex matches every
/// tool when the matcher is left out).  A hook that fails or times out
/// only costs the agent that turn's news.
pub fn hooks(cli: &str, max_blocks: u32) -> String {
    let hook = serde_json::json!([{"hooks": [{
        "type": "command",
        "command": format!("{INBOX_COMMAND} --hook {cli} --max-blocks {max_blocks}"),
        "timeout": 10,
    }]}]);
    let after_tools = if cli == "claude" {
        serde_json::json!([{"matcher": "*", "hooks": hook[0]["hooks"].clone()}])
    } else {
        hook.clone()
    };
    let v = serde_json::json!({"hooks": {
        "SessionStart": hook.clone(),
        "UserPromptSubmit": hook.clone(),
        "PostToolUse": after_tools,
        "Stop": hook,
    }});
    serde_json::to_string_pretty(&v).expect("JSON values serialise") + "\n"
}

/// The bell as Copilot CLI's user-level hooks (`$COPILOT_HOME/hooks/`,
/// loaded in `-p` mode too): the PascalCase event names, whose input is
/// Claude Code's (`hook_event_name`, `session_id`, `source`,
/// `stop_hook_active`).  Copilot 1.0.102 drops a command hook's output for
/// `UserPromptSubmit`, so that event is left out: a message told there would
/// be marked announced and never reach the model.  `SessionStart` and
/// `PostToolUse` add `additionalContext` (`lw-inbox --hook copilot` prints
/// it at the top level, as Copilot reads it); `Stop` blocks with a reason,
/// which Copilot sends as the next prompt.
pub fn copilot_hooks(max_blocks: u32) -> String {
    let hook = serde_json::json!([{
        "type": "command",
        "command": format!("{INBOX_COMMAND} --hook copilot --max-blocks {max_blocks}"),
        "timeoutSec": 10,
    }]);
    let v = serde_json::json!({"version": 1, "hooks": {
        "SessionStart": hook.clone(),
        "PostToolUse": hook.clone(),
        "Stop": hook,
    }});
    serde_json::to_string_pretty(&v).expect("JSON values serialise") + "\n"
}

/// The context file's text.
pub fn context(
    kit: &Kit,
    me: &str,
    branch: &str,
    scope: &[String],
    peers: &[registry::Sandbox],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# You are `{me}`, one of several agents working on one repository\n"
    );
    let _ = writeln!(
        s,
        "You work in the loopwright sandbox `{me}`: your clone is `{REPO}`, on branch `{branch}`. \
         Commit your work there with git, on that branch; you cannot push (the host pushes it with \
         `lw-sandbox push {me}`). The sandbox has no network but your model; nothing you install or \
         fetch from elsewhere will arrive."
    );
    if scope.is_empty() {
        let _ = writeln!(s, "\nYou own no declared scope.");
    } else {
        let _ = writeln!(
            s,
            "\nYou own these paths and contracts (your scope): {}.",
            scope
                .iter()
                .map(|x| format!("`{x}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let others: Vec<&registry::Sandbox> = peers.iter().filter(|p| p.name != me).collect();
    if others.is_empty() {
        let _ = writeln!(
            s,
            "\nNo other sandbox was registered when yours was made; `lw-post` to `mediator` reaches whoever comes."
        );
    } else {
        let _ = writeln!(s, "\nYour peers (when this sandbox was made):\n");
        for p in others {
            let _ = writeln!(
                s,
                "- `{}`: branch `{}`, scope {}",
                p.name,
                p.branch.as_deref().unwrap_or("-"),
                if p.scope.is_empty() {
                    "-".to_string()
                } else {
                    p.scope.join(", ")
                }
            );
        }
    }
    let _ = writeln!(
        s,
        "\n## The door: the only way to reach the others\n\n\
         Messages go through a mediator that routes them by kind and scope. Post one with\n\n\
         ```sh\n\
         lw-post --kind KIND --subject 'one line' [--to NAME] [--ref PATH] 'body'\n\
         ```\n\n\
         Kinds: `contract-change` (a shared interface changed; `--ref` says which; it reaches every \
         sandbox whose scope overlaps), `request` (asks `--to NAME` to do something), `handoff` \
         (passes work on to `--to NAME`), `question` (needs a person), `answer` (`--reply-to ID`), \
         `status` (news; nobody must act).\n\n\
         Read what reached you with `lw-inbox` (list), `lw-inbox show ID`; wait for the next \
         message with `lw-inbox --wait` (add `--timeout S` to give up after S seconds). When you \
         change something another sandbox depends on, post a `contract-change` before you go on."
    );
    let _ = writeln!(
        s,
        "\nThe same door is an MCP server, `loopwright` (`{MCP_COMMAND}`), when this toolkit has it."
    );
    let _ = writeln!(
        s,
        "\n(Written by lw-sandbox for kit `{}`; it is not part of the repository.)",
        kit.name
    );
    s
}

/// The MCP registration (and, for codex, the provider), with its path under HOME.
pub fn registration(kit: &Kit, credential: Credential) -> (String, String) {
    match kit.mcp {
        McpFormat::ClaudeJson => (
            format!("{}/lw-mcp.json", kit.state_dir),
            serde_json::json!({"mcpServers": {"loopwright": {"command": MCP_COMMAND, "args": []}}})
                .to_string()
                + "\n",
        ),
        McpFormat::CodexToml => {
            let mut t = String::new();
            let _ = writeln!(t, "# Written by lw-sandbox for kit {}.", kit.name);
            if credential == Credential::Proxy {
                let _ = writeln!(t, "model_provider = \"loopwright\"\n");
                let _ = writeln!(
                    t,
                    "[model_providers.loopwright]\nname = \"loopwright model proxy\""
                );
                let _ = writeln!(t, "base_url = \"{}/v1\"", proxy::url());
                let _ = writeln!(
                    t,
                    "env_key = \"{}\"\nwire_api = \"responses\"\n",
                    kit.key_env
                );
            }
            let _ = writeln!(
                t,
                "[features]\nplugins = false\n\n[analytics]\nenabled = false\n"
            );
            let _ = writeln!(
                t,
                "[mcp_servers.loopwright]\ncommand = \"{MCP_COMMAND}\"\nargs = []"
            );
            (format!("{}/config.toml", kit.state_dir), t)
        }
        McpFormat::OpencodeJson => (
            format!("{OPENCODE_DIR}/opencode.json"),
            opencode_config(kit, credential),
        ),
        // Copilot reads its provider from the environment (the kit's
        // base-url-env and key-env), its MCP servers from here.
        McpFormat::CopilotJson => (
            format!("{}/mcp-config.json", kit.state_dir),
            serde_json::json!({"mcpServers": {"loopwright": {
                "type": "local", "command": MCP_COMMAND, "args": [], "tools": ["*"],
            }}})
            .to_string()
                + "\n",
        ),
        McpFormat::GeminiJson => (
            format!("{}/settings.json", kit.state_dir),
            gemini_settings(mailbox::bell::DEFAULT_MAX_BLOCKS),
        ),
    }
}

/// The files to write under HOME: (path relative to HOME, content).
/// `bell_max_blocks` is `agent.KIT.bell-max-blocks`.
pub fn files(
    kit: &Kit,
    credential: Credential,
    me: &str,
    branch: &str,
    scope: &[String],
    peers: &[registry::Sandbox],
    bell_max_blocks: u32,
) -> Vec<(String, String)> {
    let mut v = vec![(
        kit.context_file.clone(),
        context(kit, me, branch, scope, peers),
    )];
    if kit.mcp == McpFormat::GeminiJson {
        // One file holds the MCP server and the bell's hooks.
        v.push((
            format!("{}/settings.json", kit.state_dir),
            gemini_settings(bell_max_blocks),
        ));
        return v;
    }
    v.push(registration(kit, credential));
    v.push(match kit.mcp {
        McpFormat::ClaudeJson => (
            format!("{}/settings.json", kit.state_dir),
            hooks("claude", bell_max_blocks),
        ),
        McpFormat::CodexToml => (
            format!("{}/hooks.json", kit.state_dir),
            hooks("codex", bell_max_blocks),
        ),
        McpFormat::OpencodeJson => (
            format!("{OPENCODE_DIR}/plugin/loopwright-bell.js"),
            OPENCODE_BELL.replace("@MAX_BLOCKS@", &bell_max_blocks.to_string()),
        ),
        McpFormat::CopilotJson => (
            format!("{}/hooks/loopwright-bell.json", kit.state_dir),
            copilot_hooks(bell_max_blocks),
        ),
        McpFormat::GeminiJson => unreachable!("returned above"),
    });
    v
}

/// The script that writes one file under HOME from its standard input.
pub fn write_script(rel: &str) -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        "set -eu; f=\"$1/$2\"; mkdir -p \"$(dirname \"$f\")\"; cat > \"$f\"".into(),
        "lw-agent-context".into(),
        HOME.into(),
        rel.into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_names_the_sandbox_branch_scope_peers_and_the_door() {
        let kit = super::super::kit::find(None, "claude").unwrap();
        let peers = vec![
            registry::Sandbox::new("api", Some("lw/api".into()), vec!["src/api/**".into()]),
            registry::Sandbox::new("web", Some("lw/web".into()), vec![]),
        ];
        let c = context(&kit, "api", "lw/api", &["src/api/**".into()], &peers);
        for want in [
            "`api`",
            "`lw/api`",
            "`src/api/**`",
            "- `web`: branch `lw/web`",
            "lw-post --kind",
            "lw-inbox --wait",
            "contract-change",
            "lw-mcp",
        ] {
            assert!(c.contains(want), "{want} in {c}");
        }
        assert!(!c.contains("- `api`"), "not its own peer");
        let (path, json) = registration(&kit, Credential::Proxy);
        assert_eq!(path, ".claude/lw-mcp.json");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["mcpServers"]["loopwright"]["command"], MCP_COMMAND);
        let codex = super::super::kit::find(None, "codex").unwrap();
        let (path, toml) = registration(&codex, Credential::Proxy);
        assert_eq!(path, ".codex/config.toml");
        assert!(
            toml.contains("[mcp_servers.loopwright]\ncommand = \"/usr/local/bin/lw-mcp\""),
            "{toml}"
        );
        assert!(
            toml.contains("base_url = \"http://lw-model:8080/v1\""),
            "{toml}"
        );
        assert!(toml.contains("env_key = \"OPENAI_API_KEY\""), "{toml}");
    }

    #[test]
    fn claude_and_codex_get_the_bell_in_their_hooks() {
        let kit = super::super::kit::find(None, "claude").unwrap();
        let f = files(&kit, Credential::Proxy, "a", "b", &[], &[], 5);
        let (path, text) = f.last().unwrap();
        assert_eq!(path, ".claude/settings.json");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        for event in ["SessionStart", "UserPromptSubmit", "PostToolUse", "Stop"] {
            assert_eq!(
                v["hooks"][event][0]["hooks"][0]["command"],
                "/usr/local/bin/lw-inbox --hook claude --max-blocks 5",
                "{event}: {text}"
            );
        }
        assert_eq!(v["hooks"]["PostToolUse"][0]["matcher"], "*");
        let codex = super::super::kit::find(None, "codex").unwrap();
        let f = files(&codex, Credential::Proxy, "a", "b", &[], &[], 5);
        let (path, text) = f.last().unwrap();
        assert_eq!(path, ".codex/hooks.json");
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            v["hooks"]["PostToolUse"][0]["hooks"][0]["command"],
            "/usr/local/bin/lw-inbox --hook codex --max-blocks 5"
        );
        assert!(v["hooks"]["PostToolUse"][0].get("matcher").is_none());
    }

    #[test]
    fn opencode_gets_its_provider_mcp_server_and_the_bell_as_a_plugin() {
        let kit = super::super::kit::find(None, "opencode").unwrap();
        let f = files(&kit, Credential::Proxy, "a", "b", &[], &[], 4);
        let paths: Vec<&str> = f.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                ".config/opencode/AGENTS.md",
                ".config/opencode/opencode.json",
                ".config/opencode/plugin/loopwright-bell.js"
            ]
        );
        let v: serde_json::Value = serde_json::from_str(&f[1].1).unwrap();
        assert_eq!(v["mcp"]["loopwright"]["command"][0], MCP_COMMAND);
        assert_eq!(
            v["provider"]["anthropic"]["options"]["baseURL"],
            "http://lw-model:8080/v1"
        );
        assert_eq!(
            v["provider"]["anthropic"]["options"]["apiKey"],
            "{env:ANTHROPIC_API_KEY}"
        );
        assert!(
            f[2].1.contains(r#"const MAX_BLOCKS = "4";"#)
                && f[2].1.contains("\"--hook\", \"opencode\""),
            "{}",
            f[2].1
        );
        // Holding its own key, opencode talks to its provider as it would.
        let (_, text) = registration(&kit, Credential::Env);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(v.get("provider").is_none(), "{text}");
    }

    #[test]
    fn copilot_gets_its_instructions_mcp_servers_and_the_bell_as_user_hooks() {
        let kit = super::super::kit::find(None, "copilot").unwrap();
        let f = files(&kit, Credential::Proxy, "a", "b", &[], &[], 4);
        let paths: Vec<&str> = f.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                ".copilot/copilot-instructions.md",
                ".copilot/mcp-config.json",
                ".copilot/hooks/loopwright-bell.json"
            ]
        );
        let v: serde_json::Value = serde_json::from_str(&f[1].1).unwrap();
        assert_eq!(v["mcpServers"]["loopwright"]["command"], MCP_COMMAND);
        assert_eq!(v["mcpServers"]["loopwright"]["tools"][0], "*");
        let h: serde_json::Value = serde_json::from_str(&f[2].1).unwrap();
        assert_eq!(h["version"], 1);
        let events: Vec<&String> = h["hooks"].as_object().unwrap().keys().collect();
        assert_eq!(events, ["PostToolUse", "SessionStart", "Stop"]);
        assert_eq!(
            h["hooks"]["Stop"][0]["command"],
            "/usr/local/bin/lw-inbox --hook copilot --max-blocks 4"
        );
        // No key and no URL in a file: Copilot reads both from its
        // environment, the placeholder and the proxy's address.
        assert!(!f.iter().any(|(_, t)| t.contains("lw-model")), "{f:?}");
    }

    #[test]
    fn gemini_gets_its_api_key_auth_mcp_server_and_the_bell_in_one_settings_file() {
        let kit = super::super::kit::find(None, "gemini").unwrap();
        let f = files(&kit, Credential::Proxy, "a", "b", &[], &[], 2);
        let paths: Vec<&str> = f.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, [".gemini/GEMINI.md", ".gemini/settings.json"]);
        let v: serde_json::Value = serde_json::from_str(&f[1].1).unwrap();
        assert_eq!(v["security"]["auth"]["selectedType"], "gemini-api-key");
        assert_eq!(v["privacy"]["usageStatisticsEnabled"], false);
        assert_eq!(v["mcpServers"]["loopwright"]["command"], MCP_COMMAND);
        for event in ["SessionStart", "BeforeAgent", "AfterTool", "AfterAgent"] {
            assert_eq!(
                v["hooks"][event][0]["hooks"][0]["command"],
                "/usr/local/bin/lw-inbox --hook gemini --max-blocks 2",
                "{event}"
            );
        }
        assert_eq!(v["hooks"]["AfterTool"][0]["matcher"], "*");
        assert_eq!(
            registration(&kit, Credential::Env).0,
            ".gemini/settings.json"
        );
    }
}
