//! Encrypted releases (`updraft-publish release --encrypt-to`): a device
//! listed as a recipient installs the release; a device that is not is
//! refused before anything is downloaded, naming its recipient id; a
//! ciphertext frame that was altered, moved or cut off is refused before
//! it is decrypted, and its plaintext never reaches the slot; a download
//! cut mid-way resumes at a frame boundary, as a plain one does; a bundle
//! of an encrypted release installs; a sealed delta installs, and one whose
//! chunks do not open under its key falls back to the full image; the
//! publisher refuses a bad recipient list.

use std::path::PathBuf;

use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::publisher::{
    KeyPair, Repo, image, keygen, keygen_recipient, publish_ok, recipient_list,
};

/// Four 1 MiB frames and a short one.
const IMAGE: usize = 4 * 1024 * 1024 + 4321;

struct Fixture {
    dev: Device,
    repo: Repo,
    release: KeyPair,
    v2: PathBuf,
    plain: Vec<u8>,
    _keys: updraft_tests::tmp::TempDir,
}

fn fixture(name: &str) -> Fixture {
    let keydir = updraft_tests::tmp::TempDir::new(&format!("{name}-keys"));
    let release = keygen(keydir.path(), "release");
    let dev = Device::new(name, DeviceSpec::simple(&release));
    dev.init();
    let repo = Repo::new(dev.path("repo"));
    let v2 = dev.path("v2.img");
    let plain = image(&v2, IMAGE, 20);
    Fixture {
        dev,
        repo,
        release,
        v2,
        plain,
        _keys: keydir,
    }
}

impl Fixture {
    /// Publish v2 encrypted for the device itself and `others`.
    fn publish_for(&self, device: bool, others: &[&str]) -> String {
        self.publish_with(device, others, &[])
    }

    /// [`Fixture::publish_for`] with more publisher arguments.
    fn publish_with(&self, device: bool, others: &[&str], extra: &[&str]) -> String {
        let mut lines: Vec<String> = others.iter().map(|s| s.to_string()).collect();
        if device {
            lines.push(format!(
                "{}  # the device under test",
                self.dev.encryption_key()
            ));
        }
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let list = recipient_list(&self.dev.path("recipients.txt"), &refs);
        let mut args = vec!["--encrypt-to", list.to_str().unwrap()];
        args.extend_from_slice(extra);
        self.repo.release(&[&self.release], "2.0", &self.v2, &args)
    }

    fn artifact(&self) -> PathBuf {
        self.repo.artifact()
    }

    fn frames(&self) -> Vec<(u64, u64, u64)> {
        let p = self.repo.payload();
        let mut out_offset = 0;
        p["artifact"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let o = out_offset;
                out_offset += f["out_size"].as_u64().unwrap();
                (
                    f["offset"].as_u64().unwrap(),
                    f["size"].as_u64().unwrap(),
                    o,
                )
            })
            .collect()
    }

    /// Install, expect a refusal containing `expect`, and check that slot B
    /// holds no plaintext of frame `bad` and slot A is untouched.
    fn refused_with_no_plaintext_of(&self, bad: usize, expect: &str) -> String {
        let a = self.dev.slot_bytes(SlotName::A);
        let err = self.dev.fails(&["install", &self.repo.manifest_str()]);
        assert!(err.contains(expect), "expected {expect:?} in:\n{err}");
        assert_eq!(
            self.dev.slot_bytes(SlotName::A),
            a,
            "the active slot changed"
        );
        let (_, _, out) = self.frames()[bad];
        let len = self.frames().get(bad + 1).map_or(IMAGE as u64, |f| f.2) - out;
        let b = self.dev.slot_bytes(SlotName::B);
        let range = out as usize..(out + len) as usize;
        assert!(
            b.get(range.clone()) != Some(&self.plain[range]),
            "slot B holds the plaintext of the refused frame {bad}"
        );
        let st = self.dev.status();
        assert_eq!(st["slots"][1]["bootable"], false, "{st:#}");
        err
    }
}

#[test]
fn a_listed_device_installs_the_encrypted_release() {
    let f = fixture("enc-installs");
    let other = keygen_recipient(f.dev.dir(), "group-east");
    let other_pub = std::fs::read_to_string(&other.public).unwrap();
    f.publish_for(true, &[&other_pub]);
    let payload = f.repo.payload();
    assert_eq!(payload["spec_version"], 3);
    assert_eq!(
        payload["encryption"]["recipients"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // The artifact is not the zstd stream of a plain release.
    let art = std::fs::read(f.artifact()).unwrap();
    assert_ne!(&art[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    let verified = publish_ok(&[
        "verify",
        "--pub",
        f.release.public.to_str().unwrap(),
        &f.repo.manifest_str(),
    ]);
    assert!(verified.contains("ciphertext hashes match"), "{verified}");
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert_eq!(
        f.dev.slot_sha256(SlotName::B, IMAGE as u64),
        updraft::hash::Sha256::of(&f.plain)
    );
}

#[test]
fn a_device_that_is_not_a_recipient_is_refused_before_downloading_naming_its_id() {
    let f = fixture("enc-not-listed");
    let other = keygen_recipient(f.dev.dir(), "someone-else");
    let other_pub = std::fs::read_to_string(&other.public).unwrap();
    f.publish_for(false, &[&other_pub]);
    // Without the artifact on the server, a download would fail otherwise.
    std::fs::remove_file(f.artifact()).unwrap();
    let before = f.dev.snapshot();
    let err = f.dev.fails(&["install", &f.repo.manifest_str()]);
    assert!(err.contains("none is this device"), "{err}");
    let key = updraft::keys::decode_base64(&f.dev.encryption_key(), "key").unwrap();
    let id = updraft::hash::Sha256::of(&key).to_hex();
    assert!(err.contains(&id), "the refusal does not name {id}:\n{err}");
    let after = f.dev.snapshot();
    assert_eq!((after.slot_a, after.slot_b), (before.slot_a, before.slot_b));
}

#[test]
fn a_tampered_ciphertext_frame_is_refused_before_it_is_decrypted() {
    let f = fixture("enc-tampered");
    f.publish_for(true, &[]);
    let (off, size, _) = f.frames()[2];
    let mut art = std::fs::read(f.artifact()).unwrap();
    art[(off + size / 2) as usize] ^= 0x40;
    std::fs::write(f.artifact(), &art).unwrap();
    f.refused_with_no_plaintext_of(2, "ciphertext hashes to");
}

#[test]
fn swapped_frames_are_refused() {
    let f = fixture("enc-swapped");
    f.publish_for(true, &[]);
    let frames = f.frames();
    let art = std::fs::read(f.artifact()).unwrap();
    let (o1, s1, _) = frames[1];
    let (o2, s2, _) = frames[2];
    let mut swapped = art[..o1 as usize].to_vec();
    swapped.extend_from_slice(&art[o2 as usize..(o2 + s2) as usize]);
    swapped.extend_from_slice(&art[o1 as usize..(o1 + s1) as usize]);
    swapped.extend_from_slice(&art[(o2 + s2) as usize..]);
    std::fs::write(f.artifact(), &swapped).unwrap();
    f.refused_with_no_plaintext_of(1, "artifact frame 1");
}

#[test]
fn a_truncated_artifact_is_refused_and_its_last_frame_never_decrypted() {
    let f = fixture("enc-truncated");
    f.publish_for(true, &[]);
    let art = std::fs::read(f.artifact()).unwrap();
    std::fs::write(f.artifact(), &art[..art.len() - 100]).unwrap();
    let last = f.frames().len() - 1;
    f.refused_with_no_plaintext_of(last, "frame");
}

#[test]
fn a_download_cut_mid_way_resumes_at_the_last_verified_frame() {
    updraft_tests::require!("nginx");
    let ps = updraft_tests::proxied::ProxiedServer::start("enc-resume", false);
    const SIZE: usize = 8 * 1024 * 1024;
    let mut spec = ps.device_spec("1h", "");
    spec.slot_size = SIZE as u64;
    let mut dev = Device::new("enc-resume", spec);
    dev.init();
    let list = recipient_list(&dev.path("recipients.txt"), &[&dev.encryption_key()]);
    let img = ps.publish("1.0", 8, SIZE, &["--encrypt-to", list.to_str().unwrap()]);
    // The first connection carries the manifest and then the artifact:
    // cut it half way in.
    ps.proxy
        .script([updraft_tests::proxy::Behaviour::ResetAfter(
            ps.artifact_size() / 2,
        )]);
    let a = dev.slot_bytes(SlotName::A);
    dev.start_daemon();
    dev.wait_reboot_requested(std::time::Duration::from_secs(120));
    dev.stop_daemon();
    let log = dev.log();
    assert!(
        log.contains("resuming at frame"),
        "no resume in the log:\n{log}"
    );
    assert!(
        dev.slot_bytes(SlotName::B)[..SIZE] == img[..],
        "slot B does not hold the image"
    );
    assert_eq!(dev.slot_bytes(SlotName::A), a, "the active slot changed");
}

#[test]
fn the_publisher_refuses_a_bad_recipient_list() {
    let f = fixture("enc-publisher-refusals");
    let bad = recipient_list(&f.dev.path("bad.txt"), &["c2hvcnQ="]);
    let key = f.release.key.to_str().unwrap();
    let out = f.repo.dir.to_str().unwrap();
    let v2 = f.v2.to_str().unwrap();
    let rows: Vec<(Vec<&str>, &str)> = vec![(
        vec!["--encrypt-to", bad.to_str().unwrap()],
        "line 2: the key is 5 bytes, an X25519 public key is 32",
    )];
    for (extra, want) in rows {
        let mut args = vec![
            "release",
            "--key",
            key,
            "--version",
            "2.0",
            "--compatible",
            "testboard",
            "--image",
            v2,
            "--out",
            out,
        ];
        args.extend(extra);
        let o = updraft_tests::publisher::publish(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{args:?}: {err}");
    }
    assert!(
        !f.repo.manifest().exists(),
        "a refused release wrote a manifest"
    );
}

#[test]
fn a_bundle_of_an_encrypted_release_installs() {
    let f = fixture("enc-bundle");
    f.publish_for(true, &[]);
    let bundle = f.dev.path("release.updraft");
    f.repo.bundle(&bundle, &[]);
    f.dev.ok(&["install", bundle.to_str().unwrap()]);
    assert_eq!(
        f.dev.slot_sha256(SlotName::B, IMAGE as u64),
        updraft::hash::Sha256::of(&f.plain)
    );
}

/// A device running plain release 1.0 from slot B (installed, booted,
/// committed), where 1.0 is release 2.0 with a few bytes changed; and the
/// path of 1.0's image.
fn running_v1(name: &str) -> (Fixture, PathBuf) {
    let mut f = fixture(name);
    let v1 = f.dev.path("v1.img");
    let mut old = f.plain.clone();
    for i in (0..IMAGE).step_by(131_071) {
        old[i] ^= 0x33;
    }
    std::fs::write(&v1, &old).unwrap();
    f.repo.release(&[&f.release], "1.0", &v1, &[]);
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    f.dev.reboot_into(SlotName::B);
    f.dev.ok(&["mark-good"]);
    (f, v1)
}

#[test]
fn a_sealed_delta_installs_the_encrypted_release() {
    let (f, v1) = running_v1("enc-delta");
    let out = f.publish_with(true, &[], &["--from", v1.to_str().unwrap()]);
    assert!(out.contains("delta from"), "no delta published: {out}");
    let p = f.repo.payload();
    assert_eq!(p["spec_version"], 3);
    let url = p["deltas"][0]["url"].as_str().unwrap();
    assert!(url.ends_with(".bsdiff.zst.sealed"), "{url}");
    let sealed = std::fs::read(f.repo.dir.join(url)).unwrap();
    assert_ne!(
        &sealed[..4],
        &[0x28, 0xb5, 0x2f, 0xfd],
        "the delta is plain zstd"
    );
    let out = f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert!(out.contains("installed release 2.0 into slot A"), "{out}");
    assert_eq!(
        f.dev.slot_sha256(SlotName::A, IMAGE as u64),
        updraft::hash::Sha256::of(&f.plain)
    );
    let history = f.dev.ok(&["history"]);
    assert!(
        history.contains("verified on the slot (delta)"),
        "{history}"
    );
    assert!(!history.contains("delta-fallback"), "{history}");
}

#[test]
fn a_sealed_delta_that_does_not_open_falls_back_to_the_full_image() {
    let (f, v1) = running_v1("enc-delta-bad");
    // A delta sealed for another source, signed as if it were 1.0's: its
    // size and hash match the manifest, but its chunks are sealed under
    // another delta's key, so none opens and nothing reaches the patcher.
    let other = f.dev.path("other.img");
    let mut bytes = std::fs::read(&v1).unwrap();
    bytes[4096] ^= 0xff;
    std::fs::write(&other, &bytes).unwrap();
    f.publish_with(true, &[], &["--from", other.to_str().unwrap()]);
    let old = std::fs::read(&v1).unwrap();
    f.repo.resign(&[&f.release], |p| {
        p["deltas"][0]["from_sha256"] = serde_json::json!(updraft::hash::Sha256::of(&old).to_hex());
    });
    // With the full image out of reach the job fails, and the slot holds
    // nothing of release 2.0.
    let full = f.artifact();
    let away = f.dev.path("artifact.away");
    std::fs::rename(&full, &away).unwrap();
    let err = f.dev.fails(&["install", &f.repo.manifest_str()]);
    assert!(err.contains("chunk 0 (final) does not decrypt"), "{err}");
    assert!(err.contains("falling back to the full image"), "{err}");
    assert_ne!(
        f.dev.slot_sha256(SlotName::A, IMAGE as u64),
        updraft::hash::Sha256::of(&f.plain),
        "slot A holds release 2.0 from a delta that did not open"
    );
    std::fs::rename(&away, &full).unwrap();
    let out = f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert!(out.contains("installed release 2.0 into slot A"), "{out}");
    assert_eq!(
        f.dev.slot_sha256(SlotName::A, IMAGE as u64),
        updraft::hash::Sha256::of(&f.plain)
    );
    let history = f.dev.ok(&["history"]);
    assert!(history.contains("delta-fallback"), "{history}");
    assert!(
        history.contains("chunk 0 (final) does not decrypt"),
        "{history}"
    );
}
