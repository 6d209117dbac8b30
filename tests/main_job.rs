//! The main job end to end (scripts/main-job), twice in a row, on the real
//! Docker engine, real git and the local GitHub-compatible sink: two sandboxes
//! coordinate a contract change through the mediator, lw-radar tells both of
//! the conflict their branches hold before either is pushed and then that it
//! is cleared, a person's answer comes back, both branches leave as pull
//! requests (draft during the conflict, with the radar's status on their
//! heads, then ready), a person's review comment is answered by the
//! consumer in its pull request's thread, the log lands on the pull
//! requests; the second run rebuilds nothing, and neither
//! leaves anything behind.  Then once with each of `--agent claude`,
//! `--agent opencode` and `--agent copilot`: both agents are the real CLI
//! against the scripted model, and the consumer's hears of the contract
//! change by the bell while it works (issue 32 §3, issue 45).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The runs share the project's image names and Docker's two cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// What a failed run in `work` left (its sandboxes, their egress networks,
/// the scripted model's container and network) is removed when the test
/// fails, by `scripts/main-job --clean`: the job keeps it to be looked at,
/// but the suites after this one share Docker's 31 address pools with it.
struct ClearOnFailure<'a>(&'a Path);

impl Drop for ClearOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = main_job(self.0).arg("--clean").output();
        }
    }
}

/// scripts/main-job, non-interactive (`--yes`), on the binaries under test.
fn main_job(work: &Path) -> Command {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_lw")).parent().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/main-job");
    let mut c = Command::new("bash");
    c.arg(&script).arg("--yes").arg("--work").arg(work);
    c.env("LW_BIN_DIR", bin_dir).stdin(Stdio::null());
    c
}

fn run_main_job(work: &Path) -> String {
    let _clear = ClearOnFailure(work);
    let o = main_job(work).output().expect("bash runs scripts/main-job");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success(),
        "scripts/main-job failed ({:?}):\n{out}\n{err}",
        o.status
    );
    out
}

fn has_line(t: &str, parts: &[&str]) -> bool {
    t.lines().any(|l| parts.iter().all(|p| l.contains(p)))
}

/// `lw-mediate log --json` of the run in `work`.
fn log(work: &Path) -> Vec<serde_json::Value> {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_lw")).parent().unwrap();
    let o = Command::new(bin_dir.join("lw-mediate"))
        .arg("--root")
        .arg(work.join("mailbox"))
        .args(["log", "--json"])
        .output()
        .expect("lw-mediate runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("the log is JSON Lines"))
        .collect()
}

fn epoch(rfc3339: &serde_json::Value) -> f64 {
    let s = rfc3339.as_str().expect("a time");
    base::time::parse_rfc3339(s)
        .unwrap_or_else(|| panic!("'{s}' is not RFC 3339"))
        .as_secs_f64()
}

/// Issue 32 §3, the radar's part, on the run's own records: lw-radar's
/// `conflict` (the consumer's edit and the producer's rename touch the same
/// line of contract/user.schema.json) was logged and forwarded to both
/// sandboxes before the push, then its `conflict-cleared` once the consumer
/// dropped its edit, and both reached both inboxes.
fn radar_told_both_before_the_push(work: &Path) {
    let entries = log(work);
    let of = |kind: &str| -> Vec<&serde_json::Value> {
        entries
            .iter()
            .filter(|e| e["message"]["kind"] == kind)
            .collect()
    };
    let at = |file: &str| -> f64 {
        std::fs::read_to_string(work.join(file))
            .unwrap_or_else(|e| panic!("the job records {file}: {e}"))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{file} holds seconds: {e}"))
    };
    // The first push (draft pull requests) waits for the conflict; the
    // last comes after it cleared.
    let (opened, pushed) = (at("pr-opened-at"), at("pushed-at"));
    for kind in ["conflict", "conflict-cleared"] {
        let e = of(kind);
        assert_eq!(e.len(), 1, "one {kind} entry: {entries:#?}");
        let e = e[0];
        assert_eq!(e["sender"], "mediator", "{e:#}");
        assert_eq!(e["decision"]["action"], "forward", "{e:#}");
        let mut to: Vec<&str> = e["decision"]["to"]
            .as_array()
            .unwrap_or_else(|| panic!("forwarded to whom? {e:#}"))
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        to.sort();
        assert_eq!(to, ["consumer", "producer"], "{e:#}");
        assert!(
            epoch(&e["logged"]) < pushed,
            "{kind} logged after the push: {e:#}"
        );
    }
    assert!(
        epoch(&of("conflict")[0]["logged"]) < opened
            && opened < epoch(&of("conflict-cleared")[0]["logged"]),
        "the pull requests were opened while the conflict stood"
    );
    let conflict = of("conflict")[0];
    let text = conflict["message"].to_string();
    for want in [
        "contract/user.schema.json",
        "task/consumer",
        "task/producer",
    ] {
        assert!(text.contains(want), "{want} in {text}");
    }
    assert!(
        epoch(&conflict["logged"]) < epoch(&of("conflict-cleared")[0]["logged"]),
        "cleared after the conflict"
    );
    let cid = conflict["message_id"].as_str().unwrap();
    let xid = of("conflict-cleared")[0]["message_id"].as_str().unwrap();
    for sb in ["producer", "consumer"] {
        let inbox = std::fs::read_to_string(work.join(format!("inbox-{sb}.txt")))
            .expect("the job lists each inbox");
        for (id, kind) in [(cid, "conflict"), (xid, "conflict-cleared")] {
            assert!(
                inbox.contains(&format!("{id}\tmediator\t{kind}\t")),
                "{sb}'s inbox holds {kind} {id}:\n{inbox}"
            );
        }
    }
}

/// Issue 43, the main job's part: both task branches are pull requests; the
/// radar's `loopwright/radar` status (read back from the sink) was
/// `failure` on both heads during the conflict and is `success` on both
/// after it cleared; the consumer's pull request carries its side of the
/// contract-change thread (its question about the change, the conflict,
/// the person's answer) and the review exchange: ada's review comment came
/// back as a request from human and the consumer's answer went to the
/// thread, while mallory's (untrusted) review never reached the sandbox.
/// The figures: at most 3 requests per new pull request, 1 per status change.
fn pull_requests_carry_the_story(work: &Path, out: &str) {
    let entries = log(work);
    let json = |file: &str| -> serde_json::Value {
        let t = std::fs::read_to_string(work.join(file))
            .unwrap_or_else(|e| panic!("the job keeps {file}: {e}"));
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("{file}: {e}: {t}"))
    };
    // Statuses, oldest first: two failures naming the other branch, then
    // success on both final heads.
    let statuses = json("statuses.json");
    let st: Vec<(&str, &str, &str)> = statuses
        .as_array()
        .expect("a list")
        .iter()
        .filter(|s| s["context"] == "loopwright/radar")
        .map(|s| {
            (
                s["sha"].as_str().unwrap(),
                s["state"].as_str().unwrap(),
                s["description"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(st.len(), 4, "one status per change: {st:#?}");
    for (i, other) in [(0, "task/"), (1, "task/")] {
        assert_eq!(st[i].1, "failure", "{st:#?}");
        assert!(
            st[i].2.contains(other) && st[i].2.contains("contract/user.schema.json"),
            "{st:#?}"
        );
    }
    assert_ne!(st[0].0, st[1].0, "failure on both heads: {st:#?}");
    let upstream = work.join("upstream.git");
    for b in ["task/producer", "task/consumer"] {
        let o = Command::new("git")
            .arg("--git-dir")
            .arg(&upstream)
            .args(["rev-parse", b])
            .output()
            .expect("git runs");
        let head = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let last = st.iter().rev().find(|s| s.0 == head);
        assert_eq!(last.map(|s| s.1), Some("success"), "{b} at {head}: {st:#?}");
    }
    // The consumer's pull request's conversation: the entries of its task.
    let comments = json("pr-consumer.json");
    let bodies: String = comments
        .as_array()
        .expect("a list")
        .iter()
        .map(|c| c["body"].as_str().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let on_pr = |kind: &str, sender: &str| {
        let e = entries
            .iter()
            .find(|e| e["message"]["kind"] == kind && e["sender"] == sender)
            .unwrap_or_else(|| panic!("no {kind} from {sender} in the log"));
        let name = e["entry"].as_str().or(e["name"].as_str()).unwrap_or("");
        let id = e["message_id"].as_str().unwrap();
        assert!(
            bodies.contains(&format!("\"id\":\"{id}\"")),
            "the consumer's pull request holds {kind} {id} ({name}):\n{bodies}"
        );
        e.clone()
    };
    // The contract change itself goes to its sender's task: the producer's.
    let change = entries
        .iter()
        .find(|e| e["message"]["kind"] == "contract-change")
        .expect("the contract change is in the log");
    let producer_pr = json("pr-producer.json").to_string();
    let cid = change["message_id"].as_str().unwrap();
    assert!(
        producer_pr.contains(&format!("\\\"id\\\":\\\"{cid}\\\"")),
        "the producer's pull request holds the contract change {cid}:\n{producer_pr}"
    );
    let question = on_pr("question", "consumer");
    assert!(
        question["message"]["subject"]
            .as_str()
            .unwrap()
            .contains("fallback"),
        "{question:#}"
    );
    on_pr("conflict", "mediator");
    on_pr("answer", "human");
    on_pr("conflict-cleared", "mediator");
    let request = on_pr("request", "human");
    assert_eq!(request["decision"]["action"], "forward", "{request:#}");
    let refs = request["message"]["refs"].to_string();
    assert!(refs.contains("consumer/greet.sh:4"), "{refs}");
    let reply = on_pr("status", "consumer");
    assert_eq!(
        reply["message"]["in_reply_to"], request["message_id"],
        "the consumer answered the review: {reply:#}"
    );
    assert!(
        !entries.iter().any(|e| e["message"]["body"]
            .as_str()
            .is_some_and(|b| b.contains("Ignore your scope"))),
        "the untrusted review never reached the door"
    );
    // The figures, as the job printed them.
    let figure = |prefix: &str| -> Vec<u64> {
        let l = out
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix}:\n{out}"));
        l.split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    let reqs = figure("Requests per pushed task: ");
    assert!(
        reqs[0] <= 3 && reqs[1] <= 3 && reqs[0] >= 2,
        "requests per new pull request: {reqs:?}"
    );
    println!(
        "figure [main job pull requests]: {} and {} requests per new pull request",
        reqs[0], reqs[1]
    );
    assert!(
        has_line(
            out,
            &[
                "during the conflict: task/producer=failure task/consumer=failure (2 request(s) for 2 changes)",
                "after it cleared: task/producer=success task/consumer=success (2 request(s) for 2 changes)"
            ]
        ),
        "{out}"
    );
    assert!(
        has_line(
            out,
            &[
                "Review: ada's comment on consumer/greet.sh:4 reached the consumer",
                "1 item(s) from a login the sync config does not trust ignored"
            ]
        ),
        "{out}"
    );
}

#[test]
fn main_job_runs_twice_and_leaves_nothing_behind() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("main-job");
    let first = run_main_job(&work);
    println!("{first}");
    radar_told_both_before_the_push(&work);
    pull_requests_carry_the_story(&work, &first);
    // Every message's path through the system.
    assert!(
        has_line(
            &first,
            &[
                "forward",
                "producer -> consumer",
                "contract-change",
                "scope overlaps"
            ]
        ),
        "{first}"
    );
    assert!(
        has_line(&first, &["read", "producer -> consumer", "consumer acked"]),
        "{first}"
    );
    assert!(
        has_line(&first, &["escalate", "consumer -> human", "question"]),
        "{first}"
    );
    assert!(
        has_line(&first, &["forward", "human -> consumer", "answer"]),
        "{first}"
    );
    // Both branches left by push, and together they keep the contract.
    assert!(
        has_line(
            &first,
            &["task/producer", "contract: user.name is now user.full_name"]
        ),
        "{first}"
    );
    assert!(
        has_line(&first, &["task/consumer", "fall back to user.name"]),
        "{first}"
    );
    assert!(
        first.contains("merged check:  ok: Hello, Ada Lovelace"),
        "{first}"
    );
    assert!(first.contains("Host checkout: untouched"), "{first}");
    assert!(first.contains("Left behind: 0 containers, 0 volumes, 0 sandboxes listed by lw-sandbox ls, 0 port leases."), "{first}");
    assert!(
        has_line(
            &first,
            &["lw-sync verify: the pull requests and the issue hold all 12 log entries, each once"]
        ),
        "{first}"
    );

    let second = run_main_job(&work);
    println!("{second}");
    assert!(
        second.contains("Image layers: 0 built this run (3 cached)."),
        "the second run rebuilt a layer:\n{second}"
    );
    pull_requests_carry_the_story(&work, &second);
    assert!(second.contains("Left behind: 0 containers, 0 volumes, 0 sandboxes listed by lw-sandbox ls, 0 port leases."), "{second}");

    // lw doctor, run by the job after it cleaned up: nothing fails.
    for t in [&first, &second] {
        let doctor: String = t
            .lines()
            .skip_while(|l| !l.starts_with("lw doctor"))
            .take_while(|l| !l.starts_with("Steps:"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            has_line(&doctor, &["ok", "image", "layer deps is current"]),
            "{doctor}"
        );
        assert!(
            has_line(&doctor, &["ok", "github", "reads demo/contract-change#1"]),
            "{doctor}"
        );
        assert!(!doctor.contains("FAIL"), "{doctor}");
    }
}

/// Issue 45: `--agent` takes every built-in kit (runtime/agents/*.kit, so a
/// new kit joins without an edit to the script) and refuses any other name
/// with 64, listing them, before it touches Docker or builds anything.
#[test]
fn main_job_agent_takes_the_built_in_kits_and_refuses_another_name() {
    let kits: Vec<String> = {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime/agents");
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("runtime/agents is there")
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".kit").map(str::to_string)
            })
            .collect();
        v.sort();
        v
    };
    assert!(kits.len() >= 4, "{kits:?}");
    for bad in ["gpt", "", "claude codex", "*", "../claude"] {
        let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("main-job-bad-agent");
        let o = main_job(&work)
            .args(["--agent", bad])
            .output()
            .expect("bash runs scripts/main-job");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{bad:?}: {err}");
        assert!(
            err.contains(&format!(
                "main-job: --agent: '{bad}' is not a built-in kit; the kits are: {}",
                kits.join(" ")
            )),
            "{bad:?}: {err}"
        );
        assert!(!work.exists(), "nothing made for {bad:?}");
    }
}

/// Issue 32 §3 with the real Claude Code playing both agents against the
/// scripted model: the consumer's agent is in the middle of its task (a
/// slow step, again and again) when the producer's agent posts the contract
/// change; the consumer's next model request carries it, put there by its
/// PostToolUse hook (`lw-inbox --hook claude`), without the agent asking;
/// its stop is blocked once until it reads it.  Asserted on the requests
/// the scripted model recorded and on the mediator's log; the radar's part
/// as in the scripted run.
#[test]
fn main_job_with_claude_the_consumer_hears_the_contract_change_by_the_bell() {
    agent_job("claude", "ANTHROPIC_API_KEY", true);
}

/// Issue 45: the same with opencode, whose bell is its plugin (appended to
/// the next tool's result) and which has no stop a plugin can refuse: its
/// run ends with the change unread, and the job resumes it to read its
/// mail.  296 s on this machine with opencode's CLI layer cached (a cold
/// one adds its install, about 150 s).
#[test]
fn main_job_with_opencode_the_consumer_hears_the_contract_change_by_its_plugin() {
    agent_job("opencode", "ANTHROPIC_API_KEY", false);
}

/// Issue 45: the same with GitHub Copilot CLI, whose bell is its user-level
/// hooks (the same input as Claude Code's; its stop blocked the same way).
#[test]
fn main_job_with_copilot_the_consumer_hears_the_contract_change_by_its_hooks() {
    agent_job("copilot", "COPILOT_PROVIDER_API_KEY", true);
}

/// Issue 45: the same with Gemini CLI, whose bell is its hooks in
/// `~/.gemini/settings.json` (Claude Code's answers under Gemini's event
/// names; its `AfterAgent` stop blocked the same way).
#[test]
fn main_job_with_gemini_the_consumer_hears_the_contract_change_by_its_hooks() {
    agent_job("gemini", "GEMINI_API_KEY", true);
}

/// `scripts/main-job --agent KIT` against the scripted model (the kit's key
/// variable removed from the host), asserted on the requests the model
/// recorded and the mediator's log.  `blocks_stop`: the CLI's stop hook
/// holds the agent until it reads the message (claude), or its run ends
/// and the job resumes it (opencode).
fn agent_job(kit: &str, key_env: &str, blocks_stop: bool) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("main-job-{kit}"));
    let _clear = ClearOnFailure(&work);
    let mut c = main_job(&work);
    c.arg("--agent").arg(kit).env_remove(key_env);
    let o = c.output().expect("bash runs scripts/main-job");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "scripts/main-job --agent {kit} failed ({:?}):\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    println!("{out}");
    radar_told_both_before_the_push(&work);
    assert!(
        out.contains("merged check:  ok: Hello, Ada Lovelace"),
        "{out}"
    );

    let entries = log(&work);
    let change = entries
        .iter()
        .find(|e| e["message"]["kind"] == "contract-change")
        .expect("the contract change is in the log");
    assert_eq!(change["decision"]["action"], "forward", "{change:#}");
    let id = change["message_id"].as_str().unwrap();
    let posted = epoch(&change["message"]["created"]);
    let forwarded = epoch(&change["logged"]);

    // The consumer's requests, as the scripted model recorded them.
    let reqs: Vec<serde_json::Value> =
        std::fs::read_to_string(work.join("model/out/requests.jsonl"))
            .expect("the scripted model recorded its requests")
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON lines"))
            .filter(|r: &serde_json::Value| r["role"] == "You are the consumer")
            // Its turns: Gemini CLI's own JSON questions are not.
            .filter(|r| {
                let path = r["path"].as_str().unwrap_or("");
                !path.contains(":generateContent") && !path.contains(":countTokens")
            })
            .collect();
    let body = |r: &serde_json::Value| r["body"].as_str().unwrap_or("").to_string();
    let t = |r: &serde_json::Value| r["t"].as_f64().expect("the model records the time");
    // Gemini CLI escapes '<' in a hook's context (docs/agents.md).
    let lt = if kit == "gemini" { "&lt;" } else { "<" };
    let label = format!(
        r#"{lt}lw-message id=\"{id}\" from=\"producer\" kind=\"contract-change\" mediator=\"delivered\""#
    );
    let carrying = reqs
        .iter()
        .position(|r| body(r).contains(&label))
        .unwrap_or_else(|| panic!("no request of the consumer's carries {label}"));
    // Mid-task: the request carrying it brings back the output of at
    // least one slow work step, and the one before did not carry it.
    let works = body(&reqs[carrying])
        .matches("checked consumer/greet.sh against the stored records")
        .count();
    assert!(
        works >= 1,
        "the consumer was mid-task: {works} work steps before request {carrying}"
    );
    assert!(
        !body(&reqs[carrying - 1]).contains(&label),
        "announced by the bell, not read before"
    );
    // The next tool call after the mediator's pass: at most the running
    // 2 s step and its hook after the forward (opencode spends seconds of
    // its own between a tool's end and its next request: its slowest turn).
    let after_forward = t(&reqs[carrying]) - forwarded;
    // (Its turns before the request carrying it: the run it ends is
    // resumed only after the producer's and the radar's steps.)
    let turn = (1..carrying)
        .map(|i| t(&reqs[i]) - t(&reqs[i - 1]))
        .fold(0.0, f64::max);
    let bound = if blocks_stop { 2.0 } else { turn } + 1.0;
    assert!(
        after_forward <= bound,
        "{after_forward:.2}s from the forward to the request carrying it (bound {bound:.2}s)"
    );
    // Announced once; stopping with it unread was blocked once, or the run
    // ended and was resumed.
    let last = body(reqs.last().unwrap());
    assert_eq!(last.matches(&label).count(), 1, "announced once: {last}");
    let then = if blocks_stop {
        assert!(
            last.contains("Stop blocked 1 of at most 3 times")
                && !last.contains("Stop blocked 2 of"),
            "the stop was blocked once: {last}"
        );
        "stop was then blocked 1 time(s)"
    } else {
        assert!(
            last.contains("A message is waiting in your inbox"),
            "resumed: {last}"
        );
        "was resumed to read it"
    };
    // The transcript says when.
    assert!(
        has_line(
            &out,
            &[
                &format!("Bell: the consumer's {kit} heard of contract-change"),
                id,
                &format!("mid-task, after {works} slow work step(s)"),
                &format!("its model request {} of {}", carrying + 1, reqs.len()),
                then,
            ]
        ),
        "{out}"
    );
    println!(
        "figure [main job bell {kit}]: lw-post exit to the consumer's request carrying it {:.2} s (forwarded at +{:.2} s); request {} of {}, after {works} work step(s)",
        t(&reqs[carrying]) - posted,
        forwarded - posted,
        carrying + 1,
        reqs.len()
    );
}
