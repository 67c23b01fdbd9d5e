//! What `updraft-publish release` writes depends on the release, never on
//! the build host: frames are compressed independently and in parallel, and
//! the artifact and its signed frame table are the same bytes whatever the
//! number of threads.

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
