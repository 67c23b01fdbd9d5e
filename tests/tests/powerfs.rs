//! The power-cut filesystem keeps exactly what was made durable: unsynced
//! data and namespace changes vanish at a cut, synced ones survive, and
//! nothing changes between the cut and power-on. Real processes, real
//! syscalls, real tools (SQLite, fw_setenv/fw_printenv, flock, dd).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use updraft_tests::powerfs::{self, PowerFs};

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A powered, empty [`PowerFs`] mounted in a fresh temporary directory.
struct Fixture {
    // Field order matters: unmount before removing the directory.
    fs: PowerFs,
    mnt: PathBuf,
    /// A directory outside the mount for things that must not be cut.
    outside: PathBuf,
    _dir: TempDir,
}

impl Fixture {
    fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Power off (if still on), then on again.
    fn power_cycle(&mut self) {
        self.fs.cut_now();
        self.fs.restore_power().expect("power-on");
    }
}

/// Mount a fixture, or record a loud skip and return None.
fn fixture() -> Option<Fixture> {
    if let Some(why) = powerfs::unavailable() {
        let test = std::thread::current().name().unwrap_or("?").to_string();
        updraft_tests::skip::record(&test, &why);
        return None;
    }
    static N: AtomicU32 = AtomicU32::new(0);
    let root = std::env::temp_dir().join(format!(
        "updraft-powerfs-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let dir = TempDir(root.clone());
    let mnt = root.join("mnt");
    let outside = root.join("outside");
    fs::create_dir_all(&mnt).expect("create mount point");
    fs::create_dir_all(&outside).expect("create outside dir");
    let fs = PowerFs::mount(&mnt).expect("mount powerfs");
    Some(Fixture {
        fs,
        mnt,
        outside,
        _dir: dir,
    })
}

fn sh(script: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("run sh")
}

fn is_eio<T: std::fmt::Debug>(r: io::Result<T>) -> bool {
    matches!(r, Err(ref e) if e.raw_os_error() == Some(libc::EIO))
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

/// Deterministic pseudo-random numbers (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let x = self.next().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
    }
}

/// The seed for cut schedules: `UPDRAFT_POWERFS_SEED` or a fixed default.
fn seed() -> u64 {
    let seed = std::env::var("UPDRAFT_POWERFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0fc0_ffee);
    eprintln!("cut schedule seed: {seed} (set UPDRAFT_POWERFS_SEED to change)");
    seed
}

#[test]
fn a_write_without_fsync_is_gone_after_a_cut() {
    let Some(mut fx) = fixture() else { return };
    let state = fx.path("state");
    fs::write(&state, b"old").unwrap();
    fx.fs.sync_all();
    // Read it so the kernel caches the old pages, then overwrite from
    // another process without fsync (sync(1) does not count): the new
    // content is what everyone sees.
    assert_eq!(fs::read(&state).unwrap(), b"old");
    let out = sh(&format!(
        "printf 'new and longer' > '{}' && sync",
        state.display()
    ));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(fs::read(&state).unwrap(), b"new and longer");

    fx.power_cycle();

    assert_eq!(fs::read(&state).unwrap(), b"old");
    let cut = fx.fs.stats().last_cut.expect("a cut was recorded");
    assert_eq!(cut.bytes_dropped, 14, "{cut:?}");
}

#[test]
fn a_write_followed_by_fsync_or_fdatasync_survives_a_cut() {
    let Some(mut fx) = fixture() else { return };
    let (a, b) = (fx.path("a"), fx.path("b"));
    fs::write(&a, b"").unwrap();
    fs::write(&b, b"").unwrap();
    fx.fs.sync_all();

    // fsync from another process (dd conv=fsync), fdatasync from this one.
    let out = sh(&format!(
        "printf 'synced by dd' | dd of='{}' conv=fsync status=none",
        a.display()
    ));
    assert!(out.status.success(), "{out:?}");
    let mut f = OpenOptions::new().write(true).open(&b).unwrap();
    f.write_all(b"synced by fdatasync").unwrap();
    f.sync_data().unwrap();
    f.write_all(b", this tail is not").unwrap();
    drop(f);

    fx.power_cycle();

    assert_eq!(fs::read(&a).unwrap(), b"synced by dd");
    assert_eq!(fs::read(&b).unwrap(), b"synced by fdatasync");
}

#[test]
fn namespace_changes_without_a_directory_fsync_revert() {
    let Some(mut fx) = fixture() else { return };
    fs::write(fx.path("config"), b"old config").unwrap();
    fs::write(fx.path("doomed"), b"still here").unwrap();
    fs::write(fx.path("moving"), b"moving").unwrap();
    fx.fs.sync_all();

    // Replace config the careful way except for the directory fsync.
    let tmp = fx.path("config.tmp");
    let mut f = File::create(&tmp).unwrap();
    f.write_all(b"new config").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::rename(&tmp, fx.path("config")).unwrap();
    fs::rename(fx.path("moving"), fx.path("moved")).unwrap();
    fs::remove_file(fx.path("doomed")).unwrap();
    fs::create_dir(fx.path("newdir")).unwrap();
    assert_eq!(fs::read(fx.path("config")).unwrap(), b"new config");
    assert_eq!(names(&fx.mnt), ["config", "moved", "newdir"]);

    fx.power_cycle();

    assert_eq!(names(&fx.mnt), ["config", "doomed", "moving"]);
    assert_eq!(fs::read(fx.path("config")).unwrap(), b"old config");
    assert_eq!(fs::read(fx.path("doomed")).unwrap(), b"still here");
    assert_eq!(fs::read(fx.path("moving")).unwrap(), b"moving");
}

#[test]
fn write_temp_fsync_rename_fsync_dir_survives_a_cut() {
    let Some(mut fx) = fixture() else { return };
    let dir = fx.path("state");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("config"), b"old config").unwrap();
    fx.fs.sync_all();

    let tmp = dir.join(".config.tmp");
    let mut f = File::create(&tmp).unwrap();
    f.write_all(b"new config").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::rename(&tmp, dir.join("config")).unwrap();
    fsync_dir(&dir).unwrap();

    fx.power_cycle();

    assert_eq!(names(&dir), ["config"]);
    assert_eq!(fs::read(dir.join("config")).unwrap(), b"new config");
}

#[test]
fn a_file_fsynced_in_a_directory_never_fsynced_is_gone_after_a_cut() {
    let Some(mut fx) = fixture() else { return };
    // "known" is durable in the root but its own entries were never synced;
    // "fresh" is not even durable in the root.
    fs::create_dir(fx.path("known")).unwrap();
    fx.fs.sync_all();
    fs::create_dir(fx.path("fresh")).unwrap();
    for rel in ["known/file", "fresh/file"] {
        let mut f = File::create(fx.path(rel)).unwrap();
        f.write_all(b"synced data").unwrap();
        f.sync_all().unwrap();
    }

    fx.power_cycle();

    assert_eq!(names(&fx.mnt), ["known"]);
    assert!(names(&fx.path("known")).is_empty());
}

#[test]
fn operations_after_the_armed_cut_fail_with_eio_and_change_nothing() {
    let Some(mut fx) = fixture() else { return };
    let log = fx.path("log");
    fs::write(&log, b"").unwrap();
    fx.fs.sync_all();
    let mut f = OpenOptions::new().write(true).open(&log).unwrap();

    // Four mutating ops: write, fsync, write, fsync. Power fails after the
    // fourth has been applied and answered.
    fx.fs.arm_cut_after(4);
    f.write_all(b"first ").unwrap();
    f.sync_all().unwrap();
    f.write_all(b"second").unwrap();
    assert!(!fx.fs.is_dead());
    f.sync_all().unwrap();
    assert!(fx.fs.is_dead());
    let ops_at_cut = fx.fs.mutating_ops();

    assert!(is_eio(f.write_all(b" third")));
    assert!(is_eio(f.sync_all()));
    assert!(is_eio(fs::metadata(&log)));
    assert!(is_eio(File::open(&log)));
    assert!(is_eio(
        fs::read_dir(&fx.mnt).and_then(|mut d| d.next().transpose())
    ));
    assert!(is_eio(File::create(fx.path("new"))));
    assert!(is_eio(fs::rename(&log, fx.path("renamed"))));
    let out = sh(&format!("printf x >> '{}'", log.display()));
    assert!(!out.status.success(), "a child process cannot write either");
    assert_eq!(
        fx.fs.mutating_ops(),
        ops_at_cut,
        "nothing is counted after the cut"
    );
    drop(f);

    fx.fs.restore_power().unwrap();

    assert!(!fx.fs.is_dead());
    assert_eq!(names(&fx.mnt), ["log"]);
    assert_eq!(fs::read(&log).unwrap(), b"first second");
}

/// Body of row `id`: long enough that rows span pages and trees split.
fn row_body(id: u32) -> Vec<u8> {
    let mut rng = Rng(u64::from(id));
    let mut body = vec![0u8; 200 + (id as usize * 397) % 3000];
    rng.fill(&mut body);
    body
}

/// Open a database the way updraft does: rollback journal, EXTRA sync.
fn open_db(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open database");
    conn.pragma_update(None, "journal_mode", "DELETE")
        .expect("journal_mode");
    conn.pragma_update(None, "synchronous", "EXTRA")
        .expect("synchronous");
    conn
}

/// Commit one row per transaction until `txns`, the first error or the
/// power failing. Returns (committed, attempted): `committed` counts only
/// COMMITs that returned while the power was still on. One that returns
/// after the cut proves nothing: SQLite treats a directory it cannot open
/// for the post-delete directory fsync as success.
fn insert_rows(conn: &mut rusqlite::Connection, txns: u32, fs: &PowerFs) -> (u32, u32, bool) {
    let mut committed = 0;
    for id in 1..=txns {
        let r = conn.transaction().and_then(|tx| {
            tx.execute(
                "INSERT INTO t (id, body) VALUES (?1, ?2)",
                (id, row_body(id)),
            )?;
            tx.commit()
        });
        if r.is_err() || fs.is_dead() {
            return (committed, id, r.is_ok());
        }
        committed = id;
    }
    (committed, committed, false)
}

#[test]
fn sqlite_commits_survive_cuts_at_seeded_random_points() {
    let Some(mut fx) = fixture() else { return };
    const TXNS: u32 = 40;
    const TRIALS: u32 = 30;
    let mut rng = Rng(seed());

    let setup = |fx: &Fixture, trial: u32| -> (PathBuf, rusqlite::Connection) {
        let dir = fx.path(&format!("trial-{trial}"));
        fs::create_dir(&dir).unwrap();
        let db = dir.join("state.db");
        let conn = open_db(&db);
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
            .unwrap();
        fx.fs.sync_all();
        (db, conn)
    };

    // Calibrate: how many mutating ops do all transactions take?
    let (_, mut conn) = setup(&fx, 0);
    let before = fx.fs.mutating_ops();
    assert_eq!(insert_rows(&mut conn, TXNS, &fx.fs), (TXNS, TXNS, false));
    let total_ops = fx.fs.mutating_ops() - before;
    drop(conn);
    eprintln!("{TXNS} transactions take {total_ops} mutating ops");

    let (mut hot_journals, mut in_flight_kept, mut late_commits) = (0, 0, 0);
    let mut points: Vec<u64> = vec![1, total_ops];
    points.extend((2..TRIALS).map(|_| rng.range(1, total_ops)));
    for (trial, &cut_after) in (1..).zip(&points) {
        let (db, mut conn) = setup(&fx, trial);
        fx.fs.arm_cut_after(cut_after);
        let (committed, attempted, late_ok) = insert_rows(&mut conn, TXNS, &fx.fs);
        late_commits += u32::from(late_ok);
        drop(conn);
        fx.power_cycle();

        let journal = db.with_file_name("state.db-journal");
        hot_journals += u32::from(journal.exists());
        let conn = rusqlite::Connection::open(&db).expect("database opens after power-on");
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok", "trial {trial}, cut after op {cut_after}");
        let mut stmt = conn.prepare("SELECT id, body FROM t ORDER BY id").unwrap();
        let rows: Vec<(u32, Vec<u8>)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let kept = rows.len() as u32;
        let context = format!(
            "trial {trial}, cut after op {cut_after}: committed {committed}, \
             attempted {attempted}, found {kept} rows"
        );
        assert!(committed <= kept && kept <= attempted, "{context}");
        for (i, (id, body)) in (1..).zip(&rows) {
            assert_eq!(*id, i, "rows are a prefix; {context}");
            assert!(*body == row_body(i), "row {i} body intact; {context}");
        }
        in_flight_kept += u32::from(kept > committed);
    }
    eprintln!(
        "{} cuts: {hot_journals} left a hot journal, {in_flight_kept} kept a transaction \
         whose COMMIT had not returned, {late_commits} saw a COMMIT return OK after the cut; {:?}",
        points.len(),
        fx.fs.stats()
    );
    assert!(hot_journals > 0, "some cuts must land inside a transaction");
}

/// One U-Boot environment as `fw_printenv` prints it.
type Env = BTreeMap<String, String>;

fn printenv(config: &Path) -> Result<Env, String> {
    let out = Command::new("fw_printenv")
        .arg("-c")
        .arg(config)
        .output()
        .map_err(|e| format!("running fw_printenv: {e}"))?;
    if !out.status.success() {
        return Err(format!("fw_printenv failed: {out:?}"));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

#[test]
fn fw_setenv_cut_at_every_mutating_op_leaves_the_old_or_the_new_environment() {
    for tool in ["fw_setenv", "fw_printenv", "mkenvimage"] {
        if Command::new(tool).arg("-h").output().is_err() {
            updraft_tests::skip!("{tool} is not installed (libubootenv-tool, u-boot-tools)");
        }
    }
    let Some(mut fx) = fixture() else { return };
    // Redundant environment in two files on the power-cut filesystem; the
    // config and the initial image stay outside.
    let (copy1, copy2) = (fx.path("uboot.env"), fx.path("uboot-redund.env"));
    let config = fx.outside.join("fw_env.config");
    fs::write(
        &config,
        format!(
            "{} 0x0 0x4000\n{} 0x0 0x4000\n",
            copy1.display(),
            copy2.display()
        ),
    )
    .unwrap();
    let text = fx.outside.join("env.txt");
    fs::write(
        &text,
        "bootcmd=run distro_bootcmd\nboot_slot=A\nupgrade_available=0\nbootcount=0\n",
    )
    .unwrap();
    let image = fx.outside.join("env.bin");
    let out = Command::new("mkenvimage")
        .args(["-r", "-s", "0x4000", "-o"])
        .arg(&image)
        .arg(&text)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let image = fs::read(&image).unwrap();
    let provision = |fx: &Fixture| {
        fs::write(&copy1, &image).unwrap();
        fs::write(&copy2, vec![0u8; image.len()]).unwrap();
        fx.fs.sync_all();
    };

    // An A/B switch as three fw_setenv calls; states[i] is the environment
    // after i of them.
    let steps: [&[&str]; 3] = [
        &["upgrade_available", "1"],
        &["boot_slot", "B"],
        &["bootcount", "1"],
    ];
    let setenv = |args: &[&str]| {
        Command::new("fw_setenv")
            .arg("-c")
            .arg(&config)
            .args(args)
            .output()
            .unwrap()
    };
    provision(&fx);
    let mut states = vec![printenv(&config).unwrap()];
    let mut step_end = Vec::new();
    let start = fx.fs.mutating_ops();
    for args in steps {
        let out = setenv(args);
        assert!(out.status.success(), "{out:?}");
        step_end.push(fx.fs.mutating_ops() - start);
        states.push(printenv(&config).unwrap());
    }
    let total = *step_end.last().unwrap();
    eprintln!("fw_setenv steps end after mutating ops {step_end:?}");

    for cut_after in 1..=total {
        provision(&fx);
        fx.fs.arm_cut_after(cut_after);
        // Steps that exited 0 while the power was still on. After the cut
        // an exit status proves nothing: fw_setenv exits 0 when its fsync
        // fails.
        let mut returned = 0;
        for args in steps {
            let ok = setenv(args).status.success();
            if fx.fs.is_dead() {
                break;
            }
            assert!(ok, "fw_setenv {args:?} failed with the power on");
            returned += 1;
        }
        fx.power_cycle();

        let env = printenv(&config)
            .unwrap_or_else(|e| panic!("cut after op {cut_after}: no environment: {e}"));
        let found = states.iter().position(|s| *s == env);
        let context = format!("cut after op {cut_after}: found {env:?}, steps returned {returned}");
        let found = found.unwrap_or_else(|| panic!("not a state fw_setenv wrote; {context}"));
        assert!(
            found == returned || found == returned + 1,
            "old or new; {context}"
        );
        // Strictness: a step counts only once its last op (the fsync) is in;
        // its write alone, not yet synced, must not survive.
        let synced = step_end.iter().filter(|&&end| end <= cut_after).count();
        assert_eq!(found, synced, "only synced steps survive; {context}");
    }
}

#[test]
fn flock_excludes_other_processes_on_the_mount() {
    let Some(fx) = fixture() else { return };
    let lock = fx.path("lock");
    let f = File::create(&lock).unwrap();
    let try_lock = || {
        Command::new("flock")
            .args(["-n", "-E", "75"])
            .arg(&lock)
            .arg("true")
            .status()
            .expect("run flock(1)")
            .code()
    };
    // SAFETY: flock on a valid open descriptor.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    assert_eq!(
        try_lock(),
        Some(75),
        "another process must not get the lock"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) }, 0);
    assert_eq!(try_lock(), Some(0));
}

#[test]
fn o_excl_fallocate_statfs_fadvise_and_sync_file_range_behave() {
    let Some(mut fx) = fixture() else { return };
    let path = fx.path("blob");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    fsync_dir(&fx.mnt).unwrap();
    let again = OpenOptions::new().write(true).create_new(true).open(&path);
    assert_eq!(again.unwrap_err().kind(), io::ErrorKind::AlreadyExists);

    let fd = f.as_raw_fd();
    // SAFETY: plain syscalls on a valid descriptor.
    unsafe {
        assert_eq!(libc::fallocate(fd, 0, 0, 1 << 20), 0);
        assert_eq!(libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED), 0);
    }
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    let mut buf = vec![1u8; 4096];
    f.read_exact_at(&mut buf, 4096).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0),
        "allocated space reads as zeros"
    );
    f.sync_all().unwrap();

    // sync_file_range starts writeback; it does not make data durable.
    f.write_all_at(b"not durable", 0).unwrap();
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sync_file_range(fd, 0, 0, flags) }, 0);

    // SAFETY: statvfs writes into the zeroed struct we pass.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new(fx.mnt.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid path and out pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    assert!(
        st.f_blocks > 0 && st.f_bavail > 0 && st.f_bsize == 4096,
        "statfs figures"
    );
    drop(f);

    fx.power_cycle();

    let data = fs::read(&path).unwrap();
    assert_eq!(data.len(), 1 << 20);
    assert!(data.iter().all(|&b| b == 0));
}

const MIB: usize = 1 << 20;

#[test]
fn a_slot_written_in_4_mib_pwrites_and_fsynced_survives_a_cut() {
    let Some(mut fx) = fixture() else { return };
    const SLOT: usize = 64 * MIB;
    let slot = fx.path("slot-b");
    let mut image = vec![0u8; SLOT];
    Rng(7).fill(&mut image);

    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&slot)
        .unwrap();
    fsync_dir(&fx.mnt).unwrap();
    let ops = fx.fs.mutating_ops();
    let t = Instant::now();
    for (i, block) in image.chunks(4 * MIB).enumerate() {
        f.write_all_at(block, (i * 4 * MIB) as u64).unwrap();
    }
    let write = t.elapsed();
    let write_ops = fx.fs.mutating_ops() - ops;
    assert_eq!(
        write_ops,
        (SLOT / MIB) as u64,
        "each MiB of a pwrite is one op"
    );
    let t = Instant::now();
    f.sync_all().unwrap();
    let sync = t.elapsed();
    let t = Instant::now();
    let mut back = vec![0u8; 4 * MIB];
    for (i, block) in image.chunks(4 * MIB).enumerate() {
        f.read_exact_at(&mut back, (i * 4 * MIB) as u64).unwrap();
        assert!(back == block, "block {i} reads back");
    }
    let read = t.elapsed();
    // Overwrite the start without syncing: that part reverts.
    f.write_all_at(&vec![0xee; 4 * MIB], 0).unwrap();
    drop(f);
    let mb = SLOT as f64 / 1e6;
    eprintln!(
        "64 MiB slot: pwrite 4 MiB blocks {:.0} MB/s, fsync {:?}, read back {:.0} MB/s",
        mb / write.as_secs_f64(),
        sync,
        mb / read.as_secs_f64()
    );

    fx.power_cycle();

    let after = fs::read(&slot).unwrap();
    assert!(after == image, "the synced image is intact after power-on");
}

#[test]
fn every_fdatasync_in_a_stream_of_small_writes_is_durable() {
    let Some(mut fx) = fixture() else { return };
    const N: u64 = 1000;
    let path = fx.path("journal");
    let f = File::create(&path).unwrap();
    fsync_dir(&fx.mnt).unwrap();
    let t = Instant::now();
    for i in 0..N {
        f.write_all_at(&[i as u8; 4096], (i % 64) * 4096).unwrap();
        f.sync_data().unwrap();
    }
    let elapsed = t.elapsed();
    eprintln!(
        "{N} × (4 KiB pwrite + fdatasync): {:.0} fsyncs/s; {:?}",
        N as f64 / elapsed.as_secs_f64(),
        fx.fs.stats()
    );
    // One more write, not synced.
    f.write_all_at(&[0xff; 4096], 0).unwrap();
    drop(f);

    fx.power_cycle();

    let data = fs::read(&path).unwrap();
    assert_eq!(data.len(), 64 * 4096);
    for (slot, page) in data.chunks(4096).enumerate() {
        // The last write to page `slot` was the largest i < N with i % 64 == slot.
        let slot = slot as u64;
        let last = ((N - 1 - slot) / 64 * 64 + slot) as u8;
        assert!(
            page.iter().all(|&b| b == last),
            "page {slot} holds its last synced write"
        );
    }
}

#[test]
fn power_on_succeeds_while_a_process_still_holds_the_old_mount() {
    let Some(mut fx) = fixture() else { return };
    fs::write(fx.path("held"), b"durable").unwrap();
    fx.fs.sync_all();
    fs::write(fx.path("held"), b"not durable").unwrap();
    // A process keeps the file open and its working directory on the mount.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("exec 3<held; echo ready; exec sleep 600")
        .current_dir(&fx.mnt)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let stdout = child.stdout.take().unwrap();
    io::BufRead::read_line(&mut io::BufReader::new(stdout), &mut line).unwrap();
    assert_eq!(line, "ready\n");

    let result = fx.fs.restore_power();
    child.kill().unwrap();
    child.wait().unwrap();

    result.expect("power-on detaches the busy mount");
    assert_eq!(fs::read(fx.path("held")).unwrap(), b"durable");
}
