//! A damaged `updraft.db` does not end updates: it is moved aside (never
//! deleted), a new one is made from the protected copy beside it, and the
//! device keeps its serial floor, so a replayed older manifest is still
//! refused. One row per kind of damage SQLite meets after power cuts and
//! wear: a flipped byte in the page of each table, a truncated file, a
//! zero-length file; and a flipped byte inside a floor's value, which
//! SQLite cannot see and the copy raises back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{KeyPair, Repo, image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const IMAGE: usize = 1024 * 1024 + 77;

/// A device that accepted release 2.0 at serial 5, and the manifest of an
/// older release at serial 4 that its floor refuses.
struct Floored {
    dev: Device,
    old_manifest: String,
    _keys: TempDir,
}

fn floored(
    name: &str,
    key: &KeyPair,
    keys: TempDir,
    spec: impl FnOnce(&mut DeviceSpec),
) -> Floored {
    let mut s = DeviceSpec::simple(key);
    spec(&mut s);
    let dev = Device::new(name, s);
    dev.init();
    let repo = Repo::new(dev.path("repo"));
    let v2 = dev.path("v2.img");
    image(&v2, IMAGE, 2);
    repo.release(&[key], "2.0", &v2, &["--serial", "5"]);
    dev.ok(&["install", &repo.manifest_str()]);
    let old = Repo::new(dev.path("old-repo"));
    let v1 = dev.path("v1.img");
    image(&v1, IMAGE, 1);
    old.release(&[key], "1.0", &v1, &["--serial", "4"]);
    let f = Floored {
        old_manifest: old.manifest_str(),
        dev,
        _keys: keys,
    };
    f.assert_replay_refused();
    assert!(
        f.dev.state_dir.join("protected.json").is_file(),
        "no protected copy was written"
    );
    f
}

impl Floored {
    fn db(&self) -> PathBuf {
        self.dev.state_dir.join("updraft.db")
    }

    fn assert_replay_refused(&self) {
        let err = self.dev.fails(&["install", &self.old_manifest]);
        assert!(
            err.contains("manifest serial 4 is older than stored serial 5"),
            "the replayed manifest was not refused by its floor: {err}"
        );
    }

    /// The damaged files moved aside.
    fn aside(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.dev.state_dir)
            .expect("listing the state directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("updraft.db.damaged-"))
            })
            .collect();
        v.sort();
        v
    }

    /// The `database-recovered` events of the history, oldest first.
    fn recoveries(&self) -> Vec<Value> {
        let text = self.dev.ok(&["history", "--json"]);
        let history: Vec<Value> = serde_json::from_str(&text).expect("history --json is JSON");
        history
            .into_iter()
            .filter(|e| e["event"] == json!("database-recovered"))
            .collect()
    }
}

/// The root page of `table` and the page size, read from the file.
fn root_page(db: &Path, table: &str) -> (u64, u64) {
    let c = rusqlite::Connection::open(db).expect("opening the database");
    let page_size: u64 = c
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .expect("page size");
    let root: u64 = c
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = ?1",
            [table],
            |r| r.get(0),
        )
        .expect("the table's root page");
    (root, page_size)
}

/// Flip the page-type byte of `table`'s root page.
fn flip_page_of(db: &Path, table: &str) {
    let (root, size) = root_page(db, table);
    // Page 1 starts with the 100-byte file header.
    let offset = (root - 1) * size + if root == 1 { 100 } else { 0 };
    let mut bytes = std::fs::read(db).expect("reading the database");
    bytes[offset as usize] ^= 0xff;
    std::fs::write(db, bytes).expect("writing the database");
}

fn recovers_from(name: &str, damage: impl FnOnce(&Path)) {
    let keys = TempDir::new(&format!("{name}-keys"));
    let key = keygen(keys.path(), "release");
    let f = floored(name, &key, keys, |_| {});
    damage(&f.db());
    // The next command opens the database: it is rebuilt, and the floor
    // holds.
    f.assert_replay_refused();
    let recoveries = f.recoveries();
    let recovered = recoveries.first().expect("a database-recovered event");
    let detail = recovered["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&f.db().display().to_string()),
        "the event does not name the file: {detail}"
    );
    assert!(detail.contains("restored from protected.json"), "{detail}");
    // Only once: the rebuilt database is used from then on.
    f.assert_replay_refused();
    let again = f.recoveries();
    assert_eq!(again.len(), 1, "{again:#?}");
    assert_eq!(f.dev.status()["serial"], json!(5));
}

#[test]
fn a_flipped_byte_in_the_page_of_any_table_is_recovered_from() {
    for table in [
        "sqlite_master",
        "meta",
        "state",
        "key_documents",
        "slots",
        "rejected",
        "history",
        "outbox",
    ] {
        let name = format!("dbflip-{}", table.replace('_', "-"));
        recovers_from(&name, |db| {
            if table == "sqlite_master" {
                let mut b = std::fs::read(db).expect("reading the database");
                b[100] ^= 0xff;
                std::fs::write(db, b).expect("writing the database");
            } else {
                flip_page_of(db, table);
            }
        });
    }
}

#[test]
fn a_truncated_database_is_moved_aside_and_rebuilt() {
    let keys = TempDir::new("dbtrunc-keys");
    let key = keygen(keys.path(), "release");
    let f = floored("dbtrunc", &key, keys, |_| {});
    let len = std::fs::metadata(f.db()).expect("the database").len();
    let before = std::fs::read(f.db()).expect("reading the database");
    std::fs::OpenOptions::new()
        .write(true)
        .open(f.db())
        .and_then(|file| file.set_len(len / 2 + 7))
        .expect("truncating the database");
    f.assert_replay_refused();
    let aside = f.aside();
    assert_eq!(aside.len(), 1, "{aside:?}");
    // Kept as it was found, for whoever wants to look.
    let kept = std::fs::read(&aside[0]).expect("reading the moved file");
    assert_eq!(kept.len() as u64, len / 2 + 7);
    assert_eq!(&kept[..], &before[..kept.len()]);
}

#[test]
fn a_zero_length_database_is_refilled_from_the_copy() {
    let keys = TempDir::new("dbzero-keys");
    let key = keygen(keys.path(), "release");
    let f = floored("dbzero", &key, keys, |_| {});
    std::fs::write(f.db(), b"").expect("emptying the database");
    f.assert_replay_refused();
    let recoveries = f.recoveries();
    let event = recoveries.first().expect("a database-recovered event");
    assert!(
        event["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("it was empty"),
        "{event:#}"
    );
}

#[test]
fn a_floor_lowered_inside_its_value_is_raised_back_from_the_copy() {
    let keys = TempDir::new("dbvalue-keys");
    let key = keygen(keys.path(), "release");
    let f = floored("dbvalue", &key, keys, |_| {});
    // What a flipped byte inside a value does: SQLite sees a valid file.
    let c = rusqlite::Connection::open(f.db()).expect("opening the database");
    c.execute("UPDATE meta SET value = '0 1' WHERE key LIKE 'floor.%'", [])
        .expect("lowering the floor");
    c.execute("UPDATE meta SET value = '1' WHERE key = 'serial'", [])
        .expect("lowering the serial");
    drop(c);
    f.assert_replay_refused();
    assert!(f.aside().is_empty(), "a valid file was moved aside");
}

/// With a daemon and a report server: the recovery is reported.
#[test]
fn the_daemon_recovers_and_reports_it() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("dbdaemon-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), true);
    let collector = server.collector.as_ref().expect("a report collector");
    let toml = server.server_toml("1s", "200ms");
    let mut f = floored("dbdaemon", &key, keys, |s| s.server = toml);
    flip_page_of(&f.db(), "state");
    f.dev.start_daemon();
    let report = collector.wait_report("the recovery", Duration::from_secs(60), |r| {
        r["kind"] == json!("database_recovered")
    });
    let reason = report["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("updraft.db.damaged-"), "{report:#}");
    let log = f.dev.log();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("could not be used")),
        "{log}"
    );
    assert!(f.dev.daemon_running(), "{}", f.dev.log_tail());
    f.dev.stop_daemon();
    f.assert_replay_refused();
}

/// After a recovery, a rollback to the previous release of updraft finds a
/// database it reads, with the floor the copy restored.
#[test]
fn the_previous_release_runs_on_a_recovered_database() {
    let old = updraft_tests::previous_release!();
    let keys = TempDir::new("dbprevious-keys");
    let key = keygen(keys.path(), "release");
    let mut f = floored("dbprevious", &key, keys, |_| {});
    flip_page_of(&f.db(), "meta");
    f.assert_replay_refused();
    f.dev.use_binary(Some(old));
    let st = f.dev.status();
    assert_eq!(st["serial"], json!(5), "{st:#}");
    f.assert_replay_refused();
}

/// A state directory whose filesystem fills up (a 1 MiB tmpfs, filled by
/// another file): the database write that finds no space says which file
/// could not grow and where, at ERROR or WARNING; nothing is lost, the
/// daemon keeps running, and once space is freed the release it could not
/// start is installed.
#[test]
fn a_full_state_directory_is_named_and_the_update_goes_on_once_space_is_freed() {
    updraft_tests::require!("nginx", "mount", "umount");
    if !updraft_tests::skip::is_root() {
        updraft_tests::skip!("needs root to mount a small tmpfs as the state directory");
    }
    let keys = TempDir::new("dbfull-keys");
    let key = keygen(keys.path(), "release");
    let server = UpdateServer::start(&keys.join("site"), false);
    let mut s = DeviceSpec::simple(&key);
    s.server = server.server_toml("1s", "200ms");
    let mut dev = Device::new("dbfull", s);
    let _mount = Tmpfs::mount(&dev.state_dir, "1m");
    dev.init();
    let v1 = keys.join("1.0.img");
    image(&v1, IMAGE, 11);
    server.repo.release(&[&key], "1.0", &v1, &[]);
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    dev.reboot();
    dev.start_daemon();
    dev.wait_for("1.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });

    // Another file takes every free block.
    let filler = dev.state_dir.join("filler");
    fill(&filler);
    let v2 = keys.join("2.0.img");
    image(&v2, IMAGE, 12);
    server.repo.release(&[&key], "2.0", &v2, &[]);
    let named = format!(
        "no space left for the database {} (and its journal) in {}",
        dev.state_dir.join("updraft.db").display(),
        dev.state_dir.display()
    );
    dev.wait_log(&named, WAIT);
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    let st = dev.status();
    assert_eq!(st["running_version"], json!("1.0"), "{st:#}");

    std::fs::remove_file(&filler).expect("removing the filler");
    dev.wait_reboot_requested(WAIT);
    dev.reboot();
    dev.start_daemon();
    dev.wait_for("2.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("2.0")
    });
    dev.stop_daemon();
}

const WAIT: Duration = Duration::from_secs(120);

/// Write zeros to `path` until its filesystem is full.
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("creating the filler");
    let block = vec![0u8; 16 * 1024];
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = f.sync_all();
}

/// A tmpfs of `size` mounted on `dir` until dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("creating the mount point");
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs on {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}
