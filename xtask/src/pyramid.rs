//! The test pyramid: where each integration test file runs.
//!
//! Every test runs on the host (`cargo xtask test`). Running it again under
//! qemu-user for armv7 or aarch64 (`cargo xtask cross-test`) costs five to
//! twenty times its host time, so a file is run there only when the target
//! can change its outcome: word size and 32-bit `time_t` (armv7), alignment
//! and the layout of structures handed to the kernel (ioctls, `ucred`,
//! `stat`), the bootloader environments' bytes, slot I/O, SQLite's files,
//! the delta patcher, TLS. What only depends on updraft's logic (decisions,
//! protocols, retries, the CLI's text) or tests the test support itself is
//! proven by the host run. aarch64 also boots for real (`cargo xtask
//! vm-test aarch64`: the release build through updates, a delta, a
//! rollback and power cuts on U-Boot), so its emulated run keeps only what
//! those boots do not reach; armv7, which no machine boots, runs more.
//!
//! Each file's row says why. docs/testing.md ("The test pyramid") holds
//! the table `cargo xtask pyramid` prints, and every file under the test
//! directories must have a row; the unit tests below fail otherwise, so a
//! new test file is placed on purpose and the docs never drift.
//! `cargo xtask cross-test --full` ignores this table and runs every file
//! on every target. `cargo xtask pyramid` prints the table for the docs.
//!
//! This module only describes; it never runs anything.

/// Where a test file runs besides the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Emulated {
    /// The host run only.
    No,
    /// Also under qemu-user for armv7.
    Armv7,
    /// Also under qemu-user for armv7 and aarch64.
    Both,
}

impl Emulated {
    /// Whether a file so placed runs on the cross target `short`.
    pub(crate) fn on(self, short: &str) -> bool {
        match self {
            Emulated::No => false,
            Emulated::Armv7 => short == "armv7",
            Emulated::Both => true,
        }
    }

    /// The words docs/testing.md uses for this placement.
    fn doc_word(self) -> &'static str {
        match self {
            Emulated::No => "host",
            Emulated::Armv7 => "host, armv7",
            Emulated::Both => "host, armv7, aarch64",
        }
    }
}

/// One integration test file and where it runs.
pub(crate) struct Placement {
    /// The file, relative to the repository root.
    pub(crate) file: &'static str,
    pub(crate) emulated: Emulated,
    /// Why it runs there (or not), in a few words.
    pub(crate) why: &'static str,
}

impl Placement {
    /// The cargo test target the file builds (its file stem).
    pub(crate) fn target(&self) -> &'static str {
        let name = self.file.rsplit('/').next().unwrap_or(self.file);
        name.strip_suffix(".rs").unwrap_or(name)
    }
}

use Emulated::{Armv7, Both, No};

/// Where each integration test file runs. The unit tests of the crates
/// (`--lib --bins`) run on every target, always.
#[rustfmt::skip]
pub(crate) const FILES: &[Placement] = &[
    // Bytes the bootloader reads, and the locks around them.
    p("tests/tests/bootenv_uboot.rs", Both, "U-Boot environment bytes and CRCs read back by fw_printenv"),
    p("tests/tests/bootenv_grub.rs", Both, "grubenv block bytes read back by grub-editenv"),
    p("tests/tests/bootenv_script.rs", Both, "the script bootloader's fw_env interop"),
    p("tests/tests/uboot_lock.rs", Both, "flock and file modes through the target's syscalls"),
    // Slot I/O and the image formats.
    p("tests/tests/block_slots.rs", Both, "block-device ioctls and O_DIRECT alignment on loop devices"),
    p("tests/tests/delta_install.rs", Both, "the delta patcher's arithmetic"),
    p("tests/tests/bundle_install.rs", Both, "bundle offsets and sizes (usize is 32 bits on armv7)"),
    // Structures crossing the kernel boundary with untrusted peers.
    p("tests/tests/control_hostile.rs", Both, "SO_PEERCRED and a hostile local client on the socket"),
    p("tests/tests/credentials.rs", Both, "file ownership and modes (stat) of credential files"),
    // The whole cycle and its durability, on the target no machine boots.
    p("tests/tests/update_cycle.rs", Armv7, "the update cycle; aarch64 boots it for real"),
    p("tests/tests/power_cut.rs", Armv7, "SQLite and fsync under power cuts; aarch64 boots cuts for real"),
    p("tests/tests/outbox.rs", Armv7, "SQLite outbox across restarts"),
    p("tests/tests/hostile_install.rs", Armv7, "hostile sizes and lengths with a 32-bit usize"),
    p("tests/tests/maintenance_windows.rs", Armv7, "local time and time zones with a 32-bit time_t"),
    p("tests/tests/daemon_waits.rs", Armv7, "timers, poll(2) and child processes with a 32-bit time_t"),
    p("tests/tests/network_faults.rs", Armv7, "TLS, timeouts and resume offsets"),
    p("tests/tests/bundle_remote.rs", Armv7, "Range offsets of a remote bundle with a 32-bit usize"),
    p("tests/tests/control_socket.rs", Armv7, "the control socket's framing"),
    p("tests/tests/status_outcome.rs", Armv7, "64-bit counters and times in status JSON"),
    p("tests/tests/metrics_format.rs", Armv7, "64-bit counters and times in the metrics file"),
    // Logic the target does not change: the host run proves it.
    p("tests/tests/bandwidth_cap.rs", No, "rate arithmetic in u64; logic"),
    p("tests/tests/channels.rs", No, "channel rules; logic"),
    p("tests/tests/rollback_counter.rs", No, "hardware floor rules against swtpm through host tpm2-tools and directly; logic"),
    p("tests/tests/cli_help.rs", No, "the CLI's text"),
    p("tests/tests/exit_codes.rs", No, "exit statuses; the decision behind them is unit-tested emulated"),
    p("tests/tests/ddi_client.rs", No, "the DDI conversation; ddi.rs's parser unit tests run emulated"),
    p("tests/tests/fleet.rs", No, "poll jitter across a fleet; logic"),
    p("tests/tests/inhibitors.rs", No, "inhibitor rules; logic"),
    p("tests/tests/key_rotation.rs", No, "key chain rules; signatures are unit-tested emulated"),
    p("tests/tests/provenance.rs", No, "attestation rules; the statement parser and the rule are unit-tested emulated"),
    p("tests/tests/operator_cancel.rs", No, "cancel rules; logic"),
    p("tests/tests/polling.rs", No, "poll and retry rules; logic"),
    p("tests/tests/provisioned.rs", No, "first-boot rules; logic"),
    p("tests/tests/degraded.rs", No, "start failures and recovery; logic"),
    p("tests/tests/database_recovery.rs", No, "damage SQLite reports and the copy; the store is unit-tested emulated"),
    p("tests/tests/app_tree.rs", No, "publisher to generations, 10,000 files; the app module's file-system calls are unit-tested emulated"),
    p("tests/tests/handlers.rs", No, "the example handlers are shell scripts; the runner is unit-tested emulated"),
    p("tests/tests/release_components.rs", No, "releases of components against nginx, the boot files on a FAT image through Debian's `fusefat` (the kernels here may lack `vfat`); generations are file-system calls app_tree covers"),
    p("tests/tests/boot_flows.rs", No, "another updater's boot script's variables (Mender, RAUC) through the real `fw_setenv` and `grub-editenv`; the flows' mapping is unit-tested emulated"),
    p("tests/tests/adopt.rs", No, "another updater's real client (Debian's RAUC 1.8, Mender 3.4) installs first, on loop devices; the state files' parsers are unit-tested emulated"),
    p("tests/tests/rpi_tryboot.rs", No, "the Raspberry Pi firmware simulated on FAT images through `fusefat`; the backend's parsing and changes are unit-tested emulated"),
    p("tests/tests/hostile_neighbour.rs", No, "plants made as another account; fsutil is unit-tested emulated"),
    p("tests/tests/slow_retrieval.rs", No, "deadlines and supersession; logic (daemon_waits covers timers)"),
    p("tests/tests/goosebit.rs", No, "a real gooseBit; the DDI conversation is logic"),
    // The previous release is built for the host only.
    p("tests/tests/previous_release.rs", No, "the previous release is built for the host only"),
    p("tests/tests/status_compat.rs", No, "the previous release is built for the host only"),
    // Files updraft ships, checked by host tools.
    p("tests/tests/grub_boot_script.rs", No, "the shipped GRUB script under grub-emu"),
    p("tests/tests/uboot_boot_script.rs", No, "the shipped U-Boot script's logic"),
    p("tests/tests/systemd_unit.rs", No, "the shipped unit, checked by systemd's tools"),
    p("tests/tests/yocto_bitbake.rs", No, "bitbake 2.16 and oe-core whinlatter (`../shared/yocto/`) parse meta-updraft for two machines and fetch its sources from a local mirror; host only"),
    p("tests/tests/yocto_release.rs", No, "the release class's script with the build-host publisher; bundle_install covers the install emulated"),
    p("tests/tests/yocto_recipe.rs", No, "the Yocto layer's files"),
    p("tests/tests/deb_package.rs", No, "the Debian package, checked by dpkg-deb and lintian; vm-test 10 installs it"),
    // The publisher runs on build hosts.
    p("tests/tests/publish_output.rs", No, "the publisher runs on build hosts"),
    p("publish/tests/delta.rs", No, "the publisher runs on build hosts"),
    // Tests of the test support.
    p("tests/tests/ddi_server.rs", No, "tests the test support's DDI server"),
    p("tests/tests/goosebit_server.rs", No, "tests the test support's gooseBit harness"),
    p("tests/tests/nethost.rs", No, "tests the test support's servers and proxy"),
    p("tests/tests/powerfs.rs", No, "tests the test support's power-cut filesystem"),
    p("tests/tests/static_server.rs", No, "tests the demo's embedded server"),
    p("tests/tests/encrypted_release.rs", No, "encryption is byte-exact ring and curve25519 code, unit-tested per target"),
];

const fn p(file: &'static str, emulated: Emulated, why: &'static str) -> Placement {
    Placement {
        file,
        emulated,
        why,
    }
}

/// `cargo xtask pyramid [--left-out]`: the table as docs/testing.md shows
/// it, to paste there after changing [`FILES`]; with `--left-out`, the one
/// line that says what a run of `cross-test` without `--full` leaves out.
pub fn run(args: &[String]) -> Result<(), String> {
    match args {
        [] => print!("{}", markdown_table()),
        [a] if a == "--left-out" => println!("{}", left_out_line()),
        [a, ..] => {
            return Err(format!(
                "unknown argument {a:?}; usage: cargo xtask pyramid [--left-out]"
            ));
        }
    }
    Ok(())
}

/// What the emulated runs leave to the host, in one line.
fn left_out_line() -> String {
    let count = |short: &str| host_only_on(short).len();
    format!(
        "under emulation, {} of the {} integration test files on aarch64 and {} on armv7, and the \
         publisher's unit tests, which docs/testing.md's test pyramid leaves to the host run \
         (cargo xtask cross-test --full runs them)",
        count("aarch64"),
        FILES.len(),
        count("armv7")
    )
}

/// [`FILES`] as a Markdown table: file, where it runs, why.
fn markdown_table() -> String {
    let mut out = String::from("| file | runs on | why |\n|---|---|---|\n");
    for f in FILES {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            f.file,
            f.emulated.doc_word(),
            f.why
        ));
    }
    out
}

/// The test targets that run on the cross target `short`.
pub(crate) fn emulated_on(short: &str) -> Vec<&'static Placement> {
    FILES.iter().filter(|f| f.emulated.on(short)).collect()
}

/// The test files that do not run on the cross target `short`.
pub(crate) fn host_only_on(short: &str) -> Vec<&'static Placement> {
    FILES.iter().filter(|f| !f.emulated.on(short)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The directories whose `*.rs` files are integration test targets.
    const TEST_DIRS: [&str; 2] = ["tests/tests", "publish/tests"];

    /// The integration test files under `root`'s test directories, sorted.
    fn test_files(root: &Path) -> Result<Vec<String>, String> {
        let mut files = Vec::new();
        for dir in TEST_DIRS {
            let entries =
                std::fs::read_dir(root.join(dir)).map_err(|e| format!("listing {dir}: {e}"))?;
            for entry in entries {
                let entry = entry.map_err(|e| format!("listing {dir}: {e}"))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".rs") {
                    files.push(format!("{dir}/{name}"));
                }
            }
        }
        files.sort();
        Ok(files)
    }

    fn root() -> std::path::PathBuf {
        crate::util::root()
    }

    #[test]
    fn every_test_file_has_exactly_one_row() {
        let files = test_files(&root()).unwrap();
        let mut listed: Vec<String> = FILES.iter().map(|f| f.file.to_string()).collect();
        listed.sort();
        let before = listed.len();
        listed.dedup();
        assert_eq!(
            before,
            listed.len(),
            "a file is listed twice in pyramid::FILES"
        );
        let unlisted: Vec<&String> = files.iter().filter(|f| !listed.contains(f)).collect();
        let gone: Vec<&String> = listed.iter().filter(|f| !files.contains(f)).collect();
        assert!(
            unlisted.is_empty() && gone.is_empty(),
            "xtask/src/pyramid.rs: files without a row: {unlisted:?}; rows without a file: {gone:?}"
        );
    }

    #[test]
    fn docs_hold_the_printed_table() {
        let doc = std::fs::read_to_string(root().join("docs/testing.md")).unwrap();
        assert!(
            doc.contains(&markdown_table()),
            "docs/testing.md: paste the output of `cargo xtask pyramid` as its pyramid table"
        );
    }

    #[test]
    fn placements_select_targets() {
        let armv7: Vec<&str> = emulated_on("armv7").iter().map(|f| f.target()).collect();
        let aarch64: Vec<&str> = emulated_on("aarch64").iter().map(|f| f.target()).collect();
        assert!(armv7.contains(&"update_cycle") && !aarch64.contains(&"update_cycle"));
        assert!(armv7.contains(&"bootenv_uboot") && aarch64.contains(&"bootenv_uboot"));
        assert!(!armv7.contains(&"cli_help") && !aarch64.contains(&"cli_help"));
        assert!(
            aarch64.iter().all(|t| armv7.contains(t)),
            "armv7 runs a superset of aarch64"
        );
        assert_eq!(
            emulated_on("aarch64").len() + host_only_on("aarch64").len(),
            FILES.len()
        );
        assert_eq!(p("publish/tests/delta.rs", No, "").target(), "delta");
        let line = left_out_line();
        assert!(
            line.contains(&format!(
                "{} of the {}",
                host_only_on("aarch64").len(),
                FILES.len()
            )),
            "{line}"
        );
    }
}
