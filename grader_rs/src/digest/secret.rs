//! The process secret: the seed keying every row hash, and its public id.

use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::xxh3_64_with_seed;

static SECRET: AtomicU64 = AtomicU64::new(0);
static SECRET_INIT: std::sync::Once = std::sync::Once::new();

/// The seed keying every row hash. Random per process unless `set_secret` fixed it (a disk
/// cache shared by several processes does that).
pub fn secret() -> u64 {
    SECRET_INIT.call_once(|| {
        if SECRET.load(Ordering::Relaxed) == 0 {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).expect("OS random source");
            SECRET.store(u64::from_le_bytes(b) | 1, Ordering::Relaxed);
        }
    });
    SECRET.load(Ordering::Relaxed)
}

pub fn set_secret(bytes: &[u8]) {
    SECRET_INIT.call_once(|| {});
    SECRET.store(
        xxh3_64_with_seed(bytes, 0x7432_7371_6c5f_6b65) | 1,
        Ordering::Relaxed,
    );
}

/// A public name for the secret (a hash of it), to tell digests of different secrets apart.
pub fn secret_id() -> u64 {
    xxh3_64_with_seed(&secret().to_le_bytes(), 0x6964)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn the_secret_is_drawn_once_odd_and_named_by_a_hash_of_it() {
        // No test sets the secret (that would change every other test's digests); this one
        // only reads it.
        let s = secret();
        assert_eq!(s & 1, 1, "never 0, the value that means not drawn yet");
        assert_eq!(secret(), s);
        assert_eq!(secret_id(), secret_id());
        assert_ne!(
            secret_id(),
            s,
            "the public id does not give the secret away"
        );
    }
}
