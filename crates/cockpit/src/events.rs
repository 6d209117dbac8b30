//! Live updates: one watcher thread per topic (crates/base/src/fs/watch.rs, inotify)
//! turns a change on disk into a topic name on a broadcast channel; each
//! open page holds a server-sent-events stream of those names and fetches
//! the part that changed.  A topic says "look again", never what changed,
//! as the watcher itself does; a slow page that falls behind the channel
//! gets every topic once (`lagged`), which means the same.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast;

use base::error::{Error, Exit, Result};
use base::fs::{Watcher, Woke};
use mailbox::layout::Root;

/// What a page refreshes on an event.
pub(super) const TOPICS: &[&str] = &["log", "queues", "sandboxes", "state"];

/// The directories each topic watches.
fn dirs(root: &Root, topic: &str) -> Vec<PathBuf> {
    match topic {
        "log" => vec![root.log_dir().join("new")],
        // A question answered or a message released moves from new/ to
        // cur/: the watcher sees arrivals only, so cur/ is watched too.
        "queues" => [root.human(), root.held()]
            .iter()
            .flat_map(|m| {
                [
                    m.sub(mailbox::maildir::Sub::New),
                    m.sub(mailbox::maildir::Sub::Cur),
                ]
            })
            .collect(),
        "sandboxes" => vec![root.registry_dir(), root.state_dir().join("sandbox")],
        _ => vec![root.state_dir()],
    }
}

/// Starts the watchers; their topics arrive on the returned sender's
/// receivers.  A directory that does not exist yet (no sandbox was ever
/// made) is left out; the others are watched.
pub(super) fn start(root: &Root) -> Result<broadcast::Sender<&'static str>> {
    let (tx, _) = broadcast::channel(64);
    for topic in TOPICS {
        let w = Watcher::new().map_err(|e| {
            Error::new(Exit::Unavailable, "cannot start a directory watcher").with_source(e)
        })?;
        for d in dirs(root, topic) {
            if d.is_dir() {
                w.add(&d).map_err(|e| Error::io("cannot watch", &d, e))?;
            }
        }
        let tx = tx.clone();
        std::thread::Builder::new()
            .name(format!("watch-{topic}"))
            .spawn(move || watch(w, topic, tx))
            .map_err(|e| Error::new(Exit::Unavailable, "cannot start a thread").with_source(e))?;
    }
    Ok(tx)
}

fn watch(w: Watcher, topic: &'static str, tx: broadcast::Sender<&'static str>) {
    loop {
        match w.wait(None) {
            Ok(Woke::Timeout) => continue,
            Ok(_) => {
                // No receiver (no page open) is not an error.
                let _ = tx.send(topic);
            }
            // An unreadable inotify descriptor will not recover; pages
            // still work, without live updates for this topic.
            Err(_) => return,
        }
    }
}

/// One server-sent event naming `topic`.
pub(super) fn frame(topic: &str) -> Bytes {
    Bytes::from(format!("event: change\ndata: {topic}\n\n"))
}

/// How often an idle stream says it is alive (a comment line), so a proxy
/// or the browser does not time it out.
pub(super) const KEEPALIVE: Duration = Duration::from_secs(15);

/// The next bytes of a page's stream: a topic, every topic after a lag,
/// a keep-alive comment, or `None` when the server is going away.
pub(super) async fn next(rx: &mut broadcast::Receiver<&'static str>) -> Option<Bytes> {
    match tokio::time::timeout(KEEPALIVE, rx.recv()).await {
        Err(_) => Some(Bytes::from_static(b": alive\n\n")),
        Ok(Ok(topic)) => Some(frame(topic)),
        Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
            let all: String = TOPICS
                .iter()
                .map(|t| format!("event: change\ndata: {t}\n\n"))
                .collect();
            Some(Bytes::from(all))
        }
        Ok(Err(broadcast::error::RecvError::Closed)) => None,
    }
}
