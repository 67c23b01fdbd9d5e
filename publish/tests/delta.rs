//! Deltas made by the publisher, applied by the `bsdiff` crate's reference
//! patcher and by the device's streaming patcher, on random and structured
//! image pairs.

use std::fs::File;
use std::io::Write;

use updraft::artifact::parse_frame_header;
use updraft::manifest::MAX_WINDOW_LOG;
use updraft_publish::delta::{self, DeltaOptions};

/// A small deterministic generator (xorshift64*), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Text-like bytes with repeats, so there is something to match.
fn text(rng: &mut Rng, n: usize) -> Vec<u8> {
    let words: [&[u8]; 8] = [
        b"load ",
        b"store ",
        b"\0\0\0\0",
        b"call 0x",
        b"ret\n",
        b"mov r1, ",
        b"\xff\xfe",
        b"jmp ",
    ];
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(words[rng.below(words.len())]);
        if rng.below(4) == 0 {
            v.push(rng.next() as u8);
        }
    }
    v.truncate(n);
    v
}

/// An old image and an edited new one.
fn pair(rng: &mut Rng, case: usize) -> (Vec<u8>, Vec<u8>) {
    let size = rng.below(60_000);
    let old = text(rng, size);
    let mut new = old.clone();
    match case % 9 {
        0 => return (Vec::new(), text(rng, size)),
        1 => return (old, Vec::new()),
        2 => return (old.clone(), old),
        3 => {
            for _ in 0..1 + rng.below(20) {
                let at = rng.below(new.len() + 1);
                let n = rng.below(400);
                let ins = rng.bytes(n);
                new.splice(at..at, ins);
            }
        }
        4 => {
            for _ in 0..1 + rng.below(20) {
                let at = rng.below(new.len() + 1);
                let end = (at + rng.below(800)).min(new.len());
                new.drain(at..end);
            }
        }
        5 => {
            for _ in 0..1 + rng.below(6) {
                let a = rng.below(new.len() + 1);
                let b = (a + rng.below(8000)).min(new.len());
                let block: Vec<u8> = new.drain(a..b).collect();
                let at = rng.below(new.len() + 1);
                new.splice(at..at, block);
            }
        }
        6 => {
            for _ in 0..rng.below(300) {
                if !new.is_empty() {
                    let at = rng.below(new.len());
                    new[at] ^= 1 << rng.below(8);
                }
            }
        }
        7 => {
            // Code whose addresses moved: every 16th byte changes by one.
            for i in (rng.below(16)..new.len()).step_by(16) {
                new[i] = new[i].wrapping_add(1);
            }
        }
        _ => return (rng.bytes(size), rng.bytes(size)),
    }
    (old, new)
}

fn small_windows() -> DeltaOptions {
    // Small windows and index pieces, so the cuts between windows and
    // between suffix arrays are exercised on small images.
    DeltaOptions {
        threads: 3,
        zstd_level: 3,
        window: 7_001,
        index_part: 9_999,
        memory_budget: delta::DEFAULT_MEMORY_BUDGET,
    }
}

fn small_regions() -> DeltaOptions {
    // A budget far below any pair's, so every window is matched against
    // chosen 4 KiB chunks of the old image (at most 256 KiB of them), two
    // windows at a time.
    DeltaOptions {
        memory_budget: 4 << 20,
        ..small_windows()
    }
}

fn stream_of(delta: &[u8]) -> Vec<u8> {
    zstd::stream::decode_all(delta).unwrap()
}

fn reference_patch(old: &[u8], stream: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    bsdiff::patch(old, &mut &stream[..], &mut out).unwrap();
    out
}

fn source(bytes: &[u8]) -> File {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("updraft-publish-delta-{}-{n}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let f = File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}

fn device_apply(old: &[u8], delta: &[u8], new_len: usize) -> updraft::Result<Vec<u8>> {
    let f = source(old);
    let mut out = Vec::new();
    updraft::delta::apply(
        &f,
        old.len() as u64,
        &mut &delta[..],
        new_len as u64,
        &mut |b: &[u8]| {
            out.extend_from_slice(b);
            Ok(())
        },
    )?;
    Ok(out)
}

#[test]
fn the_reference_patcher_rebuilds_the_new_image_from_our_deltas() {
    let mut rng = Rng(0xde17_a000_0001);
    for case in 0..180 {
        let (old, new) = pair(&mut rng, case);
        let opts = if case % 2 == 0 {
            DeltaOptions {
                zstd_level: 3,
                ..DeltaOptions::default()
            }
        } else {
            small_windows()
        };
        let mut delta = Vec::new();
        let n = delta::make(&old, &new, &opts, &mut delta).unwrap();
        assert_eq!(n, delta.len() as u64, "case {case}: reported size");
        let rebuilt = reference_patch(&old, &stream_of(&delta));
        assert!(
            rebuilt == new,
            "case {case} ({} -> {} bytes): bsdiff::patch does not rebuild the new image",
            old.len(),
            new.len()
        );
    }
}

#[test]
fn the_device_patcher_agrees_with_the_reference_on_our_deltas() {
    let mut rng = Rng(0xde17_a000_0002);
    for case in 0..180 {
        let (old, new) = pair(&mut rng, case);
        let mut delta = Vec::new();
        delta::make(&old, &new, &small_windows(), &mut delta).unwrap();
        let expected = reference_patch(&old, &stream_of(&delta));
        let got =
            device_apply(&old, &delta, new.len()).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert!(
            got == expected,
            "case {case}: device and reference patchers differ"
        );
        assert!(got == new, "case {case}: not the new image");
    }
}

#[test]
fn the_device_patcher_agrees_with_the_reference_on_the_crates_own_deltas() {
    let mut rng = Rng(0xde17_a000_0003);
    for case in 0..60 {
        let (old, new) = pair(&mut rng, case);
        let mut stream = Vec::new();
        bsdiff::diff(&old, &new, &mut stream).unwrap();
        let mut delta = Vec::new();
        let mut enc = zstd::stream::write::Encoder::new(&mut delta, 3).unwrap();
        enc.set_parameter(zstd::zstd_safe::CParameter::WindowLog(MAX_WINDOW_LOG))
            .unwrap();
        enc.write_all(&stream).unwrap();
        enc.finish().unwrap();
        let got =
            device_apply(&old, &delta, new.len()).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert!(
            got == reference_patch(&old, &stream) && got == new,
            "case {case}"
        );
    }
}

#[test]
fn deltas_matched_in_regions_rebuild_the_new_image() {
    let mut rng = Rng(0xde17_a000_0005);
    for case in 0..180 {
        let (old, new) = pair(&mut rng, case);
        let opts = small_regions();
        assert_eq!(
            delta::plan(old.len() as u64, new.len() as u64, &opts),
            delta::Plan::Regions
        );
        let mut delta = Vec::new();
        let n = delta::make(&old, &new, &opts, &mut delta).unwrap();
        assert_eq!(n, delta.len() as u64, "case {case}: reported size");
        let expected = reference_patch(&old, &stream_of(&delta));
        assert!(
            expected == new,
            "case {case}: bsdiff::patch does not rebuild it"
        );
        let got =
            device_apply(&old, &delta, new.len()).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert!(
            got == new,
            "case {case}: the device patcher does not rebuild it"
        );
    }
}

#[test]
fn the_output_of_the_region_plan_does_not_depend_on_the_thread_count() {
    let mut rng = Rng(0xde17_a000_0006);
    for case in [5, 6, 7] {
        let (old, new) = pair(&mut rng, case);
        let make = |threads| {
            let mut d = Vec::new();
            delta::make(
                &old,
                &new,
                &DeltaOptions {
                    threads,
                    ..small_regions()
                },
                &mut d,
            )
            .unwrap();
            d
        };
        assert_eq!(make(1), make(2), "case {case}");
        assert_eq!(make(1), make(4), "case {case}");
    }
}

#[test]
fn the_output_does_not_depend_on_the_thread_count() {
    let mut rng = Rng(0xde17_a000_0004);
    let (old, new) = pair(&mut rng, 5);
    let make = |threads| {
        let mut d = Vec::new();
        delta::make(
            &old,
            &new,
            &DeltaOptions {
                threads,
                ..small_windows()
            },
            &mut d,
        )
        .unwrap();
        d
    };
    assert_eq!(make(1), make(4));
}

#[test]
fn the_frame_header_records_a_window_the_device_accepts() {
    let mut rng = Rng(0xde17_a000_0005);
    // Larger than the window, so the encoder cannot shrink it to the input.
    let old = text(&mut rng, 17 << 20);
    let mut new = old.clone();
    new.splice(5 << 20..5 << 20, rng.bytes(3 << 20));
    let mut delta = Vec::new();
    delta::make(
        &old,
        &new,
        &DeltaOptions {
            zstd_level: 1,
            ..DeltaOptions::default()
        },
        &mut delta,
    )
    .unwrap();
    let header = parse_frame_header(&delta).unwrap();
    assert!(
        header.window_size <= 1 << MAX_WINDOW_LOG,
        "window {}",
        header.window_size
    );
    assert_eq!(device_apply(&old, &delta, new.len()).unwrap(), new);
}

#[test]
fn a_small_change_makes_a_small_delta() {
    let mut rng = Rng(0xde17_a000_0006);
    let old = rng.bytes(1 << 20);
    let mut new = old.clone();
    new[1000..1100].copy_from_slice(&rng.bytes(100));
    new.splice(500_000..500_000, rng.bytes(1000));
    let mut delta = Vec::new();
    delta::make(&old, &new, &DeltaOptions::default(), &mut delta).unwrap();
    // Random data does not compress: what is left is the changed bytes.
    assert!(delta.len() < 2_000, "delta of {} bytes", delta.len());
}
