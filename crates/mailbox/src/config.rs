//! The door's keys of `.loopwright/config` (the file's format and the
//! checks are `base::config`'s).  lw-mediate and lw-sync read them; the
//! product's commands check them with every other layer's.

use base::config::{Check, Keys};

/// The door's keys: lw-mediate(1), lw-sync(1).
pub const KEYS: Keys = &["door.secrets", "door.log-max", "door.quarantine-max"];

/// The check the door's readers make: its own keys, the other layers' left
/// to the commands that read them (`base::config::Check::Own`).
pub const CHECK: Check<'static> = Check::Own(KEYS);
