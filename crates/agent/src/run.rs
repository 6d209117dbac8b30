//! `lw-sandbox run`: the kit's headless command, inside, with a transcript.
//!
//! Before the agent starts: the sandbox and its model proxy are running, and
//! the key is read on the host (missing: exit 78, naming the variable, and
//! nothing runs) and written to the proxy's key file.  The agent runs as the
//! sandbox's user in `/work/repo` with its standard input closed.  Every line
//! it prints is kept, in order, in `ROOT/transcripts/NAME/RUN.jsonl` (one file
//! per run): a `lw-run` header, the agent's own JSON lines verbatim, its
//! standard error as `lw-stderr` records, and a `lw-exit` record.  The same
//! lines go to standard output with `--json`; otherwise a one-line summary
//! per event.  The status is the agent's (124 when `--timeout` ended it).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::kit::{self, Kit};
use super::lines::{Lines, MAX_LINE};
use super::{AgentRecord, Credential, Settings, proxy};
use base::error::{Error, Exit, Result};
use base::visible::visible_line;
use engine::{ExecIo, NetworkEngine, SandboxEngine};
use engine::{ExecRequest, OutStream};
use mailbox::layout::Root;
use wall::REPO;

/// Status when `--timeout` ended the agent (as timeout(1)).
pub const TIMED_OUT: i64 = 124;

pub struct RunOptions {
    pub prompt: String,
    pub resume: bool,
    pub json: bool,
    pub timeout: Option<Duration>,
}

/// What a run did.
pub struct Ran {
    pub status: i64,
    pub transcript: PathBuf,
}

/// The sandbox an agent runs in, as its record says (lib/sandbox/agent.rs
/// makes one from a sandbox's record).
pub struct Target<'a> {
    pub name: &'a str,
    pub container: &'a str,
    pub uid: u32,
    /// The project's top directory; empty when the sandbox was made outside one.
    pub project: &'a Path,
    pub agent: Option<&'a AgentRecord>,
    /// The OCI runtime of its container (gVisor's execs go through lw-confine).
    pub runtime: &'a str,
}

/// The kit and settings of an agent sandbox.
pub fn kit_of(rec: &Target) -> Result<(Kit, Settings, Credential)> {
    let Some(agent) = rec.agent else {
        return Err(Error::usage(format!(
            "sandbox '{}' has no agent; create one with lw-sandbox create NAME --branch B --agent KIT",
            rec.name
        )));
    };
    let project = if rec.project.as_os_str().is_empty() {
        None
    } else {
        wall::config::project(rec.project)?
    };
    let kit = kit::find(project.as_ref().map(|p| p.top.as_path()), &agent.kit)?;
    let settings = Settings::from_project(project.as_ref(), &kit)?;
    Ok((kit, settings, agent.credential))
}

fn transcript_path(root: &Path, name: &str) -> PathBuf {
    let t = base::time::rfc3339(base::time::now()).replace(':', "");
    root.join("transcripts")
        .join(name)
        .join(format!("{t}-{:08x}.jsonl", base::id::random128() as u32))
}

/// Runs the agent of the sandbox `rec`; progress goes to `out`, warnings to `warn`.
pub fn run(
    engine: &dyn SandboxEngine,
    root: &Root,
    rec: &Target,
    opts: &RunOptions,
    out: &mut dyn Write,
    warn: &mut dyn FnMut(&str),
) -> Result<Ran> {
    let name = rec.name;
    let (kit, settings, credential) = kit_of(rec)?;
    for w in &settings.warnings {
        warn(w);
    }
    let key = settings.read_key(&kit)?;
    running(engine, rec)?;
    let mut env = rec.agent.map(|a| a.env.clone()).unwrap_or_default();
    let path = transcript_path(&root.dir, name);
    let run_id = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    hand_key(
        engine,
        root,
        rec,
        (&kit, &settings, credential),
        (&key, &run_id),
        &mut env,
        warn,
    )?;
    drop(key);
    let cmd = command(&kit, opts);
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).map_err(|e| Error::io("cannot create", d, e))?;
    }
    let mut file = fs::File::create(&path).map_err(|e| Error::io("cannot create", &path, e))?;
    let header = serde_json::json!({
        "type": "lw-run", "sandbox": name, "kit": kit.name, "resume": opts.resume,
        "prompt": opts.prompt, "started": base::time::rfc3339(base::time::now()),
        "command": kit.command("{prompt}", opts.resume),
    });
    let record = |line: &str, out: &mut dyn Write, file: &mut fs::File| {
        let _ = writeln!(file, "{line}");
        let _ = file.flush();
        if opts.json {
            let _ = writeln!(out, "{line}");
        } else if let Some(s) = summary(line) {
            let _ = writeln!(out, "{s}");
        }
        let _ = out.flush();
    };
    record(&header.to_string(), out, &mut file);
    let req = ExecRequest {
        cmd: wall::confined(rec.runtime, cmd),
        env,
        user: Some(format!("{0}:{0}", rec.uid)),
        workdir: Some(REPO.into()),
    };
    // A cap the proxy reached is told to the person while the agent runs
    // (each line it prints may be its CLI retrying a 429), and at the end.
    let mut caps = CapWatch::new(root, name, &kit.name);
    let keep = credential == Credential::Proxy;
    let (status, kept) = exec_kept(engine, rec.container, &req, keep, &mut |l| {
        record(l, out, &mut file);
        caps.check(false);
    });
    let status = status?;
    caps.check(true);
    for w in caps.said.into_iter().chain(kept) {
        warn(&w);
    }
    let timed_out = opts.timeout.is_some() && status == TIMED_OUT;
    let end = serde_json::json!({"type": "lw-exit", "status": status, "timed_out": timed_out, "transcript": path});
    record(&end.to_string(), out, &mut file);
    if timed_out {
        warn(&format!(
            "the agent did not finish within --timeout; it was stopped (transcript: {})",
            path.display()
        ));
    }
    Ok(Ran {
        status,
        transcript: path,
    })
}

/// The sandbox's container must exist and run.
fn running(engine: &dyn SandboxEngine, rec: &Target) -> Result<()> {
    let name = rec.name;
    let c = engine.inspect(rec.container)?.ok_or_else(|| {
        Error::new(
            Exit::NoInput,
            format!("the container of sandbox '{name}' is gone; lw-sandbox gc reclaims the rest"),
        )
    })?;
    if !c.running {
        return Err(Error::new(
            Exit::Unavailable,
            format!("sandbox '{name}' is stopped; lw-sandbox start {name}"),
        ));
    }
    Ok(())
}

/// Hands the key over: to the model proxy (which is started), or into the
/// agent's environment with `--credential env`.
fn hand_key(
    engine: &dyn SandboxEngine,
    root: &Root,
    rec: &Target,
    (kit, settings, credential): (&Kit, &Settings, Credential),
    (key, run_id): (&[u8], &str),
    env: &mut Vec<String>,
    warn: &mut dyn FnMut(&str),
) -> Result<()> {
    let name = rec.name;
    match credential {
        Credential::Proxy => {
            let dir = proxy::key_dir(&root.state_dir(), name);
            proxy::prepare_dir(&dir, settings)?;
            proxy::write_key(&dir, key)?;
            proxy::write_caps(&dir, &settings.caps)?;
            proxy::write_run(&dir, run_id)?;
            let nets: &dyn NetworkEngine = engine;
            proxy::start(nets, rec.container)?;
        }
        Credential::Env => {
            warn(&format!(
                "--credential env: the key from {} is in the agent's environment INSIDE the sandbox; the agent can read it and send it to any host its allow-list reaches",
                settings.key_source()
            ));
            env.push(format!("{}={}", kit.key_env, String::from_utf8_lossy(key)));
        }
    }
    Ok(())
}

/// Watches the proxy's usage file for cap episodes to tell the person of,
/// at most once a second; what it told (or failed to) becomes warnings.
struct CapWatch<'a> {
    root: &'a Root,
    name: &'a str,
    kit: &'a str,
    last: Option<std::time::Instant>,
    said: Vec<String>,
}

impl<'a> CapWatch<'a> {
    fn new(root: &'a Root, name: &'a str, kit: &'a str) -> Self {
        CapWatch {
            root,
            name,
            kit,
            last: None,
            said: vec![],
        }
    }

    fn check(&mut self, now: bool) {
        if !now
            && self
                .last
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last = Some(std::time::Instant::now());
        let Some(u) = proxy::usage(&self.root.state_dir(), self.name) else {
            return;
        };
        match super::notice::tell_caps(self.root, self.name, self.kit, &u) {
            Ok(told) => self
                .said
                .extend(told.into_iter().map(|s| format!("told the person: {s}"))),
            Err(e) => {
                let w = format!("cannot tell the person of a cap reached: {e}");
                if !self.said.contains(&w) {
                    self.said.push(w);
                }
            }
        }
    }
}

/// The kit's headless command, under timeout(1) with `--timeout`.
fn command(kit: &Kit, opts: &RunOptions) -> Vec<String> {
    let mut cmd = kit.command(&opts.prompt, opts.resume);
    if let Some(t) = opts.timeout {
        let mut w = vec![
            "timeout".to_string(),
            "-k".into(),
            "10".into(),
            format!("{}", t.as_secs().max(1)),
        ];
        w.append(&mut cmd);
        cmd = w;
    }
    cmd
}

/// [`exec_lines`], with the model proxy kept running meanwhile when `keep`
/// (issue 40: a `docker kill` of it left the agent without a model until
/// the next run); returns the status and what the watch did.
fn exec_kept(
    engine: &dyn SandboxEngine,
    container: &str,
    req: &ExecRequest,
    keep: bool,
    sink: &mut dyn FnMut(&str),
) -> (Result<i64>, Vec<String>) {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let keeper = keep.then(|| {
            let nets: &(dyn NetworkEngine + Sync) = engine;
            s.spawn(|| proxy::keep(nets, container, &done))
        });
        let status = exec_lines(engine, container, req, sink);
        done.store(true, Ordering::Release);
        let kept = keeper
            .map(|k| {
                k.join()
                    .unwrap_or_else(|_| vec!["the model proxy's watch failed".into()])
            })
            .unwrap_or_default();
        (status, kept)
    })
}

/// Runs `req` in `container`, handing each line of its output, made a
/// transcript line, to `sink`; returns the command's status.
fn exec_lines(
    engine: &dyn SandboxEngine,
    container: &str,
    req: &ExecRequest,
    sink: &mut dyn FnMut(&str),
) -> Result<i64> {
    let mut lines = [Lines::new(MAX_LINE), Lines::new(MAX_LINE)];
    let mut on = |s: OutStream, b: &[u8]| {
        let i = if s == OutStream::Stdout { 0 } else { 1 };
        lines[i].feed(b, &mut |l, cut| {
            emit(i, &String::from_utf8_lossy(l), cut, &mut *sink)
        });
    };
    let status = engine.exec_io(container, req, ExecIo::output(&mut on))?;
    for (i, rest) in lines.iter_mut().enumerate() {
        rest.finish(&mut |l, cut| emit(i, &String::from_utf8_lossy(l), cut, &mut *sink));
    }
    Ok(status)
}

/// One line of the agent's output as a transcript line: stdout lines that
/// are JSON verbatim, anything else wrapped; a line cut at the bound is
/// wrapped with the count of its bytes dropped (`cut`).
fn emit(stream: usize, text: &str, cut: u64, sink: &mut dyn FnMut(&str)) {
    if cut == 0
        && stream == 0
        && serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object())
    {
        sink(text);
    } else {
        let kind = if stream == 0 {
            "lw-stdout"
        } else {
            "lw-stderr"
        };
        let mut v = serde_json::json!({"type": kind, "text": text});
        if cut > 0 {
            v["cut"] = cut.into();
        }
        sink(&v.to_string());
    }
}

fn clip(s: &str, n: usize) -> String {
    let one = visible_line(s.trim()).into_owned();
    if one.chars().count() > n {
        one.chars().take(n).collect::<String>() + "…"
    } else {
        one
    }
}

/// Gemini CLI's events (`--output-format stream-json`), told from the
/// others' by their fields; None when the line is not one of them.
fn gemini_summary(v: &serde_json::Value) -> Option<Option<String>> {
    let s = |k: &str| v[k].as_str().unwrap_or("?").to_string();
    Some(match v["type"].as_str()? {
        "init" if v.get("session_id").is_some() => {
            Some(format!("session {} model {}", s("session_id"), s("model")))
        }
        "message" if v["role"] == "assistant" => {
            Some(format!("says: {}", clip(v["content"].as_str()?, 200)))
        }
        "message" if v.get("role").is_some() => None,
        "tool_use" if v.get("tool_name").is_some() => Some(format!(
            "tool {}: {}",
            s("tool_name"),
            clip(&v["parameters"].to_string(), 200)
        )),
        "tool_result" if v.get("tool_id").is_some() => Some(format!(
            "tool result ({}): {}",
            s("status"),
            clip(v["output"].as_str().unwrap_or(""), 200)
        )),
        "result" if v.get("stats").is_some() && v.get("subtype").is_none() => {
            Some(format!("result: {}", s("status")))
        }
        _ => return None,
    })
}

/// The one-line summary of a transcript line, for people; None to skip.
/// Knows Claude Code's stream-json, Codex's and opencode's --json events,
/// Copilot CLI's `--output-format json` ([`copilot_summary`]) and Gemini
/// CLI's stream-json.
pub fn summary(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if let Some(s) = gemini_summary(&v) {
        return s;
    }
    let t = v["type"].as_str().unwrap_or("");
    match t {
        "lw-run" => Some(format!(
            "run {} ({}{})",
            v["sandbox"].as_str().unwrap_or(""),
            v["kit"].as_str().unwrap_or(""),
            if v["resume"].as_bool() == Some(true) {
                ", resumed"
            } else {
                ""
            }
        )),
        "lw-exit" => Some(format!("exit {}", v["status"])),
        "lw-stderr" | "lw-stdout" => {
            Some(format!("| {}", clip(v["text"].as_str().unwrap_or(""), 200)))
        }
        // Claude Code.
        "assistant" => {
            let parts: Vec<String> = v["message"]["content"]
                .as_array()?
                .iter()
                .filter_map(|c| match c["type"].as_str()? {
                    "text" => Some(format!("says: {}", clip(c["text"].as_str()?, 200))),
                    "tool_use" => Some(format!(
                        "tool {}: {}",
                        c["name"].as_str().unwrap_or("?"),
                        clip(&c["input"].to_string(), 200)
                    )),
                    _ => None,
                })
                .collect();
            (!parts.is_empty()).then(|| parts.join("\n"))
        }
        "result" if v.get("exitCode").is_some() => copilot_summary(t, &v),
        "result" => Some(format!(
            "result{}: {}",
            if v["is_error"].as_bool() == Some(true) {
                " (error)"
            } else {
                ""
            },
            clip(
                v["result"]
                    .as_str()
                    .unwrap_or(v["subtype"].as_str().unwrap_or("")),
                300
            )
        )),
        "system" if v["subtype"] == "init" => Some(format!(
            "session {} model {}",
            v["session_id"].as_str().unwrap_or("?"),
            v["model"].as_str().unwrap_or("?")
        )),
        // Codex.
        "item.completed" | "item.started" => {
            let it = &v["item"];
            match it["type"].as_str()? {
                "agent_message" => Some(format!("says: {}", clip(it["text"].as_str()?, 200))),
                "command_execution" if t == "item.completed" => Some(format!(
                    "ran: {} (exit {})",
                    clip(it["command"].as_str().unwrap_or("?"), 200),
                    it["exit_code"]
                )),
                "command_execution" => None,
                other => Some(format!("{other}: {}", clip(&it.to_string(), 200))),
            }
        }
        "thread.started" => Some(format!(
            "session {}",
            v["thread_id"].as_str().unwrap_or("?")
        )),
        "turn.failed" | "error" => Some(format!("error: {}", clip(&v.to_string(), 300))),
        // opencode.
        "text" => Some(format!("says: {}", clip(v["part"]["text"].as_str()?, 200))),
        "tool_use" => Some(format!(
            "tool {}: {}",
            v["part"]["tool"].as_str().unwrap_or("?"),
            clip(&v["part"]["state"]["input"].to_string(), 200)
        )),
        _ => copilot_summary(t, &v),
    }
}

/// Copilot CLI's events: what it said and asked for, each tool's end, the
/// result, errors; its many ephemeral progress events are skipped.
fn copilot_summary(t: &str, v: &serde_json::Value) -> Option<String> {
    let d = &v["data"];
    match t {
        "assistant.message" => {
            let mut parts: Vec<String> = Vec::new();
            if let Some(text) = d["content"].as_str().filter(|s| !s.is_empty()) {
                parts.push(format!("says: {}", clip(text, 200)));
            }
            for r in d["toolRequests"].as_array().into_iter().flatten() {
                parts.push(format!(
                    "tool {}: {}",
                    r["name"].as_str().unwrap_or("?"),
                    clip(&r["arguments"].to_string(), 200)
                ));
            }
            (!parts.is_empty()).then(|| parts.join("\n"))
        }
        "tool.execution_complete" => Some(format!(
            "tool {}: {}",
            if d["success"].as_bool() == Some(true) {
                "done"
            } else {
                "failed"
            },
            clip(
                d["result"]["content"]
                    .as_str()
                    .or(d["error"]["message"].as_str())
                    .unwrap_or(""),
                200
            )
        )),
        "result" => Some(format!(
            "result: exit {} (session {})",
            v["exitCode"],
            v["sessionId"].as_str().unwrap_or("?")
        )),
        "session.error" => Some(format!("error: {}", clip(&d.to_string(), 300))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_of_both_kits_events() {
        let s = summary(r#"{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Bash","input":{"command":"git commit -m x"}}]}}"#).unwrap();
        assert!(
            s.starts_with("tool Bash: {\"command\":\"git commit -m x\"}"),
            "{s}"
        );
        let s = summary(r#"{"type":"item.completed","item":{"type":"command_execution","command":"ls","exit_code":0}}"#).unwrap();
        assert_eq!(s, "ran: ls (exit 0)");
        let s = summary(
            r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":{"command":"ls"}}}}"#,
        )
        .unwrap();
        assert_eq!(s, r#"tool bash: {"command":"ls"}"#);
        let s = summary(r#"{"type":"assistant.message","data":{"content":"","toolRequests":[{"name":"bash","arguments":{"command":"ls"}}]}}"#).unwrap();
        assert_eq!(s, r#"tool bash: {"command":"ls"}"#);
        let s = summary(r#"{"type":"result","sessionId":"d5a4","exitCode":0}"#).unwrap();
        assert_eq!(s, "result: exit 0 (session d5a4)");
        assert_eq!(
            summary(r#"{"type":"session.background_tasks_changed","data":{},"ephemeral":true}"#),
            None
        );
        let s =
            summary(r#"{"type":"text","part":{"type":"text","text":"resumed with 5 messages"}}"#)
                .unwrap();
        assert_eq!(s, "says: resumed with 5 messages");
        assert_eq!(summary(r#"{"type":"step_start","part":{}}"#), None);
        // Gemini CLI.
        let s = summary(r#"{"type":"tool_use","tool_name":"run_shell_command","tool_id":"t1","parameters":{"command":"ls"}}"#).unwrap();
        assert_eq!(s, r#"tool run_shell_command: {"command":"ls"}"#);
        let s = summary(r#"{"type":"message","role":"assistant","content":"resumed with 11 contents","delta":true}"#).unwrap();
        assert_eq!(s, "says: resumed with 11 contents");
        assert_eq!(
            summary(r#"{"type":"message","role":"user","content":"go"}"#),
            None
        );
        let s =
            summary(r#"{"type":"result","status":"success","stats":{"total_tokens":90}}"#).unwrap();
        assert_eq!(s, "result: success");
        let s = summary(r#"{"type":"lw-stderr","text":"a\u001b[31mb"}"#).unwrap();
        assert!(
            !s.contains('\u{1b}'),
            "control characters made visible: {s}"
        );
        assert_eq!(summary("not json"), None);
    }

    #[test]
    fn stdout_json_is_kept_verbatim_and_the_rest_wrapped() {
        let mut got = Vec::new();
        emit(0, r#"{"type":"x"}"#, 0, &mut |l| got.push(l.to_string()));
        emit(0, "plain", 0, &mut |l| got.push(l.to_string()));
        emit(1, r#"{"type":"y"}"#, 0, &mut |l| got.push(l.to_string()));
        emit(0, r#"{"type":"z"}"#, 7, &mut |l| got.push(l.to_string()));
        assert_eq!(got[0], r#"{"type":"x"}"#);
        assert_eq!(got[1], r#"{"text":"plain","type":"lw-stdout"}"#);
        assert!(got[2].contains("lw-stderr"));
        assert_eq!(
            got[3],
            r#"{"cut":7,"text":"{\"type\":\"z\"}","type":"lw-stdout"}"#
        );
    }
}
