//! A `lw-inbox --wait` waiting in a sandbox: the reader's side of a
//! delivery, used to time post -> deliver end to end.

use std::time::SystemTime;

use super::Target;
use crate::sandbox_support::Fixture;

/// A `lw-inbox --wait` in sandbox `name`, started and waiting.
pub(super) struct Waiter(crate::courier_support::Waiter);

impl Waiter {
    pub(super) fn start(fx: &Fixture, t: &Target, name: &str) -> Waiter {
        let wait = crate::courier_support::WAIT;
        Waiter(crate::courier_support::Waiter::start(
            t.env(&mut fx.cmd(&["exec", name, "--", "sh", "-c", wait])),
        ))
    }
    /// The line it lists and when it came; it must be `id`'s.
    pub(super) fn listed(self, id: &str) -> (String, SystemTime) {
        self.0.listed(id)
    }
}

/// Acks everything in sandbox `name`'s inbox, so that a waiter waits.
pub(super) fn ack_all(fx: &Fixture, t: &Target, name: &str) {
    t.ok(
        fx,
        &[
            "exec",
            name,
            "--",
            "sh",
            "-c",
            "ls /lw/mailbox/inbox/new | lw-inbox ack - >/dev/null",
        ],
    );
}
