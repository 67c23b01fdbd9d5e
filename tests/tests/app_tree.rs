//! An application tree from the publisher to a device's generations,
//! through the blobs directory a release carries: the publisher's index is
//! what the device's parser accepts, every file lands with its bytes and
//! mode, a release that changes one file of ten thousand reads that file's
//! blob alone (the rest is linked from the active generation), and the
//! previous generation comes back with one rename.
//!
//! The state machine does not run app components yet
//! (docs/components.md); this is the part of the path that exists, end to
//! end between the two binaries' libraries.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use updraft::app::blobs::DirBlobs;
use updraft::app::generation::App;
use updraft::app::index::{Entry, Index, Limits};
use updraft_publish::app::publish_tree;
use updraft_tests::publisher::image_bytes;
use updraft_tests::tmp::TempDir;

const FILES: usize = 10_000;

/// A tree of `FILES` files in 100 directories, about 1 KiB each, every
/// tenth executable; contents from `seed`.
fn make_tree(root: &Path, seed: u64) {
    for d in 0..100 {
        std::fs::create_dir_all(root.join(format!("lib/d{d:02}"))).expect("a directory");
    }
    for i in 0..FILES {
        let path = root.join(format!("lib/d{:02}/f{i:05}", i % 100));
        let bytes = image_bytes(900 + i % 250, seed.wrapping_add(i as u64));
        std::fs::write(&path, bytes).expect("a file");
        let mode = if i % 10 == 0 { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("a mode");
    }
    std::os::unix::fs::symlink("lib/d00/f00000", root.join("main")).expect("a link");
}

/// Every file of `index` under `dir` holds what the publisher's tree at
/// `src` holds, with its mode.
fn assert_same_tree(index: &Index, src: &Path, dir: &Path) {
    for e in &index.entries {
        if let Entry::File {
            path, executable, ..
        } = e
        {
            let got = std::fs::read(dir.join(path)).expect("an installed file");
            assert_eq!(
                got,
                std::fs::read(src.join(path)).expect("a source file"),
                "{path}"
            );
            let mode = std::fs::metadata(dir.join(path))
                .expect("mode")
                .permissions()
                .mode();
            assert_eq!(
                mode & 0o777,
                if *executable { 0o755 } else { 0o644 },
                "{path}"
            );
        }
    }
}

#[test]
fn a_release_changing_one_file_of_ten_thousand_reads_that_files_blob_alone() {
    let tmp = TempDir::new("app-tree");
    let src = tmp.join("src");
    let blobs = tmp.join("site/artifacts/blobs");
    make_tree(&src, 1);
    let v1 = publish_tree(&src, &blobs, 3).expect("publishing 1.3");
    assert_eq!(v1.blobs_written, FILES as u64);
    let limits = |t: &Index| Limits {
        entries: t.entries.len() as u64,
        bytes: t.bytes,
    };
    let index1 = Index::parse(&v1.lines, limits(&v1.index)).expect("the device reads 1.3's index");

    let app = App::new(&tmp.join("device/apps"), "web");
    let mut source = DirBlobs::new(&blobs);
    let (g1, w1) = app.install(&index1, &mut source).expect("installing 1.3");
    assert_eq!((w1.fetched, w1.reused), (FILES as u64, 0));
    app.activate(g1).expect("activating 1.3");
    let current = app.dir().join("current");
    assert_same_tree(&index1, &src, &current);
    assert_eq!(
        std::fs::read_link(current.join("main")).expect("the link"),
        Path::new("lib/d00/f00000")
    );

    // 1.4 changes one file.
    let changed = "lib/d42/f04242";
    std::fs::write(src.join(changed), b"the one file that changed in 1.4\n").expect("changing");
    let v2 = publish_tree(&src, &blobs, 3).expect("publishing 1.4");
    assert_eq!(v2.blobs_written, 1, "only the changed file is a new blob");
    let index2 = Index::parse(&v2.lines, limits(&v2.index)).expect("the device reads 1.4's index");
    let mut source = DirBlobs::new(&blobs);
    let (g2, w2) = app.install(&index2, &mut source).expect("installing 1.4");
    assert_eq!((w2.fetched, w2.reused), (1, FILES as u64 - 1));
    assert_eq!(source.opened, 1);
    assert_eq!(source.read_bytes, v2.blob_bytes_written);
    eprintln!(
        "app tree of {FILES} files, {} bytes: blobs of 1.3 {} bytes; index {} bytes; \
         1.4 read {} bytes of blobs ({} file) and linked {} files ({} bytes)",
        index1.bytes,
        v1.blob_bytes_written,
        v2.lines.len(),
        source.read_bytes,
        w2.fetched,
        w2.reused,
        w2.reused_bytes
    );
    assert_eq!(app.activate(g2).expect("activating 1.4"), Some(g1));
    assert_same_tree(&index2, &src, &current);

    // A failed health check of 1.4 brings 1.3 back by one rename.
    assert_eq!(app.activate(g1).expect("rolling back"), Some(g2));
    let old = std::fs::read(current.join(changed)).expect("the file");
    assert_ne!(old, b"the one file that changed in 1.4\n");
    assert_eq!(app.active().expect("active"), Some(g1));
}
