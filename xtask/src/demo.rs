//! `cargo xtask demo`: the main job of updraft end to end, on a safe
//! default — file-backed slots, the `file` bootloader, the publisher's
//! output served over TLS on 127.0.0.1 — with a real update, a delta update
//! and a real rollback, a line for each step and a summary at the end.
//!
//! The server is nginx when it is installed (`/usr/sbin/nginx`, or
//! `UPDRAFT_NGINX`), otherwise the embedded static server of the test
//! support crate, so the demo needs nothing but Rust; `--server
//! nginx|embedded` insists on one, and `UPDRAFT_NGINX=/nonexistent` hides
//! nginx. The demo says which one it uses.
//!
//! Nothing here is simulated except the reboot itself: the daemon's reboot
//! command only leaves a marker, and the demo plays the boot loader (it runs
//! the boot script logic on the boot state file, gives the device a new boot
//! id and starts the daemon again), exactly as the end-to-end tests do.
//!
//! A missing prerequisite is one sentence with its fix and a non-zero exit,
//! never a panic: the test-support calls the demo makes panic on failure
//! (they are written for tests), so the demo runs them under
//! `catch_unwind` with a panic hook that keeps the message and prints no
//! backtrace.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use updraft_tests::device::{Device, DeviceSpec, TrustSpec};
use updraft_tests::nginx::AccessEntry;
use updraft_tests::publisher::{KeyPair, image, keygen, publish_ok};
use updraft_tests::server::{Choice, Site};
use updraft_tests::tmp::TempDir;

use crate::util::{self, Result};

const WAIT: Duration = Duration::from_secs(120);
const MIB: usize = 1024 * 1024;

const USAGE: &str = "usage: cargo xtask demo [--server auto|nginx|embedded] [--vm]
  auto (default): nginx when installed (/usr/sbin/nginx, or UPDRAFT_NGINX), else the embedded server
  --vm: a full update and a rollback on a real QEMU x86_64 machine (GRUB, a kernel, real reboots),
        its console shown (as cargo xtask vm-test builds it)";

pub fn run(args: &[String]) -> Result {
    let mut choice = Choice::Auto;
    let mut vm = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--server" => {
                let v = it.next().ok_or(USAGE)?;
                choice = Choice::parse(v).ok_or_else(|| {
                    format!("--server {v:?}: expected auto, nginx or embedded\n{USAGE}")
                })?;
            }
            "--vm" => vm = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if vm {
        return crate::vm::demo();
    }
    check_prerequisites()?;
    util::build_binaries()?;
    guarded(|| demo(choice))
}

/// What the demo needs besides Rust, each with its fix.
fn check_prerequisites() -> Result {
    for (tool, why) in [
        ("sh", "runs the demo's health check and reboot command"),
        ("install", "puts the health check in place (coreutils)"),
    ] {
        if updraft_tests::prereq::command(tool).is_none() {
            return Err(format!(
                "`{tool}` is not on PATH, and the demo needs it ({why}): add /bin and /usr/bin to PATH"
            ));
        }
    }
    let tmp = std::env::var_os("UPDRAFT_TEST_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let probe = tmp.join(format!("updraft-demo-probe-{}", std::process::id()));
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
            Ok(())
        }
        Err(e) => Err(format!(
            "the demo cannot create files in {} ({e}): set TMPDIR (or UPDRAFT_TEST_TMP) to a writable directory",
            tmp.display()
        )),
    }
}

/// Run `f`, turning a panic of the test-support code into an error with
/// its message (no backtrace).
fn guarded(f: impl FnOnce() -> Result) -> Result {
    util::guarded("demo", f)
}

/// A numbered step with its start time.
struct Steps {
    n: u32,
    started: Option<Instant>,
}

impl Steps {
    fn next(&mut self, text: &str) {
        self.done();
        self.n += 1;
        println!("\n{}", bold(&format!("{}. {text}", self.n)));
        self.started = Some(Instant::now());
    }

    fn done(&mut self) {
        if let Some(t) = self.started.take() {
            println!("   ({:.1} s)", t.elapsed().as_secs_f64());
        }
    }
}

fn status_line(dev: &Device) -> String {
    let st = dev.status();
    format!(
        "   state {}, booted {} running {}, next boot {}, slots [{}]",
        st["state"].as_str().unwrap_or("?"),
        st["booted_slot"].as_str().unwrap_or("?"),
        st["running_version"].as_str().unwrap_or("-"),
        st["next_boot"].as_str().unwrap_or("-"),
        slots_of(&st).join(" ")
    )
}

/// `A:2.0` / `B:3.0(off)` for each slot.
fn slots_of(st: &Value) -> Vec<String> {
    st["slots"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    format!(
                        "{}:{}{}",
                        s["slot"].as_str().unwrap_or("?"),
                        s["version"].as_str().unwrap_or("-"),
                        if s["bootable"] == json!(false) {
                            "(off)"
                        } else {
                            ""
                        }
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Wait for the daemon's reboot request, then reboot the device.
fn reboot(dev: &mut Device) {
    dev.wait_reboot_requested(WAIT);
    println!(
        "   the daemon asked for a reboot; the boot script runs and the device comes up again"
    );
    let slot = dev.reboot();
    println!("   booted slot {slot}");
    dev.start_daemon();
}

fn wait_running(dev: &Device, version: &str) -> Value {
    dev.wait_for(&format!("release {version} to run"), WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!(version)
    })
}

/// One release as published: its artifact URLs, for the summary.
struct Published {
    version: String,
    full: String,
    deltas: Vec<String>,
}

fn publish_release(
    site: &Site,
    key: &KeyPair,
    version: &str,
    img: &Path,
    from: Option<&Path>,
) -> Published {
    let mut args: Vec<String> = vec![
        "release".into(),
        "--key".into(),
        key.key.display().to_string(),
        "--version".into(),
        version.into(),
        "--compatible".into(),
        "testboard".into(),
        "--image".into(),
        img.display().to_string(),
        "--out".into(),
        site.repo.dir.display().to_string(),
        "--level".into(),
        "9".into(),
    ];
    if let Some(f) = from {
        args.push("--from".into());
        args.push(f.display().to_string());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = publish_ok(&refs);
    println!(
        "   $ updraft-publish release --version {version} --image {}{} --out site/",
        file_name(img),
        from.map(|f| format!(" --from {}", file_name(f)))
            .unwrap_or_default()
    );
    for line in out.lines() {
        println!("     {line}");
    }
    let payload = site.repo.payload();
    let url = |v: &Value| {
        v["url"]
            .as_str()
            .map(|u| format!("/{}", u.trim_start_matches('/')))
            .unwrap_or_default()
    };
    Published {
        version: version.to_string(),
        full: url(&payload["artifact"]),
        deltas: payload["deltas"]
            .as_array()
            .map(|d| d.iter().map(url).collect())
            .unwrap_or_default(),
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// What one release cost in downloads, from the server's access log.
struct Download {
    version: String,
    what: &'static str,
    requests: usize,
    bytes: u64,
}

fn downloads(log: &[AccessEntry], releases: &[Published]) -> Vec<Download> {
    let mut out = Vec::new();
    for r in releases {
        let of = |uri: &str| -> (usize, u64) {
            log.iter()
                .filter(|e| {
                    e.method == "GET" && e.uri == uri && (e.status == 200 || e.status == 206)
                })
                .fold((0, 0), |(n, b), e| (n + 1, b + e.body_bytes_sent))
        };
        let (n, b) = of(&r.full);
        if n > 0 {
            out.push(Download {
                version: r.version.clone(),
                what: "full image",
                requests: n,
                bytes: b,
            });
        }
        for d in &r.deltas {
            let (n, b) = of(d);
            if n > 0 {
                out.push(Download {
                    version: r.version.clone(),
                    what: "delta",
                    requests: n,
                    bytes: b,
                });
            }
        }
    }
    out
}

fn human(bytes: u64) -> String {
    if bytes >= MIB as u64 {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else if bytes >= 1024 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

fn demo(choice: Choice) -> Result {
    let started = Instant::now();
    let work = TempDir::new("demo");
    let mut steps = Steps {
        n: 0,
        started: None,
    };
    let site = Site::start(&work.join("site"), true, choice).map_err(|e| e.to_string())?;
    let server_name = if site.http.is_nginx() {
        "nginx"
    } else {
        "the embedded static server"
    };
    println!(
        "\nserver: {} at {}",
        site.http.describe(),
        site.http.url("/")
    );
    if let Some(why) = &site.fallback_reason {
        println!("        chosen because there is {why}");
    }

    steps.next("Keys: a root key (kept offline) and a release key; key document v1 says who may sign releases");
    let root_key = keygen(work.path(), "root");
    let key = keygen(work.path(), "release");
    let out = publish_ok(&[
        "keys",
        "--root-key",
        &root_key.key.display().to_string(),
        "--release-pub",
        &key.public.display().to_string(),
        "--version",
        "1",
        "--out",
        &site.repo.dir.display().to_string(),
    ]);
    print!("   {out}");

    steps.next(
        "A device: slots A and B are files; A runs the factory image; it trusts the root key only",
    );
    let mut spec = DeviceSpec::simple(&key);
    spec.trust = TrustSpec::Root(vec![root_key.public.clone()], 1, 0);
    spec.slot_size = 24 * MIB as u64;
    spec.server = site.server_toml("3s", "1s");
    let mut dev = Device::new("demo-device", spec);
    // A health check: release 3.0 "fails to start its application".
    dev.health_check(
        "10-application",
        "if [ \"$UPDRAFT_VERSION\" = 3.0 ]; then echo 'application failed to start: config schema mismatch' >&2; exit 1; fi",
    );
    dev.init();
    println!("   config {}", dev.config.display());
    println!(
        "   polls {} every 3 s ({server_name}, TLS with a demo CA)",
        site.manifest_url()
    );
    println!("{}", status_line(&dev));

    let mut releases = Vec::new();
    steps.next("Full update: publish release 1.0; the daemon polls, verifies, writes slot B and asks for a reboot");
    let v1 = work.join("rootfs-1.0.img");
    image(&v1, 16 * MIB, 1000);
    releases.push(publish_release(&site, &key, "1.0", &v1, None));
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    println!("{}", status_line(&dev));
    reboot(&mut dev);
    let st = wait_running(&dev, "1.0");
    println!("   health checks passed on slot B: release 1.0 committed");
    println!(
        "   serial {}, key document v{}",
        st["serial"], st["keys_version"]
    );
    println!("{}", status_line(&dev));

    steps
        .next("Delta update: publish release 2.0 with a delta from 1.0; `updraft check` polls now");
    let v2 = work.join("rootfs-2.0.img");
    let mut bytes = std::fs::read(&v1).map_err(|e| format!("reading {}: {e}", v1.display()))?;
    for (i, b) in bytes.iter_mut().enumerate().skip(3 * MIB).take(MIB) {
        *b = b.wrapping_add((i % 7) as u8);
    }
    std::fs::write(&v2, &bytes).map_err(|e| format!("writing {}: {e}", v2.display()))?;
    releases.push(publish_release(&site, &key, "2.0", &v2, Some(&v1)));
    print!("   $ updraft check\n   {}", dev.ok(&["check"]));
    reboot(&mut dev);
    wait_running(&dev, "2.0");
    let history = dev.ok(&["history"]);
    let how = if history.contains("(delta)") {
        "the delta"
    } else {
        "the full image"
    };
    println!("   release 2.0 committed on slot A, installed from {how}");
    println!("{}", status_line(&dev));

    steps.next("Rollback: publish release 3.0, whose application fails its health check");
    let v3 = work.join("rootfs-3.0.img");
    image(&v3, 16 * MIB, 3000);
    releases.push(publish_release(&site, &key, "3.0", &v3, None));
    print!("   $ updraft check\n   {}", dev.ok(&["check"]));
    reboot(&mut dev);
    println!(
        "   the health check fails on 3.0: the daemon marks it bad, puts 2.0 first and reboots"
    );
    reboot(&mut dev);
    let st = wait_running(&dev, "2.0");
    println!(
        "   back on release 2.0 in slot {}",
        st["booted_slot"].as_str().unwrap_or("?")
    );
    println!("{}", status_line(&dev));
    print!(
        "   $ updraft check   (3.0 is not installed again)\n   {}",
        dev.ok(&["check"])
    );

    steps.next("What the device recorded, and what reached the server");
    println!("   $ updraft history");
    for line in dev.ok(&["history"]).lines() {
        println!("   {line}");
    }
    if let Some(c) = &site.collector {
        // Reports are delivered at the daemon's next turn: wait for the
        // three install results.
        let deadline = Instant::now() + Duration::from_secs(15);
        let installs = loop {
            let installs: Vec<String> = c
                .unique_reports()
                .iter()
                .filter_map(|r| r.json().ok())
                .filter(|b| b["kind"] == json!("install"))
                .map(|b| {
                    format!(
                        "{} {}{}",
                        b["job"]["release"].as_str().unwrap_or("?"),
                        b["result"].as_str().unwrap_or("?"),
                        b["reason"]
                            .as_str()
                            .map(|r| format!(" ({r})"))
                            .unwrap_or_default()
                    )
                })
                .collect();
            if installs.len() >= releases.len() || Instant::now() >= deadline {
                break installs;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        println!(
            "   the server received {} reports; install results: {}",
            c.unique_reports().len(),
            installs.join("; ")
        );
    }
    println!("\n   $ updraft status");
    for line in dev.ok(&["status"]).lines() {
        println!("   {line}");
    }
    let final_status = dev.status();
    dev.stop_daemon();
    steps.done();

    // nginx writes a request's log line a moment after answering it.
    if site.http.is_nginx() {
        std::thread::sleep(Duration::from_millis(500));
    }
    let log = site
        .http
        .access_log()
        .map_err(|e| format!("reading the server's access log: {e}"))?;
    summary(&site, &log, &releases, &final_status, started.elapsed());
    Ok(())
}

fn summary(
    site: &Site,
    log: &[AccessEntry],
    releases: &[Published],
    st: &Value,
    elapsed: Duration,
) {
    let server = if site.http.is_nginx() {
        "nginx"
    } else {
        "embedded static server"
    };
    println!(
        "\n{} ({server}, {:.1} s)",
        bold("Summary"),
        elapsed.as_secs_f64()
    );
    println!("   downloaded:");
    for d in downloads(log, releases) {
        println!(
            "     release {:4} {:10} {:>9} ({} bytes, {} request{})",
            d.version,
            d.what,
            human(d.bytes),
            d.bytes,
            d.requests,
            if d.requests == 1 { "" } else { "s" }
        );
    }
    let polls: Vec<&AccessEntry> = log.iter().filter(|e| e.uri == "/manifest.json").collect();
    let not_modified = polls.iter().filter(|e| e.status == 304).count();
    let total: u64 = log.iter().map(|e| e.bytes_sent).sum();
    println!(
        "     manifest polls {} ({not_modified} answered 304 Not Modified: nothing new, a few hundred bytes)",
        polls.len()
    );
    println!(
        "   served: {} in {} requests, {} connections",
        human(total),
        log.len(),
        {
            let mut c: Vec<u64> = log.iter().map(|e| e.connection).collect();
            c.sort_unstable();
            c.dedup();
            c.len()
        }
    );
    println!("   final slots:");
    if let Some(slots) = st["slots"].as_array() {
        for s in slots {
            let mut notes = Vec::new();
            if s["booted"] == json!(true) {
                notes.push("booted");
            }
            match s["bootable"].as_bool() {
                Some(true) => notes.push("bootable"),
                Some(false) => notes.push("not bootable"),
                None => {}
            }
            println!(
                "     {}  release {:4} {}",
                s["slot"].as_str().unwrap_or("?"),
                s["version"].as_str().unwrap_or("-"),
                notes.join(", ")
            );
        }
    }
    println!(
        "   running release {} in slot {}; state {}",
        st["running_version"].as_str().unwrap_or("-"),
        st["booted_slot"].as_str().unwrap_or("?"),
        st["state"].as_str().unwrap_or("?")
    );
    println!("\ndemo finished: an update, a delta update and a rollback on file-backed slots.");
}

/// `text` in bold on a terminal; as it is in a log or a pipe.
fn bold(text: &str) -> String {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        format!("\x1b[1m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_one_error_line_and_the_hook_is_restored() {
        let err = guarded(|| panic!("nginx did not start: no such file")).unwrap_err();
        assert!(
            err.starts_with("demo failed: nginx did not start: no such file ("),
            "{err}"
        );
        assert!(err.contains("demo.rs:"), "{err}");
        assert_eq!(guarded(|| Ok(())), Ok(()));
        assert_eq!(
            guarded(|| Err("no key".into())),
            Err("demo failed: no key".to_string())
        );
    }
}
