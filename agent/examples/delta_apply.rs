//! Apply a delta as the device does, as a process of its own, so its time and
//! peak memory can be measured (`cargo xtask bench delta`).
//!
//! `delta_apply [--no-sync] OLD DELTA NEW NEW_SIZE`: reads the source from
//! OLD with pread, streams DELTA through the patcher and writes NEW through
//! the slot writer (NEW is created at NEW_SIZE bytes), hashing the output on
//! the way as an install does: write-back in steps, fdatasync and a dropped
//! page cache at the end. With `--no-sync` it writes into the page cache
//! only, as xdelta3 and bspatch do. Prints the sha256 of the new image.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::ExitCode;

use updraft::error::{Context, Result};
use updraft::hash::Hasher;
use updraft::slot::SlotWriter;

fn run(args: &[String]) -> Result<()> {
    let (plain, args) = match args {
        [flag, rest @ ..] if flag == "--no-sync" => (true, rest),
        _ => (false, args),
    };
    let [old, delta, new, size] = args else {
        return Err(updraft::err!(
            Usage,
            "usage: delta_apply [--no-sync] OLD DELTA NEW NEW_SIZE"
        ));
    };
    let new_len: u64 = size
        .parse()
        .map_err(|_| updraft::err!(Usage, "NEW_SIZE {size:?} is not a number"))?;
    let old_file = File::open(old).with_context(|| format!("opening {old}"))?;
    let old_len = old_file
        .metadata()
        .with_context(|| format!("reading {old}"))?
        .len();
    let mut patch = File::open(delta).with_context(|| format!("opening {delta}"))?;
    let out = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(new)
        .with_context(|| format!("creating {new}"))?;
    out.set_len(new_len)
        .with_context(|| format!("sizing {new}"))?;
    let mut hasher = Hasher::new();
    // The slot writer (bounded write-back, like the device), or plain
    // positioned writes with --no-sync.
    let mut writer = if plain {
        None
    } else {
        Some(SlotWriter::open(Path::new(new), Path::new(old), 32 << 20)?)
    };
    let mut at = 0u64;
    updraft::delta::apply(
        &old_file,
        old_len,
        &mut patch,
        new_len,
        &mut |block: &[u8]| {
            hasher.update(block);
            match writer.as_mut() {
                Some(w) => w.write_all(block).map(|_| ()),
                None => {
                    out.write_all_at(block, at)
                        .with_context(|| format!("writing {new}"))?;
                    at += block.len() as u64;
                    Ok(())
                }
            }
        },
    )?;
    if let Some(w) = writer {
        w.finish()?;
    }
    println!("{}", hasher.finish());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("delta_apply: {e}");
            ExitCode::FAILURE
        }
    }
}
