//! `cargo xtask yocto-crates [--check]`: write the Yocto recipe's crate list
//! (`yocto/meta-updraft/recipes-support/updraft/updraft-crates.inc`) from
//! `Cargo.lock`.
//!
//! The recipe builds offline (`cargo --frozen`), and cargo resolves the whole
//! workspace lock file even to build one package, so every crates.io package
//! in `Cargo.lock` must be fetched: one `crate://crates.io/NAME/VERSION`
//! entry and one `SRC_URI[NAME-VERSION.sha256sum]` per package, the checksum
//! copied from the lock file. A package from anywhere else (git, another
//! registry) is refused: the recipe would not be able to fetch it.
//!
//! Run it after every change to `Cargo.lock`; `--check` only compares and
//! fails when the file is stale (the `yocto_recipe` test checks the same).

use std::path::PathBuf;

use crate::util::{self, Result};

const CRATES_IO: &str = "registry+https://github.com/rust-lang/crates.io-index";

pub fn inc_path() -> PathBuf {
    util::root().join("yocto/meta-updraft/recipes-support/updraft/updraft-crates.inc")
}

pub fn run(args: &[String]) -> Result {
    let check = match args {
        [] => false,
        [a] if a == "--check" => true,
        _ => return Err("usage: cargo xtask yocto-crates [--check]".into()),
    };
    let lock_path = util::root().join("Cargo.lock");
    let lock = std::fs::read_to_string(&lock_path)
        .map_err(|e| format!("reading {}: {e}", lock_path.display()))?;
    let text = render(&registry_packages(&lock)?);
    let path = inc_path();
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if check {
        return if current == text {
            println!("{} matches Cargo.lock", path.display());
            Ok(())
        } else {
            Err(format!(
                "{} is stale: run `cargo xtask yocto-crates`",
                path.display()
            ))
        };
    }
    if current == text {
        println!("{} already matches Cargo.lock", path.display());
        return Ok(());
    }
    std::fs::write(&path, &text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// A crates.io package pinned by the lock file.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Package {
    name: String,
    version: String,
    checksum: String,
}

/// The crates.io packages of a `Cargo.lock` (version 3 or 4), sorted.
fn registry_packages(lock: &str) -> Result<Vec<Package>> {
    #[derive(Default)]
    struct Entry {
        name: Option<String>,
        version: Option<String>,
        source: Option<String>,
        checksum: Option<String>,
    }
    let mut entries: Vec<Entry> = Vec::new();
    let mut in_package = false;
    for line in lock.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[[package]]";
            if in_package {
                entries.push(Entry::default());
            }
            continue;
        }
        let Some(entry) = entries.last_mut().filter(|_| in_package) else {
            continue;
        };
        let Some((key, value)) = line.split_once(" = ") else {
            continue;
        };
        let value = value
            .trim()
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'));
        let slot = match key.trim() {
            "name" => &mut entry.name,
            "version" => &mut entry.version,
            "source" => &mut entry.source,
            "checksum" => &mut entry.checksum,
            _ => continue,
        };
        *slot = value.map(str::to_string);
    }
    let mut packages = Vec::new();
    let mut foreign = Vec::new();
    for e in entries {
        let (Some(name), Some(version)) = (e.name, e.version) else {
            return Err("Cargo.lock has a [[package]] without name or version".into());
        };
        match e.source.as_deref() {
            None => {} // a workspace member
            Some(CRATES_IO) => {
                let checksum = e
                    .checksum
                    .ok_or_else(|| format!("Cargo.lock: {name} {version} has no checksum"))?;
                if checksum.len() != 64 || !checksum.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "Cargo.lock: {name} {version}: {checksum:?} is not a sha256"
                    ));
                }
                packages.push(Package {
                    name,
                    version,
                    checksum,
                });
            }
            Some(other) => foreign.push(format!("{name} {version} from {other}")),
        }
    }
    if !foreign.is_empty() {
        return Err(format!(
            "Cargo.lock has packages the recipe cannot fetch as crate:// (add them to the recipe by hand as git:// with a destsuffix, or use crates.io): {}",
            foreign.join(", ")
        ));
    }
    packages.sort();
    Ok(packages)
}

fn render(packages: &[Package]) -> String {
    let mut s = String::new();
    s.push_str("# Generated from Cargo.lock by `cargo xtask yocto-crates`: do not edit.\n");
    s.push_str("# Every crates.io package in Cargo.lock, because cargo resolves the whole\n");
    s.push_str("# workspace lock file even when it builds one package offline.\n\n");
    // oelint-adv style: first entry on the assignment line, the rest
    // aligned under it, the closing quote on its own line.
    const HEAD: &str = "SRC_URI += \"";
    for (i, p) in packages.iter().enumerate() {
        let lead = if i == 0 {
            HEAD.to_string()
        } else {
            " ".repeat(HEAD.len())
        };
        s.push_str(&format!(
            "{lead}crate://crates.io/{}/{} \\\n",
            p.name, p.version
        ));
    }
    s.push_str(&" ".repeat(HEAD.len()));
    s.push_str("\"\n\n");
    for p in packages {
        s.push_str(&format!(
            "SRC_URI[{}-{}.sha256sum] = \"{}\"\n",
            p.name, p.version, p.checksum
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: &str = r#"
version = 4

[[package]]
name = "updraft"
version = "0.1.0"
dependencies = [
 "log",
]

[[package]]
name = "log"
version = "0.4.35"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "5d15f86d12da44cd8d4ec3c73984537eb7f4cadcb9776a575a0a8a05ca11005c"

[[package]]
name = "base64"
version = "0.22.1"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "72b3254f16251a8381aa12e40e3c4d2f0199f8c6508fbecb9d91f575e0fbb8c6"
"#;

    #[test]
    fn registry_packages_are_listed_sorted_with_their_checksums() {
        let text = render(&registry_packages(LOCK).unwrap());
        assert!(
            text.contains("SRC_URI += \"crate://crates.io/base64/0.22.1 \\\n"),
            "{text}"
        );
        let b = text.find("crate://crates.io/base64/0.22.1 \\").unwrap();
        let l = text.find("crate://crates.io/log/0.4.35 \\").unwrap();
        assert!(b < l);
        assert!(text.contains(
            "SRC_URI[log-0.4.35.sha256sum] = \"5d15f86d12da44cd8d4ec3c73984537eb7f4cadcb9776a575a0a8a05ca11005c\"\n"
        ));
        assert!(
            !text.contains("updraft/0.1.0"),
            "workspace members are not fetched"
        );
    }

    #[test]
    fn git_sources_are_refused() {
        let lock = format!(
            "{LOCK}\n[[package]]\nname = \"x\"\nversion = \"1.0.0\"\nsource = \"git+https://example.org/x#abc\"\n"
        );
        assert!(
            registry_packages(&lock)
                .unwrap_err()
                .contains("x 1.0.0 from git+")
        );
    }

    #[test]
    fn a_missing_checksum_is_an_error() {
        let lock = LOCK.replace(
            "checksum = \"72b3254f16251a8381aa12e40e3c4d2f0199f8c6508fbecb9d91f575e0fbb8c6\"\n",
            "",
        );
        assert!(
            registry_packages(&lock)
                .unwrap_err()
                .contains("base64 0.22.1 has no checksum")
        );
    }
}
