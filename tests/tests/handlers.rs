//! The example `command` handlers shipped in `contrib/handlers/`, driven
//! through updraft's handler runner phase by phase as a release would
//! drive them: installed and committed, installed and rolled back (the
//! previous file back, or no file where there was none).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use updraft::handler::{Handler, Phase, Run};
use updraft_tests::tmp::TempDir;

fn file_copy(tmp: &TempDir, target: &Path) -> Handler {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/handlers/file-copy");
    Handler {
        component: "mcu".into(),
        argv: vec![script.display().to_string(), target.display().to_string()],
        timeout: Duration::from_secs(30),
        work_dir: tmp.join("work/mcu"),
    }
}

fn phase(h: &Handler, phase: Phase, payload: Option<&'static [u8]>) {
    let payload = payload.map(|p| Box::new(p) as Box<dyn Read + Send>);
    let run = Run {
        phase,
        version: "4.1",
        previous_version: Some("4.0"),
    };
    if let Err(e) = h.run_unattended(&run, payload) {
        panic!("{}: {e}", phase.as_str());
    }
}

fn target(tmp: &TempDir) -> PathBuf {
    let dir = tmp.join("opt/vendor");
    std::fs::create_dir_all(&dir).expect("target directory");
    dir.join("mcu.bin")
}

#[test]
fn file_copy_installs_activates_and_commits() {
    let tmp = TempDir::new("handler-commit");
    let target = target(&tmp);
    std::fs::write(&target, b"firmware 4.0").expect("the old file");
    let h = file_copy(&tmp, &target);
    phase(&h, Phase::Install, Some(b"firmware 4.1"));
    assert_eq!(
        std::fs::read(&target).expect("target"),
        b"firmware 4.0",
        "install changes nothing live"
    );
    phase(&h, Phase::Activate, None);
    assert_eq!(std::fs::read(&target).expect("target"), b"firmware 4.1");
    phase(&h, Phase::Commit, None);
    assert_eq!(std::fs::read(&target).expect("target"), b"firmware 4.1");
    let left: Vec<_> = std::fs::read_dir(&h.work_dir).expect("work dir").collect();
    assert!(left.is_empty(), "commit leaves nothing behind: {left:?}");
}

#[test]
fn file_copy_rolls_back_to_the_previous_file_or_to_none() {
    let tmp = TempDir::new("handler-rollback");
    let target = target(&tmp);
    std::fs::write(&target, b"firmware 4.0").expect("the old file");
    let h = file_copy(&tmp, &target);
    phase(&h, Phase::Install, Some(b"firmware 4.1"));
    phase(&h, Phase::Activate, None);
    phase(&h, Phase::Rollback, None);
    assert_eq!(std::fs::read(&target).expect("target"), b"firmware 4.0");

    // No file before: none after the rollback.
    std::fs::remove_file(&target).expect("removing");
    phase(&h, Phase::Install, Some(b"firmware 4.1"));
    phase(&h, Phase::Activate, None);
    assert!(target.exists());
    phase(&h, Phase::Rollback, None);
    assert!(!target.exists(), "a file that was not there is gone again");

    // A rollback after a failed install leaves the live file alone.
    std::fs::write(&target, b"firmware 4.0").expect("the old file");
    phase(&h, Phase::Install, Some(b"half"));
    phase(&h, Phase::Rollback, None);
    assert_eq!(std::fs::read(&target).expect("target"), b"firmware 4.0");
}
