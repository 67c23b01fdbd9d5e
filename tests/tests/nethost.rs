//! The network side of the test support, checked with real clients: nginx
//! over TLS trusted through the test CA (ureq 3 + rustls/ring, the stack
//! updraft uses, and curl as a second opinion), the fault server blocks,
//! the fault-injecting proxy and the report collector.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use updraft_tests::ca::TestCa;
use updraft_tests::collector::{Collector, Mode};
use updraft_tests::nginx::{Block, Nginx};
use updraft_tests::proxy::{Behaviour, Proxy};

const WAIT: Duration = Duration::from_secs(10);

/// A ureq agent that trusts exactly the CA certificates in `ca_file`, with
/// HTTP error statuses returned as responses.
fn tls_agent(ca_file: &Path) -> ureq::Agent {
    let pem = std::fs::read(ca_file).expect("read CA file");
    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item.expect("PEM item") {
            ureq::tls::PemItem::Certificate(c) => Some(c),
            _ => None,
        })
        .collect();
    assert!(!certs.is_empty(), "no certificate in {}", ca_file.display());
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(WAIT))
        .build()
        .into()
}

/// Bytes that differ at every offset that matters (not a repeating short
/// pattern), so a wrong range or a spliced body cannot compare equal.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

fn docroot(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, data) in files {
        let p = dir.path().join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(p, data).expect("write file");
    }
    dir
}

fn start_nginx(root: &Path) -> Nginx {
    let n = Nginx::builder(root).start().expect("start nginx");
    eprintln!("nginx started in {:?}", n.startup_time());
    n
}

fn main_entries(n: &Nginx, count: usize) -> Vec<updraft_tests::nginx::AccessEntry> {
    n.wait_access_log(WAIT, |e| {
        e.iter().filter(|e| e.block == Block::Main).count() >= count
    })
    .expect("access log")
    .into_iter()
    .filter(|e| e.block == Block::Main)
    .collect()
}

#[test]
fn nginx_serves_a_file_over_tls_trusted_through_the_test_ca() {
    updraft_tests::require!("nginx", "curl");
    let data = pattern(10_000);
    let root = docroot(&[
        ("manifest.json", b"{\"serial\":1}"),
        ("artifacts/a.bin", &data),
    ]);
    let ca = TestCa::new("updraft test CA").unwrap();
    let nginx = Nginx::builder(root.path())
        .ca(&ca)
        .start()
        .expect("start nginx");
    eprintln!("nginx started in {:?}", nginx.startup_time());
    assert_eq!(
        std::fs::read_to_string(nginx.ca_file()).unwrap(),
        ca.cert_pem()
    );

    let mut resp = tls_agent(nginx.ca_file())
        .get(&nginx.url("/artifacts/a.bin"))
        .call()
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.body_mut().read_to_vec().unwrap(), data);

    // Second opinion: curl (OpenSSL) trusts the same CA file, by IP and by name.
    for host in ["127.0.0.1", "localhost"] {
        let out = Command::new("curl")
            .args(["-sS", "--fail", "--cacert"])
            .arg(nginx.ca_file())
            .arg(format!("https://{host}:{}/manifest.json", nginx.port()))
            .output()
            .expect("run curl");
        assert!(
            out.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"{\"serial\":1}");
    }
}

#[test]
fn a_conditional_get_with_the_etag_gives_304_and_the_log_shows_both_with_byte_counts() {
    updraft_tests::require!("nginx");
    let body = pattern(5_000);
    let root = docroot(&[("manifest.json", &body)]);
    let nginx = start_nginx(root.path());
    let agent = tls_agent(nginx.ca_file());

    let mut first = agent.get(&nginx.url("/manifest.json")).call().unwrap();
    assert_eq!(first.status(), 200);
    let etag = first
        .headers()
        .get("etag")
        .expect("ETag")
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(first.body_mut().read_to_vec().unwrap(), body);
    let mut second = agent
        .get(&nginx.url("/manifest.json"))
        .header("If-None-Match", &etag)
        .call()
        .unwrap();
    assert_eq!(second.status(), 304);
    assert!(second.body_mut().read_to_vec().unwrap().is_empty());

    let log = main_entries(&nginx, 2);
    assert_eq!(log.len(), 2, "{log:#?}");
    let (a, b) = (&log[0], &log[1]);
    assert_eq!((a.status, a.if_none_match.as_deref()), (200, None));
    assert_eq!(
        (b.status, b.if_none_match.as_deref()),
        (304, Some(etag.as_str()))
    );
    assert_eq!(a.request, "GET /manifest.json HTTP/1.1");
    assert_eq!(a.body_bytes_sent, body.len() as u64);
    assert!(
        a.bytes_sent > body.len() as u64,
        "headers are counted too: {a:?}"
    );
    assert_eq!(b.body_bytes_sent, 0);
    assert!(b.bytes_sent > 0 && b.bytes_sent < 1000, "{b:?}");
    assert!(
        a.request_length > 0 && b.request_length > a.request_length,
        "the second carries If-None-Match"
    );
    assert_eq!(a.ssl_protocol.as_deref(), Some("TLSv1.3"));
    assert_eq!(a.connection, b.connection, "ureq reused the connection");
    assert_eq!(b.connection_requests, 2);
    assert!(a.time <= b.time);
}

#[test]
fn a_range_request_gives_206_with_exactly_the_requested_bytes() {
    updraft_tests::require!("nginx");
    let data = pattern(100_000);
    let root = docroot(&[("a.bin", &data)]);
    let nginx = start_nginx(root.path());
    let mut resp = tls_agent(nginx.ca_file())
        .get(&nginx.url("/a.bin"))
        .header("Range", "bytes=12345-")
        .call()
        .unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(
        resp.headers()
            .get("content-range")
            .unwrap()
            .to_str()
            .unwrap(),
        "bytes 12345-99999/100000"
    );
    assert_eq!(resp.body_mut().read_to_vec().unwrap(), &data[12345..]);
    let log = main_entries(&nginx, 1);
    assert_eq!(
        (log[0].status, log[0].range.as_deref()),
        (206, Some("bytes=12345-"))
    );
    assert_eq!(log[0].body_bytes_sent, (data.len() - 12345) as u64);
}

#[test]
fn the_fault_blocks_answer_500_429_and_503_with_the_configured_retry_after() {
    updraft_tests::require!("nginx");
    let root = docroot(&[("manifest.json", b"{}")]);
    let nginx = Nginx::builder(root.path())
        .retry_after_429("7")
        .retry_after_503("Wed, 21 Oct 2037 07:28:00 GMT")
        .start()
        .expect("start nginx");
    let agent = tls_agent(nginx.ca_file());
    let cases = [
        (Block::Error500, 500, None),
        (Block::TooManyRequests, 429, Some("7")),
        (
            Block::Unavailable,
            503,
            Some("Wed, 21 Oct 2037 07:28:00 GMT"),
        ),
    ];
    for (block, status, retry_after) in cases {
        let resp = agent
            .get(&nginx.url_of(block, "/manifest.json"))
            .call()
            .unwrap();
        assert_eq!(resp.status(), status, "{block:?}");
        let got = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(got.as_deref(), retry_after, "{block:?}");
    }
    let log = nginx.wait_access_log(WAIT, |e| e.len() >= 3).unwrap();
    let seen: Vec<(Block, u16)> = log.iter().map(|e| (e.block, e.status)).collect();
    assert_eq!(
        seen,
        [
            (Block::Error500, 500),
            (Block::TooManyRequests, 429),
            (Block::Unavailable, 503)
        ]
    );

    let seconds = Nginx::builder(root.path()).retry_after(30).start().unwrap();
    for block in [Block::TooManyRequests, Block::Unavailable] {
        let resp = tls_agent(seconds.ca_file())
            .get(&seconds.url_of(block, "/"))
            .call()
            .unwrap();
        assert_eq!(resp.headers().get("retry-after").unwrap(), "30");
    }
}

#[test]
fn the_untrusted_ca_block_fails_verification_but_serves_the_same_files() {
    updraft_tests::require!("nginx");
    let root = docroot(&[("manifest.json", b"{}")]);
    let nginx = start_nginx(root.path());
    let url = nginx.url_of(Block::UntrustedCert, "/manifest.json");
    let err = tls_agent(nginx.ca_file())
        .get(&url)
        .call()
        .expect_err("untrusted CA accepted");
    let msg = err.to_string();
    assert!(
        msg.contains("UnknownIssuer") || msg.to_lowercase().contains("certificate"),
        "not a certificate error: {msg}"
    );
    // The block itself works: trusting its CA instead, the same request succeeds.
    let mut ok = tls_agent(nginx.untrusted_ca_file())
        .get(&url)
        .call()
        .unwrap();
    assert_eq!(ok.body_mut().read_to_vec().unwrap(), b"{}");
    // And the main server's CA is not the untrusted one.
    assert!(
        tls_agent(nginx.untrusted_ca_file())
            .get(&nginx.url("/manifest.json"))
            .call()
            .is_err()
    );
}

#[test]
fn a_missing_nginx_fails_with_the_debian_package_name() {
    let root = docroot(&[]);
    let err = Nginx::builder(root.path())
        .binary("/nonexistent/sbin/nginx")
        .start()
        .err()
        .expect("started without nginx");
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/sbin/nginx") && msg.contains("Debian package `nginx`"),
        "{msg}"
    );
}

#[test]
fn nginx_stops_on_drop_and_leaves_nothing_running() {
    updraft_tests::require!("nginx");
    let root = docroot(&[("f", b"x")]);
    let parent = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder(root.path())
        .in_dir(parent.path())
        .start()
        .unwrap();
    let pid = nginx.pid().unwrap();
    let addr = nginx.addr();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let workers: Vec<u32> = children
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    assert_eq!(workers.len(), 1, "one worker: {children:?}");
    drop(nginx);
    for p in std::iter::once(pid).chain(workers) {
        assert!(
            !Path::new(&format!("/proc/{p}")).exists(),
            "process {p} still exists"
        );
    }
    assert_eq!(
        TcpStream::connect(addr).unwrap_err().kind(),
        ErrorKind::ConnectionRefused
    );
}

/// A plain TCP server that sends `data` on every connection and then closes
/// its sending side (reading whatever the client sends until it closes).
fn byte_server(data: Vec<u8>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let data = data.clone();
            thread::spawn(move || {
                let _ = s.write_all(&data);
                let _ = s.shutdown(Shutdown::Write);
                let _ = std::io::copy(&mut s, &mut std::io::sink());
            });
        }
    });
    addr
}

/// Read until EOF or an error; returns the bytes and the error kind, if any.
fn read_all(s: &mut TcpStream) -> (Vec<u8>, Option<ErrorKind>) {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, None),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return (out, Some(e.kind())),
        }
    }
}

#[test]
fn proxy_reset_after_n_delivers_n_bytes_then_a_connection_reset() {
    let data = pattern(200_000);
    let proxy = Proxy::start(byte_server(data.clone())).unwrap();
    proxy.set_default(Behaviour::ResetAfter(1000));
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    let (got, err) = read_all(&mut c);
    assert_eq!(got, &data[..1000]);
    assert_eq!(err, Some(ErrorKind::ConnectionReset));
    let stats = proxy.wait_idle(WAIT);
    assert_eq!((stats[0].to_client, stats[0].open), (1000, false));
}

#[test]
fn proxy_close_after_n_truncates_with_a_clean_end_of_stream() {
    let data = pattern(200_000);
    let proxy = Proxy::start(byte_server(data.clone())).unwrap();
    proxy.set_default(Behaviour::CloseAfter(4321));
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    let (got, err) = read_all(&mut c);
    assert_eq!((got.as_slice(), err), (&data[..4321], None));
    drop(c);
    assert_eq!(proxy.wait_idle(WAIT)[0].to_client, 4321);
}

#[test]
fn proxy_stall_after_n_sends_n_bytes_then_nothing_while_staying_open() {
    let data = pattern(50_000);
    let proxy = Proxy::start(byte_server(data.clone())).unwrap();
    proxy.script([Behaviour::StallAfter(700), Behaviour::Stall]);
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    let mut got = vec![0u8; 700];
    c.read_exact(&mut got).unwrap();
    assert_eq!(got, &data[..700]);
    c.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut more = [0u8; 1];
    let e = c
        .read(&mut more)
        .expect_err("data or EOF after the stall point");
    assert!(
        matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{e}"
    );

    // Stall from the start: the upstream is never contacted.
    let mut s = TcpStream::connect(proxy.addr()).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let e = s
        .read(&mut more)
        .expect_err("an answer from a stalled connection");
    assert!(
        matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{e}"
    );
    let stats = proxy.connections();
    assert_eq!(
        (stats[1].upstream, stats[1].to_client, stats[1].to_server),
        (None, 0, 0)
    );

    // reset_all ends both.
    proxy.reset_all();
    assert_eq!(read_all(&mut c).1, Some(ErrorKind::ConnectionReset));
    assert_eq!(read_all(&mut s).1, Some(ErrorKind::ConnectionReset));
    assert!(proxy.wait_idle(WAIT).iter().all(|c| !c.open));
}

#[test]
fn proxy_refuse_resets_at_once_and_never_contacts_the_upstream() {
    let proxy = Proxy::start(byte_server(pattern(10))).unwrap();
    proxy.script([Behaviour::Refuse]);
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    let (got, err) = read_all(&mut c);
    assert!(got.is_empty());
    assert_eq!(err, Some(ErrorKind::ConnectionReset));
    let stats = proxy.wait_idle(WAIT);
    assert_eq!(
        (stats[0].behaviour, stats[0].upstream),
        (Behaviour::Refuse, None)
    );
    // The script is used up: the next connection passes.
    let (got, err) = read_all(&mut TcpStream::connect(proxy.addr()).unwrap());
    assert_eq!((got.len(), err), (10, None));
}

#[test]
fn proxy_drip_forwards_everything_no_faster_than_the_rate() {
    let data = pattern(3000);
    let proxy = Proxy::start(byte_server(data.clone())).unwrap();
    proxy.set_default(Behaviour::Drip {
        bytes_per_sec: 4000,
    });
    let started = Instant::now();
    let (got, err) = read_all(&mut TcpStream::connect(proxy.addr()).unwrap());
    let took = started.elapsed();
    assert_eq!((got, err), (data, None));
    // A rate limit is a lower bound on duration: 3000 B at 4000 B/s take at
    // least 0.75 s (the first 200-byte slice is due at 50 ms).
    assert!(
        took >= Duration::from_millis(700),
        "3000 bytes arrived in {took:?}"
    );
}

#[test]
fn proxy_over_tls_counts_bytes_and_routes_single_connections_to_other_blocks() {
    updraft_tests::require!("nginx");
    let data = pattern(64 * 1024);
    let root = docroot(&[("a.bin", &data)]);
    let nginx = start_nginx(root.path());
    let proxy = Proxy::start(nginx.addr()).unwrap();
    let via = |path: &str| format!("https://127.0.0.1:{}{path}", proxy.port());

    // Pass: TLS end to end through the proxy.
    let mut resp = tls_agent(nginx.ca_file())
        .get(&via("/a.bin"))
        .call()
        .unwrap();
    assert_eq!(resp.body_mut().read_to_vec().unwrap(), data);
    drop(resp);

    // Upstream: one connection goes to the 429 block, the next passes again.
    proxy.script([Behaviour::Upstream(nginx.addr_of(Block::TooManyRequests))]);
    let mut resp = tls_agent(nginx.ca_file())
        .get(&via("/a.bin"))
        .call()
        .unwrap();
    assert_eq!(resp.status(), 429);
    resp.body_mut().read_to_vec().unwrap();
    let mut resp = tls_agent(nginx.ca_file())
        .get(&via("/a.bin"))
        .call()
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.body_mut().read_to_vec().unwrap(), data);

    // ResetAfter mid-body: the client sees an error, not a short body.
    proxy.script([Behaviour::ResetAfter(20_000)]);
    let res = tls_agent(nginx.ca_file())
        .get(&via("/a.bin"))
        .call()
        .and_then(|mut r| r.body_mut().read_to_vec());
    assert!(res.is_err(), "a reset download completed");

    // CloseAfter mid-body: a clean FIN before Content-Length is an error too.
    proxy.script([Behaviour::CloseAfter(20_000)]);
    let res = tls_agent(nginx.ca_file())
        .get(&via("/a.bin"))
        .call()
        .and_then(|mut r| r.body_mut().read_to_vec());
    assert!(res.is_err(), "a truncated download completed");

    // Refuse: the TLS handshake fails.
    proxy.script([Behaviour::Refuse]);
    assert!(
        tls_agent(nginx.ca_file())
            .get(&via("/a.bin"))
            .call()
            .is_err()
    );

    let stats = proxy.wait_idle(WAIT);
    let behaviours: Vec<Behaviour> = stats.iter().map(|c| c.behaviour).collect();
    assert_eq!(
        behaviours,
        [
            Behaviour::Pass,
            Behaviour::Upstream(nginx.addr_of(Block::TooManyRequests)),
            Behaviour::Pass,
            Behaviour::ResetAfter(20_000),
            Behaviour::CloseAfter(20_000),
            Behaviour::Refuse,
        ]
    );
    assert_eq!(stats[3].to_client, 20_000);
    assert_eq!(stats[4].to_client, 20_000);
    assert_eq!(stats[5].to_client + stats[5].to_server, 0);
    let totals = proxy.totals();
    assert_eq!(totals.connections, 6);
    assert_eq!(
        totals.to_client,
        stats.iter().map(|c| c.to_client).sum::<u64>()
    );
    assert_eq!(
        totals.to_server,
        stats.iter().map(|c| c.to_server).sum::<u64>()
    );

    // The full downloads carried the whole response plus TLS records and
    // handshake: nginx's own count (found by the proxy's source port) is
    // below what crossed the proxy.
    let log = main_entries(&nginx, 4);
    for conn in [&stats[0], &stats[2]] {
        let port = conn.upstream_local.unwrap().port();
        let entry = log.iter().find(|e| e.remote_port == port).expect("logged");
        assert_eq!(
            (entry.status, entry.body_bytes_sent),
            (200, data.len() as u64)
        );
        assert!(conn.to_client > entry.bytes_sent, "{conn:?} vs {entry:?}");
        assert!(
            conn.to_server > entry.request_length,
            "{conn:?} vs {entry:?}"
        );
    }
}

fn post(agent: &ureq::Agent, url: &str, key: &str, body: &str) -> Result<u16, ureq::Error> {
    agent
        .post(url)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .send(body)
        .map(|r| r.status().as_u16())
}

#[test]
fn the_collector_records_posts_through_nginx_and_deduplicates_by_key() {
    updraft_tests::require!("nginx");
    let collector = Collector::start().unwrap();
    let root = docroot(&[]);
    let nginx = Nginx::builder(root.path())
        .report_to("/report", collector.addr())
        .start()
        .unwrap();
    let agent = tls_agent(nginx.ca_file());
    let url = nginx.url("/report/device-1");
    assert_eq!(
        post(&agent, &url, "k1", r#"{"state":"Idle"}"#).unwrap(),
        204
    );
    assert_eq!(
        post(&agent, &url, "k2", r#"{"state":"Checking"}"#).unwrap(),
        204
    );
    assert_eq!(
        post(&agent, &url, "k1", r#"{"state":"Idle"}"#).unwrap(),
        204
    );

    let reports = collector.wait_for_reports(3, WAIT);
    let keys: Vec<_> = reports
        .iter()
        .map(|r| r.idempotency_key.as_deref().unwrap())
        .collect();
    assert_eq!(keys, ["k1", "k2", "k1"]);
    assert_eq!(reports[1].path, "/report/device-1");
    assert_eq!(reports[1].json().unwrap()["state"], "Checking");
    assert_eq!(reports[1].header("content-type"), Some("application/json"));
    assert!(reports[0].received <= reports[1].received);
    let unique: Vec<_> = collector
        .unique_reports()
        .into_iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(unique, [0, 1]);
    assert_eq!(collector.duplicate_count(), 1);

    // nginx logged the key too.
    let log = main_entries(&nginx, 3);
    assert_eq!(log[0].idempotency_key.as_deref(), Some("k1"));
    assert_eq!(log[0].method, "POST");
}

#[test]
fn the_collector_goes_down_and_comes_back_on_the_same_port() {
    updraft_tests::require!("nginx");
    let collector = Collector::start().unwrap();
    let root = docroot(&[]);
    let nginx = Nginx::builder(root.path())
        .report_to("/report", collector.addr())
        .start()
        .unwrap();
    let agent = tls_agent(nginx.ca_file());
    let url = nginx.url("/report");
    assert_eq!(post(&agent, &url, "a", "{}").unwrap(), 204);

    collector.set_mode(Mode::Refusing).unwrap();
    assert_eq!(
        TcpStream::connect(collector.addr()).unwrap_err().kind(),
        ErrorKind::ConnectionRefused
    );
    assert_eq!(
        post(&agent, &url, "b", "{}").unwrap(),
        502,
        "nginx cannot reach it"
    );

    collector
        .set_mode(Mode::Unavailable {
            retry_after: Some(30),
        })
        .unwrap();
    let resp = agent
        .post(&url)
        .header("Idempotency-Key", "c")
        .send("{}")
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers().get("retry-after").unwrap(), "30");
    assert_eq!(collector.rejected_count(), 1);

    collector.up().unwrap();
    assert_eq!(post(&agent, &url, "d", "{}").unwrap(), 204);
    // Direct plain HTTP works as well.
    let direct = ureq::Agent::new_with_defaults()
        .post(&collector.url("/report"))
        .header("Idempotency-Key", "e")
        .send("{}")
        .unwrap();
    assert_eq!(direct.status(), 204);

    let keys: Vec<_> = collector
        .wait_for_reports(3, WAIT)
        .iter()
        .map(|r| r.idempotency_key.clone().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["a", "d", "e"],
        "only reports made while up are recorded"
    );
}

#[test]
fn a_resumed_tls_session_shows_in_the_access_log() {
    updraft_tests::require!("nginx");
    let root = docroot(&[("manifest.json", b"{}")]);
    let nginx = start_nginx(root.path());
    let agent = tls_agent(nginx.ca_file());
    for _ in 0..2 {
        let mut r = agent
            .get(&nginx.url("/manifest.json"))
            .header("Connection", "close")
            .call()
            .unwrap();
        r.body_mut().read_to_vec().unwrap();
    }
    let log = main_entries(&nginx, 2);
    assert_ne!(log[0].connection, log[1].connection, "two connections");
    assert_eq!(
        (log[0].ssl_session_reused, log[1].ssl_session_reused),
        (false, true)
    );
}

fn openssl_verify(ca: &Path, chain: &Path) -> std::process::Output {
    Command::new("openssl")
        .arg("verify")
        .arg("-CAfile")
        .arg(ca)
        .arg(chain)
        .output()
        .expect("run openssl (Debian package openssl)")
}

#[test]
fn test_ca_files_verify_with_openssl_and_only_against_their_own_ca() {
    updraft_tests::require!("openssl");
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("updraft test CA").unwrap();
    let other = TestCa::new("updraft untrusted test CA").unwrap();
    let files = ca.write_server_files(dir.path(), "server").unwrap();
    let chain = std::fs::read_to_string(&files.chain).unwrap();
    assert_eq!(
        chain.matches("BEGIN CERTIFICATE").count(),
        2,
        "leaf then CA"
    );
    assert!(chain.ends_with(&ca.cert_pem()));
    assert!(
        std::fs::read_to_string(&files.key)
            .unwrap()
            .contains("BEGIN PRIVATE KEY")
    );
    let mode = std::fs::metadata(&files.key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let ok = openssl_verify(&files.ca_cert, &files.chain);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let other_ca = dir.path().join("other.pem");
    other.write_cert(&other_ca).unwrap();
    assert!(!openssl_verify(&other_ca, &files.chain).status.success());

    // A validity window in the past gives an expired certificate.
    let day = Duration::from_secs(86_400);
    let now = std::time::SystemTime::now();
    let expired = ca
        .issue_valid(&["127.0.0.1"], now - 10 * day, now - day)
        .unwrap();
    let (chain, _) = expired.write(dir.path(), "expired").unwrap();
    let out = openssl_verify(&files.ca_cert, &chain);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expired"),
        "{out:?}"
    );
}
