//! Security settings: sign-in throttling, the door in front of sign-up and
//! the waiting rooms, which proxies may name the
//! client's address, and how long a session lasts.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use ipnet::IpNet;

use super::env::{parse_var, var};

#[derive(Debug, Clone)]
pub struct SecuritySettings {
    pub login_limits: LoginLimits,
    pub trusted_proxies: TrustedProxies,
    /// How long a signed-in session lasts, however active it is.
    pub session_ttl: Duration,
    /// How often each process proves its copy of the revoked sessions
    /// current: a round trip on its listening connection, or a poll while
    /// it cannot listen. Under a second, or the copy is never fresh enough
    /// to trust and every page asks the sessions table.
    pub session_poll_interval: Duration,
    /// The door in front of sign-up and the waiting rooms (`services::door`).
    pub door: DoorSettings,
}

/// How hard the door's puzzle is and how many visitors one client address
/// may send through it within `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorSettings {
    /// The puzzle's size at sign-up: the tries a browser makes on average.
    pub signup_work: i32,
    /// The size a new sale's waiting room starts with (the admin sets each).
    pub join_work: i32,
    pub signups_per_address: u32,
    /// Per sale: joins of its waiting room from one address.
    pub joins_per_address: u32,
    pub window: Duration,
}

/// The largest puzzle an admin may set: about a minute in a slow phone.
pub const MAX_CHECK_WORK: i32 = 1_000_000;

/// How many unsuccessful sign-ins are allowed within `window`, per account
/// email and per client address, before further attempts are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginLimits {
    pub per_email: u32,
    pub per_ip: u32,
    pub window: Duration,
}

impl Default for SecuritySettings {
    fn default() -> Self {
        SecuritySettings {
            login_limits: LoginLimits {
                per_email: 5,
                per_ip: 20,
                window: Duration::from_secs(15 * 60),
            },
            trusted_proxies: TrustedProxies::default(),
            session_ttl: Duration::from_secs(12 * 3600),
            session_poll_interval: Duration::from_millis(250),
            door: DoorSettings {
                signup_work: 2_000,
                join_work: 2_000,
                // A household or an office shares an address; a script
                // making accounts by the hundred does too.
                signups_per_address: 10,
                joins_per_address: 20,
                window: Duration::from_secs(3600),
            },
        }
    }
}

impl SecuritySettings {
    /// `LOGIN_FAILURES_PER_EMAIL`, `LOGIN_FAILURES_PER_IP`,
    /// `LOGIN_THROTTLE_WINDOW_SECS`, `TRUSTED_PROXY`, `SESSION_TTL_HOURS`,
    /// `SESSION_POLL_MS`; anything unset keeps its default.
    pub fn from_env() -> anyhow::Result<SecuritySettings> {
        let defaults = SecuritySettings::default();
        let settings = SecuritySettings {
            login_limits: LoginLimits {
                per_email: parse_var("LOGIN_FAILURES_PER_EMAIL", defaults.login_limits.per_email)?,
                per_ip: parse_var("LOGIN_FAILURES_PER_IP", defaults.login_limits.per_ip)?,
                window: Duration::from_secs(parse_var(
                    "LOGIN_THROTTLE_WINDOW_SECS",
                    defaults.login_limits.window.as_secs(),
                )?),
            },
            trusted_proxies: match var("TRUSTED_PROXY") {
                Some(raw) => TrustedProxies::parse(&raw).context("TRUSTED_PROXY")?,
                None => defaults.trusted_proxies,
            },
            session_ttl: Duration::from_secs(
                3600 * parse_var("SESSION_TTL_HOURS", defaults.session_ttl.as_secs() / 3600)?,
            ),
            session_poll_interval: Duration::from_millis(parse_var(
                "SESSION_POLL_MS",
                defaults.session_poll_interval.as_millis() as u64,
            )?),
            door: DoorSettings {
                signup_work: parse_var("SIGNUP_CHECK_WORK", defaults.door.signup_work)?,
                join_work: parse_var("JOIN_CHECK_WORK", defaults.door.join_work)?,
                signups_per_address: parse_var(
                    "SIGNUPS_PER_ADDRESS",
                    defaults.door.signups_per_address,
                )?,
                joins_per_address: parse_var("JOINS_PER_ADDRESS", defaults.door.joins_per_address)?,
                window: Duration::from_secs(parse_var(
                    "DOOR_WINDOW_SECS",
                    defaults.door.window.as_secs(),
                )?),
            },
        };
        let limits = settings.login_limits;
        if limits.per_email == 0 || limits.per_ip == 0 || limits.window.is_zero() {
            bail!("the sign-in throttle needs limits and a window of at least 1");
        }
        let door = settings.door;
        let works = 1..=MAX_CHECK_WORK;
        if !works.contains(&door.signup_work) || !works.contains(&door.join_work) {
            bail!("SIGNUP_CHECK_WORK and JOIN_CHECK_WORK must be between 1 and {MAX_CHECK_WORK}");
        }
        if door.signups_per_address == 0 || door.joins_per_address == 0 || door.window.is_zero() {
            bail!("SIGNUPS_PER_ADDRESS, JOINS_PER_ADDRESS and DOOR_WINDOW_SECS must be at least 1");
        }
        if settings.session_ttl.is_zero() {
            bail!("SESSION_TTL_HOURS must be at least 1");
        }
        // A copy whose last proof is older than a second is not trusted
        // (`services::revocations`).
        let poll = settings.session_poll_interval;
        if poll.is_zero() || poll >= Duration::from_secs(1) {
            bail!("SESSION_POLL_MS must be between 1 and 999");
        }
        Ok(settings)
    }
}

/// The reverse proxies whose `X-Forwarded-For` is believed. Empty (the
/// default) means the TCP peer is the client, whatever the header says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Comma-separated addresses or networks, e.g. `10.0.0.0/8, 127.0.0.1`.
    pub fn parse(raw: &str) -> anyhow::Result<TrustedProxies> {
        raw.split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .with_context(|| format!("{entry:?} is not an IP address or network"))
            })
            .collect::<anyhow::Result<_>>()
            .map(TrustedProxies)
    }

    fn trusts(&self, address: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&address))
    }

    /// The client's address: the peer, unless the peer is a trusted proxy; then
    /// the right-most `X-Forwarded-For` hop that is not itself a trusted proxy.
    /// Hops further left were written by the client and prove nothing.
    pub fn client_ip<'a>(
        &self,
        peer: IpAddr,
        forwarded_for: impl DoubleEndedIterator<Item = &'a str>,
    ) -> IpAddr {
        let mut client = peer;
        if !self.trusts(peer) {
            return client;
        }
        for hop in forwarded_for.rev() {
            match hop.trim().parse::<IpAddr>() {
                Ok(address) => {
                    client = address;
                    if !self.trusts(address) {
                        break;
                    }
                }
                // A hop that is no address ends the chain we can believe.
                Err(_) => break,
            }
        }
        client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(raw: &str) -> IpAddr {
        raw.parse().unwrap()
    }

    fn hops(header: &str) -> impl DoubleEndedIterator<Item = &str> {
        header.split(',')
    }

    #[test]
    fn without_trusted_proxies_the_peer_is_the_client() {
        let proxies = TrustedProxies::default();
        assert_eq!(
            proxies.client_ip(ip("198.51.100.7"), hops("203.0.113.1")),
            ip("198.51.100.7")
        );
    }

    #[test]
    fn a_trusted_proxy_names_the_first_untrusted_hop_from_the_right() {
        let proxies = TrustedProxies::parse("10.0.0.0/8, 127.0.0.1").unwrap();
        // The client forged the left-most hop; the proxies appended the rest.
        let header = "1.2.3.4, 203.0.113.9, 10.1.2.3";
        assert_eq!(
            proxies.client_ip(ip("127.0.0.1"), hops(header)),
            ip("203.0.113.9")
        );
        assert_eq!(
            proxies.client_ip(ip("127.0.0.1"), hops("")),
            ip("127.0.0.1")
        );
        assert_eq!(
            proxies.client_ip(ip("10.0.0.1"), hops("garbage, 10.0.0.2")),
            ip("10.0.0.2")
        );
        // A peer outside the list is not believed, whatever it sends.
        assert_eq!(
            proxies.client_ip(ip("198.51.100.7"), hops("203.0.113.9")),
            ip("198.51.100.7")
        );
    }

    #[test]
    fn proxies_parse_addresses_and_networks() {
        assert!(TrustedProxies::parse("10.0.0.0/8,::1, 192.168.1.1").is_ok());
        assert!(TrustedProxies::parse("not-an-ip").is_err());
        assert_eq!(
            TrustedProxies::parse(" ").unwrap(),
            TrustedProxies::default()
        );
    }
}
