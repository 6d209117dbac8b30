//! The courier: carries the mail of volume-mode sandboxes (volume.rs)
//! between their mail volumes on the engine's side and the root on this
//! host, through the engine contract only (`copy_out`, `copy_in`,
//! `exec_io`).  mailbox-spec.md, "REMOTE ENGINES", is the normative text;
//! in short, per sandbox and pass:
//!
//! * **out**: an archive of the volume's `outbox/new/` is read as it
//!   streams; each regular file named by the id grammar, within the
//!   message-file limit and without a NUL byte is delivered into `ROOT/sandboxes/NAME/outbox/`
//!   with deliver-once (no-replace rename, skipped when the name is in
//!   `new/` or `cur/` already), so a copy carried twice (a crash before the
//!   acknowledgement) lands once.  Only when that delivery is durable is the
//!   engine's copy acknowledged: linked into `outbox/cur/` and removed from
//!   `outbox/new/`, inside the sandbox, as its user.  Anything else in
//!   `outbox/new/` (links, directories, other names, oversized files) is
//!   moved to `outbox/junk/` there and reported.  Each pass reads at most
//!   [`PASS_MAX`] of a sandbox's outbox, and never the data of an entry
//!   over the limit (outbox.rs): what a sandbox plants costs the courier,
//!   and the other sandboxes' mail, a bounded read.  The sender is the
//!   sandbox whose volume it came from: the courier writes only into that
//!   sandbox's own outbox on the host.
//! * **in**: each name in the host's `inbox/new/` (the mediator's
//!   deliveries) that this courier has not delivered yet is copied into the
//!   volume's `inbox/tmp/`; inside, a name already in `cur/` (acked: the
//!   host's copy is then claimed into `inbox/cur/`, which is what the
//!   mediator's read receipts read) or in `new/` is dropped from `tmp/`, the
//!   others are fsynced, linked into `inbox/new/` (link(2) never replaces)
//!   and removed from `tmp/`, and `new/` is fsynced: `lw-inbox --wait`
//!   inside wakes on the link.  Names delivered and not acked are looked up
//!   again every second, for the receipts.
//!
//! Passes do every sandbox's deliveries first, then the outboxes.  Each
//! engine request is a round trip (over TLS, a handshake: bollard keeps no
//! idle connection), so a pass is a handful of requests per sandbox: the
//! outbox's archive, and an exec only when there is something to do.
//!
//! The host side is watched (inotify on the inboxes); the engine side is
//! polled, since its API raises no event for a file in a volume.
//!
//! The courier is the root's own daemon: a volume-mode `create` (and
//! `lw-sandbox courier --ensure`) makes sure one courier runs for the root,
//! so mail moves without anyone starting one by hand.
//!
//! * **One.**  `ROOT/state/courier.lock` makes it one per
//!   root; the holder writes its pid to `ROOT/state/courier.pid`.  `ensure`
//!   starts one only when the lock is free; two racing `ensure`s start two,
//!   and the one that loses the lock exits at once saying who holds it.
//! * **Detached.**  `lw-sandbox courier --detached`, in a process group of
//!   its own, with no terminal and its output (timestamped pass lines and
//!   warnings, one of each repeat) appended to `ROOT/state/courier.log`
//!   (kept under [`LOG_MAX`]: the older half is `courier.log.1`).  It tells
//!   the `ensure` that started it its pid over a pipe once it holds the
//!   lock, or that another holds it, then closes that pipe.
//! * **Leaves by itself.**  When the root has no ready volume-mode sandbox
//!   (the last one removed, or the root itself removed) it removes its pid
//!   file, lets go of the lock and looks once more: a `create` that finished
//!   meanwhile saw the lock held and started nothing, so the courier takes
//!   the lock back and stays (or, when another took it, leaves it that one).
//! * **Restarted.**  A courier killed (even with SIGKILL) loses nothing
//!   (mailbox-spec.md, REMOTE ENGINES); the next volume-mode `create` or
//!   `courier --ensure` starts another.  `courier --stop` ends it (SIGTERM)
//!   and returns once its lock is free.
//!
//! By concern: `carry` (the passes), `outbox` (its bounded read), `lock` (one courier per root),
//! `serve` (the loop, and `lw-sandbox courier` in the foreground) and
//! `daemon` (the detached courier, started and stopped).

mod carry;
mod daemon;
mod lock;
mod outbox;
mod ring;
mod serve;

pub use carry::{Carried, Courier, Due, Status};
pub use daemon::{Ensured, LOG_MAX, control, detached, ensure, ensure_from, log_path};
pub use lock::{PidFile, lock_path, pid_path, running, stop, take_lock};
pub use outbox::{End, HEADERS, PASS_MAX, Read1, read_outbox};
pub use ring::SILENT;
pub use serve::{SWEEP, Told, foreground, run, serve};
