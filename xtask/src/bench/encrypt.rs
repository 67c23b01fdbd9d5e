//! `cargo xtask bench encrypt [--size MIB] [--runs N]`: what encryption
//! costs, a plain and an encrypted release of the same image side by side.
//!
//! The image is the test support's synthetic one (pseudo-random blocks
//! mixed with repeated and zero blocks, so it compresses partly, like a
//! filesystem), `--size` MiB (default 64). With the release binaries, each
//! `--runs` times (default 3), interleaved: `updraft-publish release` plain
//! and with `--encrypt-to` (one recipient, the device), then `updraft
//! install` of each on a fresh simulated device with file slots. Printed:
//! artifact bytes, and the median wall time of publishing and installing.
//! Timings are printed, never asserted.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{KeyPair, image, recipient_list};
use updraft_tests::tmp::TempDir;

use super::common::{self, fmt_secs, print_table, summary};
use crate::util::Result;

pub fn run(args: &[String]) -> Result {
    let flags = common::flags(args, &["size", "runs"])?;
    let mib = common::number_flag(&flags, "size", 64)?;
    let runs = common::number_flag(&flags, "runs", 3)?.max(1);
    let bin = common::release_binaries()?;
    let publish = bin.join("updraft-publish");
    let updraft = bin.join("updraft");
    let work = TempDir::new("bench-encrypt");
    let size = (mib << 20) as usize;
    let img = work.path().join("image.img");
    image(&img, size, 42);
    let prefix = work.path().join("release");
    run_ok(
        Command::new(&publish)
            .args(["keygen", "--out"])
            .arg(&prefix),
    )?;
    let release = KeyPair {
        key: prefix.with_extension("key"),
        public: prefix.with_extension("pub"),
    };
    let mut times: [[Vec<f64>; 2]; 2] = Default::default();
    let mut bytes = [0u64; 2];
    for run in 0..runs {
        for (v, encrypted) in [false, true].into_iter().enumerate() {
            let mut spec = DeviceSpec::simple(&release);
            spec.slot_size = (size as u64).next_multiple_of(1 << 20) + (1 << 20);
            let mut dev = Device::new(&format!("bench-enc-{run}-{v}"), spec);
            dev.use_binary(Some(updraft.clone()));
            dev.init();
            let out = work.path().join(format!("r{run}-{v}"));
            let mut cmd = Command::new(&publish);
            cmd.args(["release", "--key"])
                .arg(&release.key)
                .args(["--version", "2.0", "--compatible", "testboard", "--image"])
                .arg(&img)
                .arg("--out")
                .arg(&out);
            if encrypted {
                let list = recipient_list(
                    &work.path().join(format!("recipients-{run}")),
                    &[&dev.encryption_key()],
                );
                cmd.arg("--encrypt-to").arg(list);
            }
            let t = Instant::now();
            run_ok(&mut cmd)?;
            times[v][0].push(t.elapsed().as_secs_f64());
            bytes[v] = artifact_bytes(&out)?;
            let manifest = out.join("manifest.json");
            let t = Instant::now();
            let o = dev.install(manifest.to_str().ok_or("non-UTF-8 path")?);
            if !o.status.success() {
                return Err(format!(
                    "updraft install failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
            times[v][1].push(t.elapsed().as_secs_f64());
        }
    }
    println!("\n{mib} MiB image, {runs} run(s) each, release binaries, median wall time\n");
    let mut rows = vec![vec![
        "release".to_string(),
        "artifact bytes".into(),
        "publish".into(),
        "install".into(),
    ]];
    for (v, name) in ["plain", "encrypted"].into_iter().enumerate() {
        rows.push(vec![
            name.into(),
            bytes[v].to_string(),
            fmt_secs(summary(&times[v][0])),
            fmt_secs(summary(&times[v][1])),
        ]);
    }
    print_table(&rows);
    println!(
        "\nencrypted artifact: {:+} bytes ({:+.3} %)",
        bytes[1] as i64 - bytes[0] as i64,
        (bytes[1] as f64 / bytes[0] as f64 - 1.0) * 100.0
    );
    Ok(())
}

fn run_ok(cmd: &mut Command) -> Result {
    let o = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(())
}

fn artifact_bytes(out: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(out.join("manifest.json"))
        .map_err(|e| format!("reading the manifest: {e}"))?;
    let env: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let payload = env["payload"].as_str().ok_or("no payload")?;
    let raw = updraft::keys::decode_base64(payload, "payload").map_err(|e| e.to_string())?;
    let p: serde_json::Value = serde_json::from_slice(&raw).map_err(|e| e.to_string())?;
    p["artifact"]["size"]
        .as_u64()
        .ok_or_else(|| "no artifact size".to_string())
}
