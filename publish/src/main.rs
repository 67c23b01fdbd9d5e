//! `updraft-publish`: keys, key documents, releases and their checks.
//!
//! Arguments are parsed by hand against one table, [`PROGRAM`]: every
//! subcommand's usage, options and examples. A subcommand accepts exactly
//! the options listed there, `--help` prints its entry and `completions
//! bash` is made from it (see [`updraft::help`]).

use std::path::PathBuf;
use std::process::ExitCode;

use updraft::help::{self, Command, Opt, Program};
use updraft_publish::bundle;
use updraft_publish::description::{self, Description};
use updraft_publish::keys::{self, Key, KeyDocSpec};
use updraft_publish::release::{
    self, ComponentSpec, DEFAULT_FRAME_SIZE, DEFAULT_LEVEL, ReleaseSpec,
};
use updraft_publish::reports;
use updraft_publish::verify;

const fn opt(name: &'static str, value: &'static str, help: &'static str) -> Opt {
    Opt {
        name,
        short: "",
        value,
        help,
    }
}

/// Every subcommand: usage, options, examples.
const PROGRAM: Program = Program {
    name: "updraft-publish",
    version: env!("CARGO_PKG_VERSION"),
    summary: "keys, key documents and signed releases for updraft devices",
    usage: "updraft-publish COMMAND [OPTIONS]",
    common: &[],
    commands: &[
        Command {
            name: "keygen",
            summary: "make an ed25519 key pair: PREFIX.key (mode 0600) and PREFIX.pub",
            usage: "updraft-publish keygen --out PREFIX",
            about: "Refuses to overwrite an existing file; creates the directory.",
            options: &[opt(
                "--out",
                "PREFIX",
                "write PREFIX.key and PREFIX.pub (required)",
            )],
            words: &[],
            examples: &["updraft-publish keygen --out keys/release"],
        },
        Command {
            name: "keys",
            summary: "write a key document, DIR/keys/N.json, signed by root keys",
            usage: "updraft-publish keys --root-key R.key [--root-key R2.key]... \\
      --release-pub K.pub [--release-pub K2.pub]... [--threshold N] \\
      [--root-pub NEWROOT.pub]... [--root-threshold N] --version N --out DIR",
            about: "",
            options: &[
                opt(
                    "--root-key",
                    "R.key",
                    "root key that signs the document (repeatable, required)",
                ),
                opt(
                    "--release-pub",
                    "K.pub",
                    "release key the document lists (repeatable, required)",
                ),
                opt("--threshold", "N", "release key threshold (default 1)"),
                opt(
                    "--root-pub",
                    "NEWROOT.pub",
                    "root key the document lists (repeatable; default: the signers)",
                ),
                opt("--root-threshold", "N", "root key threshold (default 1)"),
                opt("--version", "N", "document version, 1 or more (required)"),
                opt("--out", "DIR", "release directory (required)"),
            ],
            words: &[],
            examples: &[
                "updraft-publish keys --root-key keys/root.key --release-pub keys/release.pub --version 1 --out site",
            ],
        },
        Command {
            name: "release",
            summary: "sign a release: framed artifact, deltas and DIR/manifest.json",
            usage: "updraft-publish release --key K.key [--key K2.key]... [--description RELEASE.toml] \\
      --version V --compatible HW [--compatible HW2]... [--image NEW.img [--from OLD.img]...] \\
      [--app NAME[@VERSION]=DIR]... [--boot NAME[@VERSION]=DIR] [--command NAME[@VERSION]=FILE]... \\
      [--slot-name NAME] \\
      [--channel NAME] [--serial N] [--allow-serial-jump] [--security-version N] [--expires 30d] \\
      [--rollout PERCENT] [--frame-size BYTES] [--level N] [--threads N] [--delta-memory MIB] \
      [--attest-with BUILDER.key [--builder-id URI]] [--bundle FILE.updraft] --out DIR",
            about: "",
            options: &[
                opt(
                    "--key",
                    "K.key",
                    "release key that signs the manifest (repeatable, required)",
                ),
                opt(
                    "--description",
                    "RELEASE.toml",
                    "the release described in a file (docs/components.md); flags beside it add components and override its values",
                ),
                opt(
                    "--version",
                    "V",
                    "the release version (required, here or in --description)",
                ),
                opt(
                    "--compatible",
                    "HW",
                    "hardware id or comma-separated ids (repeatable; required, here or in --description)",
                ),
                opt(
                    "--image",
                    "NEW.img",
                    "the new slot image (required unless --app keeps the slot of DIR/manifest.json)",
                ),
                opt(
                    "--app",
                    "NAME[@VERSION]=DIR",
                    "an application tree published as component NAME (repeatable; makes a release of components, spec_version 2)",
                ),
                opt(
                    "--boot",
                    "NAME[@VERSION]=DIR",
                    "the slot's boot files (kernel, device trees, firmware) as component NAME, installed and tried with the slot (spec_version 2)",
                ),
                opt(
                    "--command",
                    "NAME[@VERSION]=FILE",
                    "a payload for the handler of command component NAME (repeatable; spec_version 2)",
                ),
                opt(
                    "--slot-name",
                    "NAME",
                    "the slot component's name in a release of components (default rootfs)",
                ),
                opt(
                    "--from",
                    "OLD.img",
                    "an older image to make a delta from (repeatable)",
                ),
                opt(
                    "--channel",
                    "NAME",
                    "the channel signed into the manifest (default stable)",
                ),
                opt(
                    "--serial",
                    "N",
                    "manifest serial (default: the verified one in DIR plus 1, or 1)",
                ),
                opt(
                    "--allow-serial-jump",
                    "",
                    "accept a serial more than 2^32 above the previous one",
                ),
                opt(
                    "--security-version",
                    "N",
                    "device-global security version; devices with a hardware rollback floor refuse releases below it (default: the one in DIR, or 0)",
                ),
                opt(
                    "--expires",
                    "DURATION",
                    "validity from now: 30d, 12h, 1w (default 30d)",
                ),
                opt(
                    "--rollout",
                    "PERCENT",
                    "share of devices that install it, 0 to 100",
                ),
                opt(
                    "--frame-size",
                    "BYTES",
                    "decoded bytes per frame, 1 to 8 MiB (default 2 MiB)",
                ),
                opt(
                    "--attest-with",
                    "BUILDER.key",
                    "sign a build provenance attestation (in-toto, SLSA provenance v1) naming the release's artifacts with this builder key (docs/manifest.md)",
                ),
                opt(
                    "--builder-id",
                    "URI",
                    "the builder id signed into the attestation (default urn:updraft:builder:<key id>)",
                ),
                opt(
                    "--bundle",
                    "FILE.updraft",
                    "also write DIR as one bundle file (as `updraft-publish bundle`)",
                ),
                opt("--level", "N", "zstd level (default 12)"),
                opt(
                    "--threads",
                    "N",
                    "frames compressed in parallel (default: the CPUs)",
                ),
                opt(
                    "--delta-memory",
                    "MIB",
                    "memory a delta is made within, at least 16 (default 2048)",
                ),
                opt("--out", "DIR", "release directory (required)"),
            ],
            words: &[],
            examples: &[
                "updraft-publish release --key keys/release.key --version 1.1 --compatible rpi4 \\
      --image rootfs-1.1.ext4 --from rootfs-1.0.ext4 --out site",
            ],
        },
        Command {
            name: "bundle",
            summary: "write a published release as one file: a cpio bundle a device installs from",
            usage: "updraft-publish bundle --dir DIR --out FILE.updraft [--part-size BYTES]",
            about: "The bundle holds an SWUpdate-style sw-description, DIR/manifest.json, every key \
document in DIR/keys and the artifacts the manifest names (docs/manifest.md, bundles). \
An artifact larger than the part size is stored in several entries (the image cut at frame \
boundaries). Nothing is signed again: the manifest's signatures and hashes cover it.",
            options: &[
                opt(
                    "--dir",
                    "DIR",
                    "the release directory `release` wrote (required)",
                ),
                opt("--out", "FILE.updraft", "the bundle to write (required)"),
                opt(
                    "--part-size",
                    "BYTES",
                    "largest entry an artifact is stored in, 1 to 4294967295 (the default)",
                ),
            ],
            words: &[],
            examples: &["updraft-publish bundle --dir site --out release-1.1.updraft"],
        },
        Command {
            name: "modules",
            summary: "write a published release of components as a DDI distribution set's software modules",
            usage: "updraft-publish modules --dir DIR --out OUTDIR",
            about: "One directory per component below OUTDIR, each a software module to upload to a \
hawkBit server, every file under its own name (docs/fleet-server.md): the slot's holds \
manifest.json, the key documents and the slot's artifact and deltas; an app's or the boot \
files' holds its index and its pack (its files, read by Range requests); a command's its \
payload. Nothing is signed again.",
            options: &[
                opt(
                    "--dir",
                    "DIR",
                    "the release directory `release` wrote (required)",
                ),
                opt(
                    "--out",
                    "OUTDIR",
                    "where the modules are written; must not exist (required)",
                ),
            ],
            words: &[],
            examples: &["updraft-publish modules --dir site --out modules-2.1"],
        },
        Command {
            name: "verify",
            summary: "check a release as a device would: signatures, payload, artifacts",
            usage: "updraft-publish verify --pub K.pub [--pub K2.pub]... [--threshold N] \\
      [--builder-pub B.pub]... [--builder-threshold N] DIR/manifest.json",
            about: "",
            options: &[
                opt(
                    "--pub",
                    "K.pub",
                    "release public key (repeatable, required)",
                ),
                opt("--threshold", "N", "signatures needed (default 1)"),
                opt(
                    "--builder-pub",
                    "B.pub",
                    "builder public key: the attestation must be there and signed by it, as a device with [provenance] builders requires (repeatable)",
                ),
                opt(
                    "--builder-threshold",
                    "N",
                    "builder signatures needed (default 1)",
                ),
            ],
            words: &[],
            examples: &["updraft-publish verify --pub keys/release.pub site/manifest.json"],
        },
        Command {
            name: "verify-reports",
            summary: "check devices' signed reports: signatures, and counters rising by one",
            usage: "updraft-publish verify-reports --device-key PUB [--device-key PUB2]... REPORTS...",
            about: "Each REPORTS file holds one report as the server received it, or one per line (JSON lines), in the order they arrived; files are read in the order given. Every report must be signed by one of the device keys (`device-key.pub` of a device, or the public_key `updraft status` shows, in base64), and each device's report_counter must go up by one: a replay, a report out of order, missing counters and a forged or altered report are refused, each named with its file, line and counter. Exits 1 when any report is refused.",
            options: &[opt(
                "--device-key",
                "PUB",
                "a device's public key: a PEM file, or the raw key in base64 (repeatable, required)",
            )],
            words: &[],
            examples: &["updraft-publish verify-reports --device-key device-key.pub reports.jsonl"],
        },
        Command {
            name: "inspect",
            summary: "print what a manifest or key document says, without verifying it",
            usage: "updraft-publish inspect [--json] DIR/manifest.json",
            about: "",
            options: &[opt("--json", "", "print the payload as JSON")],
            words: &[],
            examples: &[
                "updraft-publish inspect site/manifest.json",
                "updraft-publish inspect --json site/keys/1.json",
            ],
        },
        Command {
            name: "help",
            summary: "describe a command",
            usage: "updraft-publish help [COMMAND]",
            about: "",
            options: &[],
            words: &[],
            examples: &["updraft-publish help release"],
        },
        Command {
            name: "completions",
            summary: "print the bash completion script",
            usage: "updraft-publish completions bash",
            about: "",
            options: &[],
            words: &["bash"],
            examples: &[
                "updraft-publish completions bash > /usr/share/bash-completion/completions/updraft-publish",
            ],
        },
    ],
    examples: &[
        "updraft-publish keygen --out keys/release",
        "updraft-publish release --key keys/release.key --version 1.0 --compatible rpi4 --image rootfs.ext4 --out site",
    ],
};

/// Options of one subcommand: repeated values collected in order.
struct Flags {
    values: Vec<(String, String)>,
    switches: Vec<String>,
    positional: Vec<String>,
}

impl Flags {
    /// Parse against the options `cmd` lists (`--name value`,
    /// `--name=value`, switches); anything else starting with `-` is an
    /// unknown option.
    fn parse(args: &[String], cmd: &Command) -> Result<Flags, String> {
        let mut f = Flags {
            values: Vec::new(),
            switches: Vec::new(),
            positional: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if !a.starts_with('-') || a == "-" {
                f.positional.push(a.clone());
                continue;
            }
            let (flag, inline) = match a.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            let Some(o) = cmd.options.iter().find(|o| o.is(flag)) else {
                return Err(format!("unknown option {flag} for {}", cmd.name));
            };
            let name = o.name.trim_start_matches('-').to_string();
            if !o.value.is_empty() {
                let v = match inline {
                    Some(v) => v,
                    None => it.next().ok_or(format!("{flag} needs a value"))?.clone(),
                };
                f.values.push((name, v));
            } else if inline.is_some() {
                return Err(format!("{flag} takes no value"));
            } else {
                f.switches.push(name);
            }
        }
        Ok(f)
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.values
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn one(&self, name: &str) -> Result<Option<&str>, String> {
        match self.all(name).as_slice() {
            [] => Ok(None),
            [v] => Ok(Some(v)),
            _ => Err(format!("--{name} given more than once")),
        }
    }

    fn required(&self, name: &str) -> Result<&str, String> {
        self.one(name)?.ok_or(format!("--{name} is required"))
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, String> {
        self.one(name)?
            .map(|v| {
                v.parse::<T>()
                    .map_err(|_| format!("--{name} {v:?} is not a valid number"))
            })
            .transpose()
    }

    fn switch(&self, name: &str) -> bool {
        self.switches.iter().any(|s| s == name)
    }
}

/// How a command ends when it does not succeed.
enum Failure {
    /// Exit 2: a usage error, with the command it concerns once known.
    Usage(Option<&'static Command>, String),
    /// Exit 1.
    Failed(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Failure::Failed(s)
    }
}

fn usage<T>(r: Result<T, String>) -> Result<T, Failure> {
    r.map_err(|m| Failure::Usage(None, m))
}

fn bad(msg: &str) -> Failure {
    Failure::Usage(None, msg.to_string())
}

fn run(args: &[String]) -> Result<(), Failure> {
    let Some((cmd, rest)) = args.split_first() else {
        return Err(bad("no command given"));
    };
    if help::is_help(cmd) {
        print!("{}", PROGRAM.overview());
        return Ok(());
    }
    if help::VERSION.is(cmd) {
        println!("updraft-publish {}", env!("CARGO_PKG_VERSION"));
        return Ok(());
    }
    let c = PROGRAM
        .command(cmd)
        .ok_or_else(|| bad(&format!("unknown command {cmd:?}")))?;
    if rest.iter().any(|a| help::is_help(a)) {
        print!("{}", PROGRAM.help(c));
        return Ok(());
    }
    command(c, rest).map_err(|f| match f {
        Failure::Usage(None, m) => Failure::Usage(Some(c), m),
        f => f,
    })
}

fn command(c: &'static Command, rest: &[String]) -> Result<(), Failure> {
    let f = usage(Flags::parse(rest, c))?;
    let takes_args = !matches!(c.name, "keygen" | "keys" | "release" | "bundle");
    if let Some(first) = f.positional.first().filter(|_| !takes_args) {
        return Err(bad(&format!("{} takes no argument {first:?}", c.name)));
    }
    match c.name {
        "keygen" => {
            let out = usage(f.required("out"))?;
            let (k, p) = keys::keygen(&PathBuf::from(out))?;
            println!("wrote {} and {}", k.display(), p.display());
        }
        "keys" => {
            let signers = f
                .all("root-key")
                .iter()
                .map(|p| Key::load(&PathBuf::from(p)))
                .collect::<Result<Vec<_>, _>>()?;
            if signers.is_empty() {
                return Err(Failure::Usage(None, "--root-key is required".into()));
            }
            let release_keys = f
                .all("release-pub")
                .iter()
                .map(|p| keys::load_pub(&PathBuf::from(p)))
                .collect::<Result<Vec<_>, _>>()?;
            if release_keys.is_empty() {
                return Err(Failure::Usage(None, "--release-pub is required".into()));
            }
            let root_pubs = f.all("root-pub");
            let root = if root_pubs.is_empty() {
                signers.iter().map(|k| k.public.clone()).collect()
            } else {
                root_pubs
                    .iter()
                    .map(|p| keys::load_pub(&PathBuf::from(p)))
                    .collect::<Result<Vec<_>, _>>()?
            };
            let version: u64 = usage(f.number("version"))?
                .ok_or(Failure::Usage(None, "--version is required".into()))?;
            let out = PathBuf::from(usage(f.required("out"))?);
            let spec = KeyDocSpec {
                version,
                signers: &signers,
                root,
                root_threshold: usage(f.number("root-threshold"))?.unwrap_or(1),
                release: release_keys,
                release_threshold: usage(f.number("threshold"))?.unwrap_or(1),
            };
            let doc = keys::key_document(&spec)?;
            let dir = out.join("keys");
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
            let path = dir.join(format!("{version}.json"));
            release::write_atomic(&path, &doc)?;
            println!("wrote {}", path.display());
        }
        "release" => {
            let keys = f
                .all("key")
                .iter()
                .map(|p| Key::load(&PathBuf::from(p)))
                .collect::<Result<Vec<_>, _>>()?;
            if keys.is_empty() {
                return Err(Failure::Usage(None, "--key is required".into()));
            }
            let described = match usage(f.one("description"))? {
                None => Description::default(),
                Some(file) => {
                    let path = PathBuf::from(file);
                    let text = std::fs::read_to_string(&path).map_err(|e| {
                        Failure::Usage(
                            None,
                            format!("--description: reading {}: {e}", path.display()),
                        )
                    })?;
                    description::parse(&text, &path).map_err(|e| Failure::Usage(None, e))?
                }
            };
            let mut compatible: Vec<String> = f
                .all("compatible")
                .iter()
                .flat_map(|c| c.split(','))
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect();
            if compatible.is_empty() {
                compatible = described.compatible.clone();
            }
            if compatible.is_empty() {
                return Err(Failure::Usage(None, "--compatible is required".into()));
            }
            let version = match (usage(f.one("version"))?, &described.version) {
                (Some(v), _) => v.to_string(),
                (None, Some(v)) => v.clone(),
                (None, None) => {
                    return Err(Failure::Usage(
                        None,
                        "--version is required (or version in --description)".into(),
                    ));
                }
            };
            let mut apps = described.apps.clone();
            apps.extend(
                f.all("app")
                    .iter()
                    .map(|a| ComponentSpec::parse(a))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| Failure::Usage(None, format!("--app {e}")))?,
            );
            let boot = match usage(f.one("boot"))? {
                Some(b) => Some(
                    ComponentSpec::parse(b)
                        .map_err(|e| Failure::Usage(None, format!("--boot {e}")))?,
                ),
                None => described.boot.clone(),
            };
            let mut commands = described.commands.clone();
            commands.extend(
                f.all("command")
                    .iter()
                    .map(|a| ComponentSpec::parse(a))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| Failure::Usage(None, format!("--command {e}")))?,
            );
            let mut from: Vec<PathBuf> = described.deltas_from.clone();
            from.extend(f.all("from").iter().map(PathBuf::from));
            let expires = match usage(f.one("expires"))? {
                Some(e) => updraft::timestamp::parse_duration(e)
                    .map_err(|e| Failure::Usage(None, format!("--expires: {e}")))?,
                None => std::time::Duration::from_secs(30 * 86_400),
            };
            let rollout: Option<f64> = usage(f.number("rollout"))?;
            if let Some(r) = rollout {
                if !(0.0..=100.0).contains(&r) {
                    return Err(Failure::Usage(
                        None,
                        "--rollout must be between 0 and 100".into(),
                    ));
                }
            }
            let threads = usage(f.number("threads"))?.unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            });
            let delta_memory = match usage(f.number::<usize>("delta-memory"))? {
                None => updraft_publish::delta::DEFAULT_MEMORY_BUDGET,
                Some(mib) if (16..=1 << 24).contains(&mib) => mib << 20,
                Some(_) => {
                    return Err(Failure::Usage(
                        None,
                        "--delta-memory must be between 16 and 16777216 (MiB)".into(),
                    ));
                }
            };
            let spec = ReleaseSpec {
                keys,
                version,
                compatible,
                image: usage(f.one("image"))?
                    .map(PathBuf::from)
                    .or(described.image.clone()),
                slot_name: usage(f.one("slot-name"))?
                    .map(str::to_string)
                    .or(described.slot_name.clone())
                    .unwrap_or_else(|| "rootfs".into()),
                apps,
                boot,
                commands,
                from,
                serial: usage(f.number("serial"))?,
                allow_serial_jump: f.switch("allow-serial-jump"),
                security_version: usage(f.number("security-version"))?
                    .or(described.security_version),
                channel: usage(f.one("channel"))?
                    .map(str::to_string)
                    .or(described.channel.clone())
                    .unwrap_or_else(|| "stable".into()),
                expires,
                rollout,
                out: PathBuf::from(usage(f.required("out"))?),
                frame_size: usage(f.number("frame-size"))?.unwrap_or(DEFAULT_FRAME_SIZE),
                level: usage(f.number("level"))?.unwrap_or(DEFAULT_LEVEL),
                threads,
                delta_memory,
                attest: match usage(f.one("attest-with"))? {
                    Some(p) => {
                        let key = Key::load(&PathBuf::from(p))?;
                        let id = match usage(f.one("builder-id"))? {
                            Some(id) => id.to_string(),
                            None => updraft_publish::attest::default_builder_id(&key),
                        };
                        Some((key, id))
                    }
                    None if f.one("builder-id").ok().flatten().is_some() => {
                        return Err(Failure::Usage(
                            None,
                            "--builder-id needs --attest-with".into(),
                        ));
                    }
                    None => None,
                },
            };
            let s = release::release(&spec)?;
            println!(
                "wrote {}: release {} serial {}, image {} bytes, artifact {} bytes in {} frames",
                s.manifest.display(),
                spec.version,
                s.serial,
                s.image_size,
                s.artifact_size,
                s.frames
            );
            for (from, size) in &s.deltas {
                println!("delta from {}: {size} bytes", from.display());
            }
            for (from, why) in &s.skipped {
                println!("delta from {} not published: {why}", from.display());
            }
            for a in &s.apps {
                println!(
                    "{} {}: {} entries, {} bytes; index {} bytes; {} new blob(s), {} bytes",
                    a.kind,
                    a.name,
                    a.entries,
                    a.bytes,
                    a.index_size,
                    a.blobs_written,
                    a.blob_bytes_written
                );
            }
            if let Some(file) = usage(f.one("bundle"))? {
                let out = PathBuf::from(file);
                let b = bundle::bundle(&spec.out, &out, bundle::DEFAULT_PART_SIZE)?;
                println!(
                    "wrote {}: release {}, {} entries, {} bytes",
                    out.display(),
                    b.version,
                    b.entries,
                    b.bytes
                );
            }
        }
        "modules" => {
            let dir = PathBuf::from(usage(f.required("dir"))?);
            let out = PathBuf::from(usage(f.required("out"))?);
            for m in updraft_publish::modules::modules(&dir, &out)? {
                println!(
                    "module {} {} ({}): {}",
                    m.name,
                    m.version,
                    m.kind,
                    m.files
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
        }
        "bundle" => {
            let dir = PathBuf::from(usage(f.required("dir"))?);
            let out = PathBuf::from(usage(f.required("out"))?);
            let part_size = match usage(f.number::<u64>("part-size"))? {
                None => bundle::DEFAULT_PART_SIZE,
                Some(n) if (1..=bundle::DEFAULT_PART_SIZE).contains(&n) => n,
                Some(_) => {
                    return Err(Failure::Usage(
                        None,
                        format!(
                            "--part-size must be between 1 and {} (bytes)",
                            bundle::DEFAULT_PART_SIZE
                        ),
                    ));
                }
            };
            let s = bundle::bundle(&dir, &out, part_size)?;
            println!(
                "wrote {}: release {}, {} entries, {} bytes",
                out.display(),
                s.version,
                s.entries,
                s.bytes
            );
            for (url, parts) in &s.split {
                println!("{url}: {parts} parts");
            }
        }
        "verify" => {
            let pubs = f
                .all("pub")
                .iter()
                .map(|p| keys::load_pub(&PathBuf::from(p)))
                .collect::<Result<Vec<_>, _>>()?;
            if pubs.is_empty() {
                return Err(Failure::Usage(None, "--pub is required".into()));
            }
            let [manifest] = f.positional.as_slice() else {
                return Err(Failure::Usage(
                    None,
                    "verify takes one manifest path".into(),
                ));
            };
            let builders = f
                .all("builder-pub")
                .iter()
                .map(|p| keys::load_pub(&PathBuf::from(p)))
                .collect::<Result<Vec<_>, _>>()?;
            let builders = match builders.is_empty() {
                true => None,
                false => Some(
                    updraft::trust::KeySet::new(
                        builders,
                        usage(f.number("builder-threshold"))?.unwrap_or(1),
                    )
                    .map_err(|e| Failure::Usage(None, format!("--builder-pub: {e}")))?,
                ),
            };
            for line in verify::verify(
                &PathBuf::from(manifest),
                pubs,
                usage(f.number("threshold"))?.unwrap_or(1),
                builders.as_ref(),
            )? {
                println!("{line}");
            }
        }
        "verify-reports" => {
            let keys = f
                .all("device-key")
                .iter()
                .map(|k| device_key(k))
                .collect::<Result<Vec<_>, _>>()?;
            if keys.is_empty() {
                return Err(Failure::Usage(None, "--device-key is required".into()));
            }
            if f.positional.is_empty() {
                return Err(Failure::Usage(
                    None,
                    "verify-reports takes one or more report files".into(),
                ));
            }
            let mut v = reports::Verifier::new(keys);
            for file in &f.positional {
                let text =
                    std::fs::read(file).map_err(|e| format!("reading reports {file}: {e}"))?;
                for (name, bytes) in reports::split(file, &text) {
                    println!("{}", v.check(&name, &bytes));
                }
            }
            if v.refused > 0 {
                return Err(Failure::Failed(format!(
                    "{} of {} reports refused",
                    v.refused, v.checked
                )));
            }
            println!("{} reports verified", v.checked);
        }
        "inspect" => {
            let [manifest] = f.positional.as_slice() else {
                return Err(Failure::Usage(
                    None,
                    "inspect takes one manifest path".into(),
                ));
            };
            print!(
                "{}",
                verify::inspect(&PathBuf::from(manifest), f.switch("json"))?
            );
            if f.switch("json") {
                println!();
            }
        }
        "help" => match f.positional.as_slice() {
            [] => print!("{}", PROGRAM.overview()),
            [name] => {
                let h = PROGRAM
                    .command(name)
                    .ok_or_else(|| bad(&format!("unknown command {name:?}")))?;
                print!("{}", PROGRAM.help(h));
            }
            _ => return Err(bad("help takes one command name")),
        },
        "completions" => match f.positional.as_slice() {
            [shell] if shell == "bash" => print!("{}", PROGRAM.bash_completion()),
            _ => return Err(bad("completions takes one shell name: bash")),
        },
        other => return Err(bad(&format!("unknown command {other:?}"))),
    }
    Ok(())
}

/// A device key given on the command line: a PEM file, or the raw key in
/// base64 as `updraft status` shows it.
fn device_key(arg: &str) -> Result<updraft::trust::PublicKey, String> {
    let path = PathBuf::from(arg);
    if path.exists() {
        return keys::load_pub(&path);
    }
    let raw = updraft::envelope::decode_base64(arg, "--device-key")
        .map_err(|e| format!("--device-key {arg}: neither a file nor a base64 key ({e})"))?;
    let raw: [u8; 32] = raw.try_into().map_err(|r: Vec<u8>| {
        format!(
            "--device-key {arg}: {} bytes, an ed25519 key is 32",
            r.len()
        )
    })?;
    updraft::trust::PublicKey::from_bytes(&raw).map_err(|e| format!("--device-key {arg}: {e}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(c, m)) => {
            eprintln!("updraft-publish: {m}\n{}", PROGRAM.usage_hint(c));
            ExitCode::from(2)
        }
        Err(Failure::Failed(m)) => {
            eprintln!("updraft-publish: {m}");
            ExitCode::FAILURE
        }
    }
}
