//! A tiny deterministic generator (xorshift64) for schedules and test data
//! that must be the same on every run with the same seed. Not for anything
//! that needs unpredictability.

/// xorshift64; the seed must not be 0 (`seed | 1` is a safe choice).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
