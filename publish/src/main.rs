//! `updraft-publish`: keys, key documents, releases and their checks.

use std::path::PathBuf;
use std::process::ExitCode;

use updraft_publish::keys::{self, Key, KeyDocSpec};
use updraft_publish::release::{self, DEFAULT_FRAME_SIZE, ReleaseSpec};
use updraft_publish::verify;

const USAGE: &str = "usage:
  updraft-publish keygen --out PREFIX
  updraft-publish keys --root-key R.key [--root-key R2.key]... --release-pub K.pub [--release-pub K2.pub]...
                       [--threshold N] [--root-pub NEWROOT.pub]... [--root-threshold N] --version N --out DIR
  updraft-publish release --key K.key [--key K2.key]... --version V --compatible HW [--compatible HW2]...
                       --image NEW.img [--from OLD.img]... [--serial N] [--expires 30d] [--rollout PERCENT]
                       [--frame-size BYTES] [--level N] [--threads N] --out DIR
  updraft-publish verify --pub K.pub [--pub K2.pub]... [--threshold N] DIR/manifest.json
  updraft-publish inspect [--json] DIR/manifest.json";

/// Flags of one subcommand: repeated values collected in order.
struct Flags {
    values: Vec<(String, String)>,
    switches: Vec<String>,
    positional: Vec<String>,
}

impl Flags {
    fn parse(args: &[String], with_value: &[&str], switches: &[&str]) -> Result<Flags, String> {
        let mut f = Flags {
            values: Vec::new(),
            switches: Vec::new(),
            positional: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--") {
                let (name, inline) = match name.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (name, None),
                };
                if with_value.contains(&name) {
                    let v = match inline {
                        Some(v) => v,
                        None => it.next().ok_or(format!("--{name} needs a value"))?.clone(),
                    };
                    f.values.push((name.to_string(), v));
                } else if switches.contains(&name) && inline.is_none() {
                    f.switches.push(name.to_string());
                } else {
                    return Err(format!("unknown option --{name}"));
                }
            } else {
                f.positional.push(a.clone());
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

enum Failure {
    Usage(String),
    Failed(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Failure::Failed(s)
    }
}

fn usage<T>(r: Result<T, String>) -> Result<T, Failure> {
    r.map_err(Failure::Usage)
}

fn run(args: &[String]) -> Result<(), Failure> {
    let (cmd, rest) = args
        .split_first()
        .ok_or(Failure::Usage("no command given".into()))?;
    match cmd.as_str() {
        "keygen" => {
            let f = usage(Flags::parse(rest, &["out"], &[]))?;
            let out = usage(f.required("out"))?;
            let (k, p) = keys::keygen(&PathBuf::from(out))?;
            println!("wrote {} and {}", k.display(), p.display());
        }
        "keys" => {
            let f = usage(Flags::parse(
                rest,
                &[
                    "root-key",
                    "release-pub",
                    "threshold",
                    "root-pub",
                    "root-threshold",
                    "version",
                    "out",
                ],
                &[],
            ))?;
            let signers = f
                .all("root-key")
                .iter()
                .map(|p| Key::load(&PathBuf::from(p)))
                .collect::<Result<Vec<_>, _>>()?;
            if signers.is_empty() {
                return Err(Failure::Usage("--root-key is required".into()));
            }
            let release_keys = f
                .all("release-pub")
                .iter()
                .map(|p| keys::load_pub(&PathBuf::from(p)))
                .collect::<Result<Vec<_>, _>>()?;
            if release_keys.is_empty() {
                return Err(Failure::Usage("--release-pub is required".into()));
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
                .ok_or(Failure::Usage("--version is required".into()))?;
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
            let f = usage(Flags::parse(
                rest,
                &[
                    "key",
                    "version",
                    "compatible",
                    "image",
                    "from",
                    "serial",
                    "expires",
                    "rollout",
                    "out",
                    "frame-size",
                    "level",
                    "threads",
                ],
                &[],
            ))?;
            let keys = f
                .all("key")
                .iter()
                .map(|p| Key::load(&PathBuf::from(p)))
                .collect::<Result<Vec<_>, _>>()?;
            if keys.is_empty() {
                return Err(Failure::Usage("--key is required".into()));
            }
            let compatible: Vec<String> = f
                .all("compatible")
                .iter()
                .flat_map(|c| c.split(','))
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect();
            if compatible.is_empty() {
                return Err(Failure::Usage("--compatible is required".into()));
            }
            let expires = match f.one("expires").map_err(Failure::Usage)? {
                Some(e) => updraft::timestamp::parse_duration(e)
                    .map_err(|e| Failure::Usage(format!("--expires: {e}")))?,
                None => std::time::Duration::from_secs(30 * 86_400),
            };
            let rollout: Option<f64> = usage(f.number("rollout"))?;
            if let Some(r) = rollout {
                if !(0.0..=100.0).contains(&r) {
                    return Err(Failure::Usage("--rollout must be between 0 and 100".into()));
                }
            }
            let threads = usage(f.number("threads"))?.unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            });
            let spec = ReleaseSpec {
                keys,
                version: usage(f.required("version"))?.to_string(),
                compatible,
                image: PathBuf::from(usage(f.required("image"))?),
                from: f.all("from").iter().map(PathBuf::from).collect(),
                serial: usage(f.number("serial"))?,
                expires,
                rollout,
                out: PathBuf::from(usage(f.required("out"))?),
                frame_size: usage(f.number("frame-size"))?.unwrap_or(DEFAULT_FRAME_SIZE),
                level: usage(f.number("level"))?.unwrap_or(19),
                threads,
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
        }
        "verify" => {
            let f = usage(Flags::parse(rest, &["pub", "threshold"], &[]))?;
            let pubs = f
                .all("pub")
                .iter()
                .map(|p| keys::load_pub(&PathBuf::from(p)))
                .collect::<Result<Vec<_>, _>>()?;
            if pubs.is_empty() {
                return Err(Failure::Usage("--pub is required".into()));
            }
            let [manifest] = f.positional.as_slice() else {
                return Err(Failure::Usage("verify takes one manifest path".into()));
            };
            for line in verify::verify(
                &PathBuf::from(manifest),
                pubs,
                usage(f.number("threshold"))?.unwrap_or(1),
            )? {
                println!("{line}");
            }
        }
        "inspect" => {
            let f = usage(Flags::parse(rest, &[], &["json"]))?;
            let [manifest] = f.positional.as_slice() else {
                return Err(Failure::Usage("inspect takes one manifest path".into()));
            };
            print!(
                "{}",
                verify::inspect(&PathBuf::from(manifest), f.switch("json"))?
            );
            if f.switch("json") {
                println!();
            }
        }
        "-h" | "--help" | "help" => println!("{USAGE}"),
        "--version" => println!("updraft-publish {}", env!("CARGO_PKG_VERSION")),
        other => return Err(Failure::Usage(format!("unknown command {other:?}"))),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("updraft-publish: {m}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(m)) => {
            eprintln!("updraft-publish: {m}");
            ExitCode::FAILURE
        }
    }
}
