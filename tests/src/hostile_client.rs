//! Hostile local clients of the control socket, run as an unprivileged
//! user.
//!
//! [`Drip`] holds several connections to a daemon's socket open and sends
//! each a byte at a time without ever finishing a request, reconnecting
//! whenever the daemon drops one: the slow-request attack of a local user.
//! It runs as uid/gid 65534 (nobody/nogroup) through `setpriv`, so the
//! daemon sees a real unprivileged peer in `SO_PEERCRED`; the client itself
//! is a short Perl program (Perl is on every test host; the daemon's side
//! is what is under test).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The uid and gid the hostile client runs as.
pub const NOBODY: u32 = 65534;

const DRIP: &str = r#"
use strict;
use IO::Socket::UNIX;
use Socket qw(SOCK_STREAM);
use Time::HiRes qw(time sleep);
$SIG{PIPE} = 'IGNORE';
my ($path, $n, $secs, $gap) = @ARGV;
my $end = time + $secs;
my @s;
my ($connects, $bytes) = (0, 0);
while (time < $end) {
    for my $i (0 .. $n - 1) {
        if (!$s[$i]) {
            $s[$i] = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $path);
            $connects++ if $s[$i];
        }
        next unless $s[$i];
        my $w = syswrite($s[$i], "{");
        if (defined $w && $w == 1) { $bytes++ } else { close $s[$i]; $s[$i] = undef; }
    }
    sleep $gap;
}
print "connects $connects bytes $bytes\n";
"#;

/// `perl -e SCRIPT` as the unprivileged uid 65534 (no groups): how the
/// tests play a local user who is not root.
pub fn perl_as_nobody(script: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "perl",
        "-e",
    ])
    .arg(script);
    c
}

/// A running drip attack.
pub struct Drip {
    child: Option<Child>,
}

/// What the attacker managed.
#[derive(Debug, Clone, Copy)]
pub struct DripReport {
    pub connects: u64,
    pub bytes: u64,
}

impl Drip {
    /// Start `connections` dripping connections to `socket` for `run`, one
    /// byte per connection every `gap`, as uid 65534.
    pub fn start(socket: &Path, connections: u32, run: Duration, gap: Duration) -> Drip {
        let child = perl_as_nobody(DRIP)
            .arg(socket)
            .arg(connections.to_string())
            .arg(format!("{:.3}", run.as_secs_f64()))
            .arg(format!("{:.3}", gap.as_secs_f64()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the dripping client (setpriv, perl)");
        Drip { child: Some(child) }
    }

    /// Wait for the attack to end and say what it did.
    pub fn finish(mut self) -> DripReport {
        let child = self.child.take().expect("drip running");
        let out = child
            .wait_with_output()
            .expect("waiting for the dripping client");
        assert!(
            out.status.success(),
            "the dripping client failed: {}",
            out.status
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let num = |key: &str| -> u64 {
            text.split_whitespace()
                .skip_while(|w| *w != key)
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("dripping client said {text:?}"))
        };
        DripReport {
            connects: num("connects"),
            bytes: num("bytes"),
        }
    }
}

impl Drop for Drip {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Our own child, by its handle.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether the hostile client can run here (root, setpriv, perl).
pub fn unavailable() -> Option<&'static str> {
    if !crate::skip::is_root() {
        return Some("needs root to run a client as another user");
    }
    if !crate::skip::on_path("setpriv") {
        return Some("setpriv (util-linux) is not installed");
    }
    if !crate::skip::on_path("perl") {
        return Some("perl is not installed");
    }
    None
}
