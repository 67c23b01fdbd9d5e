//! `cargo xtask demo`: the main job of updraft end to end, on a safe
//! default — file-backed slots, the `file` bootloader, a real nginx serving
//! the publisher's output over TLS on 127.0.0.1 — with a real update, a
//! delta update and a real rollback.
//!
//! Nothing here is simulated except the reboot itself: the daemon's reboot
//! command only leaves a marker, and the demo plays the boot loader (it runs
//! the boot script logic on the boot state file, gives the device a new boot
//! id and starts the daemon again), exactly as the end-to-end tests do.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{KeyPair, image, keygen, publish_ok};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

use crate::util::{self, Result, cargo, root};

const WAIT: Duration = Duration::from_secs(120);
const MIB: usize = 1024 * 1024;

fn step(n: u32, text: &str) {
    println!("\n\x1b[1m{n}. {text}\x1b[0m");
}

fn show(v: &Value, keys: &[&str]) -> String {
    keys.iter()
        .map(|k| {
            format!(
                "{k}={}",
                v.get(*k).map(|x| x.to_string()).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("  ")
}

fn status_line(dev: &Device) -> String {
    let st = dev.status();
    let slots: Vec<String> = st["slots"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    format!(
                        "{}:{}{}",
                        s["slot"].as_str().unwrap_or("?"),
                        s["version"].as_str().unwrap_or("-"),
                        if s["bootable"] == json!(true) {
                            ""
                        } else {
                            "(off)"
                        }
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "   state {}, booted {} running {}, next boot {}, slots [{}]",
        st["state"].as_str().unwrap_or("?"),
        st["booted_slot"].as_str().unwrap_or("?"),
        st["running_version"].as_str().unwrap_or("-"),
        st["next_boot"].as_str().unwrap_or("-"),
        slots.join(" ")
    )
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

fn publish_release(
    server: &UpdateServer,
    key: &KeyPair,
    version: &str,
    img: &Path,
    from: Option<&Path>,
) {
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
        server.repo.dir.display().to_string(),
        "--level".into(),
        "9".into(),
    ];
    if let Some(f) = from {
        args.push("--from".into());
        args.push(f.display().to_string());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    print!(
        "   $ updraft-publish {}\n   {}",
        refs.join(" "),
        publish_ok(&refs).replace('\n', "\n   ")
    );
    println!();
}

pub fn run(_args: &[String]) -> Result {
    println!("building updraft and updraft-publish ...");
    util::run(cargo().args(["build", "--quiet", "-p", "updraft", "-p", "updraft-publish"]))?;
    // SAFETY: single-threaded at this point; the variables are read by the
    // test-support code this process calls.
    unsafe {
        std::env::set_var("UPDRAFT_BIN_DIR", root().join("target/debug"));
    }
    demo().map_err(|e| format!("demo failed: {e}"))
}

fn demo() -> Result {
    let work = TempDir::new("demo");

    step(
        1,
        "Keys: a root key (kept offline) and a release key; key document v1 says who may sign releases",
    );
    let root_key = keygen(work.path(), "root");
    let key = keygen(work.path(), "release");
    let server = UpdateServer::start(&work.join("site"), true);
    let out = publish_ok(&[
        "keys",
        "--root-key",
        &root_key.key.display().to_string(),
        "--release-pub",
        &key.public.display().to_string(),
        "--version",
        "1",
        "--out",
        &server.repo.dir.display().to_string(),
    ]);
    print!("   {out}");

    step(
        2,
        "A device: slots A and B are files; A runs the factory image; it trusts the root key only",
    );
    let mut spec = DeviceSpec::simple(&key);
    spec.trust = updraft_tests::device::TrustSpec::Root(vec![root_key.public.clone()], 1, 0);
    spec.slot_size = 24 * MIB as u64;
    spec.server = server.server_toml("3s", "1s");
    let mut dev = Device::new("demo-device", spec);
    // A health check: release 3.0 "fails to start its application".
    dev.health_check(
        "10-application",
        "if [ \"$UPDRAFT_VERSION\" = 3.0 ]; then echo 'application failed to start: config schema mismatch' >&2; exit 1; fi",
    );
    dev.init();
    println!("   config {}", dev.config.display());
    println!(
        "   server {} (nginx, TLS with a demo CA)",
        server.manifest_url()
    );
    println!("{}", status_line(&dev));

    step(
        3,
        "Publish release 1.0; the daemon polls (jittered), verifies, installs into B and asks for a reboot",
    );
    let v1 = work.join("rootfs-1.0.img");
    image(&v1, 16 * MIB, 1000);
    publish_release(&server, &key, "1.0", &v1, None);
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    println!("{}", status_line(&dev));
    reboot(&mut dev);
    let st = wait_running(&dev, "1.0");
    println!("   health checks passed: release 1.0 committed");
    println!("   {}", show(&st, &["serial", "keys_version"]));
    println!("{}", status_line(&dev));

    step(
        4,
        "Publish release 2.0 with a delta from 1.0; `updraft check` polls now",
    );
    let v2 = work.join("rootfs-2.0.img");
    let mut bytes = std::fs::read(&v1).map_err(|e| e.to_string())?;
    for (i, b) in bytes.iter_mut().enumerate().skip(3 * MIB).take(MIB) {
        *b = b.wrapping_add((i % 7) as u8);
    }
    std::fs::write(&v2, &bytes).map_err(|e| e.to_string())?;
    publish_release(&server, &key, "2.0", &v2, Some(&v1));
    print!("   $ updraft check\n   {}", dev.ok(&["check"]));
    reboot(&mut dev);
    wait_running(&dev, "2.0");
    let history = dev.ok(&["history"]);
    let how = if history.contains("(delta)") {
        "delta"
    } else {
        "full image"
    };
    println!("   release 2.0 committed (installed from the {how})");
    println!("{}", status_line(&dev));

    step(
        5,
        "Publish release 3.0, whose application fails its health check",
    );
    let v3 = work.join("rootfs-3.0.img");
    image(&v3, 16 * MIB, 3000);
    publish_release(&server, &key, "3.0", &v3, None);
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

    step(6, "What the device recorded, and what reached the server");
    println!("   $ updraft history");
    for line in dev.ok(&["history"]).lines() {
        println!("   {line}");
    }
    std::thread::sleep(Duration::from_secs(2));
    if let Some(c) = &server.collector {
        let reports = c.unique_reports();
        println!(
            "   the server received {} reports, e.g. the install results:",
            reports.len()
        );
        for r in reports {
            if let Ok(body) = r.json() {
                if body["kind"] == json!("install") {
                    println!(
                        "     {} {} {}",
                        body["job"]["release"].as_str().unwrap_or("?"),
                        body["result"].as_str().unwrap_or("?"),
                        body["reason"].as_str().unwrap_or("")
                    );
                }
            }
        }
    }
    println!("\n   $ updraft status");
    for line in dev.ok(&["status"]).lines() {
        println!("   {line}");
    }
    dev.stop_daemon();
    println!("\ndemo finished: update, delta update and rollback on file-backed slots.");
    Ok(())
}
