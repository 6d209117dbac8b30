//! Names: message ids (which are also the file names in every mailbox
//! directory) and sandbox names, validated here so that the message, the
//! Maildir and the root's layout all depend on this module and not on each
//! other.
//!
//! Message ids.
//!
//! Grammar: `SSSSSSSSSS.NNNNNNNNN.RRRRRRRRRRRRRRRRRRRRRRRRRRRRRRRR` - seconds since
//! the epoch (10 digits), nanoseconds (9 digits), and 128 bits from the kernel's
//! random source as 32 lowercase hex digits.  Fixed widths make byte order equal
//! time order; the random part makes names unique across hosts and containers
//! whose PIDs and clocks repeat, which is why it replaces Maildir's pid and
//! hostname.  No `/`, no `:`, no leading `.`.

use std::time::Duration;

pub const ID_LEN: usize = 10 + 1 + 9 + 1 + 32;

/// A new id for the current time.
pub fn new_id() -> String {
    id_at(crate::time::now(), random128())
}

/// The id for a given time and random value (tests and deterministic names).
pub fn id_at(t: Duration, rand: u128) -> String {
    format!(
        "{:010}.{:09}.{:032x}",
        t.as_secs() % 10_000_000_000,
        t.subsec_nanos(),
        rand
    )
}

/// 128 bits from getrandom(2).
pub fn random128() -> u128 {
    let mut buf = [0u8; 16];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            // Only on kernels older than 3.17; no such kernel runs Docker today.
            Err(e) => panic!("getrandom failed: {e}"),
        }
    }
    u128::from_ne_bytes(buf)
}

/// True when `name` follows the id grammar exactly.
pub fn is_valid(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == ID_LEN
        && b[..10].iter().all(u8::is_ascii_digit)
        && b[10] == b'.'
        && b[11..20].iter().all(u8::is_ascii_digit)
        && b[20] == b'.'
        && b[21..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// The time an id was made, for sorting and age checks.
pub fn time_of(id: &str) -> Option<Duration> {
    if !is_valid(id) {
        return None;
    }
    Some(Duration::new(
        id[..10].parse().ok()?,
        id[11..20].parse().ok()?,
    ))
}

/// Reserved recipient names: the mediator itself and the human queue (here,
/// not in `layout`, so that `message` needs no `layout`: no import circle).
pub const MEDIATOR: &str = "mediator";
pub const HUMAN: &str = "human";

/// True for a valid sandbox name: 1-63 of `[a-z0-9._-]`, starting with a letter
/// or digit.  Names become directory names, container names and git ref parts.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && !b[0].is_ascii_uppercase()
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
        && !name.contains("..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_grammar_and_sort_by_time() {
        let a = id_at(Duration::new(5, 1), u128::MAX);
        let b = id_at(Duration::new(5, 2), 0);
        let c = id_at(Duration::new(1_796_058_405, 0), 7);
        assert!(is_valid(&a) && is_valid(&b) && is_valid(&c), "{a} {b} {c}");
        assert!(a < b && b < c);
        assert_eq!(time_of(&b), Some(Duration::new(5, 2)));
    }

    #[test]
    fn fresh_ids_are_distinct() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| new_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|i| is_valid(i)));
    }

    #[test]
    fn rejects_names_outside_the_grammar() {
        for bad in [
            "",
            ".1",
            "a:b",
            "../x",
            "1796058405.000000000.ABCDEF00000000000000000000000000",
        ] {
            assert!(!is_valid(bad), "{bad}");
        }
    }
}
