//! The `grub` backend: boot selection in GRUB's `grubenv` block.
//!
//! This module owns the environment block format as `grub-editenv` and
//! GRUB's `load_env`/`save_env` use it: exactly 1024 bytes, the header
//! `# GRUB Environment Block\n`, then lines (`name=value\n`, or comments
//! starting with `#`; a backslash escapes the next byte, so `\\` is a
//! backslash and backslash-newline a newline inside a value), then `#`
//! padding to the end.
//!
//! The block has no checksum and one copy, so nothing can tell a damaged
//! block from an odd one: a block of the wrong size, with the wrong header,
//! a line that is not `name=value` or a comment, a NUL byte, or padding
//! that is not all `#` is refused and reported, never guessed at or
//! repaired. Writes keep every other line byte for byte.
//!
//! **Writes go into the block in place**, as `grub-editenv` and GRUB's own
//! `save_env` write it: the same file, the same data blocks, one 1024-byte
//! `pwrite` and `fdatasync`. GRUB reads the boot partition with its own
//! filesystem driver and never replays a journal. A file replaced by rename
//! is a new directory entry and inode, metadata that a journaled ext4 keeps
//! in its journal until a later checkpoint: after a power cut GRUB would
//! read the old directory entry, the old inode and blocks that may already
//! hold something else, and boot a slot the daemon had taken out of the
//! order (a slot being written). Data written over existing blocks reaches
//! them at the `fdatasync`, where GRUB reads it. The variables updraft
//! writes fit in the block's first 512-byte sector, which a disk writes
//! whole; the rest is `#` padding that does not change.
//!
//! The boot model uses the variables of the RAUC-style GRUB script shown in
//! `docs/bootloaders.md`: `ORDER` ("A B"), `A_OK`, `A_TRY`, `B_OK`,
//! `B_TRY`. A slot is bootable when it is in `ORDER`, `x_OK=1` and
//! `x_TRY=0`; the script sets `x_TRY=1` as it boots the slot, so GRUB gives
//! a slot exactly one try and the `tries` argument of the model is ignored.
//! Missing variables read as the shipped `grub.cfg.in` initialises them:
//! `ORDER="A B"`, `A_OK=1`, `B_OK=0`, `x_TRY=0`.

use std::path::PathBuf;

use super::{BootState, Bootloader, SlotBoot, model};
use crate::error::{Context, Error, Kind, Result};
use crate::progress::Ticker;
use crate::slot::SlotName;
use crate::{bail, err};

/// Size of every GRUB environment block.
pub const GRUBENV_SIZE: usize = 1024;

/// The first line of every block.
pub const GRUBENV_HEADER: &[u8] = b"# GRUB Environment Block\n";

const VAR_ORDER: &str = "ORDER";

fn ok_var(names: &[String; 2], slot: SlotName) -> String {
    format!("{}_OK", names[index(slot)])
}

fn try_var(names: &[String; 2], slot: SlotName) -> String {
    format!("{}_TRY", names[index(slot)])
}

/// One line of the block, kept as found (without its newline).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Line {
    raw: Vec<u8>,
    /// Length of the name for a variable line; `None` for a comment.
    name_len: Option<usize>,
}

impl Line {
    fn name(&self) -> Option<&[u8]> {
        self.name_len.map(|n| &self.raw[..n])
    }
}

/// A parsed `grubenv` block: its lines in order, comments included.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GrubEnv {
    lines: Vec<Line>,
}

/// Undo GRUB's escaping: a backslash stands for the byte after it.
fn unescape(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' && i + 1 < raw.len() {
            i += 1;
        }
        out.push(raw[i]);
        i += 1;
    }
    out
}

/// Parse a whole block. Every departure from the format is an error that
/// names the byte offset.
pub fn parse_grubenv(block: &[u8]) -> Result<GrubEnv> {
    if block.len() != GRUBENV_SIZE {
        bail!(
            Malformed,
            "{} bytes; a GRUB environment block is exactly {GRUBENV_SIZE}",
            block.len()
        );
    }
    if !block.starts_with(GRUBENV_HEADER) {
        let shown = &block[..GRUBENV_HEADER.len()];
        bail!(
            Malformed,
            "starts with {:?}, not the header {:?}",
            String::from_utf8_lossy(shown),
            String::from_utf8_lossy(GRUBENV_HEADER)
        );
    }
    if let Some(p) = block.iter().position(|&b| b == 0) {
        bail!(Malformed, "NUL byte at offset {p:#x}");
    }
    let mut lines = Vec::new();
    let mut pos = GRUBENV_HEADER.len();
    let mut line_no = 1;
    while pos < block.len() {
        line_no += 1;
        // Find the end of the line, skipping escaped bytes.
        let mut i = pos;
        let mut end = None;
        while i < block.len() {
            match block[i] {
                b'\\' => {
                    if i + 1 >= block.len() {
                        bail!(
                            Malformed,
                            "line {line_no} (offset {pos:#x}): backslash at the end of the block"
                        );
                    }
                    i += 2;
                }
                b'\n' => {
                    end = Some(i);
                    break;
                }
                _ => i += 1,
            }
        }
        let Some(end) = end else {
            // No newline up to the end: this must be the padding.
            if let Some(off) = block[pos..].iter().position(|&b| b != b'#') {
                bail!(
                    Malformed,
                    "line {line_no} (offset {pos:#x}) is not terminated and is not '#' padding (byte {:#04x} at offset {:#x})",
                    block[pos + off],
                    pos + off
                );
            }
            break;
        };
        let raw = &block[pos..end];
        let name_len = if raw.first() == Some(&b'#') {
            None
        } else {
            match raw.iter().position(|&b| b == b'=') {
                Some(0) => bail!(
                    Malformed,
                    "line {line_no} (offset {pos:#x}): variable without a name: {:?}",
                    String::from_utf8_lossy(raw)
                ),
                Some(n) if !raw[..n].contains(&b'\\') => Some(n),
                _ => bail!(
                    Malformed,
                    "line {line_no} (offset {pos:#x}) is neither name=value nor a comment: {:?}",
                    String::from_utf8_lossy(raw)
                ),
            }
        };
        lines.push(Line {
            raw: raw.to_vec(),
            name_len,
        });
        pos = end + 1;
    }
    Ok(GrubEnv { lines })
}

/// The 1024-byte block for `env`: header, lines, `#` padding.
pub fn serialize_grubenv(env: &GrubEnv) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(GRUBENV_SIZE);
    out.extend_from_slice(GRUBENV_HEADER);
    for l in &env.lines {
        out.extend_from_slice(&l.raw);
        out.push(b'\n');
    }
    if out.len() > GRUBENV_SIZE {
        bail!(
            Bootloader,
            "the variables need {} bytes, more than the {GRUBENV_SIZE} of a GRUB environment block",
            out.len()
        );
    }
    out.resize(GRUBENV_SIZE, b'#');
    Ok(out)
}

impl GrubEnv {
    /// The variables in order, values unescaped.
    pub fn vars(&self) -> impl Iterator<Item = (&[u8], Vec<u8>)> {
        self.lines.iter().filter_map(|l| {
            let n = l.name_len?;
            Some((&l.raw[..n], unescape(&l.raw[n + 1..])))
        })
    }

    /// The value of `name` (the last line wins, as when GRUB loads it).
    pub fn get(&self, name: &str) -> Option<Vec<u8>> {
        self.vars()
            .filter(|(n, _)| *n == name.as_bytes())
            .last()
            .map(|(_, v)| v)
    }

    /// Set `name`: in place where it exists (later duplicates are dropped),
    /// appended otherwise. Backslashes are escaped as `grub-editenv` does;
    /// newlines, NUL and names with `=` or a leading `#` are refused.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        if name.is_empty() || name.starts_with('#') || name.contains(['=', '\n', '\\', '\0']) {
            bail!(
                Bootloader,
                "{name:?} is not a valid GRUB environment variable name"
            );
        }
        if value.contains(['\n', '\0']) {
            bail!(
                Bootloader,
                "the value for {name} contains a newline or NUL: {value:?}"
            );
        }
        let mut raw = Vec::with_capacity(name.len() + value.len() + 1);
        raw.extend_from_slice(name.as_bytes());
        raw.push(b'=');
        for b in value.bytes() {
            if b == b'\\' {
                raw.push(b'\\');
            }
            raw.push(b);
        }
        let new_line = Line {
            raw,
            name_len: Some(name.len()),
        };
        let mut placed = false;
        let mut out = Vec::with_capacity(self.lines.len() + 1);
        for l in self.lines.drain(..) {
            if l.name() == Some(name.as_bytes()) {
                if !placed {
                    out.push(new_line.clone());
                    placed = true;
                }
            } else {
                out.push(l);
            }
        }
        if !placed {
            out.push(new_line);
        }
        self.lines = out;
        Ok(())
    }

    /// Remove every line setting `name`.
    pub fn unset(&mut self, name: &str) {
        self.lines.retain(|l| l.name() != Some(name.as_bytes()));
    }
}

pub struct GrubBootloader {
    path: PathBuf,
    /// Slot A's and slot B's names in the variables: `A` and `B`, or
    /// RAUC's bootnames (`bootloader.flow = "rauc"`).
    names: [String; 2],
}

/// The model variables as the GRUB script sees them.
struct Boot {
    order: Vec<SlotName>,
    ok: [bool; 2],
    tried: [bool; 2],
}

fn index(slot: SlotName) -> usize {
    match slot {
        SlotName::A => 0,
        SlotName::B => 1,
    }
}

/// `name`'s value, `missing` when it is not set (the shipped GRUB script
/// initialises slot A's `_OK` to 1, everything else to 0).
fn flag(env: &GrubEnv, name: &str, missing: bool) -> Result<bool> {
    match env.get(name).as_deref() {
        None => Ok(missing),
        Some(b"0") => Ok(false),
        Some(b"1") => Ok(true),
        Some(v) => bail!(
            Bootloader,
            "{name}={:?} is neither 0 nor 1",
            String::from_utf8_lossy(v)
        ),
    }
}

impl Boot {
    fn from_env(env: &GrubEnv, names: &[String; 2]) -> Result<Boot> {
        let order = match env.get(VAR_ORDER) {
            None => vec![SlotName::A, SlotName::B],
            Some(v) => {
                let text = String::from_utf8(v).map_err(|e| {
                    err!(
                        Bootloader,
                        "ORDER is not text: {:?}",
                        String::from_utf8_lossy(e.as_bytes())
                    )
                })?;
                model::parse_named(VAR_ORDER, &text, names)?
            }
        };
        Ok(Boot {
            order,
            ok: [
                flag(env, &ok_var(names, SlotName::A), true)?,
                flag(env, &ok_var(names, SlotName::B), false)?,
            ],
            tried: [
                flag(env, &try_var(names, SlotName::A), false)?,
                flag(env, &try_var(names, SlotName::B), false)?,
            ],
        })
    }

    fn store(&self, env: &mut GrubEnv, names: &[String; 2]) -> Result<()> {
        let bit = |b: bool| if b { "1" } else { "0" };
        env.set(VAR_ORDER, &model::format_named(&self.order, names))?;
        for s in [SlotName::A, SlotName::B] {
            env.set(&ok_var(names, s), bit(self.ok[index(s)]))?;
            env.set(&try_var(names, s), bit(self.tried[index(s)]))?;
        }
        Ok(())
    }
}

impl GrubBootloader {
    pub fn new(path: PathBuf) -> Result<GrubBootloader> {
        if path.as_os_str().is_empty() {
            bail!(Config, "bootloader.grubenv is empty");
        }
        Ok(GrubBootloader {
            path,
            names: model::plain_names(),
        })
    }

    /// Name the slots as RAUC's bootnames (its GRUB script's `ORDER`,
    /// `<bootname>_OK`, `<bootname>_TRY`).
    pub fn set_names(&mut self, names: [String; 2]) {
        self.names = names;
    }

    /// Read and parse the block.
    pub fn load(&self) -> Result<GrubEnv> {
        let bytes = self.read_block()?;
        parse_grubenv(&bytes).kind_context(
            Kind::Bootloader,
            format!("GRUB environment {}", self.path.display()),
        )
    }

    fn read_block(&self) -> Result<Vec<u8>> {
        use std::io::Read;
        let file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                Bootloader,
                "GRUB environment {} does not exist; updraft does not create one (provision it with `grub-editenv {} create`, then set ORDER, A_OK, A_TRY, B_OK, B_TRY)",
                self.path.display(),
                self.path.display()
            ),
            Err(e) => {
                return Err(Error::from(e)
                    .wrap(format!("reading GRUB environment {}", self.path.display()))
                    .with_kind(Kind::Bootloader));
            }
        };
        // One byte more than a block, to see that a file is too long
        // without reading all of it.
        let mut bytes = Vec::with_capacity(GRUBENV_SIZE + 1);
        file.take(GRUBENV_SIZE as u64 + 1)
            .read_to_end(&mut bytes)
            .kind_context(
                Kind::Bootloader,
                format!("reading GRUB environment {}", self.path.display()),
            )?;
        if bytes.len() > GRUBENV_SIZE {
            bail!(
                Bootloader,
                "GRUB environment {}: longer than {GRUBENV_SIZE} bytes; a GRUB environment block is exactly {GRUBENV_SIZE}",
                self.path.display()
            );
        }
        Ok(bytes)
    }

    /// Change the block with `f` and write it over the old one in place
    /// (see the module documentation for why not by rename); nothing is
    /// written when the lines stay the same.
    pub fn update(&mut self, f: impl FnOnce(&mut GrubEnv) -> Result<()>) -> Result<()> {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let before = self.load()?;
        let mut env = before.clone();
        f(&mut env)?;
        if env == before {
            return Ok(());
        }
        let what = || format!("writing GRUB environment {}", self.path.display());
        let block = serialize_grubenv(&env).with_context(what)?;
        // Where a symlink points; never created, never truncated: the file
        // was just read as a whole block of this size.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.path)
            .kind_context(Kind::Bootloader, what())?;
        let len = file
            .metadata()
            .map(|m| m.len())
            .kind_context(Kind::Bootloader, what())?;
        if len != GRUBENV_SIZE as u64 {
            bail!(
                Bootloader,
                "{}: the file is {len} bytes, not the {GRUBENV_SIZE} of a GRUB environment block (changed while it was read?)",
                what()
            );
        }
        file.write_all_at(&block, 0)
            .and_then(|()| file.sync_data())
            .kind_context(Kind::Bootloader, what())
    }

    fn update_boot(&mut self, f: impl FnOnce(&mut Boot)) -> Result<()> {
        let path = self.path.display().to_string();
        let names = self.names.clone();
        self.update(|env| {
            let mut boot = Boot::from_env(env, &names).kind_context(Kind::Bootloader, format!("GRUB environment {path}"))?;
            f(&mut boot);
            if boot.order.is_empty() {
                bail!(
                    Bootloader,
                    "refusing to write an empty ORDER to GRUB environment {path}: no slot could boot"
                );
            }
            boot.store(env, &names)
        })
    }
}

impl Bootloader for GrubBootloader {
    fn describe(&self) -> String {
        format!("grub {}", self.path.display())
    }

    fn read_with(&mut self, _: &mut dyn Ticker) -> Result<BootState> {
        let env = self.load()?;
        let boot = Boot::from_env(&env, &self.names).kind_context(
            Kind::Bootloader,
            format!("GRUB environment {}", self.path.display()),
        )?;
        let slot = |s: SlotName| {
            let ready = boot.ok[index(s)] && !boot.tried[index(s)];
            SlotBoot {
                bootable: ready && boot.order.contains(&s),
                tries_left: u32::from(ready),
            }
        };
        Ok(BootState {
            a: slot(SlotName::A),
            b: slot(SlotName::B),
            order: boot.order.clone(),
        })
    }

    fn disable_with(&mut self, slot: SlotName, _: &mut dyn Ticker) -> Result<()> {
        self.update_boot(|b| {
            b.order = model::without(&b.order, slot);
            b.ok[index(slot)] = false;
            b.tried[index(slot)] = false;
        })
    }

    fn trial_tries(&self, _tries: u32) -> u32 {
        1
    }

    /// GRUB gives one try whatever `tries` says.
    fn trial_with(&mut self, slot: SlotName, _tries: u32, _: &mut dyn Ticker) -> Result<()> {
        self.update_boot(|b| {
            b.order = model::first(&b.order, slot);
            b.ok[index(slot)] = true;
            b.tried[index(slot)] = false;
        })
    }

    fn mark_good_with(&mut self, slot: SlotName, _tries: u32, _: &mut dyn Ticker) -> Result<()> {
        self.update_boot(|b| {
            b.order = model::first(&b.order, slot);
            b.ok[index(slot)] = true;
            b.tried[index(slot)] = false;
        })
    }

    fn mark_bad_with(&mut self, slot: SlotName, _: &mut dyn Ticker) -> Result<()> {
        self.update_boot(|b| {
            b.order = model::first(&model::without(&b.order, slot), slot.other());
            b.ok[index(slot)] = false;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::Rng;
    use std::os::unix::fs::PermissionsExt;

    fn block(body: &str) -> Vec<u8> {
        let mut b = GRUBENV_HEADER.to_vec();
        b.extend_from_slice(body.as_bytes());
        b.resize(GRUBENV_SIZE, b'#');
        b
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("updraft-grub-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.join("grubenv")
    }

    #[test]
    fn parses_what_grub_editenv_writes() {
        let b = block(
            "# WARNING: Do not edit this file by tools other than grub-editenv!!!\nORDER=A B\nX=a\\\\b\nY=l1\\\nl2\nZ=\n",
        );
        let env = parse_grubenv(&b).unwrap();
        assert_eq!(env.get("ORDER").as_deref(), Some(&b"A B"[..]));
        assert_eq!(env.get("X").as_deref(), Some(&b"a\\b"[..]));
        assert_eq!(env.get("Y").as_deref(), Some(&b"l1\nl2"[..]));
        assert_eq!(env.get("Z").as_deref(), Some(&b""[..]));
        assert_eq!(env.get("W"), None);
        assert_eq!(
            serialize_grubenv(&env).unwrap(),
            b,
            "round trip is byte for byte"
        );
    }

    #[test]
    fn set_and_unset_keep_other_lines() {
        let b = block("# comment\nfoo=bar baz\nORDER=A B\nsaved_entry=x\n");
        let mut env = parse_grubenv(&b).unwrap();
        env.set("ORDER", "B A").unwrap();
        env.set("B_OK", "1").unwrap();
        env.set("path", "C:\\boot").unwrap();
        env.unset("saved_entry");
        let out = serialize_grubenv(&env).unwrap();
        assert_eq!(out.len(), GRUBENV_SIZE);
        assert!(out.starts_with(b"# GRUB Environment Block\n# comment\nfoo=bar baz\nORDER=B A\nB_OK=1\npath=C:\\\\boot\n#"));
        assert_eq!(
            parse_grubenv(&out).unwrap().get("path").as_deref(),
            Some(&b"C:\\boot"[..])
        );
        assert!(env.set("X", "a\nb").is_err());
        assert!(env.set("X=Y", "1").is_err());
        assert!(env.set("#X", "1").is_err());
        assert!(env.set("", "1").is_err());
    }

    #[test]
    fn duplicates_read_last_and_collapse_on_write() {
        let mut env = parse_grubenv(&block("A_OK=0\nx=1\nA_OK=1\n")).unwrap();
        assert_eq!(env.get("A_OK").as_deref(), Some(&b"1"[..]));
        env.set("A_OK", "0").unwrap();
        assert!(
            serialize_grubenv(&env)
                .unwrap()
                .starts_with(b"# GRUB Environment Block\nA_OK=0\nx=1\n#")
        );
    }

    #[test]
    fn overflow_is_an_error() {
        let mut env = parse_grubenv(&block("")).unwrap();
        env.set("big", &"x".repeat(GRUBENV_SIZE - GRUBENV_HEADER.len() - 5))
            .unwrap();
        assert_eq!(
            serialize_grubenv(&env).unwrap().last(),
            Some(&b'\n'),
            "exactly full, no padding"
        );
        env.set("big", &"x".repeat(GRUBENV_SIZE)).unwrap();
        let e = serialize_grubenv(&env).unwrap_err().to_string();
        assert!(e.contains("more than the 1024"), "{e}");
    }

    #[test]
    fn malformed_blocks_are_refused_with_the_offset() {
        let mut short = block("");
        short.pop();
        let mut long = block("");
        long.push(b'#');
        let mut bad_header = block("");
        bad_header[2] = b'g';
        let mut nul = block("a=1\n");
        nul[GRUBENV_HEADER.len() + 1] = 0;
        let mut trailing_backslash = block("");
        trailing_backslash[GRUBENV_SIZE - 1] = b'\\';
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (short, "1023 bytes"),
            (long, "1025 bytes"),
            (bad_header, "not the header"),
            (nul, "NUL byte at offset 0x1a"),
            (block("foo\n"), "line 2 (offset 0x19) is neither"),
            (
                block("a=1\n=2\n"),
                "line 3 (offset 0x1d): variable without a name",
            ),
            (block("a=1\nunterminated"), "not terminated"),
            (block("a=1\n##x#"), "byte 0x78 at offset 0x1f"),
            (block("a\\=b=1\n"), "neither"),
            (trailing_backslash, "backslash at the end"),
            (vec![b'#'; GRUBENV_SIZE], "not the header"),
            (vec![0; GRUBENV_SIZE], "not the header"),
        ];
        for (b, want) in cases {
            let e = parse_grubenv(&b).unwrap_err();
            assert_eq!(e.kind(), Kind::Malformed);
            assert!(e.to_string().contains(want), "want {want:?}: {e}");
        }
    }

    #[test]
    fn model_operations_follow_the_rauc_scheme() {
        let p = tmp("model");
        std::fs::write(
            &p,
            block("ORDER=A B\nA_OK=1\nA_TRY=0\nB_OK=1\nB_TRY=0\nkeep=me\n"),
        )
        .unwrap();
        let mut bl = GrubBootloader::new(p.clone()).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.next_boot(), Some(SlotName::A));
        assert_eq!(s.a.tries_left, 1);
        bl.disable(SlotName::B).unwrap();
        let env = bl.load().unwrap();
        assert_eq!(env.get("ORDER").as_deref(), Some(&b"A"[..]));
        assert_eq!(env.get("B_OK").as_deref(), Some(&b"0"[..]));
        assert!(!bl.read().unwrap().b.bootable);
        bl.trial(SlotName::B, 7).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::B, SlotName::A]);
        assert_eq!(
            s.b,
            SlotBoot {
                bootable: true,
                tries_left: 1
            },
            "one try, whatever was asked"
        );
        // The GRUB script boots B and sets B_TRY=1.
        let mut env = bl.load().unwrap();
        env.set("B_TRY", "1").unwrap();
        std::fs::write(&p, serialize_grubenv(&env).unwrap()).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(
            s.b,
            SlotBoot {
                bootable: false,
                tries_left: 0
            }
        );
        assert_eq!(s.next_boot(), Some(SlotName::A), "falls back");
        bl.mark_good(SlotName::B, 3).unwrap();
        assert_eq!(bl.read().unwrap().next_boot(), Some(SlotName::B));
        // Already good: the file is not replaced.
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap());
        bl.mark_good(SlotName::B, 3).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap()),
            ino
        );
        bl.mark_bad(SlotName::B).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::A]);
        assert!(!s.b.bootable);
        assert_eq!(bl.load().unwrap().get("keep").as_deref(), Some(&b"me"[..]));
        assert!(
            bl.disable(SlotName::A)
                .unwrap_err()
                .to_string()
                .contains("empty ORDER")
        );
    }

    #[test]
    fn missing_variables_read_as_script_defaults() {
        let p = tmp("defaults");
        std::fs::write(&p, block("")).unwrap();
        let mut bl = GrubBootloader::new(p).unwrap();
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::A, SlotName::B]);
        assert!(
            s.a.bootable,
            "A_OK defaults to 1, as the shipped grub.cfg sets it"
        );
        assert!(!s.b.bootable, "B_OK defaults to 0");
        bl.mark_good(SlotName::A, 3).unwrap();
        assert_eq!(bl.read().unwrap().next_boot(), Some(SlotName::A));
    }

    #[test]
    fn malformed_files_are_refused_and_left_untouched() {
        let p = tmp("malformed");
        let mut bl = GrubBootloader::new(p.clone()).unwrap();
        let e = bl.read().unwrap_err().to_string();
        assert!(
            e.contains("does not exist") && e.contains("grub-editenv"),
            "{e}"
        );
        assert!(bl.trial(SlotName::B, 1).is_err());
        assert!(!p.exists(), "never creates a block");
        for bad in [
            block("A_OK=yes\n"),
            block("ORDER=A X\n"),
            block("junk\n"),
            b"# GRUB Environment Block\n".to_vec(),
            vec![b'#'; 4096],
        ] {
            std::fs::write(&p, &bad).unwrap();
            assert!(bl.read().is_err());
            let e = bl.trial(SlotName::B, 1).unwrap_err();
            assert_eq!(e.kind(), Kind::Bootloader);
            assert!(e.to_string().contains(&p.display().to_string()), "{e}");
            assert_eq!(std::fs::read(&p).unwrap(), bad);
        }
    }

    /// GRUB reads the block through its own filesystem driver, which
    /// replays no journal: a write must land in the file's existing data
    /// blocks (same inode, no new directory entry), not in a new file
    /// renamed over it.
    #[test]
    fn writes_go_into_the_same_file_in_place() {
        use std::os::unix::fs::MetadataExt;
        let p = tmp("in-place");
        std::fs::write(&p, block("ORDER=A B\nA_OK=1\nB_OK=0\n")).unwrap();
        let before = std::fs::metadata(&p).unwrap();
        let mut bl = GrubBootloader::new(p.clone()).unwrap();
        bl.trial(SlotName::B, 1).unwrap();
        bl.mark_bad(SlotName::B).unwrap();
        let after = std::fs::metadata(&p).unwrap();
        assert_eq!(
            after.ino(),
            before.ino(),
            "the block was replaced by another file"
        );
        assert_eq!(after.dev(), before.dev());
        assert_eq!(after.len(), GRUBENV_SIZE as u64);
        let dir: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp."))
            .collect();
        assert!(dir.is_empty(), "temporary files: {dir:?}");
        let s = bl.read().unwrap();
        assert_eq!(s.order, vec![SlotName::A]);
        assert!(!s.b.bootable);
    }

    #[test]
    fn writes_keep_mode_and_follow_symlinks() {
        let p = tmp("symlink");
        let real = p.with_file_name("real-grubenv");
        std::fs::write(&real, block("ORDER=A B\nA_OK=1\n")).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&real, &p).unwrap();
        let mut bl = GrubBootloader::new(p.clone()).unwrap();
        bl.trial(SlotName::B, 1).unwrap();
        assert!(
            std::fs::symlink_metadata(&p)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::metadata(&real).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(bl.read().unwrap().next_boot(), Some(SlotName::B));
    }

    #[test]
    fn mutated_blocks_never_panic_and_what_parses_round_trips() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let seed = block("# WARNING\nORDER=A B\nA_OK=1\nA_TRY=0\nB_OK=0\nB_TRY=0\nx=a\\\\b\n");
        let mut parsed = 0;
        for _ in 0..20_000 {
            let mut b = seed.clone();
            for _ in 0..1 + rng.next() % 4 {
                // Mutate the interesting part: the header and the lines.
                let i = (rng.next() % 110) as usize;
                b[i] = match rng.next() % 6 {
                    0 => b'#',
                    1 => b'=',
                    2 => b'\n',
                    3 => b'\\',
                    4 => 0,
                    _ => rng.next() as u8,
                };
            }
            if rng.next() % 8 == 0 {
                b.truncate((rng.next() % 1025) as usize);
            }
            let Ok(env) = parse_grubenv(&b) else { continue };
            parsed += 1;
            assert_eq!(serialize_grubenv(&env).unwrap(), b);
            let _ = Boot::from_env(&env, &model::plain_names());
        }
        assert!(
            parsed > 1000,
            "the mutations reach the line parser ({parsed})"
        );
    }
}
