//! Where the device's credentials and requests may go: the bearer token
//! only to the configured servers' origins (a signed manifest may name
//! artifacts on any host), and never a step from https down to plain http,
//! not even with the development switch that allows plain http URLs.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::ca::TestCa;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::nginx::Nginx;
use updraft_tests::publisher::{Repo, image, keygen};
use updraft_tests::tmp::TempDir;

const TOKEN: &str = "s3cr3t-device-token";
const IMAGE: usize = 1024 * 1024 + 99;

/// The manifest is served by the configured server; its artifact URL is
/// absolute, on another origin (another port of the same host: origins are
/// scheme, host and port). The manifest request carries the token; the
/// artifact request does not, and the release still installs.
#[test]
fn the_bearer_token_goes_only_to_the_configured_origins() {
    let keys = TempDir::new("cred-keys");
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    let mut dev = Device::new("cred-origin", spec.clone());
    let ca = TestCa::new("updraft test CA").expect("CA");
    let site = Repo::new(dev.path("site"));
    let cdn_dir = dev.path("cdn");
    std::fs::create_dir_all(cdn_dir.join("artifacts")).expect("cdn dir");
    let origin = Nginx::builder(&site.dir)
        .ca(&ca)
        .log_header("authorization")
        .start()
        .expect("nginx (configured server)");
    let cdn = Nginx::builder(&cdn_dir)
        .ca(&ca)
        .log_header("authorization")
        .start()
        .expect("nginx (other origin)");
    let img = dev.path("1.0.img");
    let bytes = image(&img, IMAGE, 5);
    site.release(&[&key], "1.0", &img, &[]);
    let rel = site.payload()["artifact"]["url"]
        .as_str()
        .expect("artifact url")
        .to_string();
    std::fs::copy(site.dir.join(&rel), cdn_dir.join(&rel)).expect("copying the artifact");
    let elsewhere = cdn.url(&format!("/{rel}"));
    site.resign(&[&key], |p| p["artifact"]["url"] = json!(elsewhere));
    let token = keys.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
    spec.server = format!(
        "manifest_url = {:?}\nca_file = {:?}\ntoken_file = {token:?}\npoll_interval = \"1h\"\n",
        origin.url("/manifest.json"),
        origin.ca_file()
    );
    dev.reconfigure(|s| *s = spec);
    dev.init();
    dev.start_daemon();
    let out = dev.ok(&["check"]);
    assert!(out.contains("release 1.0"), "{out}");
    dev.wait_reboot_requested(Duration::from_secs(90));
    assert_eq!(&dev.slot_bytes(SlotName::B)[..IMAGE], &bytes[..]);
    assert!(dev.daemon_running(), "{}", dev.log_tail());

    let bearer = format!("Bearer {TOKEN}");
    let mine = origin.access_log().expect("access log");
    let manifest = mine
        .iter()
        .find(|e| e.uri == "/manifest.json" && e.status == 200)
        .unwrap_or_else(|| panic!("no manifest request: {mine:#?}"));
    assert_eq!(
        manifest.headers.get("authorization"),
        Some(&bearer),
        "the configured server gets the token"
    );
    let theirs = cdn.access_log().expect("access log");
    let artifact: Vec<_> = theirs
        .iter()
        .filter(|e| e.uri == format!("/{rel}"))
        .collect();
    assert!(
        !artifact.is_empty(),
        "the artifact came from the other origin: {theirs:#?}"
    );
    for e in &theirs {
        assert_eq!(
            e.headers.get("authorization"),
            None,
            "the token went to another origin: {} {}",
            e.method,
            e.uri
        );
    }
    dev.stop_daemon();
}

/// A plain-HTTP listener that only counts the connections it gets.
struct Tripwire {
    port: u16,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Tripwire {
    fn start() -> Tripwire {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let port = l.local_addr().expect("addr").port();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok(_) => {
                        h.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Tripwire {
            port,
            hits,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Tripwire {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `server.insecure_allow_http` allows configured `http://` URLs for
/// development; it does not let an https server send the device down to
/// plain http. The redirect is refused before any connection is made to
/// its target, nothing is installed, and the daemon keeps running.
#[test]
fn a_redirect_from_https_to_plain_http_is_refused_even_with_the_development_switch() {
    let keys = TempDir::new("redir-keys");
    let key = keygen(keys.path(), "release");
    let mut spec = DeviceSpec::simple(&key);
    let mut dev = Device::new("redir-down", spec.clone());
    let wire = Tripwire::start();
    let target = format!("http://127.0.0.1:{}/manifest.json", wire.port);
    let site = Repo::new(dev.path("site"));
    let img = dev.path("1.0.img");
    image(&img, IMAGE, 6);
    site.release(&[&key], "1.0", &img, &[]);
    let nginx = Nginx::builder(&site.dir)
        .redirect("/moved/manifest.json", &target)
        .start()
        .expect("nginx");
    let url = nginx.url("/moved/manifest.json");
    spec.server = format!(
        "manifest_url = {url:?}\nca_file = {:?}\ninsecure_allow_http = true\npoll_interval = \"1h\"\n",
        nginx.ca_file()
    );
    dev.reconfigure(|s| *s = spec);
    dev.init();
    let before = dev.snapshot();
    dev.start_daemon();
    let err = dev.fails(&["check"]);
    let expected = format!(
        "GET {url}: refusing a redirect from https to {target} (never allowed, server.insecure_allow_http or not)"
    );
    assert!(err.contains(&expected), "{err}\nexpected: {expected}");
    assert_eq!(
        wire.hits.load(Ordering::Relaxed),
        0,
        "a connection reached plain http"
    );
    let log = nginx.access_log().expect("access log");
    assert!(
        log.iter()
            .any(|e| e.uri == "/moved/manifest.json" && e.status == 302),
        "{log:#?}"
    );
    assert!(dev.daemon_running(), "{}", dev.log_tail());
    assert_eq!(dev.status()["state"], json!("idle"));
    assert_eq!(dev.snapshot(), before);
    dev.stop_daemon();
}
