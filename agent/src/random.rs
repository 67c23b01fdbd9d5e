//! Randomness from the operating system, for what must not be guessed or
//! collide: device ids, temporary file names, report keys, backoff jitter.
//!
//! One function over ring's `SystemRandom` (`getrandom(2)`), so no module
//! needs another's concern to draw a number. It never falls back to a
//! weaker source: a failure is an error.

use crate::err;
use crate::error::Result;

/// `N` random bytes from the operating system.
pub fn bytes<const N: usize>() -> Result<[u8; N]> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| err!(Io, "the system random number generator failed"))?;
    Ok(b)
}
