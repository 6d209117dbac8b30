//! The tools lw-mcp offers: their names, descriptions and input schemas, and
//! the argument types those schemas decode into.
//!
//! Arguments are decoded strictly (unknown fields are refused), so a typo
//! such as `in_reply_To` is a -32602 naming the field, not a reply link that
//! silently went missing.  Whether a well-typed message may be posted (kind,
//! sizes, names) is the post library's decision and comes back as a tool
//! result with `isError`, like any other refusal.

use serde::Deserialize;
use serde_json::{Value, json};

/// `post`'s arguments: the fields of lw-post.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostArgs {
    pub kind: String,
    pub subject: String,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub to: Vec<String>,
    #[serde(default)]
    pub refs: Vec<String>,
    #[serde(default)]
    pub in_reply_to: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxArgs {
    #[serde(default)]
    pub all: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdArgs {
    pub id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    #[serde(default = "default_timeout")]
    pub timeout: f64,
    #[serde(default)]
    pub kinds: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

fn default_timeout() -> f64 {
    DEFAULT_WAIT
}

/// `wait`'s timeout when none is given, and the longest it accepts (s).
pub const DEFAULT_WAIT: f64 = 60.0;
pub const MAX_WAIT: f64 = 3600.0;

const ID_PATTERN: &str = "^[0-9]{10}\\.[0-9]{9}\\.[0-9a-f]{32}$";

/// One tool: name, description, input schema.
pub struct Spec {
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    pub read_only: bool,
    pub schema: Value,
}

/// Every tool, in the order `tools/list` shows them.
pub fn specs(kinds: &[&str]) -> Vec<Spec> {
    vec![
        post_spec(kinds),
        inbox_spec(),
        show_spec(),
        ack_spec(),
        wait_spec(),
        whoami_spec(),
    ]
}

/// The `post` tool.
fn post_spec(kinds: &[&str]) -> Spec {
    let name = json!({"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,62}$"});
    Spec {
        name: "post",
        title: "Post a message",
        description: "Post one message to the mediator, which routes it to other sandboxes or a person \
             (see the kinds). The message is on disk when this returns; the result holds its id. \
             Use `request`/`handoff` with `to` naming sandboxes, `question` for a person, \
             `answer` with `in_reply_to`, `contract-change` with `refs` naming the changed files \
             or contracts, `status` for news. Limits: subject one line of at most 200 bytes, \
             body at most 262144 bytes (put longer text in a file and name it in `refs`). \
             A refused message comes back as an error result that says what to change.",
        read_only: false,
        schema: json!({
            "type": "object",
            "properties": {
                "kind": {"type": "string", "enum": kinds,
                    "description": "contract-change: a shared interface changed (name it in refs); request: ask a named sandbox to do something; handoff: pass work to a named sandbox; question: needs a person; answer: answers in_reply_to; status: news, nobody must act"},
                "subject": {"type": "string", "minLength": 1, "maxLength": 200,
                    "description": "One line, at most 200 bytes, no control characters"},
                "body": {"type": "string", "description": "The text, at most 262144 bytes; default empty"},
                "to": {"type": "array", "items": name, "maxItems": 64,
                    "description": "Recipients: sandbox names (see whoami's peers), `mediator` or `human`; default [\"mediator\"]"},
                "refs": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 1024}, "maxItems": 64,
                    "description": "Paths (src/api/schema.json) or named contracts (contract:billing-api) the message is about"},
                "in_reply_to": {"type": ["string", "null"], "pattern": ID_PATTERN,
                    "description": "Id of the message this one answers (required for kind answer)"}
            },
            "required": ["kind", "subject"],
            "additionalProperties": false
        }),
    }
}

/// The `inbox` tool.
fn inbox_spec() -> Spec {
    Spec {
        name: "inbox",
        title: "List the inbox",
        description: "List the messages delivered to this sandbox: unread ones (state new), or with \
             all=true also those already acknowledged (state read). Each entry has id, from, kind, \
             subject, created, state; call show for the body and ack when you have handled one.",
        read_only: true,
        schema: json!({
            "type": "object",
            "properties": {"all": {"type": "boolean", "default": false,
                "description": "Also list acknowledged messages"}},
            "additionalProperties": false
        }),
    }
}

/// The `show` tool.
fn show_spec() -> Spec {
    Spec {
        name: "show",
        title: "Show a message",
        description: "Show one message of the inbox, new or acknowledged, with its body. Does not acknowledge it.",
        read_only: true,
        schema: json!({
            "type": "object",
            "properties": {"id": {"type": "string", "pattern": ID_PATTERN,
                "description": "The message id, as inbox or wait gave it"}},
            "required": ["id"],
            "additionalProperties": false
        }),
    }
}

/// The `ack` tool.
fn ack_spec() -> Spec {
    Spec {
        name: "ack",
        title: "Acknowledge a message",
        description: "Acknowledge a message you have handled: it leaves the unread list and the \
             mediator records a read receipt. Acknowledging twice is harmless (already: true).",
        read_only: false,
        schema: json!({
            "type": "object",
            "properties": {"id": {"type": "string", "pattern": ID_PATTERN,
                "description": "The message id"}},
            "required": ["id"],
            "additionalProperties": false
        }),
    }
}

/// The `wait` tool.
fn wait_spec() -> Spec {
    Spec {
        name: "wait",
        title: "Wait for messages",
        description: "Block until there are unread messages this session has not seen yet (not listed \
             by inbox, shown, or returned by an earlier wait), then return them with their bodies; \
             returns at once when there already are some. Returns an empty list with timed_out=true \
             when none came within timeout seconds. Cancelling the call stops the wait. Ack what you \
             have handled.",
        read_only: true,
        schema: json!({
            "type": "object",
            "properties": {
                "timeout": {"type": "number", "minimum": 0, "maximum": MAX_WAIT, "default": DEFAULT_WAIT,
                    "description": "Seconds to wait at most"},
                "kinds": {"type": "array", "items": {"type": "string", "enum": all_kinds()},
                    "description": "Only wake for these kinds; default any"}
            },
            "additionalProperties": false
        }),
    }
}

/// The `whoami` tool.
fn whoami_spec() -> Spec {
    Spec {
        name: "whoami",
        title: "Who am I",
        description: "This sandbox's name, branch, mailbox and scope, and the other sandboxes (peers) \
             with their branches and scopes: the names post's `to` accepts, and who owns which paths.",
        read_only: true,
        schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
    }
}

fn all_kinds() -> Vec<&'static str> {
    mailbox::message::KINDS.iter().map(|k| k.as_str()).collect()
}
