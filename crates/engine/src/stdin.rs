//! Standard input for an engine's exec, read by a plain thread (a terminal
//! or a pipe blocks) and handed to the async side in chunks.

use std::io::Read;

use tokio::sync::mpsc::{Receiver, channel};

/// Starts reading `stdin`, if any, on its own thread.  The receiver yields
/// `Some(chunk)` for what was read and `None` once at its end (or on a read
/// error); with no `stdin` the channel is closed at once.
pub(crate) fn pump(stdin: Option<Box<dyn Read + Send>>) -> Receiver<Option<Vec<u8>>> {
    let (tx, rx) = channel::<Option<Vec<u8>>>(16);
    if let Some(mut input) = stdin {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.blocking_send(None);
                        return;
                    }
                    Ok(n) => {
                        if tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    rx
}
