//! Streaming bsdiff patcher (see docs/deltas.md).

use std::fs::File;
use std::io::Read;

use crate::bail;
use crate::error::Result;

/// Apply a zstd-wrapped bsdiff delta from `old` into `sink`.
pub fn apply(
    _old: &File,
    _old_len: u64,
    _patch: &mut dyn Read,
    _new_len: u64,
    _sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    bail!(Malformed, "delta support is not built in")
}
