//! A release bundle on a web server: `updraft install
//! https://…/release.updraft` reads it by bounded Range requests from a real
//! nginx (the header walk in a request or two, each artifact part in one),
//! `bundle+https://…` names a bundle whose URL does not end in `.updraft`,
//! a server that ignores Range is refused, a release whose files sit at
//! arbitrary URLs (`links:`) installs, and a daemon polling a bundle whose
//! download is cut resumes by Range at the last verified frame, across the
//! parts of a split image.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use updraft::bundle::{Artifact, Index};
use updraft::slot::SlotName;
use updraft_tests::bundle::{entries, hostile_parts, layout};
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::nginx::{AccessEntry, Nginx};
use updraft_tests::proxied::ProxiedServer;
use updraft_tests::proxy::Behaviour;
use updraft_tests::publisher::{Repo, image, image_bytes, keygen};
use updraft_tests::tmp::TempDir;

const IMAGE: usize = 3 * 1024 * 1024 + 4321;
const WAIT: Duration = Duration::from_secs(120);

/// A device, its key, and release 1.0 (with a small delta from an older
/// image, so the bundle holds more than the image) published into
/// `dev/repo` and bundled with its image in parts.
struct Fixture {
    dev: Device,
    repo: Repo,
    image: Vec<u8>,
    _keys: TempDir,
}

fn fixture(name: &str, server: &str) -> Fixture {
    let keys = TempDir::new(&format!("{name}-keys"));
    let release = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&release);
    spec.server = server.to_string();
    let dev = Device::new(name, spec);
    dev.init();
    let repo = Repo::new(dev.path("repo"));
    let old = dev.path("v0.img");
    image(&old, IMAGE, 41);
    let img = dev.path("v1.img");
    let mut image = image_bytes(IMAGE, 41);
    image[1000..1100].fill(0x5a);
    std::fs::write(&img, &image).unwrap();
    repo.release(&[&release], "1.0", &img, &["--from", old.to_str().unwrap()]);
    assert_eq!(repo.payload()["deltas"].as_array().unwrap().len(), 1);
    Fixture {
        dev,
        repo,
        image,
        _keys: keys,
    }
}

/// `--part-size` just above `frames` times the largest frame of the
/// release in `repo`.
fn part_size(repo: &Repo, frames: u64) -> String {
    let largest = repo.payload()["artifact"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["size"].as_u64().unwrap())
        .max()
        .unwrap();
    (frames * largest + 1).to_string()
}

/// The split image artifact of the bundle at `path`.
fn image_parts(repo: &Repo, path: &Path) -> (Index, Artifact) {
    let index = layout(path);
    let url = repo.payload()["artifact"]["url"]
        .as_str()
        .unwrap()
        .to_string();
    let a = index.artifact(&url).unwrap();
    (index, a)
}

/// `bytes=A-B` of a request, when it has one.
fn range(e: &AccessEntry) -> Option<(u64, u64)> {
    let (a, b) = e
        .range
        .as_deref()?
        .strip_prefix("bytes=")?
        .split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The requests nginx logged for `uri` (path, without a query).
fn requests_for(nginx: &Nginx, uri: &str) -> Vec<AccessEntry> {
    nginx
        .access_log()
        .unwrap()
        .into_iter()
        .filter(|e| e.uri.split('?').next() == Some(uri))
        .collect()
}

/// A request whose range starts inside a part of the artifact: a body.
fn in_part(a: &Artifact, start: u64) -> bool {
    a.segments
        .iter()
        .any(|e| start >= e.offset && start < e.offset + e.size)
}

#[test]
fn a_split_bundle_installs_over_https_by_range_requests() {
    updraft_tests::require!("nginx");
    let site = TempDir::new("bundle-https-site");
    let nginx = Nginx::builder(site.path()).start().unwrap();
    let server = format!("ca_file = {:?}\n", nginx.ca_file());
    let f = fixture("bundle-https", &server);
    std::fs::create_dir_all(site.join("releases")).unwrap();
    let bundle = site.join("releases/release-1.0.updraft");
    f.repo
        .bundle(&bundle, &["--part-size", &part_size(&f.repo, 1)]);
    let (index, parts) = image_parts(&f.repo, &bundle);
    let n = parts.segments.len() as u64;
    assert!(n >= 3, "{parts:?}");

    let url = nginx.url("/releases/release-1.0.updraft?token=abc");
    let out = f.dev.ok(&["install", &url]);
    assert!(out.contains("1.0"), "{out}");
    let b = f.dev.slot_bytes(SlotName::B);
    assert_eq!(&b[..IMAGE], &f.image[..], "slot B holds the image");

    let log = requests_for(&nginx, "/releases/release-1.0.updraft");
    let total = std::fs::metadata(&bundle).unwrap().len();
    for e in &log {
        let (a, b) = range(e).unwrap_or_else(|| panic!("a request without a Range: {e:?}"));
        assert!(a <= b && b < total, "{e:?}");
        assert_eq!(e.status, 206, "{e:?}");
        assert_eq!(e.body_bytes_sent, b - a + 1, "{e:?}");
    }
    let walks = log.iter().filter(|e| range(e).unwrap().0 == 0).count() as u64;
    let bodies: Vec<(u64, u64)> = log
        .iter()
        .filter_map(range)
        .filter(|&(a, _)| a != 0 && in_part(&parts, a))
        .collect();
    let hops = log.len() as u64 - walks - bodies.len() as u64;
    // One bounded request per part, for exactly that part.
    let expected: Vec<(u64, u64)> = parts
        .segments
        .iter()
        .map(|e| (e.offset, e.offset + e.size - 1))
        .collect();
    assert_eq!(bodies, expected);
    // Each walk: one request for the headers, manifest and delta, and at
    // most one more per header that lies past a part.
    assert!(walks >= 1);
    assert!(
        hops <= walks * n,
        "{hops} requests beyond the first of {walks} walks over {} headers",
        index.entries().len() + 1
    );
    eprintln!(
        "bundle of {total} bytes, {} entries, image in {n} parts: {} requests: {walks} walks \
         costing {} requests each on average for {} headers, and {n} part bodies",
        index.entries().len(),
        log.len(),
        (walks + hops) as f64 / walks as f64,
        index.entries().len() + 1
    );
}

#[test]
fn a_bundle_with_hostile_parts_is_refused_over_https_too() {
    updraft_tests::require!("nginx");
    let site = TempDir::new("bundle-https-hostile-site");
    let nginx = Nginx::builder(site.path()).start().unwrap();
    let server = format!("ca_file = {:?}\n", nginx.ca_file());
    let f = fixture("bundle-https-hostile", &server);
    let path = site.join("r.updraft");
    f.repo
        .bundle(&path, &["--part-size", &part_size(&f.repo, 1)]);
    let (_, parts) = image_parts(&f.repo, &path);
    let names: Vec<String> = parts.segments.iter().map(|e| e.name.clone()).collect();
    let last = &parts.segments[names.len() - 1];
    let cut = (last.offset + last.size / 2) as usize;
    for h in hostile_parts(&entries(&path), &names, cut) {
        std::fs::write(&path, &h.bytes).unwrap();
        let before = f.dev.snapshot();
        let err = f.dev.fails(&["install", &nginx.url("/r.updraft")]);
        h.assert_refused(&err, &before, &f.dev.snapshot());
    }
}

#[test]
fn a_bundle_url_not_ending_in_updraft_is_named_with_bundle_plus() {
    updraft_tests::require!("nginx");
    let site = TempDir::new("bundle-plus-site");
    let nginx = Nginx::builder(site.path()).start().unwrap();
    let server = format!("ca_file = {:?}\n", nginx.ca_file());
    let f = fixture("bundle-plus", &server);
    std::fs::create_dir_all(site.join("download")).unwrap();
    f.repo.bundle(&site.join("download/7"), &[]);

    // Without the prefix the URL names a manifest, and a bundle is not one.
    let plain = nginx.url("/download/7");
    f.dev.fails(&["install", &plain]);
    f.dev.ok(&["install", &format!("bundle+{plain}")]);
    assert_eq!(&f.dev.slot_bytes(SlotName::B)[..IMAGE], &f.image[..]);
    let log: Vec<AccessEntry> = requests_for(&nginx, "/download/7")
        .into_iter()
        .skip(1)
        .collect();
    assert!(log.iter().all(|e| e.status == 206), "{log:#?}");
    // The image in one part: each walk costs two requests (the first
    // window, and the trailer past the image), the image one more.
    let walks = log.iter().filter(|e| range(e).unwrap().0 == 0).count();
    assert!(walks >= 1);
    assert_eq!(log.len(), 2 * walks + 1, "{log:#?}");
}

#[test]
fn a_daemon_polling_a_bundle_is_answered_304_until_it_changes() {
    updraft_tests::require!("nginx");
    let net = ProxiedServer::start("bundle-poll", false);
    net.publish("1.0", 7, 1024 * 1024, &["--rollout", "0"]);
    let repo = &net.server.repo;
    repo.bundle(&repo.dir.join("release.updraft"), &[]);
    let url = format!("https://{}/release.updraft", net.proxy.addr());
    let mut dev = Device::new("bundle-poll", net.device_spec_at(&url, "1s", ""));
    dev.init();
    dev.start_daemon();
    let not_modified = |log: &[AccessEntry]| {
        log.iter()
            .filter(|e| e.uri == "/release.updraft" && e.status == 304)
            .count()
    };
    let log = net
        .server
        .nginx
        .wait_access_log(WAIT, |l| not_modified(l) >= 2)
        .unwrap();
    assert!(
        not_modified(&log) >= 2,
        "no poll was answered 304: {log:#?}"
    );
    for e in log.iter().filter(|e| e.status == 304) {
        assert!(e.if_none_match.is_some(), "{e:?}");
        assert_eq!(range(e).map(|r| r.0), Some(0), "{e:?}");
    }
    // A new release in the bundle: a new ETag, and the daemon installs it.
    let image = net.publish("2.0", 8, 1024 * 1024, &[]);
    let tmp = repo.dir.join("next.updraft");
    repo.bundle(&tmp, &[]);
    std::fs::rename(&tmp, repo.dir.join("release.updraft")).unwrap();
    dev.wait_reboot_requested(WAIT);
    dev.stop_daemon();
    assert!(dev.slot_bytes(SlotName::B)[..image.len()] == image[..]);
}

#[test]
fn a_server_that_ignores_range_is_refused() {
    updraft_tests::require!("nginx");
    let site = TempDir::new("bundle-norange-site");
    std::fs::create_dir_all(site.join("whole")).unwrap();
    let nginx = Nginx::builder(site.path())
        .without_ranges("/whole/")
        .start()
        .unwrap();
    let server = format!("ca_file = {:?}\n", nginx.ca_file());
    let f = fixture("bundle-norange", &server);
    f.repo.bundle(&site.join("whole/release.updraft"), &[]);
    let before = f.dev.snapshot();
    let err = f
        .dev
        .fails(&["install", &nginx.url("/whole/release.updraft")]);
    assert!(
        err.contains("ignored the Range request"),
        "the error says why:\n{err}"
    );
    before.assert_unchanged(&f.dev.snapshot());
    let log = requests_for(&nginx, "/whole/release.updraft");
    assert_eq!(log.len(), 1, "asked once, then gave up: {log:#?}");
    assert_eq!(log[0].status, 200);
}

/// `links:` and the JSON naming where each file is.
fn links(manifest: &str, files: &[(&str, String)]) -> String {
    let files: serde_json::Map<String, Value> = files
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    format!("links:{}", json!({ "manifest": manifest, "files": files }))
}

#[test]
fn a_release_whose_files_are_at_arbitrary_urls_installs() {
    updraft_tests::require!("nginx");
    let site = TempDir::new("links-site");
    let nginx = Nginx::builder(site.path()).start().unwrap();
    let server = format!("ca_file = {:?}\n", nginx.ca_file());
    let f = fixture("links", &server);
    // The files as a fleet server stores them: under names of its own.
    let blobs = site.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::copy(f.repo.manifest(), blobs.join("object-1")).unwrap();
    std::fs::copy(f.repo.artifact(), blobs.join("object-2")).unwrap();
    let artifact = f.repo.payload()["artifact"]["url"]
        .as_str()
        .unwrap()
        .to_string();
    let manifest_url = nginx.url("/blobs/object-1?name=manifest.json");
    let artifact_url = nginx.url("/blobs/object-2?name=image&x=%221%22");

    let missing = links(&manifest_url, &[]);
    let before = f.dev.snapshot();
    let err = f.dev.fails(&["install", &missing]);
    assert!(
        err.contains(&format!("{artifact:?}")),
        "the error names the missing link:\n{err}"
    );
    let after = f.dev.snapshot();
    assert_eq!(before.slot_a, after.slot_a, "slot A changed");
    assert_eq!(before.slot_b, after.slot_b, "slot B changed");
    assert_eq!(after.state, json!("idle"));

    let given = links(&manifest_url, &[(artifact.as_str(), artifact_url)]);
    f.dev.ok(&["install", &given]);
    assert_eq!(&f.dev.slot_bytes(SlotName::B)[..IMAGE], &f.image[..]);
    let log = nginx.access_log().unwrap();
    assert!(
        log.iter()
            .any(|e| e.uri.starts_with("/blobs/object-2") && e.status == 200),
        "{log:#?}"
    );

    let bad = "links:{\"manifest\": 1}";
    let out = f.dev.updraft(&["install", bad]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a list of links"));
}

/// The frame the daemon's log says it resumed at, if it did.
fn resumed_at(log: &str) -> Option<usize> {
    let at = log.find("resuming at frame ")? + "resuming at frame ".len();
    log[at..].split(' ').next()?.parse().ok()
}

#[test]
fn a_daemon_resumes_a_cut_bundle_download_by_range_at_the_last_verified_frame() {
    updraft_tests::require!("nginx");
    let net = ProxiedServer::start("bundle-cut", false);
    let image = net.publish("1.0", 31, 8 * 1024 * 1024, &[]);
    let repo = &net.server.repo;
    let bundle: PathBuf = repo.dir.join("release.updraft");
    // Two frames to a part: a resume may start inside a part.
    repo.bundle(&bundle, &["--part-size", &part_size(repo, 2)]);
    let (_, parts) = image_parts(repo, &bundle);
    assert!(parts.segments.len() >= 3, "{parts:?}");
    assert!(parts.segments.len() < 8, "{parts:?}");
    let frames: Vec<u64> = repo.payload()["artifact"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["offset"].as_u64().unwrap())
        .collect();

    // The first connection (the poll's walk, then the transfer's walk and
    // body, on the same kept-alive connection) is reset a little past the
    // middle of the artifact.
    net.proxy
        .script([Behaviour::ResetAfter(2 * 256 * 1024 + parts.size / 2)]);
    let url = format!("https://{}/release.updraft", net.proxy.addr());
    let mut dev = Device::new("bundle-cut", net.device_spec_at(&url, "1h", ""));
    dev.init();
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    dev.stop_daemon();

    let b = dev.slot_bytes(SlotName::B);
    assert!(b[..image.len()] == image[..], "slot B holds the image");
    let log = dev.log();
    let k = resumed_at(&log)
        .unwrap_or_else(|| panic!("the daemon did not resume after the cut:\n{log}"));
    assert!(k >= 1 && k < frames.len(), "resumed at frame {k}");
    // Where frame k lies in the bundle: the resumed request starts there,
    // past the start of the artifact, and the parts after it follow.
    let at = parts.ranges(frames[k])[0].0;
    let bodies: Vec<(u64, u64)> = requests_for(&net.server.nginx, "/release.updraft")
        .iter()
        .filter_map(range)
        .filter(|&(a, _)| in_part(&parts, a))
        .collect();
    let resumed = bodies
        .iter()
        .rposition(|&(a, _)| a == at)
        .unwrap_or_else(|| panic!("no request from byte {at} (frame {k}): {bodies:?}"));
    assert!(at > parts.segments[0].offset);
    let part = parts
        .segments
        .iter()
        .find(|e| at >= e.offset && at < e.offset + e.size)
        .unwrap();
    assert_eq!(
        bodies[resumed].1,
        part.offset + part.size - 1,
        "the resumed range ends with its part"
    );
    let after: Vec<u64> = bodies[resumed + 1..].iter().map(|r| r.0).collect();
    let later_parts: Vec<u64> = parts
        .segments
        .iter()
        .map(|e| e.offset)
        .filter(|&o| o > at)
        .collect();
    assert_eq!(
        after, later_parts,
        "the parts after the resumed one, in order"
    );
    assert!(
        !later_parts.is_empty(),
        "the resumed stream crossed a part boundary"
    );
    eprintln!(
        "cut: resumed at frame {k} of {} (bundle byte {at}, {} bytes into its part), then {} \
         more part(s)",
        frames.len(),
        at - part.offset,
        later_parts.len()
    );
}
