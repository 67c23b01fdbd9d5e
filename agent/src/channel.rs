//! Which release channel this device follows, and who chose it.
//!
//! A channel (`stable`, `beta`, …) is a sequence of releases with serials
//! of its own. Every manifest names its channel inside the signed payload
//! and a device acts only on manifests of the one channel it follows, so a
//! manifest copied from another channel's directory can neither install
//! nor move a serial floor. The channel comes from `[server] channel` of
//! the image's configuration unless an operator chose another with
//! `updraft channel NAME`; that choice is kept in the database on the data
//! partition, so the next image does not undo it. Where a channel's
//! manifest lives is `{channel}` in `server.manifest_url` and the mirrors.
//!
//! This module decides the followed channel from the configuration and the
//! store; it never fetches and never judges a manifest (that is
//! [`crate::manifest::Manifest::check_channel`]).

use serde::{Deserialize, Serialize};

use crate::config::Server;
use crate::error::Result;
use crate::store::Store;

/// The channel followed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Followed {
    pub name: String,
    /// `configuration` or `operator`.
    pub source: String,
}

impl Followed {
    /// The channel the configuration names.
    pub fn configured(server: &Server) -> Followed {
        Followed {
            name: server.channel.clone(),
            source: "configuration".into(),
        }
    }

    /// The channel to follow: the operator's choice when one is stored and
    /// the configuration can serve it, else the configuration's. A choice
    /// this image cannot follow (its `manifest_url` has no `{channel}`) is
    /// kept for a later image and reported as a warning, never fatal: the
    /// device keeps updating on its configured channel.
    pub fn resolve(server: &Server, store: &Store) -> Result<Followed> {
        let configured = Followed::configured(server);
        let Some(choice) = store.channel_choice()? else {
            return Ok(configured);
        };
        if choice == configured.name {
            return Ok(Followed {
                name: choice,
                source: "operator".into(),
            });
        }
        let mut probe = server.clone();
        match probe.follow(&choice) {
            Ok(()) => Ok(Followed {
                name: choice,
                source: "operator".into(),
            }),
            Err(e) => {
                log::warn!(
                    "channel {choice}, chosen by an operator, cannot be followed with this configuration ({}); \
                     following channel {}",
                    e.message(),
                    configured.name
                );
                Ok(configured)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(url: &str) -> Server {
        Server {
            manifest_url: url.into(),
            mirrors: vec!["https://mirror.example/{channel}/".into()],
            ..Server::default()
        }
    }

    #[test]
    fn the_placeholder_points_the_urls_at_the_channel() {
        let mut s = server("https://u.example/{channel}/manifest.json");
        s.follow("beta").unwrap();
        assert_eq!(s.manifest_url, "https://u.example/beta/manifest.json");
        assert_eq!(s.mirrors, ["https://mirror.example/beta/"]);
    }

    #[test]
    fn without_the_placeholder_only_the_configured_channel_can_be_followed() {
        let mut s = server("https://u.example/stable/manifest.json");
        assert!(s.clone().follow("stable").is_ok());
        let e = s.follow("beta").unwrap_err();
        assert!(e.message().contains("has no {channel} placeholder"), "{e}");
        assert!(
            e.message()
                .contains("following beta would refuse every manifest"),
            "{e}"
        );
    }
}
