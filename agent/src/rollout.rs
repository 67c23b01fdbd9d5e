//! Staged rollout without a smart server.
//!
//! A manifest may say `"rollout": {"percent": 10}`. A device is eligible
//! when `sha256(device_id ‖ release.version)`, read as a big-endian number
//! and divided by 2^256, is below `percent / 100`. The answer depends only on
//! the device and the release, so the same device gets the same answer on
//! every poll, different releases pick different subsets, and raising the
//! percentage in a re-signed manifest only ever adds devices.
//!
//! Only the first 64 bits of the hash take part in the comparison; the
//! remaining bits could change the answer only for a device whose first 64
//! bits equal the threshold exactly (probability 2^-64).

use crate::hash::Sha256;

/// Eligibility of `device_id` for `version` at `percent` (0..=100).
pub fn eligible(device_id: &str, version: &str, percent: f64) -> bool {
    if percent.is_nan() || percent <= 0.0 {
        return false;
    }
    if percent >= 100.0 {
        return true;
    }
    let mut input = Vec::with_capacity(device_id.len() + version.len());
    input.extend_from_slice(device_id.as_bytes());
    input.extend_from_slice(version.as_bytes());
    let h = Sha256::of(&input);
    let mut top = [0u8; 8];
    top.copy_from_slice(&h.0[..8]);
    let x = u64::from_be_bytes(top) as u128;
    // x / 2^64 < percent / 100  ⇔  x * 10^8 < round(percent * 10^6) * 2^64
    let p = (percent * 1_000_000.0).round() as u128;
    x * 100_000_000 < p << 64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges() {
        assert!(!eligible("d", "1.0", 0.0));
        assert!(!eligible("d", "1.0", -5.0));
        assert!(!eligible("d", "1.0", f64::NAN));
        assert!(eligible("d", "1.0", 100.0));
    }

    #[test]
    fn monotonic_in_percent() {
        for i in 0..500 {
            let id = format!("dev-{i}");
            let mut was = false;
            for p in [1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 99.0] {
                let now = eligible(&id, "2.0", p);
                assert!(!was || now, "{id} left the rollout when it grew to {p}%");
                was = now;
            }
        }
    }
}
