//! The server a device answers to, as one seam: a directory of static
//! files (`server.kind = "static"`) or a hawkBit DDI server (`"hawkbit"`).
//!
//! The two differ in how a release is found, where reports go and how
//! often the device asks; the update itself (verification, the job, the
//! slot, the trial boot) is the same. Everything that depends on the kind
//! is answered here, once, from a [`Server`] built when the machine opens:
//! whether and how often it is polled, whether it is polled while a reboot
//! is awaited, where a report of each kind goes, whether reports are
//! delivered to the server a poll reaches, and delivering them. The
//! machine asks these questions; it never looks at `server.kind` or at
//! the configuration's URLs to decide what the mode is.
//!
//! The DDI mode's own state (the controller resource, the action a check
//! is about to start, the cancel being carried out, the deployment seen)
//! lives in [`Fleet`], owned by the `Ddi` variant; what a DDI poll leads
//! to is [`super::fleet`]'s.
//!
//! This module never decides what is installed and never makes a
//! transition.

use std::time::Duration;

use crate::config::{self, ServerKind};
use crate::error::Result;
use crate::fetch::{Fetcher, UrlOrigin};
use crate::hawkbit::Controller;
use crate::progress::Ticker;
use crate::report;
use crate::store::Store;

use super::fleet::Fleet;

/// The server this device answers to.
pub(crate) enum Server {
    /// Static files: a manifest polled at `server.manifest_url` and its
    /// mirrors (`polled: false`: none is set, releases come from the
    /// operator's `updraft install`), reports posted to
    /// `server.report_url` (`reports: false`: none is set, none are
    /// queued). The URLs themselves stay in the configuration, which
    /// follows the channel the device follows.
    Static { polled: bool, reports: bool },
    /// A hawkBit DDI server: polled at its controller resource, which also
    /// takes every report as action feedback.
    Ddi(Box<Fleet>),
}

impl Server {
    /// The server `cfg` names, `fetcher` its transport (`None` when
    /// nothing is configured to be reached).
    pub(super) fn new(cfg: &config::Server, device_id: &str, fetcher: Option<&Fetcher>) -> Server {
        match (cfg.kind, fetcher) {
            (ServerKind::Hawkbit, Some(f)) => Server::Ddi(Box::new(Fleet::new(Controller::new(
                cfg,
                device_id,
                f.clone(),
            )))),
            _ => Server::Static {
                polled: !cfg.manifest_url.is_empty(),
                reports: !cfg.report_url.is_empty(),
            },
        }
    }

    /// Whether the server's kind needs a transport at all.
    pub(super) fn needs_fetcher(cfg: &config::Server) -> bool {
        cfg.kind == ServerKind::Hawkbit
            || !cfg.manifest_url.is_empty()
            || !cfg.report_url.is_empty()
    }

    /// The DDI mode's state, in that mode.
    pub(super) fn fleet(&self) -> Option<&Fleet> {
        match self {
            Server::Ddi(f) => Some(f),
            Server::Static { .. } => None,
        }
    }

    pub(super) fn fleet_mut(&mut self) -> Option<&mut Fleet> {
        match self {
            Server::Ddi(f) => Some(f),
            Server::Static { .. } => None,
        }
    }

    /// Whether the daemon polls a server.
    pub(super) fn polled(&self) -> bool {
        match self {
            Server::Static { polled, .. } => *polled,
            Server::Ddi(_) => true,
        }
    }

    /// Whether the server is polled while a reboot is awaited, overdue or
    /// not: a DDI server's cancelAction is answered then (accepted before
    /// the reboot was requested, rejected after).
    pub(super) fn polled_while_rebooting(&self) -> bool {
        matches!(self, Server::Ddi(_))
    }

    /// The polling interval the server asked for at its last answer (a DDI
    /// server's `polling.sleep`, within bounds).
    pub(super) fn sleep(&self) -> Option<Duration> {
        self.fleet().and_then(|f| f.sleep)
    }

    /// Whether a report of `kind` is queued: DDI feedback for a DDI server,
    /// the other kinds for a static `report_url`.
    pub(super) fn takes(&self, kind: &str) -> bool {
        match self {
            Server::Static { reports, .. } => *reports && !report::is_ddi_kind(kind),
            Server::Ddi(_) => report::is_ddi_kind(kind),
        }
    }

    /// Whether reports are queued and delivered at all.
    pub(super) fn delivers(&self) -> bool {
        match self {
            Server::Static { reports, .. } => *reports,
            Server::Ddi(_) => true,
        }
    }

    /// Whether the reports go to the server a poll talks to, so that a
    /// poll it answered says the reports can go too: a DDI server takes
    /// both; a static `report_url` may share the scheme, host and port of
    /// the manifest URL or a mirror (`cfg`: the server as configured).
    pub(super) fn reports_go_to_the_polled_server(&self, cfg: &config::Server) -> bool {
        if let Server::Ddi(_) = self {
            return true;
        }
        // `{channel}` is not a valid URI character; it only ever names a path.
        let origin = |u: &str| UrlOrigin::of(&u.replace(config::CHANNEL_PLACEHOLDER, "channel"));
        let Some(reports) = origin(&cfg.report_url) else {
            return false;
        };
        std::iter::once(&cfg.manifest_url)
            .chain(&cfg.mirrors)
            .any(|u| origin(u).as_ref() == Some(&reports))
    }

    /// Deliver queued reports to where they go (`cfg`: the server as
    /// configured), signed with `key` when the device has one; how many
    /// were delivered.
    pub(super) fn deliver(
        &self,
        store: &Store,
        fetcher: Option<&Fetcher>,
        cfg: &config::Server,
        key: Option<&crate::device_key::DeviceKey>,
        t: &mut dyn Ticker,
    ) -> Result<usize> {
        match (self, fetcher) {
            (Server::Ddi(f), _) => crate::hawkbit::deliver(store, &f.controller, key, t),
            (Server::Static { reports: true, .. }, Some(fetcher)) => {
                report::deliver(store, fetcher, &cfg.report_url, key, t)
            }
            (Server::Static { .. }, _) => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(manifest: &str, report: &str, mirrors: &[&str]) -> config::Server {
        config::Server {
            manifest_url: manifest.into(),
            report_url: report.into(),
            mirrors: mirrors.iter().map(|m| m.to_string()).collect(),
            ..config::Server::default()
        }
    }

    #[test]
    fn a_static_server_is_polled_and_reported_to_only_where_configured() {
        // (manifest_url, report_url) → polled, delivers, takes a state report
        let rows = [
            ("https://u/m.json", "https://u/r", true, true, true),
            ("https://u/m.json", "", true, false, false),
            ("", "https://u/r", false, true, true),
            ("", "", false, false, false),
        ];
        for (m, r, polled, delivers, takes) in rows {
            let s = Server::new(&configured(m, r, &[]), "dev", None);
            assert_eq!(s.polled(), polled, "{m:?} {r:?}");
            assert_eq!(s.delivers(), delivers, "{m:?} {r:?}");
            assert_eq!(s.takes(report::STATE), takes, "{m:?} {r:?}");
            assert!(!s.takes(report::DDI_FEEDBACK), "{m:?} {r:?}");
            assert!(!s.polled_while_rebooting());
            assert_eq!(s.sleep(), None);
        }
    }

    #[test]
    fn reports_share_a_poll_only_with_the_same_origin() {
        let rows = [
            ("https://u/{channel}/m.json", "https://u/r", &[][..], true),
            ("https://u:8443/m.json", "https://u/r", &[][..], false),
            (
                "https://a/m.json",
                "https://b/r",
                &["https://b/m.json"][..],
                true,
            ),
            ("https://a/m.json", "", &[][..], false),
            ("", "https://a/r", &[][..], false),
        ];
        for (m, r, mirrors, want) in rows {
            let cfg = configured(m, r, mirrors);
            assert_eq!(
                Server::new(&cfg, "dev", None).reports_go_to_the_polled_server(&cfg),
                want,
                "{m:?} {r:?} {mirrors:?}"
            );
        }
    }
}
