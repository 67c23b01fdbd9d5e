//! Hostile input to `updraft install`: every way a manifest, key document
//! or artifact can be wrong, each refused with a clear error naming the
//! problem.
//!
//! Two guarantees are checked, depending on when the problem can be seen:
//! * found before the first byte is written (signatures, trust, policy,
//!   sizes, structure): both slots' bytes, the boot selection and the stored
//!   state are exactly as before;
//! * found while streaming (a frame or the whole image does not hash as
//!   signed): nothing unverified was written, the active slot is
//!   byte-for-byte untouched, the target slot is out of the boot order, and
//!   the machine is idle again with the failure in its history.

use std::path::PathBuf;

use serde_json::{Value, json};
use updraft::hash::Sha256;
use updraft::slot::SlotName;
use updraft_tests::device::{Device, DeviceSpec, TrustSpec};
use updraft_tests::publisher::{KeyPair, Repo, image, keygen};
use updraft_tests::server::UpdateServer;
use updraft_tests::tmp::TempDir;

struct Fixture {
    dev: Device,
    repo: Repo,
    release: KeyPair,
    other: KeyPair,
    root: KeyPair,
    keydir: TempDir,
    v1: PathBuf,
    v2: PathBuf,
}

const IMAGE: usize = 6 * 1024 * 1024 + 12345;

/// Keys made before the device, so its configuration can name them.
struct Keys {
    release: KeyPair,
    other: KeyPair,
    root: KeyPair,
}

fn fixture(name: &str) -> Fixture {
    fixture_with(name, |_, _| {})
}

fn fixture_with(name: &str, spec: impl FnOnce(&mut DeviceSpec, &Keys)) -> Fixture {
    let keydir = TempDir::new(&format!("{name}-keys"));
    let keys = Keys {
        release: keygen(keydir.path(), "release"),
        other: keygen(keydir.path(), "other"),
        root: keygen(keydir.path(), "root"),
    };
    let mut s = DeviceSpec::simple(&keys.release);
    spec(&mut s, &keys);
    let dev = Device::new(name, s);
    dev.init();
    let repo = Repo::new(dev.path("repo"));
    let v1 = dev.path("v1.img");
    let v2 = dev.path("v2.img");
    image(&v1, IMAGE, 10);
    image(&v2, IMAGE, 20);
    Fixture {
        dev,
        repo,
        release: keys.release,
        other: keys.other,
        root: keys.root,
        keydir,
        v1,
        v2,
    }
}

impl Fixture {
    fn publish_v1(&self) {
        self.repo.release(&[&self.release], "1.0", &self.v1, &[]);
    }

    /// The manifest is refused: everything is exactly as before, including
    /// the stored serial and trust.
    fn refused_untouched(&self, expect: &str) -> String {
        let before = self.dev.snapshot();
        let err = self.dev.fails(&["install", &self.repo.manifest_str()]);
        assert!(err.contains(expect), "expected {expect:?} in:\n{err}");
        let after = self.dev.snapshot();
        before.assert_unchanged(&after);
        err
    }

    /// The manifest verified (its serial is recorded, as anti-rollback
    /// requires) but the release is refused before a byte is written: slots,
    /// boot selection and state are as before.
    fn refused_before_write(&self, expect: &str) -> String {
        let before = self.dev.snapshot();
        let err = self.dev.fails(&["install", &self.repo.manifest_str()]);
        assert!(err.contains(expect), "expected {expect:?} in:\n{err}");
        let mut after = self.dev.snapshot();
        assert_eq!(
            after.serial,
            self.repo.payload()["serial"],
            "the verified serial was not recorded"
        );
        after.serial = before.serial.clone();
        before.assert_unchanged(&after);
        err
    }

    /// Refused while streaming, after some verified frames were written:
    /// the active slot is untouched, the target is out of the boot order,
    /// the machine is idle.
    fn refused_in_stream(&self, expect: &str) -> String {
        let before = self.dev.snapshot();
        let err = self.dev.fails(&["install", &self.repo.manifest_str()]);
        assert!(err.contains(expect), "expected {expect:?} in:\n{err}");
        let after = self.dev.snapshot();
        assert_eq!(after.slot_a, before.slot_a, "the active slot A changed");
        assert_eq!(
            after.state,
            json!("idle"),
            "machine not idle after the failure"
        );
        let st = self.dev.status();
        let b = &st["slots"][1];
        assert_eq!(
            b["bootable"],
            json!(false),
            "slot B left bootable after a failed write: {st:#}"
        );
        assert_eq!(st["next_boot"], json!("A"));
        assert_eq!(
            b["version"],
            Value::Null,
            "slot B recorded as holding a release"
        );
        let hist = self.dev.ok(&["history"]);
        assert!(hist.contains("failed"), "no failure in history:\n{hist}");
        err
    }
}

// ---- signatures and envelopes --------------------------------------------------

#[test]
fn signed_by_an_unknown_key() {
    let f = fixture("wrong-key");
    f.repo.release(&[&f.other], "1.0", &f.v1, &[]);
    f.refused_untouched(
        "manifest is signed by 0 of the 1 release keys of the configuration, threshold is 1",
    );
}

#[test]
fn below_threshold() {
    let f = fixture_with("threshold", |s, k| {
        s.trust = TrustSpec::Keys(vec![k.release.public.clone(), k.other.public.clone()], 2)
    });
    f.publish_v1();
    f.refused_untouched("signed by 1 of the 2 release keys of the configuration, threshold is 2");
}

#[test]
fn one_key_signing_twice_under_different_key_ids() {
    let f = fixture_with("same-key-twice", |s, k| {
        s.trust = TrustSpec::Keys(vec![k.release.public.clone(), k.other.public.clone()], 2)
    });
    f.repo.release(&[&f.release, &f.other], "1.0", &f.v1, &[]);
    let mut env = f.repo.envelope();
    let sigs = env["signatures"].as_array().unwrap().clone();
    // Keep only the release key's signature, twice, with made-up key ids.
    let mine = sigs
        .iter()
        .find(|s| {
            s["keyid"]
                == json!(
                    updraft::trust::PublicKey::load(&f.release.public)
                        .unwrap()
                        .keyid()
                )
        })
        .unwrap()
        .clone();
    let mut a = mine.clone();
    a["keyid"] = json!("aaaa");
    let mut b = mine;
    b["keyid"] = json!(
        updraft::trust::PublicKey::load(&f.other.public)
            .unwrap()
            .keyid()
    );
    env["signatures"] = json!([a, b]);
    f.repo.write_raw(env.to_string().as_bytes());
    f.refused_untouched("signed by 1 of the 2 release keys");
}

#[test]
fn tampered_payload() {
    let f = fixture("tampered");
    f.publish_v1();
    let mut env = f.repo.envelope();
    let mut p = f.repo.payload();
    p["release"]["version"] = json!("9.9");
    env["payload"] = json!(updraft::envelope::encode_base64(p.to_string().as_bytes()));
    f.repo.write_raw(env.to_string().as_bytes());
    f.refused_untouched("manifest is signed by 0 of the 1 release keys");
}

#[test]
fn wrong_payload_type() {
    let f = fixture("payload-type");
    f.publish_v1();
    let p = f.repo.payload();
    f.repo.write_signed(
        "application/vnd.updraft.keys+json",
        p.to_string().as_bytes(),
        &[&f.release],
    );
    f.refused_untouched("manifest has payloadType \"application/vnd.updraft.keys+json\", expected \"application/vnd.updraft.manifest+json\"");
}

#[test]
fn malformed_base64_payload() {
    let f = fixture("bad-base64");
    f.publish_v1();
    let mut env = f.repo.envelope();
    env["payload"] = json!("this is *not* base64!");
    f.repo.write_raw(env.to_string().as_bytes());
    f.refused_untouched("manifest payload is not valid base64");
}

#[test]
fn malformed_envelope_json() {
    let f = fixture("bad-json");
    f.publish_v1();
    let text = std::fs::read_to_string(f.repo.manifest()).unwrap();
    f.repo.write_raw(&text.as_bytes()[..text.len() / 2]);
    f.refused_untouched("manifest is not a valid DSSE envelope");
}

#[test]
fn malformed_signed_payload_json() {
    let f = fixture("bad-payload-json");
    f.repo.write_signed(
        updraft::manifest::PAYLOAD_TYPE,
        b"{\"spec_version\": 1, \"serial\": ",
        &[&f.release],
    );
    f.refused_untouched("manifest payload is not valid JSON");
}

/// A signature entry that is not 64 bytes counts as no signature; when
/// it was the only one, the refusal says so.
#[test]
fn malformed_signature_bytes() {
    let f = fixture("bad-sig");
    f.publish_v1();
    let mut env = f.repo.envelope();
    env["signatures"][0]["sig"] = json!(updraft::envelope::encode_base64(b"short"));
    f.repo.write_raw(env.to_string().as_bytes());
    f.refused_untouched(
        "manifest is signed by 0 of the 1 release keys of the configuration, threshold is 1 \
         (1 signature(s) are not 64-byte ed25519 signatures in base64 and were not counted: entry 1)",
    );
}

/// tuf-conformance `test_invalid_sig_in_valid_metadata`: a manifest whose
/// threshold is met also carries an entry for another listed key that is
/// 64 wrong bytes, then one that is empty. Both install: anyone on the path
/// can append entries, and refusing for one would let them block every
/// valid release.
#[test]
fn tuf_test_invalid_sig_in_valid_metadata_is_accepted() {
    let f = fixture_with("extra-bad-sig", |s, k| {
        s.trust = TrustSpec::Keys(vec![k.release.public.clone(), k.other.public.clone()], 1)
    });
    let other = updraft::trust::PublicKey::load(&f.other.public)
        .unwrap()
        .keyid();
    f.publish_v1();
    f.repo
        .push_signature(&other, &updraft::envelope::encode_base64(&[0x5a; 64]));
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert_eq!(f.dev.status()["slots"][1]["version"], json!("1.0"));
    f.dev.ok(&["mark-bad"]);
    f.repo.release(&[&f.release], "2.0", &f.v2, &[]);
    f.repo.push_signature(&other, "");
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert_eq!(f.dev.status()["slots"][1]["version"], json!("2.0"));
}

#[test]
fn no_signatures() {
    let f = fixture("no-sig");
    f.publish_v1();
    let mut env = f.repo.envelope();
    env["signatures"] = json!([]);
    f.repo.write_raw(env.to_string().as_bytes());
    f.refused_untouched("manifest carries no signatures");
}

#[test]
fn too_many_signatures() {
    let f = fixture("many-sigs");
    f.publish_v1();
    let mut env = f.repo.envelope();
    let one = env["signatures"][0].clone();
    env["signatures"] = Value::Array(vec![one; 17]);
    f.repo.write_raw(env.to_string().as_bytes());
    f.refused_untouched("manifest carries 17 signatures, at most 16 are accepted");
}

#[test]
fn manifest_over_the_size_cap() {
    let f = fixture("size-cap");
    f.publish_v1();
    let mut env = f.repo.envelope();
    env["padding"] = json!("x".repeat(1024 * 1024));
    f.repo.write_raw(env.to_string().as_bytes());
    f.refused_untouched("larger than the 1048576-byte limit");
}

// ---- policy --------------------------------------------------------------------

/// tuf-conformance `test_custom_fields`, manifest half: fields this
/// release does not know, at the top of the payload and inside its
/// objects, are signed with the rest and ignored; the release installs.
/// (Key documents refuse them: `trust.rs::tests::tuf_test_custom_fields_in_a_key_document_are_refused`.)
#[test]
fn tuf_test_custom_fields_in_a_manifest_are_ignored() {
    let f = fixture("custom-fields");
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        p["vendor"] = json!({"built_by": "ci", "pipeline": 42});
        p["release"]["notes"] = json!("custom");
        p["image"]["x-origin"] = json!("factory");
        p["artifact"]["frames"][0]["x-note"] = json!(true);
    });
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    let st = f.dev.status();
    assert_eq!(st["slots"][1]["version"], json!("1.0"), "{st:#}");
}

/// tuf-conformance `test_timestamp_content_changes` (also the Uptane
/// vector `image_repo_metadata_changed_while_version_same`): content
/// re-signed without a new serial or key-document version. A rewritten
/// `keys/1.json` is never read once version 1 is trusted (only
/// `keys/2.json` is asked for), so it gives another key nothing. A
/// manifest with the accepted serial naming another image is installed,
/// as signed, with a warning that the publisher reused a serial: updraft
/// departs from TUF here, because fleets behind a DDI server publish each
/// release on its own with serial 1 (docs/security.md, "Findings,
/// decided").
#[test]
fn tuf_test_timestamp_content_changes_a_reused_serial_is_warned_of() {
    let f = root_fixture("serial-reused");
    f.repo
        .release(&[&f.release], "1.0", &f.v1, &["--serial", "5"]);
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    f.dev.ok(&["mark-bad"]);
    // The trusted version rewritten to hand the release role to another key.
    let root = f.root.clone();
    f.repo.key_document(&[&root], &[&f.other], 1, &[]);
    f.repo
        .release(&[&f.other], "2.0", &f.v2, &["--serial", "6"]);
    f.refused_untouched(
        "manifest is signed by 0 of the 1 release keys of key document v1, threshold is 1",
    );
    // The publisher refuses to reuse a serial; the pair is made by hand.
    f.repo
        .release(&[&f.release], "2.0", &f.v2, &["--serial", "6"]);
    f.repo.resign(&[&f.release], |p| p["serial"] = json!(5));
    let out = f.dev.updraft(&["install", &f.repo.manifest_str()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("manifest serial 5 (release 2.0) names image ")
            && said.contains("but serial 5 was accepted naming image ")
            && said.contains("the publisher reused a serial"),
        "{said}"
    );
    assert_eq!(f.dev.status()["slots"][1]["version"], json!("2.0"));
}

#[test]
fn expired_manifest() {
    let f = fixture("expired");
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        p["issued"] = json!("2020-01-01T00:00:00Z");
        p["expires"] = json!("2020-02-01T00:00:00Z");
    });
    f.refused_untouched("expired at 2020-02-01T00:00:00Z");
}

#[test]
fn lower_serial_is_a_rollback_attack() {
    let f = fixture("lower-serial");
    f.repo
        .release(&[&f.release], "2.0", &f.v2, &["--serial", "5"]);
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    let old = Repo::new(f.dev.path("old-repo"));
    old.release(&[&f.release], "1.0", &f.v1, &["--serial", "4"]);
    let before = f.dev.snapshot();
    let err = f.dev.fails(&["install", &old.manifest_str()]);
    assert!(
        err.contains("manifest serial 4 is older than stored serial 5: refusing a rollback"),
        "{err}"
    );
    before.assert_unchanged(&f.dev.snapshot());
}

#[test]
fn equal_serial_is_no_change() {
    let f = fixture("equal-serial");
    f.publish_v1();
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    let before = f.dev.snapshot();
    let out = f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert!(out.starts_with("no change:"), "{out}");
    before.assert_unchanged(&f.dev.snapshot());
}

#[test]
fn incompatible_hardware() {
    let f = fixture("incompatible");
    f.repo
        .release(&[&f.release], "1.0", &f.v1, &["--compatible", "otherboard"]);
    f.refused_untouched("release 1.0 is for [\"otherboard\"], not for this device (\"testboard\")");
}

#[test]
fn unsupported_spec_version() {
    let f = fixture("spec-version");
    f.publish_v1();
    f.repo
        .resign(&[&f.release], |p| p["spec_version"] = json!(4));
    f.refused_untouched("manifest spec_version 4 is not supported");
}

#[test]
fn signed_in_the_future_means_the_clock_is_wrong() {
    let f = fixture("future-issued");
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        p["issued"] = json!("2099-01-01T00:00:00Z");
        p["expires"] = json!("2099-02-01T00:00:00Z");
    });
    f.refused_untouched("was signed at 2099-01-01T00:00:00Z, after the system clock");
}

// ---- structure of the signed payload ---------------------------------------------

#[test]
fn frames_that_do_not_tile_the_artifact() {
    let f = fixture("frame-gap");
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        let off = p["artifact"]["frames"][1]["offset"].as_u64().unwrap();
        p["artifact"]["frames"][1]["offset"] = json!(off + 1);
    });
    f.refused_untouched("frame 1 starts at");
}

#[test]
fn frame_table_that_does_not_add_up_to_the_image() {
    let f = fixture("frame-sum");
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        let size = p["image"]["size"].as_u64().unwrap();
        p["image"]["size"] = json!(size + 1);
    });
    f.refused_untouched("frames decode to");
}

#[test]
fn artifact_url_escaping_the_release_directory() {
    let f = fixture("url-escape");
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        p["artifact"]["url"] = json!("../../../etc/shadow")
    });
    f.refused_untouched("must be a plain relative path below the manifest");
}

#[test]
fn empty_compatible_list() {
    let f = fixture("no-compatible");
    f.publish_v1();
    f.repo
        .resign(&[&f.release], |p| p["release"]["compatible"] = json!([]));
    f.refused_untouched("release.compatible is empty");
}

// ---- artifacts -----------------------------------------------------------------

#[test]
fn artifact_longer_than_signed() {
    let f = fixture("artifact-long");
    f.publish_v1();
    let a = f.repo.artifact();
    let mut bytes = std::fs::read(&a).unwrap();
    bytes.extend_from_slice(b"trailing bytes");
    std::fs::write(&a, bytes).unwrap();
    f.refused_before_write("(longer than signed)");
}

#[test]
fn artifact_shorter_than_signed() {
    let f = fixture("artifact-short");
    f.publish_v1();
    let a = f.repo.artifact();
    let bytes = std::fs::read(&a).unwrap();
    std::fs::write(&a, &bytes[..bytes.len() - 100]).unwrap();
    f.refused_before_write("(shorter than signed)");
}

#[test]
fn image_larger_than_the_slot() {
    let f = fixture("too-big");
    let big = f.dev.path("big.img");
    image(&big, 17 * 1024 * 1024, 3);
    f.repo.release(&[&f.release], "1.0", &big, &[]);
    f.refused_before_write("holds only 16777216");
}

#[test]
fn target_slot_is_the_booted_slot() {
    let f = fixture_with("same-slot", |s, _| s.same_slot_twice = true);
    f.publish_v1();
    f.refused_before_write("is the same device as the booted slot A");
}

#[test]
fn artifact_hash_mismatch() {
    let f = fixture("artifact-sha");
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        p["artifact"]["sha256"] = json!(Sha256::of(b"something else").to_hex())
    });
    f.refused_in_stream("artifact sha256 is");
}

#[test]
fn frame_whose_output_hash_does_not_match() {
    let f = fixture("frame-sha");
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        p["artifact"]["frames"][3]["out_sha256"] = json!(Sha256::of(b"not this").to_hex())
    });
    let err = f.refused_in_stream("artifact frame 3: decodes to sha256");
    // Frames 0..3 verified and were written; frame 3 never was.
    let v1 = std::fs::read(&f.v1).unwrap();
    let b = f.dev.slot_bytes(SlotName::B);
    let mib = 1024 * 1024;
    assert_eq!(
        &b[..3 * mib],
        &v1[..3 * mib],
        "verified frames not written: {err}"
    );
    assert_ne!(
        &b[3 * mib..4 * mib],
        &v1[3 * mib..4 * mib],
        "the unverified frame reached the slot"
    );
}

#[test]
fn image_hash_mismatch_with_a_valid_artifact() {
    let f = fixture("image-sha");
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        p["image"]["sha256"] = json!(Sha256::of(b"other image").to_hex())
    });
    f.refused_in_stream("reads back sha256");
}

#[test]
fn image_hash_mismatch_without_read_back_is_caught_while_streaming() {
    let f = fixture_with("image-sha-stream", |s, _| {
        s.system = "readback = false\n".into()
    });
    f.publish_v1();
    f.repo.resign(&[&f.release], |p| {
        p["image"]["sha256"] = json!(Sha256::of(b"other image").to_hex())
    });
    f.refused_in_stream("(the artifact itself verified)");
}

#[test]
fn corrupt_zstd_frame() {
    let f = fixture("corrupt-frame");
    f.publish_v1();
    let p = f.repo.payload();
    let fr = &p["artifact"]["frames"][2];
    let (off, len) = (fr["offset"].as_u64().unwrap(), fr["size"].as_u64().unwrap());
    let a = f.repo.artifact();
    let mut bytes = std::fs::read(&a).unwrap();
    for i in 0..64 {
        bytes[(off + len / 2) as usize + i] ^= 0x5a;
    }
    std::fs::write(&a, &bytes).unwrap();
    f.refused_in_stream("artifact frame 2:");
}

#[test]
fn frame_whose_window_exceeds_the_limit() {
    use zstd::zstd_safe::CParameter;
    let f = fixture("big-window");
    f.publish_v1();
    // Re-encode frame 0 with a 128 MiB window and no content size, then sign
    // a manifest that describes the result exactly.
    let v1 = std::fs::read(&f.v1).unwrap();
    let mut p = f.repo.payload();
    let frames = p["artifact"]["frames"].as_array().unwrap().clone();
    let out0 = frames[0]["out_size"].as_u64().unwrap() as usize;
    // Streaming, with no size given, so zstd keeps the window it was told.
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    enc.set_parameter(CParameter::WindowLog(27)).unwrap();
    enc.include_contentsize(false).unwrap();
    std::io::Write::write_all(&mut enc, &v1[..out0]).unwrap();
    let frame0 = enc.finish().unwrap();
    let header = updraft::artifact::parse_frame_header(&frame0).unwrap();
    assert_eq!(
        header.window_size,
        1 << 27,
        "test frame does not declare the big window"
    );
    let old = std::fs::read(f.repo.artifact()).unwrap();
    let old0 = frames[0]["size"].as_u64().unwrap() as usize;
    let mut art = frame0.clone();
    art.extend_from_slice(&old[old0..]);
    let delta = frame0.len() as i64 - old0 as i64;
    let mut new_frames = frames.clone();
    new_frames[0]["size"] = json!(frame0.len());
    for fr in new_frames.iter_mut().skip(1) {
        fr["offset"] = json!(fr["offset"].as_i64().unwrap() + delta);
    }
    let sha = Sha256::of(&art);
    let url = format!("artifacts/{sha}.zst");
    std::fs::write(f.repo.dir.join(&url), &art).unwrap();
    p["artifact"]["frames"] = Value::Array(new_frames);
    p["artifact"]["size"] = json!(art.len());
    p["artifact"]["sha256"] = json!(sha.to_hex());
    p["artifact"]["url"] = json!(url);
    f.repo.write_signed(
        updraft::manifest::PAYLOAD_TYPE,
        p.to_string().as_bytes(),
        &[&f.release],
    );
    // Frame 0 is refused before anything is written.
    f.refused_before_write("artifact frame 0: zstd window of 134217728 bytes exceeds the device limit of 8388608 bytes");
}

#[test]
fn another_release_artifact_served_under_this_name() {
    // Mix and match: the bytes of another (validly published) release's
    // artifact are served where this release's artifact should be.
    let f = fixture("mix-match");
    let other = Repo::new(f.dev.path("other-repo"));
    other.release(&[&f.release], "2.0", &f.v2, &[]);
    f.publish_v1();
    let theirs = std::fs::read(other.artifact()).unwrap();
    let ours = f.repo.artifact();
    let len = std::fs::metadata(&ours).unwrap().len() as usize;
    let mut bytes = theirs;
    bytes.resize(len, 0);
    std::fs::write(&ours, bytes).unwrap();
    f.refused_before_write("artifact frame 0:");
}

// ---- trust: key documents ----------------------------------------------------------

fn root_fixture(name: &str) -> Fixture {
    let f = fixture_with(name, |s, k| {
        s.trust = TrustSpec::Root(vec![k.root.public.clone()], 1, 0)
    });
    f.repo.key_document(&[&f.root], &[&f.release], 1, &[]);
    f
}

#[test]
fn root_mode_installs_with_a_valid_key_document() {
    let f = root_fixture("root-ok");
    f.publish_v1();
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert_eq!(f.dev.status()["keys_version"], json!(1));
}

#[test]
fn key_document_signed_by_a_release_key() {
    let f = fixture_with("keydoc-release-signed", |s, k| {
        s.trust = TrustSpec::Root(vec![k.root.public.clone()], 1, 0)
    });
    f.repo.key_document(&[&f.release], &[&f.release], 1, &[]);
    f.publish_v1();
    f.refused_untouched(
        "key document keys/1.json is signed by 0 of the 1 root keys of v0, threshold is 1",
    );
}

#[test]
fn key_document_skipping_a_version() {
    let f = root_fixture("keydoc-skip");
    f.publish_v1();
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    let root = f.root.clone();
    let v3 = f.repo.key_document(&[&root], &[&f.release], 3, &[]);
    std::fs::copy(&v3, f.repo.dir.join("keys/2.json")).unwrap();
    let repo2 = &f.repo;
    repo2.release(&[&f.release], "2.0", &f.v2, &[]);
    f.dev.ok(&["mark-bad"]);
    f.refused_untouched("key document keys/2.json has version 3, which skips versions after the trusted version 1 (expected 2)");
}

#[test]
fn key_document_signed_only_by_its_new_root_keys() {
    let f = root_fixture("keydoc-new-root-only");
    f.publish_v1();
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    f.dev.ok(&["mark-bad"]);
    let new_root = keygen(f.keydir.path(), "newroot");
    let np = new_root.public.display().to_string();
    f.repo
        .key_document(&[&new_root], &[&f.release], 2, &["--root-pub", &np]);
    f.repo.release(&[&f.release], "2.0", &f.v2, &[]);
    f.refused_untouched(
        "key document keys/2.json is signed by 0 of the 1 root keys of v1, threshold is 1",
    );
}

#[test]
fn root_rotation_signed_by_old_and_new_roots_is_accepted() {
    let f = root_fixture("keydoc-rotation");
    f.publish_v1();
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    f.dev.ok(&["mark-bad"]);
    let root = f.root.clone();
    let new_root = keygen(f.keydir.path(), "newroot");
    let np = new_root.public.display().to_string();
    f.repo
        .key_document(&[&root, &new_root], &[&f.release], 2, &["--root-pub", &np]);
    f.repo.release(&[&f.release], "2.0", &f.v2, &[]);
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert_eq!(f.dev.status()["keys_version"], json!(2));
}

#[test]
fn revoked_release_key() {
    let f = root_fixture("revoked");
    f.publish_v1();
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    f.dev.ok(&["mark-bad"]);
    let root = f.root.clone();
    // Key document 2 lists only the other key: the release key is revoked.
    f.repo.key_document(&[&root], &[&f.other], 2, &[]);
    f.repo.release(&[&f.release], "2.0", &f.v2, &[]);
    let before = f.dev.snapshot();
    let err = f.dev.fails(&["install", &f.repo.manifest_str()]);
    assert!(
        err.contains(
            "manifest is signed by 0 of the 1 release keys of key document v2, threshold is 1"
        ),
        "{err}"
    );
    assert!(err.contains("did not verify"), "{err}");
    // The key document itself was valid: the revocation is now in force
    // (trusted version 2). Nothing else moved.
    let mut after = f.dev.snapshot();
    assert_eq!(
        after.keys_version,
        json!(2),
        "the revocation was not persisted"
    );
    after.keys_version = before.keys_version.clone();
    before.assert_unchanged(&after);
}

#[test]
fn key_document_with_an_impossible_threshold() {
    let f = fixture_with("keydoc-threshold", |s, k| {
        s.trust = TrustSpec::Root(vec![k.root.public.clone()], 1, 0)
    });
    let root = f.root.clone();
    // Sign a document whose release threshold cannot be met.
    let body = json!({
        "version": 1,
        "root": {"keys": [{"type": "ed25519", "public": updraft::hash::hex(updraft::trust::PublicKey::load(&root.public).unwrap().as_bytes())}], "threshold": 1},
        "release": {"keys": [{"type": "ed25519", "public": updraft::hash::hex(updraft::trust::PublicKey::load(&f.release.public).unwrap().as_bytes())}], "threshold": 3}
    });
    let env = updraft_publish::sign::sign_envelope(
        updraft::trust::KEYS_PAYLOAD_TYPE,
        body.to_string().as_bytes(),
        &[root.load()],
    )
    .unwrap();
    std::fs::create_dir_all(f.repo.dir.join("keys")).unwrap();
    std::fs::write(f.repo.dir.join("keys/1.json"), env).unwrap();
    f.publish_v1();
    f.refused_untouched("release keys: threshold 3 is impossible with 1 key(s)");
}

/// tuf-conformance `test_unsigned_initial_root`: a device provisioned
/// with the roots of key document 2 (`keys_version = 2`) fetches
/// `keys/2.json` itself, and a copy not signed by those roots is refused
/// with nothing trusted; signed by them, the same document is accepted.
#[test]
fn tuf_test_unsigned_initial_root_is_refused() {
    let f = fixture_with("unsigned-anchor", |s, k| {
        s.trust = TrustSpec::Root(vec![k.root.public.clone()], 1, 2)
    });
    let rp = f.root.public.display().to_string();
    let other = f.other.clone();
    f.repo
        .key_document(&[&other], &[&f.release], 2, &["--root-pub", &rp]);
    f.publish_v1();
    assert_eq!(f.repo.payload()["keys_version"], json!(2));
    f.refused_untouched(
        "key document keys/2.json is signed by 0 of the 1 provisioned root keys (v2), threshold is 1",
    );
    let root = f.root.clone();
    f.repo.key_document(&[&root], &[&f.release], 2, &[]);
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    let st = f.dev.status();
    assert_eq!(st["keys_version"], json!(2), "{st:#}");
    assert_eq!(st["slots"][1]["version"], json!("1.0"), "{st:#}");
}

/// tuf-conformance `test_invalid_initial_root`: a trust anchor that is not
/// an ed25519 key, or a threshold of 0 (root or simple mode), makes the
/// device refuse to work with the configuration error, before any request
/// (the server's access log stays empty). The simple-mode row also serves
/// the configuration half of the Uptane `*_targets_zero_threshold` vectors.
#[test]
fn tuf_test_invalid_initial_root_refuses_to_work() {
    updraft_tests::require!("nginx");
    let keys = TempDir::new("bad-anchor-keys");
    let release = keygen(keys.path(), "release");
    let root = keygen(keys.path(), "root");
    let server = UpdateServer::start(&keys.join("site"), false);
    server.repo.key_document(&[&root], &[&release], 1, &[]);
    let img = keys.join("1.0.img");
    image(&img, 64 * 1024, 5);
    server.repo.release(&[&release], "1.0", &img, &[]);
    let not_a_key = keys.join("not-ed25519.pub");
    std::fs::write(
        &not_a_key,
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            updraft::envelope::encode_base64(&[0u8; 44])
        ),
    )
    .unwrap();
    let cases = [
        (
            "not-a-key",
            TrustSpec::Root(vec![not_a_key.clone()], 1, 0),
            "not an ed25519 SubjectPublicKeyInfo",
        ),
        (
            "root-zero",
            TrustSpec::Root(vec![root.public.clone()], 0, 0),
            "trust.root_keys with trust.threshold: threshold 0 is impossible with 1 key(s)",
        ),
        (
            "simple-zero",
            TrustSpec::Keys(vec![release.public.clone()], 0),
            "trust.keys with trust.threshold: threshold 0 is impossible with 1 key(s)",
        ),
    ];
    for (name, trust, expect) in cases {
        let mut spec = DeviceSpec::simple(&release);
        spec.trust = trust;
        spec.server = server.server_toml("1h", "1s");
        let dev = Device::new(&format!("bad-anchor-{name}"), spec);
        let out = dev.updraft(&["install", &server.manifest_url()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: installed:\n{err}");
        assert!(
            err.contains(expect),
            "{name}: expected {expect:?} in:\n{err}"
        );
        assert!(
            !dev.slot_bytes(SlotName::B)
                .starts_with(&std::fs::read(&img).unwrap())
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let requests = server.nginx.access_log().unwrap_or_default();
    assert!(
        requests.is_empty(),
        "requests were made: {:?}",
        requests.iter().map(|e| &e.request).collect::<Vec<_>>()
    );
}

#[test]
fn missing_key_document() {
    let f = fixture_with("keydoc-missing", |s, k| {
        s.trust = TrustSpec::Root(vec![k.root.public.clone()], 1, 0)
    });
    f.publish_v1();
    f.refused_untouched("keys/1.json");
}

// ---- clock ------------------------------------------------------------------------

#[test]
fn clock_before_build_time() {
    if updraft_tests::bin::emulated() {
        updraft_tests::skip_expected!(
            "libfaketime cannot be preloaded into a binary running under qemu-user"
        );
    }
    updraft_tests::require!("lib:faketime/libfaketime.so.1");
    let f = fixture("clock-build");
    f.publish_v1();
    if updraft_tests::bin::emulated() {
        updraft_tests::skip!("libfaketime cannot be preloaded into an emulated binary");
    }
    let Some(lib) = updraft_tests::faketime::library() else {
        panic!("libfaketime is missing: install the Debian package libfaketime");
    };
    let before = f.dev.snapshot();
    let out = f
        .dev
        .cmd(&["install", &f.repo.manifest_str()])
        .env("LD_PRELOAD", &lib)
        .env("FAKETIME", "@2001-01-01 00:00:00")
        .env("DONT_FAKE_MONOTONIC", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("system clock reads 2001-01-01T00:00:00Z, before this updraft's build time"),
        "{err}"
    );
    assert!(err.contains("waiting for time synchronisation"), "{err}");
    before.assert_unchanged(&f.dev.snapshot());
}

#[test]
fn clock_before_the_newest_verified_time() {
    // A manifest signed slightly ahead of this device's clock (within the
    // accepted skew) raises the clock floor; until the clock passes it, the
    // device refuses to trust its clock.
    let f = fixture("clock-floor");
    f.publish_v1();
    let ahead = updraft::timestamp::Timestamp(updraft::timestamp::Timestamp::now().0 + 240);
    let expires = updraft::timestamp::Timestamp(ahead.0 + 86_400);
    f.repo.resign(&[&f.release], |p| {
        p["issued"] = json!(ahead.to_rfc3339());
        p["expires"] = json!(expires.to_rfc3339());
    });
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    let before = f.dev.snapshot();
    let err = f.dev.fails(&["install", &f.repo.manifest_str()]);
    assert!(
        err.contains(&format!(
            "before {}, the newest time already verified: waiting for time synchronisation",
            ahead
        )),
        "{err}"
    );
    before.assert_unchanged(&f.dev.snapshot());
}
