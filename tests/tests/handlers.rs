//! The example `command` handlers shipped in `contrib/handlers/`, driven
//! through updraft's handler runner phase by phase as a release would
//! drive them: installed and committed, installed and rolled back (the
//! previous file back, or no file where there was none). The container
//! loader runs against a real podman (Debian's), with a store of the
//! test's own, and OCI archives written by `updraft_tests::oci`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use updraft::handler::{Handler, Phase, Run};
use updraft_tests::tmp::TempDir;
use updraft_tests::{oci, require};

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

/// The image the container loader's tests load.
const IMAGE: &str = "localhost/updraft-web";

/// The container loader with a podman store of `tmp`'s own; the units'
/// restarts and stops are recorded in `tmp/units.log`.
fn container_load(tmp: &TempDir) -> Handler {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/handlers/container-load");
    let recorder = tmp.join("units");
    std::fs::write(
        &recorder,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\n",
            tmp.join("units.log").display()
        ),
    )
    .expect("recorder");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&recorder, std::fs::Permissions::from_mode(0o755)).expect("mode");
    Handler {
        component: "web-image".into(),
        argv: vec![
            script.display().to_string(),
            "--engine".into(),
            podman(tmp).join(" "),
            "--restart".into(),
            format!("{} restart", recorder.display()),
            "--stop".into(),
            format!("{} stop", recorder.display()),
            IMAGE.into(),
            "web.service".into(),
        ],
        timeout: Duration::from_secs(120),
        work_dir: tmp.join("work/web-image"),
    }
}

/// podman on the test's own store (its run root's path must stay under
/// 50 characters: the tests' directories have short names).
fn podman(tmp: &TempDir) -> Vec<String> {
    vec![
        "podman".into(),
        "--root".into(),
        tmp.join("storage").display().to_string(),
        "--runroot".into(),
        tmp.join("run").display().to_string(),
        "--storage-driver".into(),
        "vfs".into(),
    ]
}

/// The image id `reference` names in the test's store, if any.
fn image_id(tmp: &TempDir, reference: &str) -> Option<String> {
    let argv = podman(tmp);
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .args(["image", "inspect", "--format", "{{.Id}}", reference])
        .output()
        .expect("starting podman");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The archive of `IMAGE:tag` holding `content`.
fn image_archive(tmp: &TempDir, tag: &str, content: &str) -> Vec<u8> {
    let path = tmp.join(format!("web-{tag}.oci.tar"));
    oci::archive(
        &path,
        &format!("{IMAGE}:{tag}"),
        &[("app/VERSION", content.as_bytes())],
    );
    std::fs::read(&path).expect("archive")
}

fn run_phase(
    h: &Handler,
    phase: Phase,
    version: &str,
    previous: Option<&str>,
    payload: Option<Vec<u8>>,
) -> updraft::error::Result<()> {
    let payload = payload.map(|p| Box::new(std::io::Cursor::new(p)) as Box<dyn Read + Send>);
    let run = Run {
        phase,
        version,
        previous_version: previous,
    };
    h.run_unattended(&run, payload).map(drop)
}

/// Every phase of release `version` up to `last`, each required to pass.
fn through(h: &Handler, tmp: &TempDir, version: &str, previous: Option<&str>, last: Phase) {
    let archive = image_archive(tmp, version, &format!("web {version}"));
    for phase in [
        Phase::Install,
        Phase::Activate,
        Phase::Commit,
        Phase::Rollback,
    ] {
        if phase == Phase::Rollback && last != Phase::Rollback {
            break;
        }
        if phase == Phase::Commit && last == Phase::Rollback {
            continue;
        }
        let payload = (phase == Phase::Install).then(|| archive.clone());
        if let Err(e) = run_phase(h, phase, version, previous, payload) {
            panic!("{version} {}: {e}", phase.as_str());
        }
        if phase == last {
            break;
        }
    }
}

fn units_log(tmp: &TempDir) -> Vec<String> {
    std::fs::read_to_string(tmp.join("units.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn container_load_loads_switches_the_current_tag_and_restarts_the_units() {
    require!("podman");
    let tmp = TempDir::new("ctr-a");
    let h = container_load(&tmp);

    let archive = image_archive(&tmp, "1.0", "web 1.0");
    let step = |phase, payload| {
        run_phase(&h, phase, "1.0", None, payload).unwrap_or_else(|e| panic!("1.0: {e}"))
    };
    step(Phase::Install, Some(archive));
    let first = image_id(&tmp, &format!("{IMAGE}:1.0")).expect("1.0 loaded by install");
    assert_eq!(
        image_id(&tmp, &format!("{IMAGE}:current")),
        None,
        "install switches nothing"
    );
    assert!(units_log(&tmp).is_empty(), "install restarts nothing");
    step(Phase::Activate, None);
    assert_eq!(
        image_id(&tmp, &format!("{IMAGE}:current")),
        Some(first.clone())
    );
    assert_eq!(units_log(&tmp), ["restart web.service"]);
    step(Phase::Commit, None);

    through(&h, &tmp, "1.1", Some("1.0"), Phase::Commit);
    let second = image_id(&tmp, &format!("{IMAGE}:1.1")).expect("1.1 loaded");
    assert_ne!(first, second);
    assert_eq!(image_id(&tmp, &format!("{IMAGE}:current")), Some(second));
    assert_eq!(
        image_id(&tmp, &format!("{IMAGE}:1.0")),
        None,
        "commit removes the image of the version before"
    );
    assert_eq!(
        units_log(&tmp),
        ["restart web.service", "restart web.service"]
    );
    let left: Vec<_> = std::fs::read_dir(&h.work_dir).expect("work dir").collect();
    assert!(left.is_empty(), "commit leaves nothing behind: {left:?}");
}

#[test]
fn container_load_rolls_back_to_the_image_before_or_to_none() {
    require!("podman");
    let tmp = TempDir::new("ctr-b");
    let h = container_load(&tmp);
    through(&h, &tmp, "1.0", None, Phase::Commit);
    let first = image_id(&tmp, &format!("{IMAGE}:current")).expect("1.0 current");

    through(&h, &tmp, "1.1", Some("1.0"), Phase::Rollback);
    assert_eq!(
        image_id(&tmp, &format!("{IMAGE}:current")),
        Some(first),
        "current names the image before again"
    );
    assert_eq!(
        image_id(&tmp, &format!("{IMAGE}:1.1")),
        None,
        "the new image is removed"
    );
    assert_eq!(
        units_log(&tmp),
        [
            "restart web.service",
            "restart web.service",
            "restart web.service"
        ],
        "restarted on activation and again on the rollback"
    );

    // A first install rolled back: no current tag, the units stopped.
    let tmp = TempDir::new("ctr-c");
    let h = container_load(&tmp);
    through(&h, &tmp, "1.0", None, Phase::Rollback);
    assert_eq!(image_id(&tmp, &format!("{IMAGE}:current")), None);
    assert_eq!(image_id(&tmp, &format!("{IMAGE}:1.0")), None);
    assert_eq!(units_log(&tmp), ["restart web.service", "stop web.service"]);
}

#[test]
fn container_load_refuses_an_archive_without_the_released_version() {
    require!("podman");
    let tmp = TempDir::new("ctr-d");
    let h = container_load(&tmp);
    let archive = image_archive(&tmp, "9.9", "web 9.9");
    let err = run_phase(&h, Phase::Install, "1.0", None, Some(archive))
        .expect_err("an archive of another version must fail install");
    assert!(
        err.to_string()
            .contains("the archive holds no image localhost/updraft-web:1.0"),
        "{err}"
    );
    // Not an archive at all.
    let err = run_phase(&h, Phase::Install, "1.0", None, Some(b"garbage".to_vec()))
        .expect_err("garbage must fail install");
    assert!(!err.to_string().is_empty());
    assert_eq!(image_id(&tmp, &format!("{IMAGE}:current")), None);
}
