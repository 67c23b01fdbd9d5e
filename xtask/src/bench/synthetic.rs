//! The synthetic pair of `cargo xtask bench delta --synthetic-gib N`: two
//! N GiB filesystem-like images, larger than any real pair the bench can
//! make from packages, with the change pattern of a rootfs upgrade.
//!
//! The old image is real files from `/usr` (sorted by path, 1 KiB to
//! 32 MiB each; every 50th file is kept back for the new image) laid out
//! 4 KiB-aligned after a 1 MiB zero header, with zero gaps (free space, one
//! in 200 placements, 64 KiB to 4 MiB each: about a tenth of the image)
//! and, for 3 % of placements, a second copy of an earlier file (as
//! duplicated libraries are). The new
//! image starts as a copy of the old one, then:
//!
//! * 2.5 % of files are upgraded in place: a third of their 4 KiB blocks get
//!   four short runs of bytes shifted by a small amount (what recompiled
//!   code with moved addresses looks like);
//! * 1 % are upgraded likewise and moved into free space, their old blocks
//!   zeroed;
//! * 0.5 % are deleted (zeroed);
//! * files never seen in the old image, 0.5 % of the image in all, are
//!   written into free space;
//! * finally 1/16 of the image, from 5/8 of the way in, is moved 1 MiB +
//!   12 KiB further on (a re-laid-out region), so matches at other offsets
//!   are needed.
//!
//! Everything comes from a fixed seed and the sorted file list, and both
//! images are cached under `target/bench-cache/delta-synthetic/`, so reruns
//! reuse them (a changed `/usr` would change a rebuilt pair).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use updraft_tests::rng::Rng;

use crate::util::Result;

const ALIGN: u64 = 4096;

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Regular files under `dir`, 1 KiB to 32 MiB, sorted by path.
fn files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() && (1 << 10..=32 << 20).contains(&meta.len()) {
                out.push((e.path(), meta.len()));
            }
        }
    }
    out.sort();
    out
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

fn write_at(f: &File, bytes: &[u8], at: u64, what: &Path) -> Result {
    f.write_all_at(bytes, at)
        .map_err(|e| format!("writing {}: {e}", what.display()))
}

/// Shift a third of the 4 KiB blocks' bytes in four short runs each.
fn upgrade(bytes: &mut [u8], rng: &mut Rng) {
    for block in bytes.chunks_mut(ALIGN as usize) {
        if rng.below(3) != 0 {
            continue;
        }
        for _ in 0..4 {
            let len = 4 + rng.below(13) as usize;
            let at = rng.below(block.len() as u64) as usize;
            let delta = 1 + rng.below(7) as u8;
            let end = block.len().min(at + len);
            for b in block[at..end].iter_mut() {
                *b = b.wrapping_add(delta);
            }
        }
    }
}

/// Take `len` bytes of free space from `gaps`, first fit.
fn take_gap(gaps: &mut [(u64, u64)], len: u64) -> Option<u64> {
    let len = align(len);
    let g = gaps.iter_mut().find(|g| g.1 >= len)?;
    let at = g.0;
    g.0 += len;
    g.1 -= len;
    Some(at)
}

/// Build (or reuse) the old and new `gib` GiB images.
pub fn images(cache: &Path, gib: u64) -> Result<(PathBuf, PathBuf)> {
    let old_img = cache.join(format!("old-{gib}G.img"));
    let new_img = cache.join(format!("new-{gib}G.img"));
    if old_img.is_file() && new_img.is_file() {
        return Ok((old_img, new_img));
    }
    std::fs::create_dir_all(cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    let total = gib << 30;
    let all = files(Path::new("/usr"));
    let (mut pool, mut fresh) = (Vec::new(), Vec::new());
    for (i, f) in all.into_iter().enumerate() {
        if i % 50 == 0 {
            fresh.push(f);
        } else {
            pool.push(f);
        }
    }
    if pool.is_empty() {
        return Err("no files under /usr to build the synthetic images from".into());
    }
    eprintln!(
        "bench delta: building the {gib} GiB synthetic pair from {} files under /usr",
        pool.len()
    );
    let mut rng = Rng(0x5e17_7e71_c0de_0001);

    // The old image's layout: (offset, file) and free gaps.
    let mut placed: Vec<(u64, usize)> = Vec::new();
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    let mut at = 1u64 << 20;
    let mut next = 0usize;
    loop {
        let r = rng.below(1000);
        if r < 5 {
            let len = align(64 * 1024 + rng.below(4 << 20));
            if at + len > total {
                break;
            }
            gaps.push((at, len));
            at += len;
            continue;
        }
        let file = if r < 35 && !placed.is_empty() {
            placed[rng.below(placed.len() as u64) as usize].1
        } else {
            next += 1;
            (next - 1) % pool.len()
        };
        let len = pool[file].1;
        if at + len > total {
            break;
        }
        placed.push((at, file));
        at = align(at + len);
    }
    if at < total {
        gaps.push((at, total - at));
    }

    let tmp_old = old_img.with_extension("tmp");
    let old = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp_old)
        .map_err(|e| format!("creating {}: {e}", tmp_old.display()))?;
    old.set_len(total)
        .map_err(|e| format!("sizing {}: {e}", tmp_old.display()))?;
    for &(off, file) in &placed {
        let bytes = read(&pool[file].0)?;
        // A file may have changed size since it was listed.
        let n = bytes.len().min(pool[file].1 as usize);
        write_at(&old, &bytes[..n], off, &tmp_old)?;
    }
    drop(old);

    let tmp_new = new_img.with_extension("tmp");
    std::fs::copy(&tmp_old, &tmp_new)
        .map_err(|e| format!("copying to {}: {e}", tmp_new.display()))?;
    let new = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&tmp_new)
        .map_err(|e| format!("opening {}: {e}", tmp_new.display()))?;
    for &(off, file) in &placed {
        let r = rng.below(1000);
        if r >= 40 {
            continue;
        }
        let len = pool[file].1 as usize;
        let mut bytes = read(&pool[file].0)?;
        bytes.resize(len, 0);
        if r < 35 {
            upgrade(&mut bytes, &mut rng);
        }
        if r < 25 {
            write_at(&new, &bytes, off, &tmp_new)?;
            continue;
        }
        write_at(&new, &vec![0u8; len], off, &tmp_new)?;
        if r < 35 {
            if let Some(to) = take_gap(&mut gaps, len as u64) {
                write_at(&new, &bytes, to, &tmp_new)?;
            }
        }
    }
    let mut added = 0u64;
    for (path, len) in &fresh {
        if added >= total / 200 {
            break;
        }
        let Some(to) = take_gap(&mut gaps, *len) else {
            break;
        };
        let bytes = read(path)?;
        write_at(&new, &bytes[..bytes.len().min(*len as usize)], to, &tmp_new)?;
        added += len;
    }
    // The moved region, copied from its end so the overlap reads its
    // source before it is overwritten.
    let (from, len, by) = (total / 8 * 5, total / 16, (1 << 20) + 12 * 1024);
    let len = len.min(total.saturating_sub(from + by));
    let mut buf = vec![0u8; 8 << 20];
    let mut end = len;
    while end > 0 {
        let n = (buf.len() as u64).min(end);
        let start = end - n;
        new.read_exact_at(&mut buf[..n as usize], from + start)
            .map_err(|e| format!("reading {}: {e}", tmp_new.display()))?;
        write_at(&new, &buf[..n as usize], from + start + by, &tmp_new)?;
        end = start;
    }
    drop(new);
    std::fs::rename(&tmp_old, &old_img)
        .map_err(|e| format!("renaming {}: {e}", tmp_old.display()))?;
    std::fs::rename(&tmp_new, &new_img)
        .map_err(|e| format!("renaming {}: {e}", tmp_new.display()))?;
    Ok((old_img, new_img))
}
