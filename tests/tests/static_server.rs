//! The embedded static server (`tests/src/static_server.rs`), which the
//! demo uses when nginx is not installed: what it answers over TLS, byte
//! for byte (ranges, 304, 404, refused paths, the connection bound,
//! forwarded reports), and that updraft's daemon downloads from it the way
//! it does from nginx: polls carry `If-None-Match` and get `304`, a cut
//! download resumes with a `Range` request.
//!
//! Requests are written by hand over a rustls client trusting the server's
//! CA file, so every header on the wire is the one the test wrote.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use serde_json::json;
use updraft::slot::SlotName;
use updraft_tests::collector::Collector;
use updraft_tests::device::{Device, DeviceSpec};
use updraft_tests::nginx::AccessEntry;
use updraft_tests::proxy::{Behaviour, Proxy};
use updraft_tests::publisher::{Repo, image, keygen};
use updraft_tests::static_server::StaticServer;
use updraft_tests::tmp::TempDir;

const WAIT: Duration = Duration::from_secs(120);

type Tls = StreamOwned<ClientConnection, TcpStream>;

fn client_config(ca_file: &Path) -> Arc<ClientConfig> {
    let pem = std::fs::read(ca_file).expect("reading the CA file");
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&pem) {
        roots
            .add(c.expect("a CA certificate"))
            .expect("adding the CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn connect(addr: SocketAddr, ca_file: &Path) -> Tls {
    let tcp = TcpStream::connect(addr).expect("connecting");
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = ClientConnection::new(client_config(ca_file), name).expect("TLS client");
    StreamOwned::new(conn, tcp)
}

/// A parsed answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Send `head` (request line and headers, without the blank line) and
/// read one answer; `head_only` for a HEAD request (no body follows).
fn exchange(tls: &mut Tls, head: &str, head_only: bool) -> Answer {
    tls.write_all(format!("{head}\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .expect("writing the request");
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tls.read(&mut byte).expect("reading the answer head");
        assert_eq!(n, 1, "the connection ended in the head: {buf:?}");
        buf.push(byte[0]);
    }
    let text = String::from_utf8(buf).expect("an ASCII head");
    let mut lines = text.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut a = Answer {
        status,
        headers,
        body: Vec::new(),
    };
    if !head_only && status != 304 {
        let len: usize = a
            .header("content-length")
            .expect("Content-Length on every answer")
            .parse()
            .unwrap();
        a.body = vec![0; len];
        tls.read_exact(&mut a.body).expect("reading the body");
    }
    a
}

fn get(s: &StaticServer, head: &str) -> Answer {
    let mut tls = connect(s.addr(), s.ca_file());
    exchange(&mut tls, head, head.starts_with("HEAD "))
}

struct Site {
    dir: TempDir,
    server: StaticServer,
    file: Vec<u8>,
}

/// The access log once it holds `n` entries: like nginx, the server
/// logs a request after answering it.
fn logged(server: &StaticServer, n: usize) -> Vec<AccessEntry> {
    server.wait_access_log(Duration::from_secs(5), |l| l.len() >= n)
}

fn site(name: &str) -> Site {
    let dir = TempDir::new(name);
    let root = dir.join("site");
    std::fs::create_dir_all(root.join("artifacts")).unwrap();
    let file: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("artifacts/blob"), &file).unwrap();
    std::fs::write(root.join("manifest.json"), b"{\"x\":1}\n").unwrap();
    std::fs::write(dir.join("secret"), b"not for the network").unwrap();
    let server = StaticServer::builder(&root).start().expect("starting");
    Site { dir, server, file }
}

#[test]
fn a_file_is_served_with_its_length_type_and_strong_etag() {
    let s = site("static-get");
    let a = get(&s.server, "GET /manifest.json HTTP/1.1");
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, b"{\"x\":1}\n");
    assert_eq!(a.header("content-length"), Some("8"));
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(a.header("accept-ranges"), Some("bytes"));
    let tag = a.header("etag").expect("an ETag").to_string();
    assert!(
        tag.starts_with('"') && tag.ends_with('"'),
        "a strong ETag: {tag}"
    );
    let h = get(&s.server, "HEAD /manifest.json HTTP/1.1");
    assert_eq!(h.status, 200);
    assert_eq!(h.header("content-length"), Some("8"));
    assert_eq!(h.header("etag"), Some(tag.as_str()));
    // Each request came on a connection of its own, and a connection's
    // request is logged when the connection has sent its answer: the two
    // lines may come in either order.
    let log = logged(&s.server, 2);
    assert_eq!(log.len(), 2, "{log:?}");
    let by = |method: &str| {
        log.iter()
            .find(|e| e.method == method)
            .unwrap_or_else(|| panic!("no {method} logged: {log:?}"))
    };
    assert_eq!(by("GET").body_bytes_sent, 8);
    assert_eq!(by("HEAD").body_bytes_sent, 0);
    assert_eq!(by("GET").ssl_protocol.as_deref(), Some("TLSv1.3"));
}

#[test]
fn ranges_give_206_with_exactly_the_requested_bytes_and_416_past_the_end() {
    let s = site("static-range");
    let len = s.file.len();
    for (range, start, end) in [
        ("bytes=0-9", 0, 9),
        ("bytes=99990-200000", 99_990, len - 1),
        ("bytes=50000-", 50_000, len - 1),
        ("bytes=-100", len - 100, len - 1),
    ] {
        let a = get(
            &s.server,
            &format!("GET /artifacts/blob HTTP/1.1\r\nRange: {range}"),
        );
        assert_eq!(a.status, 206, "{range}: {a:?}");
        assert_eq!(
            a.header("content-range"),
            Some(format!("bytes {start}-{end}/{len}").as_str()),
            "{range}"
        );
        assert_eq!(a.body, &s.file[start..=end], "{range}");
    }
    let a = get(
        &s.server,
        &format!("GET /artifacts/blob HTTP/1.1\r\nRange: bytes={len}-"),
    );
    assert_eq!(a.status, 416);
    assert_eq!(
        a.header("content-range"),
        Some(format!("bytes */{len}").as_str())
    );
    // Several ranges, or an If-Range that does not match: the whole file.
    let a = get(
        &s.server,
        "GET /artifacts/blob HTTP/1.1\r\nRange: bytes=0-1,5-6",
    );
    assert_eq!((a.status, a.body.len()), (200, len));
    let a = get(
        &s.server,
        "GET /artifacts/blob HTTP/1.1\r\nRange: bytes=0-1\r\nIf-Range: \"other\"",
    );
    assert_eq!((a.status, a.body.len()), (200, len));
    // Logged in the order the connections ended: found by its range.
    let log = s.server.wait_access_log(Duration::from_secs(5), |l| {
        l.iter().any(|e| e.range.as_deref() == Some("bytes=0-9"))
    });
    let first = log
        .iter()
        .find(|e| e.range.as_deref() == Some("bytes=0-9"))
        .unwrap_or_else(|| panic!("no bytes=0-9 logged: {log:?}"));
    assert_eq!(first.body_bytes_sent, 10);
}

#[test]
fn a_matching_if_none_match_gives_304_and_a_replaced_file_a_new_etag() {
    let s = site("static-304");
    let first = get(&s.server, "GET /manifest.json HTTP/1.1");
    let tag = first.header("etag").unwrap().to_string();
    let a = get(
        &s.server,
        &format!("GET /manifest.json HTTP/1.1\r\nIf-None-Match: {tag}"),
    );
    assert_eq!(a.status, 304, "{a:?}");
    assert_eq!(a.header("etag"), Some(tag.as_str()));
    assert!(a.body.is_empty());
    // The publisher replaces the manifest by renaming a new file over it.
    let root = s.dir.join("site");
    std::fs::write(root.join("manifest.json.tmp"), b"{\"x\":2}\n").unwrap();
    std::fs::rename(root.join("manifest.json.tmp"), root.join("manifest.json")).unwrap();
    let a = get(
        &s.server,
        &format!("GET /manifest.json HTTP/1.1\r\nIf-None-Match: {tag}"),
    );
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, b"{\"x\":2}\n");
    assert_ne!(a.header("etag"), Some(tag.as_str()));
    // Logged in the order the connections ended, which need not be the
    // order of the requests.
    let log = s.server.wait_access_log(Duration::from_secs(5), |l| {
        l.iter().any(|e| e.status == 304)
    });
    let revalidated = log
        .iter()
        .find(|e| e.status == 304)
        .unwrap_or_else(|| panic!("no 304 logged: {log:?}"));
    assert_eq!(revalidated.if_none_match.as_deref(), Some(tag.as_str()));
}

#[test]
fn missing_files_directories_and_paths_leading_out_are_not_served() {
    let s = site("static-404");
    assert_eq!(get(&s.server, "GET /nothing HTTP/1.1").status, 404);
    assert_eq!(get(&s.server, "GET /artifacts HTTP/1.1").status, 404);
    assert_eq!(get(&s.server, "GET /artifacts/ HTTP/1.1").status, 404);
    for target in [
        "/../secret",
        "/artifacts/../../secret",
        "/%2e%2e/secret",
        "/artifacts%2f..%2f..%2fsecret",
        "/..%2fsecret",
    ] {
        let a = get(&s.server, &format!("GET {target} HTTP/1.1"));
        assert_eq!(a.status, 400, "{target}: {a:?}");
        assert!(
            !String::from_utf8_lossy(&a.body).contains("not for the network"),
            "{target} served the file outside the root"
        );
    }
    let a = get(&s.server, "DELETE /manifest.json HTTP/1.1");
    assert_eq!(a.status, 405);
    assert_eq!(a.header("allow"), Some("GET, HEAD"));
}

#[test]
fn a_connection_serves_requests_in_turn_and_connections_are_bounded() {
    let dir = TempDir::new("static-bound");
    std::fs::write(dir.join("f"), b"abc").unwrap();
    let server = StaticServer::builder(dir.path())
        .max_connections(2)
        .start()
        .unwrap();
    let mut one = connect(server.addr(), server.ca_file());
    for _ in 0..3 {
        assert_eq!(exchange(&mut one, "GET /f HTTP/1.1", false).body, b"abc");
    }
    let mut two = connect(server.addr(), server.ca_file());
    assert_eq!(exchange(&mut two, "GET /f HTTP/1.1", false).status, 200);
    // A request is logged once its answer is sent, so lines of two
    // connections may interleave in any order: grouped by connection.
    let log = logged(&server, 4);
    let mut by_connection = std::collections::BTreeMap::<u64, Vec<u64>>::new();
    for e in &log {
        by_connection
            .entry(e.connection)
            .or_default()
            .push(e.connection_requests);
    }
    let mut counts: Vec<Vec<u64>> = by_connection.into_values().collect();
    counts.iter_mut().for_each(|c| c.sort_unstable());
    counts.sort();
    assert_eq!(counts, vec![vec![1], vec![1, 2, 3]], "{log:?}");
    // A third connection while two are open is closed at once.
    let mut three = connect(server.addr(), server.ca_file());
    let refused = three.write_all(b"GET /f HTTP/1.1\r\n\r\n").is_err() || {
        let mut b = [0u8; 1];
        !matches!(three.read(&mut b), Ok(1))
    };
    assert!(refused, "a connection beyond the bound was served");
    assert_eq!(server.refused_connections(), 1);
    // `Connection: close` closes the connection after the answer.
    let a = exchange(&mut one, "GET /f HTTP/1.1\r\nConnection: close", false);
    assert_eq!(a.header("connection"), Some("close"));
    let mut b = [0u8; 1];
    assert!(!matches!(one.read(&mut b), Ok(1)));
}

#[test]
fn reports_are_forwarded_to_the_collector() {
    let dir = TempDir::new("static-report");
    let collector = Collector::start().unwrap();
    let server = StaticServer::builder(dir.path())
        .proxy("/report", collector.addr())
        .start()
        .unwrap();
    let mut tls = connect(server.addr(), server.ca_file());
    let body = "{\"kind\":\"heartbeat\"}";
    tls.write_all(
        format!(
            "POST /report HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: k1\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    let reports = collector.wait_for_reports(1, Duration::from_secs(5));
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].idempotency_key.as_deref(), Some("k1"));
    assert_eq!(reports[0].body, body.as_bytes());
    assert_eq!(logged(&server, 1)[0].status, 204);
}

#[test]
fn the_server_stops_on_drop() {
    let dir = TempDir::new("static-drop");
    let server = StaticServer::builder(dir.path()).start().unwrap();
    let addr = server.addr();
    let _idle = connect(addr, server.ca_file());
    drop(server);
    assert!(
        TcpStream::connect(addr).is_err(),
        "the port still accepts after drop"
    );
}

/// The daemon against the embedded server: a download cut mid-body
/// resumes with `Range` (206), and idle polls after the update carry the
/// manifest's ETag and get 304.
#[test]
fn the_daemon_resumes_with_range_and_polls_with_if_none_match() {
    let keys = TempDir::new("static-daemon");
    let key = keygen(keys.path(), "release");
    let repo = Repo::new(keys.join("site"));
    let img = keys.join("v1.img");
    image(&img, 8 * 1024 * 1024, 41);
    repo.release(&[&key], "1.0", &img, &[]);
    let server = StaticServer::builder(&repo.dir).start().unwrap();
    let proxy = Proxy::start(server.addr()).unwrap();
    // The first connection carries the manifest and part of the artifact.
    proxy.script([Behaviour::ResetAfter(2_500_000)]);
    let mut spec = DeviceSpec::simple(&key);
    spec.server = format!(
        "manifest_url = \"https://{}/manifest.json\"\nca_file = {:?}\npoll_interval = \"1s\"\n\
         poll_jitter = \"1s\"\nretry_max = \"2s\"\n",
        proxy.addr(),
        server.ca_file()
    );
    let mut dev = Device::new("static-daemon", spec);
    dev.init();
    dev.start_daemon();
    dev.wait_reboot_requested(WAIT);
    assert_eq!(dev.reboot(), SlotName::B);
    dev.start_daemon();
    dev.wait_for("release 1.0 committed", WAIT, |s| {
        s["state"] == json!("idle") && s["running_version"] == json!("1.0")
    });
    let log = server.wait_access_log(WAIT, |l| {
        l.iter()
            .any(|e| e.uri == "/manifest.json" && e.status == 304)
    });
    dev.stop_daemon();
    let artifact = repo.payload()["artifact"]["url"]
        .as_str()
        .unwrap()
        .to_string();
    let gets: Vec<_> = log
        .iter()
        .filter(|e| e.uri.ends_with(&artifact) && e.method == "GET")
        .collect();
    assert!(
        gets.iter().any(|e| e.status == 206
            && e.range.as_deref().is_some_and(|r| r.starts_with("bytes="))),
        "no resumed download with Range: {gets:#?}"
    );
    let poll = log
        .iter()
        .find(|e| e.uri == "/manifest.json" && e.status == 304)
        .unwrap_or_else(|| panic!("no 304 poll: {log:#?}"));
    assert!(poll.if_none_match.is_some(), "{poll:?}");
    assert!(
        dev.log().contains("resuming at frame"),
        "{}",
        dev.log_tail()
    );
}
