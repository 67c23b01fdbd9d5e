//! Make a delta as the publisher does, as a process of its own, so its time
//! and peak memory can be measured (`cargo xtask bench delta`).
//!
//! `delta_make OLD NEW DELTA [--threads N] [--level L]`

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use updraft_publish::delta::{self, DeltaOptions};

fn run(args: &[String]) -> Result<(), String> {
    let mut opts = DeltaOptions::default();
    let mut paths = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--threads" | "--level" | "--window" => {
                let v = it.next().ok_or(format!("{a} needs a value"))?;
                let n: i64 = v
                    .parse()
                    .map_err(|_| format!("{a} {v:?} is not a number"))?;
                match a.as_str() {
                    "--threads" => opts.threads = n as usize,
                    "--level" => opts.zstd_level = n as i32,
                    _ => opts.window = n as usize,
                }
            }
            _ => paths.push(a),
        }
    }
    let [old, new, out] = paths[..] else {
        return Err(
            "usage: delta_make OLD NEW DELTA [--threads N] [--level L] [--window BYTES]".into(),
        );
    };
    let old = std::fs::read(old).map_err(|e| format!("reading {old}: {e}"))?;
    let new = std::fs::read(new).map_err(|e| format!("reading {new}: {e}"))?;
    let file = std::fs::File::create(out).map_err(|e| format!("creating {out}: {e}"))?;
    let mut w = BufWriter::new(file);
    let n = delta::make(&old, &new, &opts, &mut w).map_err(|e| format!("making the delta: {e}"))?;
    w.flush().map_err(|e| format!("writing {out}: {e}"))?;
    println!("{n}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("delta_make: {e}");
            ExitCode::FAILURE
        }
    }
}
