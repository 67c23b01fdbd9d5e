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
