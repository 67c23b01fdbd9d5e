//! Build provenance attestations on a device configured with builder keys
//! (`[provenance]`): a release whose attestation is signed by a configured
//! builder and names its image and artifacts installs, from a directory
//! and from a bundle; one without an attestation, with one signed by
//! another key, or with one naming other hashes is refused before a byte
//! is written, with the reason, in the history and as a `check_failed`
//! report. A device without builders neither fetches nor needs one.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::proxied::history;
use updraft_tests::publisher::{KeyPair, Repo, image, keygen, publish_ok};
use updraft_tests::tmp::TempDir;

const IMAGE: usize = 1024 * 1024 + 4321;
const BUILDER_ID: &str = "https://ci.example.com/builders/image@v1";
/// Reports are queued for a server nobody listens on: the outbox shows
/// them, nothing is delivered.
const REPORTS: &str = "report_url = \"https://127.0.0.1:9/report\"\n";

struct Fixture {
    dev: Device,
    repo: Repo,
    release: KeyPair,
    builder: KeyPair,
    stranger: KeyPair,
    v1: PathBuf,
    v2: PathBuf,
    _keys: TempDir,
}

fn fixture(name: &str, require: bool) -> Fixture {
    let keys = TempDir::new(&format!("{name}-keys"));
    let release = keygen(keys.path(), "release");
    let builder = keygen(keys.path(), "builder");
    let stranger = keygen(keys.path(), "stranger");
    let mut spec = DeviceSpec::simple(&release);
    spec.server = REPORTS.into();
    if require {
        spec.require_provenance(&[&builder], 1);
    }
    let dev = Device::new(name, spec);
    dev.init();
    let repo = Repo::new(dev.path("repo"));
    let (v1, v2) = (dev.path("v1.img"), dev.path("v2.img"));
    image(&v1, IMAGE, 31);
    image(&v2, IMAGE, 32);
    Fixture {
        dev,
        repo,
        release,
        builder,
        stranger,
        v1,
        v2,
        _keys: keys,
    }
}

impl Fixture {
    fn publish(&self, version: &str, img: &Path, builder: Option<&KeyPair>) {
        let mut extra = vec![];
        if let Some(b) = builder {
            extra = vec![
                "--attest-with",
                b.key.to_str().expect("utf-8 path"),
                "--builder-id",
                BUILDER_ID,
            ];
        }
        self.repo.release(&[&self.release], version, img, &extra);
    }

    /// The install is refused with `expect`: slots, boot selection and
    /// state as before, the reason in a `check-failed` history entry, and
    /// a report queued for the server.
    fn refused(&self, expect: &str) -> String {
        let before = self.dev.snapshot();
        let outbox = self.dev.status()["outbox"].as_u64().unwrap_or(0);
        let err = self.dev.fails(&["install", &self.repo.manifest_str()]);
        assert!(err.contains(expect), "expected {expect:?} in:\n{err}");
        let mut after = self.dev.snapshot();
        after.serial = before.serial.clone();
        before.assert_unchanged(&after);
        let failed: Vec<Value> = history(&self.dev)
            .into_iter()
            .filter(|e| e["event"] == json!("check-failed"))
            .collect();
        let detail = failed
            .last()
            .map(|e| e["detail"].to_string())
            .unwrap_or_default();
        assert!(detail.contains(expect), "history: {failed:#?}");
        let st = self.dev.status();
        assert_eq!(
            st["outbox"].as_u64(),
            Some(outbox + 1),
            "no report queued: {st:#}"
        );
        err
    }
}

#[test]
fn a_release_attested_by_a_configured_builder_installs() {
    let f = fixture("prov-ok", true);
    f.publish("1.0", &f.v1, Some(&f.builder));
    let payload = f.repo.payload();
    let url = payload["attestation"]["url"]
        .as_str()
        .expect("the manifest names it");
    assert!(
        url.starts_with("artifacts/") && url.ends_with(".intoto.json"),
        "{url}"
    );
    // The publisher checks it as the device will.
    let verified = publish_ok(&[
        "verify",
        "--pub",
        f.release.public.to_str().expect("utf-8 path"),
        "--builder-pub",
        f.builder.public.to_str().expect("utf-8 path"),
        &f.repo.manifest_str(),
    ]);
    assert!(
        verified.contains(&format!("attestation ok: builder {BUILDER_ID}")),
        "{verified}"
    );
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert_eq!(f.dev.status()["slots"][1]["version"], json!("1.0"));
}

#[test]
fn an_attestation_travels_in_a_bundle() {
    let f = fixture("prov-bundle", true);
    f.publish("1.0", &f.v1, Some(&f.builder));
    let bundle = f.dev.path("release.updraft");
    f.repo.bundle(&bundle, &[]);
    // Only the bundle: the directory's copy cannot be what is read.
    std::fs::remove_dir_all(&f.repo.dir).expect("removing the directory");
    f.dev.ok(&["install", bundle.to_str().expect("utf-8 path")]);
    assert_eq!(f.dev.status()["slots"][1]["version"], json!("1.0"));
}

#[test]
fn a_release_without_an_attestation_is_refused_and_reported() {
    let f = fixture("prov-missing", true);
    f.publish("1.0", &f.v1, None);
    f.refused("release 1.0 (manifest serial 1): attestation missing");
}

#[test]
fn an_attestation_by_an_unknown_builder_is_refused_and_reported() {
    let f = fixture("prov-stranger", true);
    f.publish("1.0", &f.v1, Some(&f.stranger));
    let err =
        f.refused("attestation is signed by 0 of the 1 configured builder keys, threshold is 1");
    assert!(
        err.contains("did not verify with any of them: keyid "),
        "{err}"
    );
}

#[test]
fn an_attestation_naming_other_artifacts_is_refused_and_reported() {
    let f = fixture("prov-other", true);
    f.publish("1.0", &f.v1, Some(&f.builder));
    let old = f.repo.payload()["attestation"].clone();
    f.publish("2.0", &f.v2, Some(&f.builder));
    // Release 2.0 re-signed naming release 1.0's (genuine) attestation.
    f.repo.resign(&[&f.release], |p| p["attestation"] = old);
    let image = f.repo.payload()["image"]["sha256"]
        .as_str()
        .expect("image sha256")
        .to_string();
    f.refused(&format!(
        "release 2.0 (manifest serial 2): attestation does not name image sha256 {}",
        &image[..12]
    ));
}

#[test]
fn a_device_without_builders_neither_fetches_nor_needs_an_attestation() {
    let f = fixture("prov-none", false);
    f.publish("1.0", &f.v1, Some(&f.builder));
    let url = f.repo.payload()["attestation"]["url"]
        .as_str()
        .expect("the manifest names it")
        .to_string();
    std::fs::remove_file(f.repo.dir.join(url)).expect("removing the attestation");
    f.dev.ok(&["install", &f.repo.manifest_str()]);
    assert_eq!(f.dev.status()["slots"][1]["version"], json!("1.0"));
}
