//! Make a delta as the publisher does, as a process of its own, so its time
//! and peak memory can be measured (`cargo xtask bench delta`).
//!
//! `delta_make OLD NEW DELTA [--threads N] [--level L] [--window BYTES]
//! [--memory MIB]`: both images are read from their files as the publisher
//! reads them (whole when the pair fits the memory budget, by offset
//! otherwise). Prints the delta's size and the plan followed.

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use updraft_publish::delta::{self, DeltaOptions};

fn run(args: &[String]) -> Result<(), String> {
    let mut opts = DeltaOptions::default();
    let mut paths = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--threads" | "--level" | "--window" | "--memory" => {
                let v = it.next().ok_or(format!("{a} needs a value"))?;
                let n: i64 = v
                    .parse()
                    .map_err(|_| format!("{a} {v:?} is not a number"))?;
                match a.as_str() {
                    "--threads" => opts.threads = n as usize,
                    "--level" => opts.zstd_level = n as i32,
                    "--memory" => opts.memory_budget = (n as usize) << 20,
                    _ => opts.window = n as usize,
                }
            }
            _ => paths.push(a),
        }
    }
    let [old, new, out] = paths[..] else {
        return Err(
            "usage: delta_make OLD NEW DELTA [--threads N] [--level L] [--window BYTES] [--memory MIB]"
                .into(),
        );
    };
    let old_file = std::fs::File::open(old).map_err(|e| format!("opening {old}: {e}"))?;
    let new_file = std::fs::File::open(new).map_err(|e| format!("opening {new}: {e}"))?;
    let len = |f: &std::fs::File, p: &str| {
        f.metadata()
            .map(|m| m.len())
            .map_err(|e| format!("reading {p}: {e}"))
    };
    let plan = delta::plan(len(&old_file, old)?, len(&new_file, new)?, &opts);
    let file = std::fs::File::create(out).map_err(|e| format!("creating {out}: {e}"))?;
    let mut w = BufWriter::new(file);
    let n = delta::make_from(&old_file, &new_file, &opts, &mut w)
        .map_err(|e| format!("making the delta: {e}"))?;
    w.flush().map_err(|e| format!("writing {out}: {e}"))?;
    println!("{n} {plan:?}");
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
