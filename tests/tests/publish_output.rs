//! What `updraft-publish release` writes depends on the release, never on
//! the build host: frames are compressed independently and in parallel, and
//! the artifact and its signed frame table are the same bytes whatever the
//! number of threads. What it signs from the release before it (the next
//! serial, the security version) is kept, never lowered by omission.

use serde_json::Value;
use updraft_tests::publisher::{Repo, image, keygen};
use updraft_tests::tmp::TempDir;

/// The payload without the two fields that name the signing time.
fn timeless(mut payload: Value) -> Value {
    let o = payload.as_object_mut().expect("payload object");
    o.remove("issued");
    o.remove("expires");
    payload
}

#[test]
fn the_artifact_is_the_same_bytes_whatever_the_thread_count() {
    let dir = TempDir::new("publish-threads");
    let key = keygen(dir.path(), "release");
    let img = dir.join("1.0.img");
    // 9 frames of 1 MiB and a short last one: batches of 1, 2 and 4
    // frames end at different places.
    image(&img, 9 * 1024 * 1024 + 12_345, 7);
    let mut seen: Option<(Value, Vec<u8>)> = None;
    for threads in ["1", "2", "4"] {
        let repo = Repo::new(dir.join(format!("site-{threads}")));
        repo.release(&[&key], "1.0", &img, &["--threads", threads]);
        let payload = timeless(repo.payload());
        let artifact = std::fs::read(repo.artifact()).expect("reading the artifact");
        assert_eq!(
            payload["artifact"]["frames"].as_array().map(Vec::len),
            Some(10)
        );
        match &seen {
            None => seen = Some((payload, artifact)),
            Some((p, a)) => {
                assert_eq!(&payload, p, "--threads {threads}: the payload differs");
                assert!(
                    &artifact == a,
                    "--threads {threads}: the artifact bytes differ"
                );
            }
        }
    }
}

/// A delta made within a small `--delta-memory` (so each window is matched
/// against chosen regions of the old image) is the same bytes for 1 and 2
/// threads, and the device's patcher rebuilds the new image from it.
#[test]
fn a_delta_made_in_bounded_memory_rebuilds_the_image_whatever_the_thread_count() {
    let dir = TempDir::new("publish-delta-memory");
    let key = keygen(dir.path(), "release");
    let old_path = dir.join("1.0.img");
    let new_path = dir.join("1.1.img");
    let old = image(&old_path, 24 * 1024 * 1024 + 777, 7);
    let mut new = old.clone();
    // Changed bytes, an insertion that shifts what follows, and a block
    // moved from the start to near the end.
    for i in (1_000_000..1_200_000).step_by(97) {
        new[i] ^= 0x5a;
    }
    new.splice(9_000_000..9_000_000, (0..5000u32).map(|i| (i * 7) as u8));
    let moved = old[100_000..400_000].to_vec();
    new.splice(20_000_000..20_000_000, moved);
    std::fs::write(&new_path, &new).expect("writing the new image");

    let mut seen: Option<Vec<u8>> = None;
    for threads in ["1", "2"] {
        let repo = Repo::new(dir.join(format!("site-{threads}")));
        repo.release(
            &[&key],
            "1.1",
            &new_path,
            &[
                "--from",
                old_path.to_str().expect("utf-8 path"),
                "--delta-memory",
                "16",
                "--threads",
                threads,
            ],
        );
        let payload = repo.payload();
        let url = payload["deltas"][0]["url"]
            .as_str()
            .expect("a published delta");
        let delta = std::fs::read(repo.dir.join(url)).expect("reading the delta");
        match &seen {
            None => {
                let source = std::fs::File::open(&old_path).expect("opening the old image");
                let mut rebuilt = Vec::new();
                updraft::delta::apply(
                    &source,
                    old.len() as u64,
                    &mut delta.as_slice(),
                    new.len() as u64,
                    &mut |b: &[u8]| {
                        rebuilt.extend_from_slice(b);
                        Ok(())
                    },
                )
                .expect("applying the delta");
                assert!(rebuilt == new, "the delta does not rebuild the new image");
                seen = Some(delta);
            }
            Some(d) => assert!(&delta == d, "--threads {threads}: the delta differs"),
        }
    }
}

/// A release described in a file (`--description`) is the release the
/// same flags make: the same components, versions and content, the
/// description's relative paths taken from its directory; flags beside it
/// override its values and add components. A description that is not one
/// is refused before anything is written.
#[test]
fn a_release_description_file_makes_the_release_its_flags_make() {
    let dir = TempDir::new("publish-description");
    let key = keygen(dir.path(), "release");
    let build = dir.join("build");
    std::fs::create_dir_all(build.join("web/bin")).expect("app tree");
    std::fs::write(build.join("web/bin/web"), b"#!/bin/sh\necho web\n").expect("app file");
    std::fs::write(build.join("web/VERSION"), b"1.4").expect("app file");
    std::fs::write(build.join("mcu.bin"), b"firmware 4.1").expect("payload");
    std::fs::create_dir_all(build.join("boot/overlays")).expect("boot tree");
    std::fs::write(build.join("boot/config.txt"), b"arm_64bit=1\n").expect("boot file");
    std::fs::write(build.join("boot/overlays/uart.dtbo"), b"dtbo").expect("boot file");
    image(&build.join("rootfs.ext4"), 3 * 1024 * 1024 + 17, 5);
    let described = build.join("release.toml");
    std::fs::write(
        &described,
        "version = \"2.0\"\ncompatible = [\"gw-2000\"]\nchannel = \"beta\"\n\
         [slot]\nname = \"os\"\nimage = \"rootfs.ext4\"\n\
         [components.web]\nkind = \"app\"\nversion = \"1.4\"\npath = \"web\"\n\
         [components.mcu]\nkind = \"command\"\nversion = \"4.1\"\npath = \"mcu.bin\"\n\
         [components.firmware]\nkind = \"boot\"\npath = \"boot\"\n",
    )
    .expect("description");

    let by_file = dir.join("site-file");
    let k = key.key.display().to_string();
    let desc = described.display().to_string();
    updraft_tests::publisher::publish_ok(&[
        "release",
        "--key",
        &k,
        "--description",
        &desc,
        "--level",
        "3",
        "--out",
        &by_file.display().to_string(),
    ]);
    let by_flags = dir.join("site-flags");
    updraft_tests::publisher::publish_ok(&[
        "release",
        "--key",
        &k,
        "--version",
        "2.0",
        "--compatible",
        "gw-2000",
        "--channel",
        "beta",
        "--slot-name",
        "os",
        "--image",
        &build.join("rootfs.ext4").display().to_string(),
        "--app",
        &format!("web@1.4={}", build.join("web").display()),
        "--command",
        &format!("mcu@4.1={}", build.join("mcu.bin").display()),
        "--boot",
        &format!("firmware={}", build.join("boot").display()),
        "--level",
        "3",
        "--out",
        &by_flags.display().to_string(),
    ]);
    let file = timeless(Repo::new(by_file).payload());
    let flags = timeless(Repo::new(by_flags).payload());
    assert_eq!(file["spec_version"], 2);
    let kinds: Vec<&Value> = file["components"]
        .as_array()
        .map(|c| c.iter().map(|c| &c["kind"]).collect())
        .unwrap_or_default();
    assert_eq!(kinds, ["slot", "boot", "app", "command"], "{file:#}");

    // Boot files hold no links: a symlink in the tree is refused, named.
    std::os::unix::fs::symlink("config.txt", build.join("boot/cmdline.txt")).expect("symlink");
    let out = updraft_tests::publisher::publish(&[
        "release",
        "--key",
        &k,
        "--description",
        &desc,
        "--level",
        "3",
        "--out",
        &dir.join("site-link").display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cmdline.txt is a symbolic link"),
        "{err}"
    );
    std::fs::remove_file(build.join("boot/cmdline.txt")).expect("symlink");
    assert_eq!(
        file, flags,
        "the description and the flags make different releases"
    );

    // A flag overrides the file's version and adds a component.
    let more = dir.join("site-more");
    std::fs::write(build.join("api.bin"), b"api").expect("payload");
    updraft_tests::publisher::publish_ok(&[
        "release",
        "--key",
        &k,
        "--description",
        &desc,
        "--version",
        "2.1",
        "--command",
        &format!("api={}", build.join("api.bin").display()),
        "--level",
        "3",
        "--out",
        &more.display().to_string(),
    ]);
    let p = Repo::new(more).payload();
    assert_eq!(p["release"]["version"], "2.1");
    let names: Vec<&str> = p["components"]
        .as_array()
        .expect("components")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["os", "firmware", "web", "mcu", "api"]);
    assert!(names.contains(&"api") && names.contains(&"os"), "{names:?}");

    // A description that is not one: refused, naming the file and the key.
    std::fs::write(
        &described,
        "version = \"2.0\"\ncompatibel = [\"gw-2000\"]\n",
    )
    .expect("bad");
    let bad = dir.join("site-bad");
    let out = updraft_tests::publisher::publish(&[
        "release",
        "--key",
        &k,
        "--description",
        &desc,
        "--out",
        &bad.display().to_string(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("release description {desc}")) && stderr.contains("compatibel"),
        "{stderr}"
    );
    assert!(!bad.join("manifest.json").exists(), "nothing written");
}

#[test]
fn a_security_version_is_kept_by_the_next_release_and_never_lowered() {
    let dir = TempDir::new("publish-security-version");
    let key = keygen(dir.path(), "release");
    let img = dir.join("1.0.img");
    image(&img, 1024 * 1024 + 7, 3);
    let repo = Repo::new(dir.join("site"));
    repo.release(&[&key], "1.0", &img, &[]);
    assert!(
        repo.payload().get("security_version").is_none(),
        "written as 0"
    );
    repo.release(&[&key], "1.1", &img, &["--security-version", "3"]);
    assert_eq!(repo.payload()["security_version"], 3);
    // A release that does not name it keeps the previous one's.
    repo.release(&[&key], "1.2", &img, &[]);
    assert_eq!(repo.payload()["security_version"], 3);
    assert_eq!(repo.payload()["serial"], 3);
    let k = key.key.to_str().expect("utf-8 path");
    let (i, out) = (
        img.to_str().expect("utf-8 path"),
        repo.dir.to_str().expect("utf-8 path"),
    );
    let lower = updraft_tests::publisher::publish(&[
        "release",
        "--key",
        k,
        "--version",
        "1.3",
        "--compatible",
        "testboard",
        "--image",
        i,
        "--out",
        out,
        "--security-version",
        "2",
    ]);
    let err = String::from_utf8_lossy(&lower.stderr);
    assert!(
        !lower.status.success(),
        "a lower security version was signed"
    );
    assert!(
        err.contains(
            "--security-version 2 is below the security version 3 of the release in --out"
        ),
        "{err}"
    );
    assert_eq!(repo.payload()["serial"], 3, "the manifest was replaced");
}
