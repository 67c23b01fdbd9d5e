//! Releases of components beside the slot (manifest `spec_version` 2),
//! end to end against real nginx: an app installed as a new generation
//! and switched without a reboot when the slot runs already; a failing
//! health check switching it back; a crash before the commit undone at the
//! next start; a new slot and an app tried and committed or rolled back as
//! one; a `command` component run through its handler's phases, a handler
//! that fails, crashes, hangs or prints garbage in any phase leaving the
//! device as it was; a release naming a component the device is not
//! configured for refused before anything is written; a slot's boot files
//! on a FAT partition written beside it, tried with it and rolled back
//! with it, never alone.

use std::time::{Duration, Instant};

use serde_json::json;
use updraft::hash::Sha256;
use updraft::slot::SlotName;
use updraft_tests::apps::{
    active_file, active_generation, app_device, generations, health_needs_healthy_file,
    millis_after, publish_apps, publish_components, write_tree,
};
use updraft_tests::proxied::{ProxiedServer, history, wait_history};
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(120);

fn committed(release: &'static str) -> impl Fn(&serde_json::Value) -> bool {
    move |e| e["event"] == json!("committed") && e["release"] == json!(release)
}

#[test]
fn an_app_only_release_switches_without_a_reboot_and_a_failing_one_switches_back() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("app-only", true);
    let trees = TempDir::new("app-only-trees");
    let v13 = trees.join("web-1.3");
    write_tree(
        &v13,
        &[
            ("bin/web", "web binary"),
            ("VERSION", "1.3"),
            ("healthy", ""),
        ],
    );
    ps.publish(
        "1.0",
        1,
        1 << 20,
        &["--app", &format!("web@1.3={}", v13.display())],
    );
    let mut dev = app_device(&ps, "app-only", "1.0", "web");
    health_needs_healthy_file(&dev, "web");
    let slot_b = Sha256::of(&dev.slot_bytes(SlotName::B));
    dev.start_daemon();

    // Release 1.0: its slot runs (the marker says so); its app is new.
    let e = wait_history(&dev, "release 1.0 committed", WAIT, committed("1.0"));
    let detail = e["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("web 1.3") && detail.contains("without a reboot"),
        "{e}"
    );
    assert_eq!(active_generation(&dev, "web"), Some(1));
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1.3"));

    // Release 1.1 changes the app only.
    let v14 = trees.join("web-1.4");
    write_tree(
        &v14,
        &[
            ("bin/web", "web binary"),
            ("VERSION", "1.4"),
            ("healthy", ""),
        ],
    );
    let out = publish_apps(&ps, "1.1", &[format!("web@1.4={}", v14.display())]);
    assert!(out.contains("app web"), "{out}");
    let e = wait_history(&dev, "release 1.1 committed", WAIT, committed("1.1"));
    let install_ms = millis_after(e["detail"].as_str().unwrap_or_default(), "committed in");
    assert_eq!(active_generation(&dev, "web"), Some(2));
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1.4"));
    assert_eq!(generations(&dev, "web"), [1, 2]);

    // Release 1.2's app fails its health check: back on 1.4.
    let v15 = trees.join("web-1.5");
    write_tree(&v15, &[("bin/web", "web binary"), ("VERSION", "1.5")]);
    publish_apps(&ps, "1.2", &[format!("web@1.5={}", v15.display())]);
    let e = wait_history(&dev, "release 1.2 rolled back", WAIT, |e| {
        e["event"] == json!("rolled-back") && e["release"] == json!("1.2")
    });
    let rollback_ms = millis_after(e["detail"].as_str().unwrap_or_default(), "rolled back in");
    assert_eq!(active_generation(&dev, "web"), Some(2), "{e}");
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1.4"));
    assert_eq!(
        generations(&dev, "web"),
        [1, 2],
        "the failed generation stays"
    );
    // It is not tried again.
    dev.wait_log("was rolled back on this device before", WAIT);
    let attempts = history(&dev)
        .iter()
        .filter(|e| e["release"] == json!("1.2"))
        .count();
    assert_eq!(attempts, 1, "{:#?}", history(&dev));

    // The server hears of both, with each component.
    for (release, result) in [("1.1", "committed"), ("1.2", "rolled_back")] {
        let r = ps.wait_report(&format!("release {release} {result}"), WAIT, |r| {
            r["kind"] == json!("components") && r["release"] == json!(release)
        });
        assert_eq!(r["result"], json!(result), "{r:#}");
        assert_eq!(r["components"][0]["name"], json!("web"), "{r:#}");
    }

    // No reboot, no slot written, the state machine idle throughout.
    assert!(!dev.reboot_marker.exists(), "a reboot was requested");
    assert_eq!(Sha256::of(&dev.slot_bytes(SlotName::B)), slot_b);
    let st = dev.status();
    assert_eq!(st["state"], json!("idle"), "{st:#}");
    eprintln!(
        "app-only release: committed in {install_ms} ms; failed health check rolled back in {rollback_ms} ms"
    );
    dev.stop_daemon();
}

#[test]
fn a_release_changing_one_file_of_ten_thousand_downloads_that_file_and_the_index() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("app-files", false);
    let trees = TempDir::new("app-files-trees");
    // 10,000 files of 2 KiB of hex text each: about 20 MiB, a few files
    // compressing to little more than half.
    let contents: Vec<(String, String)> = (0..10_000)
        .map(|i| {
            let bytes = updraft_tests::publisher::image_bytes(1024, 1000 + i as u64);
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            (format!("share/{:02}/file-{i:05}.txt", i % 100), hex)
        })
        .collect();
    let tree = |dir: &std::path::Path, changed: &str| {
        let mut files: Vec<(&str, &str)> = contents
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        files.push(("VERSION", changed));
        write_tree(dir, &files);
    };
    let a = trees.join("a");
    tree(&a, "1");
    ps.publish(
        "1.0",
        2,
        1 << 20,
        &["--app", &format!("web={}", a.display())],
    );
    let mut dev = app_device(&ps, "app-files", "1.0", "web");
    let started = Instant::now();
    dev.start_daemon();
    let first = wait_history(&dev, "release 1.0 committed", WAIT, committed("1.0"));
    let first_took = started.elapsed();
    let full = downloaded(first["detail"].as_str().unwrap_or_default());

    let b = trees.join("b");
    tree(&b, "2");
    publish_apps(&ps, "1.1", &[format!("web={}", b.display())]);
    let second = wait_history(&dev, "release 1.1 committed", WAIT, committed("1.1"));
    let changed = downloaded(second["detail"].as_str().unwrap_or_default());
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("2"));
    assert_eq!(
        active_file(&dev, "web", "share/07/file-00007.txt"),
        Some(contents[7].1.clone())
    );
    dev.wait_log("1 file(s) fetched", WAIT);
    let index = ps.server.repo.payload()["components"][1]["index"]["size"]
        .as_u64()
        .expect("the index's size");
    // The index and one blob of a few bytes: nothing else of the tree.
    assert!(
        changed < index + 1024,
        "{changed} bytes for one file (index {index})"
    );
    assert!(
        full > 10 * changed,
        "the whole tree took {full} bytes, one file {changed}"
    );
    eprintln!(
        "10,000-file app: first install {full} bytes in {:.1} s; one file changed: {changed} bytes (index {index})",
        first_took.as_secs_f64()
    );
    dev.stop_daemon();
}

/// The bytes a committed component downloaded, from its history detail.
fn downloaded(detail: &str) -> u64 {
    let before = detail
        .split_once(" bytes downloaded")
        .unwrap_or_else(|| panic!("no bytes in {detail:?}"))
        .0;
    before
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no bytes in {detail:?}"))
}

#[test]
fn a_crash_before_the_commit_puts_the_app_back_at_the_next_start() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("app-cut", false);
    let trees = TempDir::new("app-cut-trees");
    let v1 = trees.join("v1");
    write_tree(&v1, &[("VERSION", "1")]);
    ps.publish(
        "1.0",
        3,
        1 << 20,
        &["--app", &format!("web={}", v1.display())],
    );
    let mut dev = app_device(&ps, "app-cut", "1.0", "web");
    // The check of release 1.1 hangs while the gate file exists.
    let gate = dev.path("hold-health");
    updraft_tests::tmp::write_executable(
        &updraft_tests::apps::health_dir(dev.dir(), "web").join("10-gate"),
        &format!(
            "#!/bin/sh\nwhile [ -e {gate:?} ]; do sleep 0.1; done\nexit 0\n",
            gate = gate.display().to_string()
        ),
    );
    dev.start_daemon();
    wait_history(&dev, "release 1.0 committed", WAIT, committed("1.0"));
    std::fs::write(&gate, "").unwrap();
    let v2 = trees.join("v2");
    write_tree(&v2, &[("VERSION", "2")]);
    publish_apps(&ps, "1.1", &[format!("web={}", v2.display())]);
    dev.wait_log("release 1.1 component web: running its health checks", WAIT);
    assert_eq!(active_generation(&dev, "web"), Some(2));
    dev.kill_daemon();
    std::fs::remove_file(&gate).unwrap();
    // Stop polling a server that would install 1.1 again at once: the
    // next start must undo the interrupted release by itself.
    ps.proxy
        .set_default(updraft_tests::proxy::Behaviour::Refuse);
    dev.start_daemon();
    let e = wait_history(&dev, "release 1.1 interrupted", WAIT, |e| {
        e["event"] == json!("interrupted") && e["release"] == json!("1.1")
    });
    assert_eq!(active_generation(&dev, "web"), Some(1), "{e}");
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1"));
    assert_eq!(generations(&dev, "web"), [1]);
    // Back online, the release is installed again.
    ps.proxy.set_default(updraft_tests::proxy::Behaviour::Pass);
    wait_history(&dev, "release 1.1 committed", WAIT, committed("1.1"));
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("2"));
    dev.stop_daemon();
}

#[test]
fn a_release_naming_a_component_the_device_lacks_is_refused_before_anything_is_written() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("app-unknown", false);
    let trees = TempDir::new("app-unknown-trees");
    let db = trees.join("db");
    write_tree(&db, &[("VERSION", "1")]);
    ps.publish(
        "1.0",
        4,
        1 << 20,
        &["--app", &format!("db={}", db.display())],
    );
    let dev = app_device(&ps, "app-unknown", "1.0", "web");
    let out = dev.fails(&["install", &ps.manifest_url()]);
    assert!(
        out.contains("component db (app) is not configured on this device")
            && out.contains("[components.db]"),
        "{out}"
    );
    assert!(!updraft_tests::apps::apps_dir(dev.dir()).join("db").exists());
}

#[test]
fn a_release_of_a_slot_and_an_app_is_tried_and_committed_or_rolled_back_as_one() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("slot-app", false);
    let trees = TempDir::new("slot-app-trees");
    let v13 = trees.join("web-1.3");
    write_tree(&v13, &[("VERSION", "1.3"), ("healthy", "")]);
    ps.publish(
        "1.0",
        5,
        1 << 20,
        &["--app", &format!("web@1.3={}", v13.display())],
    );
    let mut dev = app_device(&ps, "slot-app", "1.0", "web");
    health_needs_healthy_file(&dev, "web");
    dev.start_daemon();
    wait_history(&dev, "release 1.0 committed", WAIT, committed("1.0"));
    assert_eq!(active_generation(&dev, "web"), Some(1));

    // Release 2.0: a new root filesystem and app 1.4, tried together.
    let v14 = trees.join("web-1.4");
    write_tree(&v14, &[("VERSION", "1.4"), ("healthy", "")]);
    let image = ps.publish(
        "2.0",
        6,
        1 << 20,
        &["--app", &format!("web@1.4={}", v14.display())],
    );
    dev.wait_reboot_requested(WAIT);
    // Written, not active: the old slot still runs app 1.3.
    assert_eq!(active_generation(&dev, "web"), Some(1));
    assert_eq!(generations(&dev, "web"), [1, 2]);
    assert_eq!(dev.reboot(), SlotName::B);
    dev.start_daemon();
    let e = wait_history(&dev, "release 2.0 committed", WAIT, committed("2.0"));
    assert!(
        e["detail"].as_str().unwrap_or_default().contains("web 1.4"),
        "{e}"
    );
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1.4"));
    assert_eq!(&dev.slot_bytes(SlotName::B)[..image.len()], &image[..]);
    let st = dev.status();
    assert_eq!(st["components"][0]["version"], json!("1.4"), "{st:#}");
    assert_eq!(st["components"][0]["generation"], json!(2), "{st:#}");
    assert!(dev.ok(&["status"]).contains("app web:"));

    // Release 3.0's app fails its health check in the trial boot: the
    // slot and the app go back together.
    let v15 = trees.join("web-1.5");
    write_tree(&v15, &[("VERSION", "1.5")]);
    ps.publish(
        "3.0",
        7,
        1 << 20,
        &["--app", &format!("web@1.5={}", v15.display())],
    );
    dev.wait_reboot_requested(WAIT);
    assert_eq!(dev.reboot(), SlotName::A);
    dev.start_daemon();
    // The check fails, the apps switch back, a reboot into B is asked.
    dev.wait_reboot_requested(WAIT);
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1.4"));
    assert_eq!(dev.reboot(), SlotName::B);
    dev.start_daemon();
    let e = wait_history(&dev, "release 3.0 rolled back", WAIT, |e| {
        e["event"] == json!("rolled-back") && e["release"] == json!("3.0")
    });
    assert!(
        e["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("component web"),
        "{e}"
    );
    assert_eq!(active_generation(&dev, "web"), Some(2));
    assert_eq!(generations(&dev, "web"), [1, 2]);
    let st = dev.status();
    assert_eq!(st["components"][0]["version"], json!("1.4"), "{st:#}");
    dev.stop_daemon();
}

#[test]
fn a_slots_boot_files_on_a_fat_partition_are_tried_with_it_and_never_changed_alone() {
    updraft_tests::require!("nginx", "mkfs.vfat", "fsck.fat", "fusefat", "mtype");
    let ps = ProxiedServer::start("boot-files", false);
    let trees = TempDir::new("boot-files-trees");
    let factory = [
        ("config.txt", "arm_64bit=1\n"),
        ("kernel8.img", "kernel 1.0"),
        ("overlays/uart.dtbo", "uart overlay"),
    ];
    let (mut dev, mut fat) =
        updraft_tests::fat::boot_files_device(&ps, "boot-files", "1.0", &factory);
    let (a, b) = (fat.mount.join("slot-a"), fat.mount.join("slot-b"));
    // The slot's health check reads the booted slot's config.txt.
    dev.health_check(
        "10-config",
        &format!(
            "#!/bin/sh\ncase \"$UPDRAFT_SLOT\" in A) d={a:?} ;; *) d={b:?} ;; esac\n\
             ! grep -q broken \"$d/config.txt\"\n"
        ),
    );
    dev.start_daemon();

    // Release 2.0: a new slot with a new kernel, its other files as
    // before; written into slot B's directory, slot A's untouched.
    let boot20 = trees.join("boot-2.0");
    write_tree(
        &boot20,
        &[
            ("config.txt", "arm_64bit=1\n"),
            ("kernel8.img", "kernel 2.0"),
            ("overlays/uart.dtbo", "uart overlay"),
        ],
    );
    ps.publish(
        "2.0",
        11,
        1 << 20,
        &["--boot", &format!("firmware={}", boot20.display())],
    );
    dev.wait_reboot_requested(WAIT);
    assert_eq!(
        std::fs::read_to_string(b.join("kernel8.img")).unwrap(),
        "kernel 2.0"
    );
    assert_eq!(
        std::fs::read_to_string(a.join("kernel8.img")).unwrap(),
        "kernel 1.0"
    );
    dev.wait_log("2 copied unchanged", WAIT);
    assert_eq!(dev.reboot(), SlotName::B);
    dev.start_daemon();
    let e = wait_history(&dev, "release 2.0 committed", WAIT, committed("2.0"));
    assert!(
        e["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("firmware 2.0"),
        "{e}"
    );
    let st = dev.status();
    assert_eq!(st["components"][0]["name"], json!("firmware"), "{st:#}");
    assert_eq!(st["components"][0]["version"], json!("2.0"), "{st:#}");

    // Release 2.1 changes only the boot files, and breaks them: the slot
    // running already is installed again into A with them and tried; the
    // trial fails, B boots as it did, and 2.1 is not tried again.
    let boot21 = trees.join("boot-2.1");
    write_tree(
        &boot21,
        &[
            ("config.txt", "arm_64bit=1\nbroken\n"),
            ("kernel8.img", "kernel 2.0"),
            ("overlays/uart.dtbo", "uart overlay"),
        ],
    );
    publish_components(
        &ps,
        "2.1",
        &["--boot", &format!("firmware={}", boot21.display())],
    );
    dev.wait_reboot_requested(WAIT);
    dev.wait_log("its boot files change (firmware 2.1)", WAIT);
    assert!(
        std::fs::read_to_string(a.join("config.txt"))
            .unwrap()
            .contains("broken")
    );
    assert_eq!(
        std::fs::read_to_string(b.join("config.txt")).unwrap(),
        "arm_64bit=1\n"
    );
    assert_eq!(dev.reboot(), SlotName::A);
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    assert_eq!(dev.reboot(), SlotName::B);
    dev.start_daemon();
    wait_history(&dev, "release 2.1 rolled back", WAIT, |e| {
        e["event"] == json!("rolled-back") && e["release"] == json!("2.1")
    });
    dev.wait_log("was rolled back on this device before", WAIT);
    let st = dev.status();
    assert_eq!(st["components"][0]["version"], json!("2.0"), "{st:#}");
    assert_eq!(
        std::fs::read_to_string(b.join("kernel8.img")).unwrap(),
        "kernel 2.0"
    );

    // Release 3.0: a new slot with the boot files of 2.0. Slot A's
    // directory still holds 2.1's broken files: the slot's boot files are
    // written with it although they run already (copied, not downloaded).
    let boot30 = trees.join("boot-3.0");
    write_tree(
        &boot30,
        &[
            ("config.txt", "arm_64bit=1\n"),
            ("kernel8.img", "kernel 2.0"),
            ("overlays/uart.dtbo", "uart overlay"),
        ],
    );
    ps.publish(
        "3.0",
        12,
        1 << 20,
        &["--boot", &format!("firmware@2.0={}", boot30.display())],
    );
    dev.wait_reboot_requested(WAIT);
    assert_eq!(
        std::fs::read_to_string(a.join("config.txt")).unwrap(),
        "arm_64bit=1\n"
    );
    dev.wait_log("0 file(s) fetched", WAIT);
    assert_eq!(dev.reboot(), SlotName::A);
    dev.start_daemon();
    wait_history(&dev, "release 3.0 committed", WAIT, committed("3.0"));
    dev.stop_daemon();

    // What updraft wrote through the mount is a FAT file system another
    // implementation reads.
    let summary = fat.check();
    assert!(summary.contains("files"), "{summary}");
    assert_eq!(fat.read_image("/slot-b/kernel8.img"), b"kernel 2.0");
    assert_eq!(fat.read_image("/slot-a/config.txt"), b"arm_64bit=1\n");
    assert_eq!(
        fat.read_image("/slot-b/overlays/uart.dtbo"),
        b"uart overlay"
    );
}

/// A handler wrapping the shipped file copier that misbehaves in the
/// phase and way its mode file names (`activate:crash`), else copies.
fn misbehaving_handler(
    dev: &updraft_tests::device::Device,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let mode = dev.path("handler-mode");
    let script = dev.path("mcu-handler");
    let copier = updraft_tests::repo_root().join("contrib/handlers/file-copy");
    updraft_tests::tmp::write_executable(
        &script,
        &format!(
            "#!/bin/sh\n\
             mode=$(cat {mode:?} 2>/dev/null)\n\
             case \"$mode\" in \"$2:\"*) how=${{mode#*:}} ;; *) how= ;; esac\n\
             case \"$how\" in\n\
             fail) echo 'flash verify failed' >&2; exit 3 ;;\n\
             crash) kill -SEGV $$ ;;\n\
             hang) sleep 600 ;;\n\
             garbage) head -c 3000 /dev/urandom; exit 1 ;;\n\
             esac\n\
             exec {copier:?} \"$@\"\n",
            mode = mode.display().to_string(),
            copier = copier.display().to_string()
        ),
    );
    (script, mode)
}

#[test]
fn a_command_component_runs_its_handlers_phases_and_any_misbehaving_phase_leaves_it_as_it_was() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("command", false);
    let files = TempDir::new("command-payloads");
    let fw = |n: u32| {
        let path = files.join(format!("fw-{n}.bin"));
        std::fs::write(&path, format!("firmware build {n}\n").repeat(1000)).unwrap();
        path
    };
    let first = fw(1);
    ps.publish(
        "1.0",
        8,
        1 << 20,
        &["--command", &format!("mcu@4.1={}", first.display())],
    );
    let spec = ps.device_spec("1s", "");
    let mut dev = updraft_tests::device::Device::new("command", spec);
    let marker = dev.path("etc-updraft-release");
    std::fs::write(&marker, "UPDRAFT_RELEASE=1.0\n").unwrap();
    let (handler, mode) = misbehaving_handler(&dev);
    let target = dev.path("mcu.bin");
    dev.reconfigure(|s| {
        s.device = format!("release_file = {:?}", marker.display().to_string());
        s.sections = format!(
            "[components.mcu]\nkind = \"command\"\nhandler = [{:?}, {:?}]\ntimeout = \"3s\"\n",
            handler.display().to_string(),
            target.display().to_string()
        );
    });
    dev.init();
    dev.start_daemon();
    let e = wait_history(&dev, "release 1.0 committed", WAIT, committed("1.0"));
    assert!(
        e["detail"].as_str().unwrap_or_default().contains("mcu 4.1"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        std::fs::read(&first).unwrap()
    );
    assert_eq!(dev.status()["components"][0]["version"], json!("4.1"));

    let mut serial = 1;
    for phase in ["install", "activate"] {
        for how in ["fail", "crash", "hang", "garbage"] {
            serial += 1;
            let release = format!("1.{serial}");
            std::fs::write(&mode, format!("{phase}:{how}")).unwrap();
            let payload = fw(serial);
            publish_components(
                &ps,
                &release,
                &[
                    "--command",
                    &format!("mcu@4.{serial}={}", payload.display()),
                ],
            );
            let e = wait_history(&dev, &format!("release {release} ended"), WAIT, |e| {
                e["release"] == json!(release.as_str())
                    && (e["event"] == json!("failed") || e["event"] == json!("rolled-back"))
            });
            // The file is the committed firmware: the rollback phase
            // restored it, or activate never replaced it.
            assert_eq!(
                std::fs::read(&target).unwrap(),
                std::fs::read(&first).unwrap(),
                "{phase}:{how}: {e}"
            );
            let st = dev.wait_state("idle", WAIT);
            assert_eq!(
                st["components"][0]["version"],
                json!("4.1"),
                "{phase}:{how}: {st:#}"
            );
            let detail = e["detail"].as_str().unwrap_or_default();
            assert!(
                detail.contains("component mcu handler, phase"),
                "{phase}:{how}: {detail}"
            );
        }
    }
    // A payload that passes verification and a well-behaved handler:
    // the next release goes in.
    std::fs::remove_file(&mode).unwrap();
    serial += 1;
    let release = format!("1.{serial}");
    let last = fw(serial);
    publish_components(
        &ps,
        &release,
        &["--command", &format!("mcu@5.0={}", last.display())],
    );
    let release_static: &'static str = Box::leak(release.into_boxed_str());
    wait_history(
        &dev,
        "the last release committed",
        WAIT,
        committed(release_static),
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        std::fs::read(&last).unwrap()
    );
    assert_eq!(dev.status()["components"][0]["version"], json!("5.0"));
    dev.stop_daemon();
}

/// Power cuts, seeded, anywhere in releases of an app whose slot runs: the
/// apps directory and the state directory on a filesystem that drops
/// whatever was not made durable when the power goes, the daemon killed at
/// that instant. After every power-on and the daemon's start, the active
/// generation is the one the database says is committed, holding that
/// version's files: never a mixed or a partial tree.
#[test]
fn power_cuts_in_app_releases_leave_the_committed_generation_active() {
    use updraft_tests::powerfs::{self, PowerFs};
    updraft_tests::require!("nginx");
    if let Some(why) = powerfs::unavailable() {
        updraft_tests::skip!("{why}");
    }
    const CUTS: usize = 60;
    let keys = TempDir::new("app-cuts-keys");
    let key = updraft_tests::publisher::keygen(keys.path(), "release");
    let disk = keys.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let mut fs = PowerFs::mount(&disk).expect("mounting the power-cut filesystem");
    let server = updraft_tests::server::UpdateServer::start(&keys.join("site"), false);
    let mut spec = updraft_tests::device::DeviceSpec::simple(&key);
    spec.disk = Some(disk.clone());
    spec.server = server.server_toml("1h", "1s");
    let mut dev = updraft_tests::device::Device::new("app-cuts", spec);
    let marker = dev.path("etc-updraft-release");
    std::fs::write(&marker, "UPDRAFT_RELEASE=1\n").unwrap();
    let health = dev.path("health-web.d");
    std::fs::create_dir_all(&health).unwrap();
    dev.reconfigure(|s| {
        s.device = format!("release_file = {:?}", marker.display().to_string());
        s.sections = format!(
            "[apps]\ndir = {:?}\n\n[components.web]\nkind = \"app\"\nhealth_dir = {:?}\n",
            disk.join("apps").display().to_string(),
            health.display().to_string()
        );
    });
    dev.init();
    fs.sync_all();
    let repo = &server.repo;
    let image = keys.join("rootfs.img");
    updraft_tests::publisher::image(&image, 1 << 20, 9);
    let tree = |k: u64| {
        let dir = keys.join(format!("tree-{k}"));
        let files: Vec<(String, String)> = (0..40)
            .map(|i| {
                (
                    format!("lib/part-{i:02}"),
                    format!("part {i} of build {}\n", k / 3).repeat(50),
                )
            })
            .chain([("VERSION".to_string(), k.to_string())])
            .collect();
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        write_tree(&dir, &refs);
        format!("web@{k}={}", dir.display())
    };
    let publish = |k: u64, with_image: bool| {
        let (version, app, img) = (k.to_string(), tree(k), image.display().to_string());
        let mut flags = vec!["--app", &app];
        if with_image {
            flags.extend(["--image", &img]);
        }
        updraft_tests::apps::publish_into(&key, &repo.dir, &version, &flags);
    };
    let active_version = || std::fs::read_to_string(disk.join("apps/web/current/VERSION")).ok();
    // Calibrate with a clean first install.
    publish(1, true);
    let ops0 = fs.mutating_ops();
    dev.start_daemon();
    let _ = dev.updraft(&["check"]);
    wait_history(&dev, "release 1 committed", WAIT, committed("1"));
    let per_install = (fs.mutating_ops() - ops0).max(20);
    dev.stop_daemon();
    let mut rng = updraft_tests::rng::Rng(0x00a9_c075 | 1);
    let (mut cuts, mut k, mut committed_releases) = (0usize, 1u64, 0usize);
    let mut states: Vec<String> = Vec::new();
    while cuts < CUTS {
        k += 1;
        publish(k, false);
        dev.start_daemon();
        fs.kill_on_cut(dev.daemon_pid().expect("daemon pid"));
        fs.arm_cut_after(1 + rng.below(per_install));
        let _ = dev.updraft(&["check"]);
        let t = Instant::now();
        loop {
            assert!(
                t.elapsed() < WAIT,
                "release {k} neither committed nor cut\n{}",
                dev.log_tail()
            );
            if fs.is_dead() {
                break;
            }
            // The power may go while status reads the database.
            let out = dev.updraft(&["status", "--json"]);
            let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if out.status.success() && st["components"][0]["version"] == json!(k.to_string()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        fs.disarm();
        if fs.is_dead() {
            cuts += 1;
            dev.kill_daemon();
            fs.restore_power().expect("power on");
            // Power on: the daemon's start puts back what was not committed.
            fs.clear_kill_on_cut();
            dev.start_daemon();
            dev.wait_for("the daemon after the cut", WAIT, |s| s["state"].is_string());
        } else {
            committed_releases += 1;
        }
        let st = dev.status();
        let stored = st["components"][0]["version"].as_str().map(str::to_string);
        let active = active_version();
        states.push(format!("{k}:{}", stored.as_deref().unwrap_or("-")));
        if active != stored {
            let tree = std::process::Command::new("find")
                .arg(disk.join("apps"))
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            panic!(
                "after release {k} (cut {cuts}): the active generation holds {active:?}, the committed one is {stored:?}\n{tree}\n{}",
                dev.log_tail()
            );
        }
        let generation = st["components"][0]["generation"].as_u64();
        assert_eq!(
            updraft_tests::apps::active_generation_at(&disk.join("apps/web")),
            generation,
            "{st:#}"
        );
        dev.stop_daemon();
    }
    eprintln!(
        "{cuts} power cuts across {} app releases ({committed_releases} committed without a cut); 0 mixed states; releases:committed {states:?}",
        k - 1
    );
}

/// What the server serves for an app is checked before anything is
/// activated: a blob whose bytes are not the signed file's, and an index
/// whose bytes are not the signed index, each fail the release with the
/// reason named, the running generation untouched and nothing left
/// behind.
#[test]
fn a_tampered_blob_or_index_fails_the_release_before_anything_is_switched() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("app-tampered", false);
    let trees = TempDir::new("app-tampered-trees");
    let v1 = trees.join("v1");
    write_tree(&v1, &[("VERSION", "1"), ("bin/web", "web 1")]);
    ps.publish(
        "1.0",
        11,
        1 << 20,
        &["--app", &format!("web@1={}", v1.display())],
    );
    let dev = app_device(&ps, "app-tampered", "1.0", "web");
    dev.ok(&["install", &ps.manifest_url()]);
    assert_eq!(active_generation(&dev, "web"), Some(1));

    // Release 1.1: its new file's blob replaced on the server by another
    // valid zstd frame of the same length.
    let v2 = trees.join("v2");
    write_tree(&v2, &[("VERSION", "2"), ("bin/web", "web 2")]);
    publish_apps(&ps, "1.1", &[format!("web@2={}", v2.display())]);
    let manifest = ps.server.repo.manifest_str();
    let public = ps.key.public.display().to_string();
    let verify = || updraft_tests::publisher::publish(&["verify", "--pub", &public, &manifest]);
    let out = String::from_utf8_lossy(&verify().stdout).into_owned();
    assert!(
        out.contains("component web ok: app index of 3 entries, 2 file blobs"),
        "{out}"
    );
    let sha = Sha256::of(b"web 2").to_hex();
    let blob = ps
        .server
        .repo
        .dir
        .join(format!("artifacts/blobs/{sha}.zst"));
    std::fs::write(&blob, zstd::bulk::compress(b"evil!", 3).unwrap()).unwrap();
    // The publisher's check reads it as a device would, and says so.
    let checked = verify();
    let err = String::from_utf8_lossy(&checked.stderr).into_owned();
    assert!(
        !checked.status.success() && err.contains("bin/web"),
        "{err}"
    );
    let out = dev.fails(&["install", &ps.manifest_url()]);
    assert!(
        out.contains("bin/web") && out.contains("hashes to"),
        "{out}"
    );
    assert_eq!(active_generation(&dev, "web"), Some(1));
    assert_eq!(
        generations(&dev, "web"),
        [1],
        "the failed generation is removed"
    );
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1"));

    // Release 1.2: its index's bytes changed on the server.
    let v3 = trees.join("v3");
    write_tree(&v3, &[("VERSION", "3"), ("bin/web", "web 3")]);
    publish_apps(&ps, "1.2", &[format!("web@3={}", v3.display())]);
    let payload = ps.server.repo.payload();
    let index = payload["components"][1]["index"]["url"]
        .as_str()
        .unwrap()
        .to_string();
    let path = ps.server.repo.dir.join(&index);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();
    let out = dev.fails(&["install", &ps.manifest_url()]);
    assert!(out.contains("component web"), "{out}");
    assert_eq!(active_generation(&dev, "web"), Some(1));
    assert_eq!(generations(&dev, "web"), [1]);
    let st = dev.status();
    assert_eq!(st["components"][0]["version"], json!("1"), "{st:#}");
}

/// A release of apps in a single-file bundle: the app's files travel as
/// its pack, read by `updraft install FILE.updraft` from a file and by
/// Range requests from a server; a release changing one file reads that
/// file from the pack, not the whole pack; a pack whose bytes were
/// changed fails the release before anything is switched.
#[test]
fn a_release_of_apps_installs_from_a_single_file_bundle_here_or_on_a_server() {
    updraft_tests::require!("nginx");
    let ps = ProxiedServer::start("bundle-app", false);
    let trees = TempDir::new("bundle-app-trees");
    // Two files with one content (packed once), and a file of 3 MiB whose
    // bytes a release changing only VERSION must not read.
    let big: String = (0..3 * 1024 * 1024 / 16)
        .map(|i| format!("{i:015}\n"))
        .collect();
    let tree = |version: &str| {
        let dir = trees.join(format!("web-{version}"));
        write_tree(
            &dir,
            &[
                ("bin/web", "web binary"),
                ("share/a", "the same bytes"),
                ("share/b", "the same bytes"),
                ("share/big", big.as_str()),
                ("share/zz-VERSION", version),
                ("VERSION", version),
                ("healthy", ""),
            ],
        );
        dir
    };
    let site = ps.server.repo.dir.clone();
    let bundle = |name: &str| {
        let out = site.join(name);
        ps.server.repo.bundle(&out, &[]);
        out
    };
    ps.publish(
        "1.0",
        1,
        1 << 20,
        &["--app", &format!("web@1.3={}", tree("1.3").display())],
    );
    let local = bundle("r1.updraft");
    let pack = layout_entry(&local, ".pack");
    assert_eq!(
        pack.1,
        (10 + 14 + big.len() + 3) as u64,
        "the pack holds each distinct content once (VERSION is share/zz-VERSION's), uncompressed"
    );
    let dev = app_device(&ps, "bundle-app", "1.0", "web");
    health_needs_healthy_file(&dev, "web");

    // From the file: release 1.0's slot runs, its app is installed.
    let out = dev.install(&local.display().to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e = wait_history(&dev, "release 1.0 committed", WAIT, committed("1.0"));
    assert!(
        e["detail"].as_str().unwrap_or_default().contains("web 1.3"),
        "{e}"
    );
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1.3"));
    assert_eq!(
        active_file(&dev, "web", "share/b").as_deref(),
        Some("the same bytes")
    );
    assert_eq!(
        active_file(&dev, "web", "share/big").map(|b| b.len()),
        Some(big.len())
    );

    // From a server, by Range requests: only the changed files are read
    // (the big one is linked from generation 1).
    publish_apps(&ps, "1.1", &[format!("web@1.4={}", tree("1.4").display())]);
    bundle("r2.updraft");
    let url = ps.manifest_url().replace("manifest.json", "r2.updraft");
    let before = ps.proxy.totals().to_client;
    let out = dev.install(&url);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e = wait_history(&dev, "release 1.1 committed", WAIT, committed("1.1"));
    let read = downloaded(e["detail"].as_str().unwrap_or_default());
    assert!(
        read < big.len() as u64 / 4,
        "release 1.1 read {read} bytes: more than its index and changed files"
    );
    // On the wire too: the bundle's headers (its first 256 KiB, asked
    // once for the manifest and once for the files), the index and the
    // changed file, never the 3 MiB pack.
    let wire = ps.proxy.totals().to_client - before;
    assert!(
        wire < big.len() as u64 / 4 + 2 * 256 * 1024,
        "release 1.1 took {wire} bytes from the server"
    );
    assert_eq!(active_generation(&dev, "web"), Some(2));
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1.4"));
    assert_eq!(
        active_file(&dev, "web", "share/big").map(|b| b.len()),
        Some(big.len())
    );

    // A pack changed after signing: the file read from it fails its hash,
    // nothing is switched, the written generation is removed.
    publish_apps(&ps, "1.2", &[format!("web@1.5={}", tree("1.5").display())]);
    let tampered = bundle("r3.updraft");
    let (offset, size) = layout_entry(&tampered, ".pack");
    let mut bytes = std::fs::read(&tampered).expect("bundle");
    // The first file of the pack is VERSION, which changed: it is read.
    // (A changed byte in share/big would go unread: the device links that
    // file from the running generation, which it hashed.)
    bytes[offset as usize] ^= 0x20;
    std::fs::write(&tampered, &bytes).expect("tampering");
    let out = dev.install(&tampered.display().to_string());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("component web"), "{err}");
    assert_eq!(active_generation(&dev, "web"), Some(2));
    assert_eq!(active_file(&dev, "web", "VERSION").as_deref(), Some("1.4"));
    assert_eq!(
        generations(&dev, "web"),
        [1, 2],
        "the failed generation is removed"
    );
    eprintln!(
        "app from a bundle: pack of {size} bytes; a release changing VERSION read {read} bytes of it \
         and the index by Range requests, {wire} bytes on the wire in all"
    );
}

/// The offset and size of the bundle entry whose name ends with `suffix`.
fn layout_entry(bundle: &std::path::Path, suffix: &str) -> (u64, u64) {
    let index = updraft_tests::bundle::layout(bundle);
    let e = index
        .entries()
        .iter()
        .find(|e| e.name.ends_with(suffix))
        .unwrap_or_else(|| panic!("no entry ending {suffix} in {}", bundle.display()));
    (e.offset, e.size)
}
