//! Seeded randomness for crash and storm tests: the seed is printed once,
//! so a red run can be replayed with `LW_TEST_SEED=N cargo test --test T`.
//! (The kill moments also depend on the machine's timing; the seed fixes
//! every choice the test itself makes.)

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static SEED: OnceLock<u64> = OnceLock::new();
static STATE: AtomicU64 = AtomicU64::new(0);

/// The seed of this run: `LW_TEST_SEED`, or a random one; printed once.
pub fn seed() -> u64 {
    *SEED.get_or_init(|| {
        let seed = match std::env::var("LW_TEST_SEED") {
            Ok(s) => s
                .parse()
                .expect("LW_TEST_SEED is a whole number because the test printed it"),
            Err(_) => base::id::random128() as u64,
        };
        eprintln!("seed {seed} (replay with LW_TEST_SEED={seed})");
        STATE.store(seed, Ordering::Relaxed);
        seed
    })
}

/// A number below `n` (splitmix64 over the seeded sequence).
pub fn below(n: u64) -> u64 {
    seed();
    let mut z = STATE
        .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % n.max(1)
}
