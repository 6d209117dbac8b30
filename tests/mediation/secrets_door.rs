//! Secrets at the door whatever the working directory, and in disguise
//! (issue 29, items 2 and 3): lw-mediate and lw-sync run as processes from
//! `/`, outside any project, against lw-github-sink on 127.0.0.1.  The root
//! alone says which secrets its sandboxes hold (their registry records);
//! every disguise of a value posted is held, masked in the log, the human
//! queue, the recipients' copies and every comment, and a recorded secret
//! the door cannot resolve stops it with 78.  Prints its figures.

use support::sync as sync_support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use mailbox::layout::Root;
use mailbox::log::{Action, Entry, Log};
use mailbox::maildir::Sub;
use mailbox::message::{Kind, Message};
use mailbox::registry::{Registry, Sandbox};
use support::common::ok;
use support::mediate_util::post;
use sync_support::{Env, files_under, text};

/// Its base64 has '+' and '/' at offsets 1 and 2, so the URL-safe forms differ.
const KEY: &str = "sk-live~7f3a?9c2b41>";
const DEPLOY: &str = "d3pl0y~k3y?>>";

fn msg(to: &str, kind: Kind, subject: &str, body: &str) -> Message {
    sync_support::message("x", to, kind, subject, body)
}

/// lw-mediate run from `/`, with only `env` of the secrets set.
fn mediate(root: &Root, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(support::bin("lw-mediate"));
    c.current_dir("/")
        .env_remove("GH_TOKEN")
        .env_remove("GITHUB_TOKEN")
        .env_remove("LW_ROOT")
        .env_remove("API_KEY")
        .env_remove("DEPLOY_KEY")
        .envs(env.iter().copied())
        .arg("--root")
        .arg(&root.dir)
        .args(args)
        .stdin(Stdio::null());
    c.output().unwrap()
}

fn entries(root: &Root) -> Vec<Entry> {
    let (good, bad) = Log::new(root.log_dir()).entries().unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    good
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64(b: &[u8]) -> String {
    let mut out = String::new();
    for g in b.chunks(3) {
        let n = (g[0] as u32) << 16
            | (*g.get(1).unwrap_or(&0) as u32) << 8
            | *g.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            out.push(if k <= g.len() {
                B64[(n >> (18 - 6 * k) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

/// The characters of base64(`pre` + `v` + ...) that only `v`'s bits make:
/// what must not survive anywhere.
fn base64_core(pre: &str, v: &str) -> String {
    let enc = base64(format!("{pre}{v}").as_bytes());
    let (a, n) = (pre.len(), v.len());
    enc[(8 * a).div_ceil(6)..8 * (a + n) / 6].to_string()
}

fn split(v: &str, chunk: usize, sep: &str) -> String {
    let cs: Vec<char> = v.chars().collect();
    cs.chunks(chunk)
        .map(|c| c.iter().collect::<String>())
        .collect::<Vec<_>>()
        .join(sep)
}

/// Each disguise of `v` (name, as posted, what must not survive of it).
fn disguises(v: &str) -> Vec<(&'static str, String, String)> {
    let hex: String = v.bytes().map(|b| format!("{b:02x}")).collect();
    let pct: String = v.bytes().map(|b| format!("%{b:02X}")).collect();
    let pct_mixed: String = v
        .bytes()
        .enumerate()
        .map(|(i, b)| {
            if i % 2 == 0 {
                format!("%{b:02x}")
            } else {
                (b as char).to_string()
            }
        })
        .collect();
    let json: String = v.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
    let json_mixed: String = v
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if i % 3 == 0 {
                format!("\\u{:04X}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect();
    let same = |s: String| (s.clone(), s);
    let b64 = |pre: &str, url: bool| {
        let url_safe = |s: String| {
            if url {
                s.replace('+', "-").replace('/', "_")
            } else {
                s
            }
        };
        (
            url_safe(base64(format!("{pre}{v}\n").as_bytes())),
            url_safe(base64_core(pre, v)),
        )
    };
    let mut out = vec![
        ("literal", same(v.to_string())),
        ("upper case", same(v.to_uppercase())),
        ("split by spaces", same(split(v, 3, " "))),
        ("split by line breaks", same(split(v, 4, "\n"))),
        ("hex", same(hex.clone())),
        (
            "hex, upper case, split",
            same(split(&hex.to_uppercase(), 6, "\r\n")),
        ),
        ("percent-encoded", same(pct)),
        ("percent, mixed", same(pct_mixed)),
        ("json escapes", same(json)),
        ("json escapes, mixed", same(json_mixed)),
        ("base64", b64("", false)),
        ("base64 at offset 1", b64("u", false)),
        ("base64 at offset 2", b64("us", false)),
        ("base64 url-safe at offset 1", b64("u", true)),
        ("base64 url-safe at offset 2", b64("us", true)),
    ];
    let (wrapped, core) = b64("user:", false);
    out.push(("base64 wrapped by MIME", (split(&wrapped, 8, "\r\n"), core)));
    out.into_iter().map(|(n, (p, c))| (n, p, c)).collect()
}

/// Every text of every comment on the sink: the raw comment, and each
/// section's decoded subject, refs, reason and body part (a header is JSON,
/// so a raw search alone could miss an escaped copy).
fn sink_texts(env: &Env) -> Vec<String> {
    let mut out = Vec::new();
    for (_, body, _) in env.comments(1) {
        if let Some(Ok(secs)) = sync::parse_comment(&body) {
            for s in secs {
                if let sync::Head::Entry(h) = s.head {
                    out.push(h.reason);
                    if let Some(m) = h.msg {
                        out.push(m.subject);
                        out.extend(m.refs);
                    }
                }
                out.push(s.chunk);
            }
        }
        out.push(body);
    }
    out
}

/// Copies of any of `needles` in `texts`.
fn copies(texts: &[String], needles: &[&str]) -> usize {
    texts
        .iter()
        .map(|t| needles.iter().map(|n| t.matches(n).count()).sum::<usize>())
        .sum()
}

fn files_text(dir: &Path) -> Vec<String> {
    files_under(dir)
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .collect()
}

#[test]
fn every_disguise_of_a_recorded_secret_is_masked_from_cwd_slash() {
    let env = Env::new("door-disguise");
    let root = Root::new(&env.root);
    let senv = [("API_KEY", KEY), ("DEPLOY_KEY", DEPLOY)];
    // The root records the names: api by hand (lw-mediate register
    // --secret), web as lw-sandbox create writes a project's door.secrets.
    ok(&mediate(
        &root,
        &[],
        &["register", "api", "--secret", "API_KEY"],
    ));
    let mut web = Sandbox::new("web", None, vec![]);
    web.door_secrets = vec!["DEPLOY_KEY".into()];
    web.allowed_secrets = vec!["API_KEY".into(), "UNSET_ALLOWED".into()];
    Registry::new(&root).register(&web).unwrap();

    let forms = disguises(KEY);
    for (what, form, core) in &forms {
        if what.contains("url-safe") {
            assert!(core.contains(['-', '_']), "{what}: {form}");
        }
    }
    let mut posted: Vec<(&str, Message)> = Vec::new();
    for (what, form, _) in &forms {
        let m = msg(
            "web",
            Kind::Request,
            what,
            &format!("the key: {form}\nuse it"),
        );
        post(&root, "api", &m);
        posted.push((what, m));
    }
    // Headers: a held message's subject and refs, a question to a person.
    let in_subject = msg(
        "web",
        Kind::Request,
        &format!("key {}", KEY.to_uppercase()),
        "x",
    );
    let mut in_refs = msg("web", Kind::ContractChange, "refs", "see refs");
    in_refs.refs = vec![format!("src/{}.rs", forms[4].1)];
    let question = msg("human", Kind::Question, "is this ok?", &forms[10].1);
    let deploy = msg("api", Kind::Request, "deploy", &base64(DEPLOY.as_bytes()));
    let plain = msg(
        "web",
        Kind::Request,
        "plain",
        "Ship the schema: sk-live keys rotate",
    );
    for (s, m) in [
        ("api", &in_subject),
        ("api", &in_refs),
        ("api", &question),
        ("web", &deploy),
        ("api", &plain),
    ] {
        post(&root, s, m);
    }

    let o = mediate(&root, &senv, &["--once", "-v"]);
    ok(&o);
    let es = entries(&root);
    let decision = |m: &Message, a: Action| {
        es.iter()
            .find(|e| e.message_id == m.id && e.decision.action == a)
            .map(|e| e.decision.reason.clone())
    };
    let mut held = 0;
    for (what, m) in &posted {
        let r = decision(m, Action::Hold).unwrap_or_else(|| panic!("{what}: not held"));
        assert!(r.contains("contains secret API_KEY"), "{what}: {r}");
        held += 1;
    }
    for m in [&in_subject, &in_refs, &question] {
        let r = decision(m, Action::Hold).expect("held");
        assert!(r.contains("contains secret API_KEY"), "{r}");
    }
    let r = decision(&deploy, Action::Hold).expect("held");
    assert!(r.contains("contains secret DEPLOY_KEY"), "{r}");
    assert!(
        decision(&plain, Action::Forward).is_some(),
        "ordinary text passes"
    );

    // Releasing them (from /, the same environment) delivers masked copies.
    let mut ids: Vec<String> = posted.iter().map(|(_, m)| m.id.clone()).collect();
    ids.push(question.id.clone());
    let mut args = vec!["release"];
    args.extend(ids.iter().map(String::as_str));
    ok(&mediate(&root, &senv, &args));
    let mut sync = env.sync_cmd(&["--once"]);
    sync.current_dir("/").envs(senv);
    let so = sync.output().unwrap();
    ok(&so);

    let sink = sink_texts(&env);
    let masks = sink
        .iter()
        .filter(|t| t.contains("[secret API_KEY]"))
        .count();
    let log = files_text(&root.log_dir());
    let human = files_text(&root.dir.join("human"));
    let inbox = files_text(&root.sandbox("web").dir);
    let outputs = vec![
        text(&o.stdout),
        text(&o.stderr),
        text(&so.stdout),
        text(&so.stderr),
        text(&mediate(&root, &senv, &["log"]).stdout),
        text(&mediate(&root, &senv, &["held"]).stdout),
        text(&mediate(&root, &senv, &["human"]).stdout),
    ];
    let mut total = [0usize; 5];
    for (what, form, core) in &forms {
        let n = [&sink, &log, &human, &inbox, &outputs].map(|t| copies(t, &[form, core]));
        println!(
            "secrets_door: {what:30} copies on the sink {}, in ROOT/log {}, ROOT/human {}, web's mailbox {}, outputs {}",
            n[0], n[1], n[2], n[3], n[4]
        );
        for (t, k) in total.iter_mut().zip(n) {
            *t += k;
        }
    }
    let deploy_b64 = base64(DEPLOY.as_bytes());
    let deploy_left = copies(&sink, &[DEPLOY, &deploy_b64]) + copies(&log, &[DEPLOY, &deploy_b64]);
    println!(
        "secrets_door: {} disguises held, released and synced: copies on the sink {}, ROOT/log {}, ROOT/human {}, web's mailbox {}, outputs {}; DEPLOY_KEY {deploy_left}; texts masked on the sink {masks}",
        forms.len(),
        total[0],
        total[1],
        total[2],
        total[3],
        total[4]
    );
    assert_eq!(held, forms.len());
    assert_eq!(total, [0; 5]);
    assert_eq!(deploy_left, 0);
    assert!(masks >= forms.len(), "{masks}");
    // The recipient got each body, masked.
    let delivered = inbox
        .iter()
        .filter(|t| t.contains("[secret API_KEY]"))
        .count();
    assert_eq!(delivered, forms.len());
    // The question reached a person, masked.
    assert_eq!(human.len(), 1, "{human:?}");
    assert!(human[0].contains("[secret API_KEY]"), "{}", human[0]);
    // Held copies keep the value as posted (SECRETS AT THE DOOR) and only
    // the mediator's user may read them.
    use std::os::unix::fs::PermissionsExt;
    for f in files_under(&root.dir.join("held")) {
        let mode = std::fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{}", f.display());
    }
}

/// Waits for `child` up to `limit`, then kills it; its status if it ended.
fn wait_for(mut child: std::process::Child, limit: Duration) -> (Option<i32>, String) {
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = child.id();
    let mut stderr = child.stderr.take().unwrap();
    let t = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).unwrap();
        let st = child.wait().unwrap();
        tx.send(st.code()).unwrap();
        s
    });
    let code = match rx.recv_timeout(limit) {
        Ok(c) => c,
        Err(_) => {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            rx.recv().unwrap();
            None
        }
    };
    (code, t.join().unwrap())
}

#[test]
fn a_recorded_secret_the_door_cannot_resolve_is_78_never_a_silent_pass() {
    let env = Env::new("door-78");
    let root = Root::new(&env.root);
    ok(&mediate(
        &root,
        &[],
        &["register", "api", "--secret", "API_KEY"],
    ));
    ok(&mediate(&root, &[], &["register", "web"]));
    let m = msg("web", Kind::Request, "key", &format!("{KEY}\n"));
    post(&root, "api", &m);

    // Without API_KEY in its environment: 78, the name, the record, the fix;
    // nothing routed, nothing logged.
    let o = mediate(&root, &[], &["--once"]);
    let err = text(&o.stderr);
    println!(
        "secrets_door: unresolvable: lw-mediate {:?}: {err}",
        o.status.code()
    );
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.starts_with("lw-mediate: cannot resolve secret API_KEY named by '"),
        "{err}"
    );
    assert!(err.contains("registry/api.json'"), "{err}");
    assert!(err.contains("export API_KEY"), "{err}");
    assert!(entries(&root).is_empty());
    assert!(
        root.sandbox("api")
            .outbox()
            .sub(Sub::New)
            .join(&m.id)
            .exists()
    );
    // Release and drop need the secrets too.
    let o = mediate(&root, &[], &["drop", &m.id]);
    assert_eq!(o.status.code(), Some(78), "{}", text(&o.stderr));

    // lw-sync too, and it posts nothing.  (A log entry written by hand: a
    // mediator of an older version may have logged the raw value.)
    env.log()
        .append(&sync_support::entry(&m, Action::Forward))
        .unwrap();
    let mut sync = env.sync_cmd(&["--once"]);
    let so = sync
        .current_dir("/")
        .env_remove("API_KEY")
        .output()
        .unwrap();
    assert_eq!(so.status.code(), Some(78), "{}", text(&so.stderr));
    assert!(text(&so.stderr).contains("cannot resolve secret API_KEY"));
    assert!(env.comments(1).is_empty());
    // With it, lw-sync masks what that older log holds.
    let mut sync = env.sync_cmd(&["--once"]);
    ok(&sync.current_dir("/").env("API_KEY", KEY).output().unwrap());
    let sink = sink_texts(&env);
    assert_eq!(copies(&sink, &[KEY]), 0);
    assert!(copies(&sink, &["[secret API_KEY]"]) > 0);

    // A watching mediator that sees a sandbox registered with a secret it
    // cannot resolve stops with 78 instead of routing past it.
    let watcher = Command::new(support::bin("lw-mediate"))
        .current_dir("/")
        .env_remove("GH_TOKEN")
        .env_remove("GITHUB_TOKEN")
        .env("API_KEY", KEY)
        .arg("--root")
        .arg(&root.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    ok(&mediate(
        &root,
        &[],
        &["register", "ops", "--secret", "OPS_TOKEN"],
    ));
    let (code, err) = wait_for(watcher, Duration::from_secs(120));
    println!("secrets_door: a watcher that meets OPS_TOKEN: {code:?}: {err}");
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("cannot resolve secret OPS_TOKEN"), "{err}");
}

/// Issue 40: a secret's value as a header field or as the file name was
/// quoted raw in the quarantine reason, in ROOT/log and `lw-mediate log`.
#[test]
fn a_secret_in_a_quarantined_entry_is_masked_in_its_reason() {
    let env = Env::new("door-quarantine-reason");
    let root = Root::new(&env.root);
    let senv = [("API_KEY", KEY)];
    ok(&mediate(
        &root,
        &[],
        &["register", "api", "--secret", "API_KEY"],
    ));
    Registry::new(&root)
        .register(&Sandbox::new("web", None, vec![]))
        .unwrap();
    let new = root.sandbox("api").outbox().sub(mailbox::maildir::Sub::New);
    // A header field that is the value (not a valid sender), and a file
    // name that is the value's hex.
    let hex: String = KEY.bytes().map(|b| format!("{b:02x}")).collect();
    std::fs::write(
        new.join("1.bad"),
        format!(
            "{{\"v\":1,\"id\":\"x\",\"from\":\"{KEY}\",\"to\":[\"web\"],\"kind\":\"{KEY}\",\"subject\":\"s\",\"body\":\"b\",\"created\":\"{KEY}\"}}"
        ),
    )
    .unwrap();
    std::fs::write(new.join(&hex), "not json").unwrap();
    ok(&mediate(&root, &senv, &["--once"]));
    let log = mediate(&root, &senv, &["log"]);
    ok(&log);
    let mut texts: Vec<String> = entries(&root)
        .iter()
        .map(|e| e.decision.reason.clone())
        .collect();
    texts.push(text(&log.stdout));
    texts.extend(files_text(&root.log_dir()));
    let reasons: Vec<&String> = texts.iter().filter(|t| t.contains("quarantine")).collect();
    assert!(reasons.len() >= 2, "{texts:?}");
    assert_eq!(copies(&texts, &[KEY, &hex]), 0, "{texts:#?}");
    assert!(
        texts.iter().any(|t| t.contains("[secret API_KEY]")),
        "{texts:#?}"
    );
}
