//! Delta generation (see docs/deltas.md).

use std::io::Write;

#[derive(Clone, Debug)]
pub struct DeltaOptions {
    pub threads: usize,
    pub zstd_level: i32,
}

impl Default for DeltaOptions {
    fn default() -> Self {
        DeltaOptions {
            threads: 1,
            zstd_level: 19,
        }
    }
}

/// Write the zstd-wrapped bsdiff delta from `old` to `new` into `out`.
pub fn make(
    old: &[u8],
    new: &[u8],
    opts: &DeltaOptions,
    out: &mut dyn Write,
) -> std::io::Result<u64> {
    let mut raw = Vec::new();
    bsdiff::diff(old, new, &mut raw)?;
    let c = zstd::bulk::compress(&raw, opts.zstd_level)?;
    out.write_all(&c)?;
    Ok(c.len() as u64)
}
