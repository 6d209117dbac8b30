//! The terminal side of `lw-sandbox shell` and `exec -t`: raw mode while a
//! remote terminal is attached (restored on drop, also on error), and the
//! size to give the remote one.

use std::io::IsTerminal;

use rustix::termios::{self, OptionalActions, Termios};

/// Puts stdin's terminal into raw mode until dropped.
pub struct RawMode {
    saved: Option<Termios>,
}

impl RawMode {
    /// Raw mode when stdin is a terminal; a no-op otherwise.
    pub fn enter() -> RawMode {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return RawMode { saved: None };
        }
        let Ok(saved) = termios::tcgetattr(&stdin) else {
            return RawMode { saved: None };
        };
        let mut raw = saved.clone();
        raw.make_raw();
        if termios::tcsetattr(&stdin, OptionalActions::Now, &raw).is_err() {
            return RawMode { saved: None };
        }
        RawMode { saved: Some(saved) }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = &self.saved {
            let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, t);
        }
    }
}

/// Rows and columns of stdout's terminal, if it is one.
pub fn size() -> Option<(u16, u16)> {
    let out = std::io::stdout();
    if !out.is_terminal() {
        return None;
    }
    let ws = termios::tcgetwinsize(&out).ok()?;
    (ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}
