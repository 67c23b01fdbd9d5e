//! Key rotation as the recovery from a stolen release key, in the TUF
//! manner: in root mode every manifest names the key document it is signed
//! under (`keys_version`), accepting a newer key document starts every
//! channel's serial floor afresh, and a device trusts only the stored key
//! documents that chain from the roots it is provisioned with now.
//!
//! The attack: a thief with the release key signs serial 2^64-1 for the
//! running image. The device records that serial; without the reset every
//! legitimate release after root revoked the key would be refused as a
//! rollback, for good.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec, TrustSpec};
use updraft_tests::publisher::{KeyPair, Repo, image, keygen, publish};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(60);
const IMAGE: usize = 2 * 1024 * 1024 + 4321;

/// A root-mode device whose repository serves `keys/1.json` (signed by
/// `root`, listing `release`), and the release 1.0 installed from it.
struct Rotation {
    dev: Device,
    repo: Repo,
    root: KeyPair,
    release: KeyPair,
    keys: TempDir,
}

fn rotation(name: &str) -> Rotation {
    let keys = TempDir::new(&format!("{name}-keys"));
    let root = keygen(keys.path(), "root");
    let release = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&release);
    spec.trust = TrustSpec::Root(vec![root.public.clone()], 1, 0);
    let dev = Device::new(name, spec);
    dev.init();
    let repo = Repo::new(dev.path("repo"));
    repo.key_document(&[&root], &[&release], 1, &[]);
    Rotation {
        dev,
        repo,
        root,
        release,
        keys,
    }
}

impl Rotation {
    fn image(&self, version: &str, seed: u64) -> PathBuf {
        let p = self.dev.path(&format!("{version}.img"));
        image(&p, IMAGE, seed);
        p
    }

    fn key(&self, name: &str) -> KeyPair {
        keygen(self.keys.path(), name)
    }

    /// Install 1.0 and commit it as the running release of slot A (the
    /// one-shot install writes B; marking it bad keeps A running, which is
    /// all these tests need: a device with a stored floor).
    fn installed_v1(&self) -> PathBuf {
        let v1 = self.image("1.0", 1);
        self.repo.release(&[&self.release], "1.0", &v1, &[]);
        self.dev.ok(&["install", &self.repo.manifest_str()]);
        self.dev.ok(&["mark-bad"]);
        v1
    }
}

/// The key documents the device stores, by version, as stored.
fn stored_key_documents(dev: &Device) -> Vec<(u64, Vec<u8>)> {
    let db = rusqlite::Connection::open(dev.state_dir.join("updraft.db")).unwrap();
    let mut q = db
        .prepare("SELECT version, envelope FROM key_documents ORDER BY version")
        .unwrap();
    q.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

/// tuf-conformance `test_metadata_bytes_match`: a key document is kept
/// byte for byte as served, here with whitespace and a field order no
/// serialiser writes, never re-encoded; the next process verifies the
/// stored bytes from the roots again and keeps trusting them.
#[test]
fn tuf_test_metadata_bytes_match_the_stored_key_document_is_the_served_one() {
    let r = rotation("bytes-match");
    let path = r.repo.dir.join("keys/1.json");
    let env: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let served = format!(
        "{{\n   \"signatures\" : {} ,\n\t\"payload\":{},  \"payloadType\" : {}\n}}\n\n",
        env["signatures"], env["payload"], env["payloadType"]
    );
    std::fs::write(&path, &served).unwrap();
    r.installed_v1();
    assert_eq!(
        stored_key_documents(&r.dev),
        vec![(1, served.into_bytes())],
        "the stored key document is not the served one"
    );
    // A new process restores trust from the stored bytes and installs
    // under it.
    let v2 = r.image("2.0", 2);
    r.repo.release(&[&r.release], "2.0", &v2, &[]);
    let out = r.dev.updraft(&["install", &r.repo.manifest_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("discarding stored key document"), "{err}");
    let st = r.dev.status();
    assert_eq!(st["keys_version"], json!(1), "{st:#}");
    assert_eq!(st["slots"][1]["version"], json!("2.0"), "{st:#}");
}

/// Uptane `director_root_rotation_multiple` (and
/// `image_repo_root_rotation_multiple`): the roots rotate twice (v1 → v2 →
/// v3, each signed by the outgoing and the incoming roots) before the
/// device checks again; one install walks both documents, in order, and
/// installs the release signed under v3.
#[test]
fn uptane_director_root_rotation_multiple_is_walked_in_one_check() {
    let r = rotation("rotation-multiple");
    r.installed_v1();
    let root2 = r.key("root2");
    let root3 = r.key("root3");
    let p2 = root2.public.display().to_string();
    let p3 = root3.public.display().to_string();
    r.repo
        .key_document(&[&r.root, &root2], &[&r.release], 2, &["--root-pub", &p2]);
    r.repo
        .key_document(&[&root2, &root3], &[&r.release], 3, &["--root-pub", &p3]);
    let v2 = r.image("2.0", 2);
    r.repo.release(&[&r.release], "2.0", &v2, &[]);
    assert_eq!(r.repo.payload()["keys_version"], json!(3));
    r.dev.ok(&["install", &r.repo.manifest_str()]);
    let st = r.dev.status();
    assert_eq!(st["keys_version"], json!(3), "{st:#}");
    assert_eq!(st["slots"][1]["version"], json!("2.0"), "{st:#}");
    let versions: Vec<u64> = stored_key_documents(&r.dev)
        .into_iter()
        .map(|(v, _)| v)
        .collect();
    assert_eq!(versions, vec![1, 2, 3]);
}

/// The thief's manifest: the running image, serial 2^64-1, signed with the
/// stolen key under key document 1.
fn fast_forward(r: &Rotation) {
    r.repo
        .resign(&[&r.release], |p| p["serial"] = json!(u64::MAX));
    r.dev.ok(&["install", &r.repo.manifest_str()]);
    r.dev.ok(&["mark-bad"]);
    let st = r.dev.status();
    assert_eq!(st["serial"], json!(u64::MAX), "{st:#}");
    assert_eq!(st["floor"], json!(u64::MAX), "{st:#}");
}

#[test]
fn revoking_a_stolen_release_key_undoes_its_fast_forward() {
    let r = rotation("fast-forward");
    r.installed_v1();
    fast_forward(&r);
    // Root revokes the stolen key: key document 2 lists only the new key.
    let new_release = r.key("release2");
    r.repo.key_document(&[&r.root], &[&new_release], 2, &[]);
    let v2 = r.image("2.0", 2);
    r.repo
        .release(&[&new_release], "2.0", &v2, &["--serial", "6"]);
    assert_eq!(r.repo.payload()["keys_version"], json!(2));
    let out = r.dev.ok(&["install", &r.repo.manifest_str()]);
    assert!(out.contains("2.0"), "{out}");
    let st = r.dev.status();
    assert_eq!(st["slots"][1]["version"], json!("2.0"), "{st:#}");
    assert_eq!(st["keys_version"], json!(2));
    assert_eq!(st["floor"], json!(6), "the floor under key document 2");
    // The all-time serial, which releases before key epochs compare
    // against, never goes down.
    assert_eq!(st["serial"], json!(u64::MAX));

    // The thief can no longer move the floor: the stolen key signs nothing
    // under key document 2, whatever it claims.
    r.dev.ok(&["mark-bad"]);
    for kv in [1, 2] {
        r.repo.resign(&[&r.release], |p| {
            p["serial"] = json!(u64::MAX);
            p["keys_version"] = json!(kv);
        });
        let err = r.dev.fails(&["install", &r.repo.manifest_str()]);
        assert!(
            err.contains("manifest is signed by 0 of the 1 release keys of key document v2"),
            "{err}"
        );
    }
    assert_eq!(r.dev.status()["floor"], json!(6));
}

#[test]
fn root_mode_refuses_a_manifest_that_names_no_key_document() {
    let r = rotation("no-keys-version");
    let v1 = r.image("1.0", 1);
    r.repo.release(&[&r.release], "1.0", &v1, &[]);
    r.repo.resign(&[&r.release], |p| {
        p.as_object_mut().unwrap().remove("keys_version");
    });
    let before = r.dev.snapshot();
    let err = r.dev.fails(&["install", &r.repo.manifest_str()]);
    assert!(
        err.contains("manifest serial 1 names no keys_version; in root mode a manifest must name the key document it is signed under"),
        "{err}"
    );
    // The key document itself was valid and is kept; nothing else moved.
    let mut after = r.dev.snapshot();
    assert_eq!(after.keys_version, json!(1));
    after.keys_version = before.keys_version.clone();
    before.assert_unchanged(&after);
}

/// A device provisioned again with other root keys does not keep trusting
/// a key document the old roots signed.
#[test]
fn a_stored_key_document_that_does_not_chain_from_new_roots_is_discarded() {
    let mut r = rotation("reprovisioned");
    r.installed_v1();
    assert_eq!(r.dev.status()["keys_version"], json!(1));
    let new_root = r.key("root-new");
    let np = new_root.public.clone();
    r.dev
        .reconfigure(|s| s.trust = TrustSpec::Root(vec![np], 1, 0));
    // The repository still serves the old roots' keys/1.json.
    let v2 = r.image("2.0", 2);
    r.repo.release(&[&r.release], "2.0", &v2, &[]);
    let before = r.dev.snapshot();
    let err = r.dev.fails(&["install", &r.repo.manifest_str()]);
    assert!(
        err.contains(
            "discarding stored key document v1: it does not chain from the provisioned root keys"
        ),
        "{err}"
    );
    assert!(
        err.contains("key document keys/1.json is signed by 0 of the 1 root keys of v0"),
        "{err}"
    );
    assert_eq!(r.dev.status()["keys_version"], json!(0));
    assert_eq!(before.slot_b, r.dev.snapshot().slot_b, "slot B was written");
    // The new roots' own key document is then accepted.
    std::fs::remove_file(r.repo.dir.join("keys/1.json")).unwrap();
    r.repo.key_document(&[&new_root], &[&r.release], 1, &[]);
    r.repo.release(&[&r.release], "2.0", &v2, &[]);
    r.dev.ok(&["install", &r.repo.manifest_str()]);
    let st = r.dev.status();
    assert_eq!(st["keys_version"], json!(1));
    assert_eq!(st["slots"][1]["version"], json!("2.0"), "{st:#}");
}

/// A CDN edge still serving the manifest from before a rotation the device
/// already learned of (by probing for `keys/N+1.json`): the manifest is
/// stale, not wrong. Nothing fails, nothing is reported, nothing is
/// installed; the re-published manifest is installed at a later poll.
#[test]
fn a_manifest_from_before_a_known_rotation_is_stale_not_a_failure() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("stale-keys");
    let root = keygen(keys.path(), "root");
    let release = keygen(keys.path(), "release");
    let added = keygen(keys.path(), "added");
    let server = UpdateServer::start(&keys.join("site"), false);
    server.repo.key_document(&[&root], &[&release], 1, &[]);
    let img = keys.join("2.0.img");
    image(&img, IMAGE, 2);
    server.repo.release(&[&release], "2.0", &img, &[]);
    assert_eq!(server.repo.payload()["keys_version"], json!(1));
    // Key document 2 keeps the release key and adds another; the manifest
    // still names 1, as an edge that has not caught up would serve it.
    let lagging = std::fs::read(server.repo.manifest()).unwrap();
    server
        .repo
        .key_document(&[&root], &[&release, &added], 2, &[]);
    let mut spec = DeviceSpec::simple(&release);
    spec.trust = TrustSpec::Root(vec![root.public.clone()], 1, 0);
    spec.server = server.server_toml("1s", "200ms");
    let mut dev = Device::new("stale", spec);
    dev.init();
    dev.start_daemon();
    dev.wait_for("key document 2 in force", WAIT, |s| {
        s["keys_version"] == json!(2)
    });
    // Several polls of the stale manifest.
    std::thread::sleep(Duration::from_secs(3));
    let st = dev.status();
    assert_eq!(st["state"], json!("idle"), "{st:#}");
    assert_eq!(
        st["last_error"],
        json!(null),
        "a stale manifest is not an error: {st:#}"
    );
    assert_eq!(
        st["serial"],
        json!(null),
        "the stale serial was recorded: {st:#}"
    );
    assert_eq!(st["outbox"], json!(0), "something was reported: {st:#}");
    let history = dev.ok(&["history"]);
    assert!(!history.contains("check-failed"), "{history}");
    let log = dev.log();
    assert!(
        log.contains("is signed under key document v1, older than the v2 this device trusts"),
        "{log}"
    );
    assert!(
        !dev.reboot_marker.exists(),
        "the stale release was installed"
    );
    // The edge catches up: the same release, re-signed under key document 2.
    assert_eq!(std::fs::read(server.repo.manifest()).unwrap(), lagging);
    server.repo.release(&[&release], "2.0", &img, &[]);
    assert_eq!(server.repo.payload()["keys_version"], json!(2));
    dev.wait_reboot_requested(WAIT);
    assert_eq!(dev.status()["job"]["version"], json!("2.0"));
    assert_eq!(dev.reboot(), SlotName::B);
}

/// A manifest of the previous key epoch, signed at `issued` and valid
/// until `expires`, is refused with `expect` in the error and in a
/// `check_failed` report: nothing is stored or installed.
fn a_previous_epoch_manifest_is_refused(name: &str, issued: &str, expires: &str, expect: &str) {
    updraft_tests::require!("nginx");
    let keys = TempDir::new(&format!("{name}-keys"));
    let root = keygen(keys.path(), "root");
    let release = keygen(keys.path(), "release");
    let added = keygen(keys.path(), "added");
    let server = UpdateServer::start(&keys.join("site"), true);
    server.repo.key_document(&[&root], &[&release], 1, &[]);
    let img = keys.join("2.0.img");
    image(&img, IMAGE, 2);
    server.repo.release(&[&release], "2.0", &img, &[]);
    server.repo.resign(&[&release], |p| {
        p["issued"] = json!(issued);
        p["expires"] = json!(expires);
    });
    assert_eq!(server.repo.payload()["keys_version"], json!(1));
    server
        .repo
        .key_document(&[&root], &[&release, &added], 2, &[]);
    let mut spec = DeviceSpec::simple(&release);
    spec.trust = TrustSpec::Root(vec![root.public.clone()], 1, 0);
    spec.server = server.server_toml("1s", "200ms");
    let mut dev = Device::new(name, spec);
    dev.init();
    dev.start_daemon();
    let st = dev.wait_for("the expired manifest refused", WAIT, |s| {
        s["keys_version"] == json!(2) && !s["last_error"].is_null()
    });
    let error = st["last_error"].to_string();
    assert!(error.contains(expect), "{st:#}");
    assert_eq!(
        st["serial"],
        json!(null),
        "the expired serial was recorded: {st:#}"
    );
    let collector = server.collector.as_ref().expect("a report collector");
    let failed = collector.wait_report("the failed check", WAIT, |r| {
        r["kind"] == json!("check_failed")
    });
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(expect), "{reason}");
    assert!(
        !dev.log()
            .contains("the server has not caught up with the key rotation; polling again later"),
        "the manifest was waited out as a lagging edge's:\n{}",
        dev.log_tail()
    );
    assert!(
        !dev.reboot_marker.exists(),
        "the refused release was installed"
    );
    dev.stop_daemon();
}

/// A frozen mirror replaying an expired manifest of the previous key epoch:
/// expiry is checked before the epoch, so it is refused and reported as a
/// failed check (a lagging edge's manifest is waited out only while it is
/// still valid).
#[test]
fn an_expired_manifest_of_the_previous_epoch_is_refused_not_stale() {
    a_previous_epoch_manifest_is_refused(
        "expired-epoch",
        "2020-01-01T00:00:00Z",
        "2020-02-01T00:00:00Z",
        "expired at 2020-02-01T00:00:00Z",
    );
}

/// A manifest of the previous key epoch still valid but signed two days
/// ago, past `server.stale_limit` (a day): no lagging edge but a server
/// that missed the rotation, refused and reported.
#[test]
fn a_stale_manifest_past_the_stale_limit_is_reported() {
    let now = updraft::timestamp::Timestamp::now().0;
    let issued = updraft::timestamp::Timestamp(now - 2 * 86_400).to_string();
    let expires = updraft::timestamp::Timestamp(now + 30 * 86_400).to_string();
    a_previous_epoch_manifest_is_refused(
        "stale-limit",
        &issued,
        &expires,
        "(server.stale_limit 1d): the server has not caught up with the key rotation",
    );
}

/// After a rollback to the previous release of updraft, the state the
/// recovery left is read correctly: the previous release trusts key
/// document 2 and refuses the thief's manifest, as the current one does.
#[test]
fn the_previous_release_does_not_accept_what_the_recovery_refused() {
    let old = updraft_tests::previous_release!();
    let mut r = rotation("fast-forward-old");
    r.installed_v1();
    fast_forward(&r);
    let thief = std::fs::read(r.repo.manifest()).unwrap();
    let new_release = r.key("release2");
    r.repo.key_document(&[&r.root], &[&new_release], 2, &[]);
    let v2 = r.image("2.0", 2);
    r.repo
        .release(&[&new_release], "2.0", &v2, &["--serial", "6"]);
    r.dev.ok(&["install", &r.repo.manifest_str()]);
    r.dev.ok(&["mark-bad"]);

    r.dev.use_binary(Some(old));
    let st = r.dev.status();
    assert_eq!(st["keys_version"], json!(2), "{st:#}");
    assert_eq!(st["serial"], json!(u64::MAX), "{st:#}");
    std::fs::write(r.repo.manifest(), &thief).unwrap();
    let err = r.dev.fails(&["install", &r.repo.manifest_str()]);
    assert!(err.contains("release keys of key document v2"), "{err}");
}

fn publish_fails(args: &[&str]) -> String {
    let out = publish(args);
    assert_eq!(out.status.code(), Some(1), "{args:?} should fail: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn release_args<'a>(
    key: &'a Path,
    img: &'a Path,
    out: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut a = vec![
        "release",
        "--key",
        key.to_str().unwrap(),
        "--version",
        "1.0",
        "--compatible",
        "testboard",
        "--image",
        img.to_str().unwrap(),
        "--level",
        "1",
        "--out",
        out.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    a
}

/// The publisher never signs a serial that leaves no room after it, never
/// jumps far without being told to, and counts on only from a previous
/// manifest it can verify.
#[test]
fn the_publisher_guards_the_serial_sequence() {
    let dir = TempDir::new("publisher-serials");
    let key = keygen(dir.path(), "release");
    let stranger = keygen(dir.path(), "stranger");
    let img = dir.join("1.0.img");
    image(&img, 64 * 1024, 1);
    let out = dir.join("site");
    let args = |extra: &[&'static str]| release_args(&key.key, &img, &out, extra);

    let err = publish_fails(&args(&["--serial", "9007199254740992"]));
    assert!(
        err.contains(
            "serial 9007199254740992 is out of range: serials run from 1 to 9007199254740991"
        ),
        "{err}"
    );
    assert!(
        !out.join("manifest.json").exists(),
        "a manifest was written"
    );

    publish_ok_args(&args(&["--serial", "1"]));
    let err = publish_fails(&args(&["--serial", "5000000000"]));
    assert!(
        err.contains("serial 5000000000 jumps 4999999999 past the previous serial 1"),
        "{err}"
    );
    assert!(err.contains("--allow-serial-jump"), "{err}");
    publish_ok_args(&args(&["--serial", "5000000000", "--allow-serial-jump"]));
    publish_ok_args(&args(&[
        "--serial",
        "9007199254740991",
        "--allow-serial-jump",
    ]));
    let err = publish_fails(&args(&[]));
    assert!(
        err.contains("the previous serial 9007199254740991 leaves no next serial"),
        "{err}"
    );

    // A manifest nobody of this release line signed is not counted on.
    let planted = dir.join("planted");
    publish_ok_args(&release_args(
        &stranger.key,
        &img,
        &planted,
        &["--serial", "77"],
    ));
    std::fs::copy(planted.join("manifest.json"), out.join("manifest.json")).unwrap();
    let err = publish_fails(&args(&[]));
    assert!(
        err.contains("does not verify against the keys given with --key"),
        "{err}"
    );
    assert!(err.contains("pass --serial N"), "{err}");
    publish_ok_args(&args(&["--serial", "2"]));

    // A serial is published once: signed again for the same image (a
    // renewed expiry), refused for another image.
    publish_ok_args(&args(&["--serial", "2"]));
    let other = dir.join("1.1.img");
    image(&other, 64 * 1024, 2);
    let err = publish_fails(&release_args(&key.key, &other, &out, &["--serial", "2"]));
    assert!(
        err.contains("serial 2 is already published in ")
            && err.contains("for another image (release 1.0)"),
        "{err}"
    );

    // One directory, one channel.
    let err = publish_fails(&args(&["--channel", "beta"]));
    assert!(
        err.contains("is for channel stable, not beta: one directory serves one channel"),
        "{err}"
    );
}

fn publish_ok_args(args: &[&str]) {
    let out = publish(args);
    assert!(out.status.success(), "{args:?}: {out:?}");
}

/// All channels of a server share one key-document sequence: here each
/// channel directory's `keys/` is the same directory, so a rotation
/// published once is in force on every channel, and a device moved between
/// channels keeps its trust and finds each channel's floor under it.
#[test]
fn channels_share_one_key_document_sequence() {
    let keys = TempDir::new("shared-keys");
    let root = keygen(keys.path(), "root");
    let release = keygen(keys.path(), "release");
    let added = keygen(keys.path(), "added");
    let site = keys.join("site");
    let shared = site.join("keys");
    std::fs::create_dir_all(&shared).unwrap();
    let stable = Repo::new(site.join("stable"));
    let beta = Repo::new(site.join("beta"));
    for r in [&stable, &beta] {
        std::os::unix::fs::symlink("../keys", r.dir.join("keys")).unwrap();
    }
    stable.key_document(&[&root], &[&release], 1, &[]);
    let mut spec = DeviceSpec::simple(&release);
    spec.trust = TrustSpec::Root(vec![root.public.clone()], 1, 0);
    // Never contacted: the installs below name their manifests.
    spec.server = "manifest_url = \"https://127.0.0.1:9/{channel}/manifest.json\"\n".into();
    let dev = Device::new("shared-keys", spec);
    dev.init();
    let img = |version: &str, seed: u64| {
        let p = keys.join(format!("{version}.img"));
        image(&p, IMAGE, seed);
        p
    };
    stable.release(&[&release], "1.0", &img("1.0", 1), &["--serial", "10"]);
    dev.ok(&["install", &stable.manifest_str()]);
    dev.ok(&["mark-bad"]);
    // The rotation, published once, reaches both channels.
    stable.key_document(&[&root], &[&release, &added], 2, &[]);
    assert!(beta.dir.join("keys/2.json").is_file());
    beta.release(
        &[&added],
        "2.0-beta",
        &img("2.0-beta", 2),
        &["--channel", "beta"],
    );
    assert_eq!(beta.payload()["keys_version"], json!(2));
    dev.ok(&["channel", "beta"]);
    dev.ok(&["install", &beta.manifest_str()]);
    let st = dev.status();
    assert_eq!(st["keys_version"], json!(2), "{st:#}");
    assert_eq!(st["floor"], json!(1), "beta counts its own serials: {st:#}");
    assert_eq!(st["slots"][1]["version"], json!("2.0-beta"), "{st:#}");
    dev.ok(&["mark-bad"]);
    // Back on stable, under key document 2: stable's floor starts afresh
    // with the rotation, so its next serial installs.
    dev.ok(&["channel", "--default"]);
    stable.release(&[&release], "1.1", &img("1.1", 3), &[]);
    assert_eq!(stable.payload()["serial"], json!(11));
    assert_eq!(stable.payload()["keys_version"], json!(2));
    dev.ok(&["install", &stable.manifest_str()]);
    let st = dev.status();
    assert_eq!(st["channel"]["name"], json!("stable"));
    assert_eq!(st["floor"], json!(11));
    assert_eq!(st["slots"][1]["version"], json!("1.1"), "{st:#}");
}
