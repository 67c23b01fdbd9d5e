//! `updraft adopt`: take over a device another updater (RAUC, Mender) has
//! been updating, without reflashing it, downloading or rebooting.
//!
//! The device keeps the boot scripts it has: updraft is configured with
//! that updater's boot flow (`bootloader.flow`, see
//! `docs/bootloaders.md`), so it reads and writes the same variables with
//! the same meaning. What adopt learns from the other updater's own files
//! (`rauc`, `mender`: pure parsers) becomes updraft's `[slots]` and
//! `[bootloader]`, `device.compatible` and `system.state_dir`, merged into
//! the configuration file already there (the fleet's `[server]` and
//! `[trust]`, which no other updater knows); the release running in the
//! booted slot becomes the release marker, so updraft reports it and never
//! installs it again; the store records the adoption in its history.
//!
//! Before writing anything, adopt proves the result with the code the
//! daemon runs: the merged configuration must load, the booted slot must be
//! found by `bootloader::booted_slot` and the boot selection read by the
//! configured backend must boot that slot next (no switch of the other
//! updater pending). Every check runs with `--dry-run` too. The writes are
//! each atomic, and ordered so that the configuration, which makes the
//! daemon act, comes last.
//!
//! This module must never write a slot or the bootloader environment, and
//! never overwrite what updraft itself recorded: a store with updraft's own
//! state is refused.

pub mod mender;
pub mod rauc;

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::bootloader;
use crate::config::Config;
use crate::error::{Context, Result};
use crate::fsutil;
use crate::lock::StateLock;
use crate::slot::SlotName;
use crate::store::{Event, Store};
use crate::{bail, err};

/// The updater taken over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Updater {
    Rauc,
    Mender,
}

impl Updater {
    pub fn parse(s: &str) -> Option<Updater> {
        match s {
            "rauc" => Some(Updater::Rauc),
            "mender" => Some(Updater::Mender),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Updater::Rauc => "RAUC",
            Updater::Mender => "Mender",
        }
    }
}

/// What the command line asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub from: Updater,
    /// Where the other updater's files are looked for (`/` on the device).
    pub root: PathBuf,
    /// The configuration file merged into and written.
    pub config: PathBuf,
    /// The running release, when the other updater does not name it.
    pub release: Option<String>,
    /// updraft's state directory, overriding what was found.
    pub state_dir: Option<PathBuf>,
    pub dry_run: bool,
}

/// What adopt found, in updraft's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub compatible: String,
    /// Slot A's and slot B's devices.
    pub slots: [PathBuf; 2],
    pub cmdline: PathBuf,
    /// `[bootloader]` keys and their TOML values.
    pub bootloader: Vec<(&'static str, String)>,
    /// The release each slot runs, as far as the other updater says.
    pub running: Running,
    pub state_dir: Option<PathBuf>,
    /// What was found, one line each, for the operator.
    pub facts: Vec<String>,
}

/// A file of the other updater's, under `root`.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// Read a small text file; `None` when it does not exist.
fn read_small(path: &Path, max: usize) -> Result<Option<String>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => bail!(Io, "{}: {e}", path.display()),
    };
    let mut bytes = Vec::new();
    file.take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() > max {
        bail!(Malformed, "{}: longer than {max} bytes", path.display());
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| err!(Malformed, "{}: not UTF-8 text", path.display()))
}

fn required(path: &Path, max: usize, what: &str) -> Result<String> {
    read_small(path, max)?.ok_or_else(|| err!(Config, "{}: not found ({what})", path.display()))
}

fn toml_str(s: &str) -> String {
    // TOML basic strings share JSON's escapes for everything written here.
    serde_json::Value::String(s.to_string()).to_string()
}

fn toml_path(p: &Path) -> String {
    toml_str(&p.to_string_lossy())
}

/// Each slot device must be a block device (or a link to one): updraft
/// writes slots as such, and a configuration naming anything else was
/// not meant for this device.
fn check_devices(slots: &[PathBuf; 2], names: [&str; 2], file: &str) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    for (dev, name) in slots.iter().zip(names) {
        match std::fs::metadata(dev) {
            Ok(m) if m.file_type().is_block_device() => {}
            Ok(_) => bail!(
                Slot,
                "{file}: {name} is {}, which is not a block device",
                dev.display()
            ),
            Err(e) => bail!(Slot, "{file}: {name} is {}: {e}", dev.display()),
        }
    }
    Ok(())
}

/// What RAUC knows, under `root`.
pub fn find_rauc(root: &Path) -> Result<Found> {
    let conf_path = under(root, "/etc/rauc/system.conf");
    let conf_name = conf_path.display().to_string();
    let text = required(&conf_path, rauc::MAX_FILE, "RAUC's system configuration")?;
    let sys = rauc::parse_system(&text, &conf_name).map_err(|e| err!(Config, "{e}"))?;
    let slots = [sys.pair[0].device.clone(), sys.pair[1].device.clone()];
    check_devices(
        &slots,
        [
            &format!("slot {}", sys.pair[0].name),
            &format!("slot {}", sys.pair[1].name),
        ],
        &conf_name,
    )?;
    let mut facts = vec![
        format!("{conf_name}: compatible {}", sys.compatible),
        format!(
            "{conf_name}: slot A = {} {} (bootname {}), slot B = {} {} (bootname {})",
            sys.pair[0].name,
            sys.pair[0].device.display(),
            sys.pair[0].bootname,
            sys.pair[1].name,
            sys.pair[1].device.display(),
            sys.pair[1].bootname
        ),
    ];
    if !sys.others.is_empty() {
        facts.push(format!(
            "{conf_name}: not adopted (no bootname of their own): {}",
            sys.others.join(", ")
        ));
    }
    let mut bootloader = vec![
        ("flow", toml_str("rauc")),
        ("bootname_a", toml_str(&sys.pair[0].bootname)),
        ("bootname_b", toml_str(&sys.pair[1].bootname)),
    ];
    match &sys.boot {
        rauc::Boot::Uboot => {
            let env = under(root, "/etc/fw_env.config");
            if !env.is_file() {
                bail!(
                    Config,
                    "{conf_name}: bootloader=uboot, but {} is not there: RAUC's fw_setenv has no environment to write either",
                    env.display()
                );
            }
            facts.push(format!("{conf_name}: bootloader uboot ({})", env.display()));
            bootloader.insert(0, ("kind", toml_str("uboot")));
            bootloader.push(("fw_env_config", toml_path(&env)));
        }
        rauc::Boot::Grub(env) => {
            facts.push(format!("{conf_name}: bootloader grub ({})", env.display()));
            bootloader.insert(0, ("kind", toml_str("grub")));
            bootloader.push(("grubenv", toml_path(env)));
        }
    }
    // The running release: the bundle version RAUC recorded for the booted
    // slot; which slot is booted is decided later, with the daemon's code.
    let mut versions = [None, None];
    if let Some(status) = &sys.status_file {
        let name = status.display().to_string();
        match read_small(status, rauc::MAX_FILE)? {
            Some(text) => {
                for (i, slot) in sys.pair.iter().enumerate() {
                    versions[i] = rauc::slot_version(&text, &name, &slot.name)
                        .map_err(|e| err!(Malformed, "{e}"))?
                        .map(|v| (v, format!("bundle.version of {} in {name}", slot.name)));
                }
            }
            None => facts.push(format!("{name}: not there (no install recorded by RAUC)")),
        }
    }
    let state_dir = sys
        .status_file
        .as_deref()
        .and_then(Path::parent)
        .map(|d| match d.parent() {
            // data-directory=/data/rauc: updraft's beside it, /data/updraft.
            Some(p) if d.file_name().is_some_and(|n| n == "rauc") => p.join("updraft"),
            _ => d.join("updraft"),
        });
    Ok(Found {
        compatible: sys.compatible,
        slots,
        cmdline: under(root, "/proc/cmdline"),
        bootloader,
        running: Running::PerSlot(versions),
        state_dir,
        facts,
    })
}

/// What Mender knows, under `root`.
pub fn find_mender(root: &Path) -> Result<Found> {
    let main = under(root, "/etc/mender/mender.conf");
    let fallback = under(root, "/var/lib/mender/mender.conf");
    let mut files = Vec::new();
    for p in [&main, &fallback] {
        if let Some(text) = read_small(p, mender::MAX_FILE)? {
            files.push((p.display().to_string(), text));
        }
    }
    if files.is_empty() {
        bail!(
            Config,
            "neither {} nor {} is there: no Mender configuration to adopt",
            main.display(),
            fallback.display()
        );
    }
    let named: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let conf_names = files
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(" and ");
    let rootfs = mender::parse_conf(&named).map_err(|e| err!(Config, "{e}"))?;
    let slots = [rootfs.a.clone(), rootfs.b.clone()];
    check_devices(&slots, ["RootfsPartA", "RootfsPartB"], &conf_names)?;
    let part = |p: &Path| {
        let resolved = std::fs::canonicalize(p).ok();
        mender::partition_number(p, resolved.as_deref())
            .map_err(|e| err!(Config, "{conf_names}: {e}"))
    };
    let parts = [part(&rootfs.a)?, part(&rootfs.b)?];
    if parts[0] == parts[1] {
        bail!(
            Config,
            "{conf_names}: RootfsPartA and RootfsPartB are both partition {}: Mender's boot scripts could not tell them apart",
            parts[0]
        );
    }
    let type_file = under(root, "/var/lib/mender/device_type");
    let device_type = mender::parse_assignment(
        &required(&type_file, mender::MAX_FILE, "Mender's device type")?,
        &type_file.display().to_string(),
        "device_type",
    )
    .map_err(|e| err!(Config, "{e}"))?;
    let info = under(root, "/etc/mender/artifact_info");
    let artifact = match read_small(&info, mender::MAX_FILE)? {
        Some(text) => Some(
            mender::parse_assignment(&text, &info.display().to_string(), "artifact_name")
                .map_err(|e| err!(Malformed, "{e}"))?,
        ),
        None => None,
    };
    let mut facts = vec![
        format!(
            "{conf_names}: slot A = RootfsPartA {} (partition {}), slot B = RootfsPartB {} (partition {})",
            rootfs.a.display(),
            parts[0],
            rootfs.b.display(),
            parts[1]
        ),
        format!("{}: device type {device_type}", type_file.display()),
    ];
    let grubenv = under(root, "/boot/efi/grub-mender-grubenv");
    let fw_env = under(root, "/etc/fw_env.config");
    let mut bootloader = vec![
        ("flow", toml_str("mender")),
        ("boot_partition_a", parts[0].to_string()),
        ("boot_partition_b", parts[1].to_string()),
    ];
    if grubenv.is_dir() {
        facts.push(format!(
            "bootloader grub, Mender's environment {}",
            grubenv.display()
        ));
        bootloader.insert(0, ("kind", toml_str("grub")));
        bootloader.push(("mender_grubenv", toml_path(&grubenv)));
    } else if fw_env.is_file() {
        facts.push(format!("bootloader uboot ({})", fw_env.display()));
        bootloader.insert(0, ("kind", toml_str("uboot")));
        bootloader.push(("fw_env_config", toml_path(&fw_env)));
    } else {
        bail!(
            Config,
            "neither Mender's GRUB environment {} nor a U-Boot environment configuration {} is there",
            grubenv.display(),
            fw_env.display()
        );
    }
    let data = under(root, "/data");
    let state_dir = data.is_dir().then(|| data.join("updraft"));
    // Mender's artifact_info is the booted root file system's own.
    let release = artifact.map(|a| (a, format!("artifact_name in {}", info.display())));
    Ok(Found {
        compatible: device_type,
        slots,
        cmdline: under(root, "/proc/cmdline"),
        bootloader,
        running: Running::OfBooted(release),
        state_dir,
        facts,
    })
}

/// A release and what names it ("bundle.version of rootfs.0 in …").
pub type Named = (String, String);

/// What the other updater says runs where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Running {
    /// RAUC's status file: a version per slot (A, B).
    PerSlot([Option<Named>; 2]),
    /// Mender's `artifact_info`: the booted root file system's own.
    OfBooted(Option<Named>),
}

impl Running {
    /// The release in `booted`, when the other updater names it.
    pub fn of(&self, booted: SlotName) -> Option<&Named> {
        match self {
            Running::PerSlot(v) => v[match booted {
                SlotName::A => 0,
                SlotName::B => 1,
            }]
            .as_ref(),
            Running::OfBooted(r) => r.as_ref(),
        }
    }
}

// ---- the configuration, as text --------------------------------------------

/// Keys of one section adopt sets, and keys of the base it drops besides
/// (another bootloader kind's files, which would mislead a reader).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edit {
    pub section: &'static str,
    pub set: Vec<(&'static str, String)>,
    pub drop: &'static [&'static str],
}

/// The `[bootloader]` keys naming one kind's environment: adopt writes
/// the ones its kind needs and drops the others from the base.
const BOOT_ENVIRONMENT: &[&str] = &[
    "kind",
    "flow",
    "bootname_a",
    "bootname_b",
    "boot_partition_a",
    "boot_partition_b",
    "path",
    "fw_env_config",
    "grubenv",
    "mender_grubenv",
    "script",
    "autoboot",
    "device_tree",
];

/// What adopt writes into the configuration for `found`.
pub fn edits(found: &Found, state_dir: Option<&Path>) -> Vec<Edit> {
    let mut system = Vec::new();
    if let Some(d) = state_dir {
        system.push(("state_dir", toml_path(d)));
    }
    vec![
        Edit {
            section: "device",
            set: vec![("compatible", toml_str(&found.compatible))],
            drop: &[],
        },
        Edit {
            section: "slots",
            set: vec![
                ("a", toml_path(&found.slots[0])),
                ("b", toml_path(&found.slots[1])),
                ("cmdline", toml_path(&found.cmdline)),
            ],
            drop: &[],
        },
        Edit {
            section: "bootloader",
            set: found.bootloader.clone(),
            drop: BOOT_ENVIRONMENT,
        },
        Edit {
            section: "system",
            set: system,
            drop: &[],
        },
    ]
}

/// The name of a `[table]` or `[[array]]` header line.
fn header(line: &str) -> Option<&str> {
    let t = line.trim();
    let inner = t.strip_prefix("[[").and_then(|r| r.strip_suffix("]]"));
    inner
        .or_else(|| t.strip_prefix('[').and_then(|r| r.strip_suffix(']')))
        .map(str::trim)
}

/// The key of a `key = value` line.
fn key_of(line: &str) -> Option<&str> {
    let t = line.trim();
    if t.starts_with('#') {
        return None;
    }
    t.split_once('=').map(|(k, _)| k.trim())
}

/// `base` with `edits` applied: in each edited section, the keys set and
/// dropped are removed and the keys set are written right after its
/// header; a section the base lacks is appended. Everything else (other
/// sections, comments, the order) is kept as it was.
pub fn merge(base: &str, edits: &[Edit], note: &str) -> String {
    let mut out = String::new();
    let mut current: Option<&Edit> = None;
    let mut seen = Vec::new();
    let emit = |out: &mut String, e: &Edit| {
        if !e.set.is_empty() {
            out.push_str(&format!("# {note}\n"));
        }
        for (k, v) in &e.set {
            out.push_str(&format!("{k} = {v}\n"));
        }
    };
    for line in base.lines() {
        if let Some(name) = header(line) {
            current = edits
                .iter()
                .find(|e| e.section == name && !line.trim().starts_with("[["));
            out.push_str(line);
            out.push('\n');
            if let Some(e) = current {
                seen.push(e.section);
                emit(&mut out, e);
            }
            continue;
        }
        if let Some(e) = current {
            // What an earlier adopt wrote is written afresh.
            if line.trim() == format!("# {note}") {
                continue;
            }
            if let Some(k) = key_of(line) {
                if e.set.iter().any(|(s, _)| *s == k) || e.drop.contains(&k) {
                    continue;
                }
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    for e in edits {
        if !seen.contains(&e.section) && !e.set.is_empty() {
            if !out.is_empty() && !out.ends_with("\n\n") {
                out.push('\n');
            }
            out.push_str(&format!("[{}]\n", e.section));
            emit(&mut out, e);
        }
    }
    out
}

// ---- the command --------------------------------------------------------------

/// The largest configuration file merged into.
const MAX_CONFIG: usize = 1 << 20;

/// Run `updraft adopt`: find, check, print, and (unless `dry_run`) write.
pub fn run(opts: &Options) -> Result<()> {
    let from = opts.from.name();
    let found = match opts.from {
        Updater::Rauc => find_rauc(&opts.root),
        Updater::Mender => find_mender(&opts.root),
    }
    .map_err(|e| e.wrap(format!("adopting from {from}")))?;
    for f in &found.facts {
        println!("found: {f}");
    }
    let base = read_small(&opts.config, MAX_CONFIG)?.unwrap_or_default();
    let state_dir = opts.state_dir.clone().or_else(|| found.state_dir.clone());
    let note = format!(
        "set by `updraft adopt --from {}`",
        from.to_ascii_lowercase()
    );
    let text = merge(&base, &edits(&found, state_dir.as_deref()), &note);
    let cfg = Config::parse(&text).map_err(|e| {
        e.wrap(format!(
            "the configuration adopt would write to {} does not load (adopt keeps its [server], [trust] and everything else it does not set: put the fleet's settings there first)",
            opts.config.display()
        ))
    })?;
    cfg.trust_anchor()
        .map_err(|e| e.wrap(format!("{}: trust", opts.config.display())))?;

    // A device updraft already manages is not adopted again.
    let db = cfg.db_path();
    if db.exists() {
        let store = Store::open_readonly(&db)?;
        if !store.is_blank()? {
            bail!(
                Config,
                "adopting from {from}: {} already holds updraft's own state: this device is updraft's already (adopt is for a device updraft has never updated)",
                db.display()
            );
        }
    }

    // The daemon's own code decides which slot is booted and what boots next.
    let booted = bootloader::booted_slot(&cfg)
        .map_err(|e| e.wrap(format!("adopting from {from}: the booted slot")))?;
    let mut boot = bootloader::from_config(&cfg)?;
    let selection = boot.read().map_err(|e| {
        e.wrap(format!(
            "adopting from {from}: {} cannot be read with {from}'s boot flow",
            boot.describe()
        ))
    })?;
    println!(
        "found: booted slot {booted} ({}); boot selection {selection}",
        cfg.slots.cmdline.display()
    );
    if selection.next_boot() != Some(booted) || !selection.slot(booted).bootable {
        bail!(
            Bootloader,
            "adopting from {from}: the booted slot is {booted} but the bootloader would boot {} next ({selection}): {from} has a switch or a trial boot pending; let it finish (reboot, and commit or roll back with {from}) before adopting",
            selection
                .next_boot()
                .map_or("nothing".to_string(), |s| format!("slot {s}"))
        );
    }
    let (release, named_by) = match (&opts.release, found.running.of(booted)) {
        (Some(v), _) => (v.clone(), "--release".to_string()),
        (None, Some((v, by))) => (v.clone(), by.clone()),
        (None, None) => bail!(
            Config,
            "adopting from {from}: {from} names no release for the booted slot {booted}: give it with --release VERSION"
        ),
    };
    if !crate::manifest::version_ok(&release) {
        bail!(
            Config,
            "adopting from {from}: release {release:?} ({named_by}) is not a release version: 1 to 128 characters, no spaces"
        );
    }
    println!("found: release {release} running in slot {booted} ({named_by})");

    // What updraft already knows must agree, or adopt is not for this device.
    let marker_path = cfg.device.release_file.clone();
    let marker = crate::provision::read_marker(&marker_path)?;
    if let Some(m) = &marker {
        if m.version != release {
            bail!(
                Config,
                "adopting from {from}: the release marker {} names release {}, {from} release {release}: remove the marker or give --release",
                marker_path.display(),
                m.version
            );
        }
    }

    let changed_config = base != text;
    if opts.dry_run {
        println!(
            "would write: {} ({})",
            opts.config.display(),
            if changed_config { "below" } else { "unchanged" }
        );
        if marker.is_none() {
            println!(
                "would write: {} (UPDRAFT_RELEASE={release})",
                marker_path.display()
            );
        }
        println!(
            "would write: {} (history: adopted release {release} in slot {booted} from {from})",
            db.display()
        );
        if changed_config {
            print!("{text}");
        }
        println!("nothing written (--dry-run)");
        return Ok(());
    }

    let _lock = StateLock::acquire(&cfg.lock_path())?;
    if marker.is_none() {
        if let Some(dir) = marker_path.parent() {
            fsutil::ensure_dir(dir, 0o755)?;
        }
        fsutil::atomic_write(
            &marker_path,
            format!("# adopted from {from}\nUPDRAFT_RELEASE={release}\n").as_bytes(),
            0o644,
        )?;
        println!(
            "wrote: {} (UPDRAFT_RELEASE={release})",
            marker_path.display()
        );
    }
    fsutil::ensure_dir(&cfg.system.state_dir, 0o755)?;
    let store = Store::open(&db)?;
    let detail = format!(
        "from {from}: {named_by}; slots {} and {}",
        found.slots[0].display(),
        found.slots[1].display()
    );
    let recorded = store.newest_event(&["adopted"])?.is_some_and(|e| {
        e.release.as_deref() == Some(release.as_str()) && e.slot.as_deref() == Some(booted.as_str())
    });
    if recorded {
        println!("unchanged: {} (adoption recorded)", db.display());
    } else {
        store.add_history(&Event {
            event: "adopted",
            release: Some(&release),
            slot: Some(booted),
            detail: Some(&detail),
        })?;
        println!(
            "wrote: {} (history: adopted release {release} in slot {booted} from {from})",
            db.display()
        );
    }
    if changed_config {
        if !base.is_empty() {
            let backup = PathBuf::from(format!("{}.before-adopt", opts.config.display()));
            if !backup.exists() {
                fsutil::atomic_write(&backup, base.as_bytes(), 0o644)?;
                println!("wrote: {} (the configuration before)", backup.display());
            }
        }
        fsutil::atomic_write(&opts.config, text.as_bytes(), 0o644)?;
        println!("wrote: {}", opts.config.display());
    } else {
        println!("unchanged: {}", opts.config.display());
    }
    log::info!(
        "adopted: release {release} slot {booted}: from {from}; configuration {}",
        opts.config.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(
        section: &'static str,
        set: &[(&'static str, &str)],
        drop: &'static [&'static str],
    ) -> Edit {
        Edit {
            section,
            set: set.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            drop,
        }
    }

    #[test]
    fn merging_replaces_the_keys_set_keeps_everything_else_and_appends_missing_sections() {
        let base = "\
# fleet settings
[server]
manifest_url = \"https://u/m.json\"

[device]
compatible = \"old\"
id_file = \"/x\"

[bootloader]
kind = \"file\"
path = \"/boot.state\"
tries = 5

[[components]]
name = \"app\"
";
        let edits = [
            edit("device", &[("compatible", "\"acme\"")], &[]),
            edit(
                "bootloader",
                &[("kind", "\"uboot\""), ("flow", "\"rauc\"")],
                BOOT_ENVIRONMENT,
            ),
            edit("slots", &[("a", "\"/dev/a\"")], &[]),
            edit("system", &[], &[]),
        ];
        let got = merge(base, &edits, "note");
        let want = "\
# fleet settings
[server]
manifest_url = \"https://u/m.json\"

[device]
# note
compatible = \"acme\"
id_file = \"/x\"

[bootloader]
# note
kind = \"uboot\"
flow = \"rauc\"
tries = 5

[[components]]
name = \"app\"

[slots]
# note
a = \"/dev/a\"
";
        assert_eq!(got, want);
        // Merging again changes nothing more.
        assert_eq!(merge(&got, &edits, "note"), got, "merging again changed it");
    }

    #[test]
    fn an_array_table_of_the_same_name_is_not_an_edited_section() {
        let got = merge(
            "[[slots]]\na = 1\n",
            &[edit("slots", &[("a", "2")], &[])],
            "n",
        );
        assert_eq!(got, "[[slots]]\na = 1\n\n[slots]\n# n\na = 2\n");
    }

    #[test]
    fn the_release_of_the_booted_slot_comes_from_its_own_updater_record() {
        let per = Running::PerSlot([None, Some(("2.0".into(), "status".into()))]);
        assert_eq!(per.of(SlotName::A), None);
        assert_eq!(per.of(SlotName::B).map(|r| r.0.as_str()), Some("2.0"));
        let booted = Running::OfBooted(Some(("r7".into(), "artifact_info".into())));
        assert_eq!(booted.of(SlotName::A), booted.of(SlotName::B));
    }
}
