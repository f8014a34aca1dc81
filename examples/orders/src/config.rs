//! Configuration, from the environment.

use std::{fmt, net::SocketAddr, time::Duration};

/// What the router needs: the simulated payment latency and the idempotency lease and retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// How long the simulated payment provider takes (`PAYMENT_LATENCY_MS`, default 0).
    pub payment_latency: Duration,
    /// How long a claim stays valid without a heartbeat (`IDEMPOTENCY_LEASE_MS`, default 30 s).
    pub lease: Duration,
    /// How long an answer is kept for replays (`IDEMPOTENCY_TTL_SECS`, default 24 h).
    pub ttl: Duration,
    /// How long reading a `POST /orders` body may take before 408 (`BODY_TIMEOUT_MS`, default
    /// 10 s).
    pub body_timeout: Duration,
    /// How many `POST /orders` are handled at once, bodies included (`MAX_IN_FLIGHT_ORDERS`,
    /// default 64); more wait their turn without their bodies being read.
    pub max_in_flight_orders: usize,
    /// Whether each order also writes an `order.created` event to the `outbox` table, in the
    /// same transaction (`OUTBOX`, `true` or `false`, default `false`; PostgreSQL only).
    pub outbox: bool,
}

impl Default for Config {
    /// No payment latency, a 30 s lease, 24 h retention, 10 s to send a body, 64 orders at once,
    /// no outbox.
    fn default() -> Self {
        Self {
            payment_latency: Duration::ZERO,
            lease: tower_idempotency::DEFAULT_LEASE,
            ttl: tower_idempotency::DEFAULT_TTL,
            body_timeout: Duration::from_secs(10),
            max_in_flight_orders: 64,
            outbox: false,
        }
    }
}

/// How the server treats connections: timeouts, bounds, shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// How long a client may take to send a request's head, and how long an idle keep-alive
    /// connection is kept (`HEADER_READ_TIMEOUT_MS`, default 10 s). A slow-loris client is cut
    /// after this.
    pub header_read_timeout: Duration,
    /// The most connections served at once (`MAX_CONNECTIONS`, default 1024); more wait in the
    /// listen backlog.
    pub max_connections: usize,
    /// After SIGTERM or SIGINT, how long running requests get to finish before the process exits
    /// anyway (`SHUTDOWN_GRACE_MS`, default 10 s).
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    /// 10 s for a request head (and idle keep-alive), 1024 connections, 10 s of grace.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Everything the binary reads from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `DATABASE_URL`: `postgres://...`, `mysql://...` or `sqlite://...`; `None` for the default
    /// SQLite file.
    pub database_url: Option<String>,
    /// `BIND_ADDR` (default `127.0.0.1:3000`; port 0 picks a free port).
    pub bind_addr: SocketAddr,
    /// The router's configuration.
    pub config: Config,
    /// The server's timeouts and bounds.
    pub server: ServerConfig,
    /// `ADMIN_TOKEN`: the bearer token of the operator routes under `/admin/idempotency`
    /// ([`admin_routes`](crate::admin_routes)); unset (the default) leaves them unmounted.
    pub admin_token: Option<AdminToken>,
}

/// The secret an operator sends as `Authorization: Bearer <token>` to the admin routes. Its
/// `Debug` hides it, so the settings can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// A token of at least 16 characters (shorter ones are too easily guessed), else `None`.
    pub fn new(token: impl Into<String>) -> Option<Self> {
        let token = token.into();
        (token.len() >= 16).then_some(Self(token))
    }

    /// Whether `presented` is the token, in a time that does not depend on where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let expected = self.0.as_bytes();
        expected.len() == presented.len()
            && expected
                .iter()
                .zip(presented)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// `host:port` as an address: an IP address as it is, a host name (`localhost:3000`) as the
/// first address it resolves to.
fn socket_addr(value: &str) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    value
        .parse()
        .ok()
        .or_else(|| value.to_socket_addrs().ok()?.next())
}

/// The address served on when `BIND_ADDR` is not set.
pub const DEFAULT_BIND_ADDR: &str = "127.0.0.1:3000";

impl Settings {
    /// Read the settings from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Read the settings through `var` (the environment, or a map in tests). An unset or empty
    /// variable takes its default; a value that does not parse is an error naming the variable.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let database_url = get("DATABASE_URL");
        if let Some(url) = &database_url {
            let known = ["postgres://", "postgresql://", "mysql://", "sqlite:"];
            if !known.iter().any(|prefix| url.starts_with(prefix)) {
                return Err(ConfigError::new(
                    "DATABASE_URL",
                    url,
                    "a postgres://..., mysql://... or sqlite://... URL (unset: the SQLite file orders.db)",
                ));
            }
        }
        let bind_addr = match get("BIND_ADDR") {
            None => DEFAULT_BIND_ADDR
                .parse()
                .expect("the default address parses"),
            Some(v) => socket_addr(v.trim()).ok_or_else(|| {
                ConfigError::new(
                    "BIND_ADDR",
                    &v,
                    "an address and port, like 127.0.0.1:3000 or localhost:3000",
                )
            })?,
        };
        let number =
            |name: &'static str, default: u64, min: u64, expected: &'static str| match get(name) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n >= min => Ok(n),
                    _ => Err(ConfigError::new(name, &v, expected)),
                },
            };
        let defaults = Config::default();
        let config = Config {
            payment_latency: Duration::from_millis(number(
                "PAYMENT_LATENCY_MS",
                0,
                0,
                "a whole number of milliseconds, like 250",
            )?),
            lease: Duration::from_millis(number(
                "IDEMPOTENCY_LEASE_MS",
                millis(defaults.lease),
                10,
                "a whole number of milliseconds, at least 10, like 30000",
            )?),
            ttl: Duration::from_secs(number(
                "IDEMPOTENCY_TTL_SECS",
                defaults.ttl.as_secs(),
                1,
                "a whole number of seconds, at least 1, like 86400",
            )?),
            body_timeout: Duration::from_millis(number(
                "BODY_TIMEOUT_MS",
                millis(defaults.body_timeout),
                1,
                "a whole number of milliseconds, at least 1, like 10000",
            )?),
            max_in_flight_orders: count(number(
                "MAX_IN_FLIGHT_ORDERS",
                defaults.max_in_flight_orders as u64,
                1,
                "a whole number, at least 1, like 64",
            )?),
            outbox: match get("OUTBOX")
                .map(|v| v.trim().to_ascii_lowercase())
                .as_deref()
            {
                None | Some("false") => false,
                Some("true") => true,
                Some(_) => {
                    return Err(ConfigError::new(
                        "OUTBOX",
                        &get("OUTBOX").unwrap_or_default(),
                        "true or false",
                    ))
                }
            },
        };
        let postgres = database_url
            .as_deref()
            .is_some_and(|url| url.starts_with("postgres://") || url.starts_with("postgresql://"));
        if config.outbox && !postgres {
            return Err(ConfigError::new(
                "OUTBOX",
                "true",
                "false unless DATABASE_URL is a postgres://... URL (the outbox table is PostgreSQL's)",
            ));
        }
        let server_defaults = ServerConfig::default();
        let server = ServerConfig {
            header_read_timeout: Duration::from_millis(number(
                "HEADER_READ_TIMEOUT_MS",
                millis(server_defaults.header_read_timeout),
                1,
                "a whole number of milliseconds, at least 1, like 10000",
            )?),
            max_connections: count(number(
                "MAX_CONNECTIONS",
                server_defaults.max_connections as u64,
                1,
                "a whole number, at least 1, like 1024",
            )?),
            shutdown_grace: Duration::from_millis(number(
                "SHUTDOWN_GRACE_MS",
                millis(server_defaults.shutdown_grace),
                0,
                "a whole number of milliseconds, like 10000",
            )?),
        };
        let admin_token = match get("ADMIN_TOKEN") {
            None => None,
            Some(v) => Some(AdminToken::new(v.trim()).ok_or_else(|| {
                ConfigError::new(
                    "ADMIN_TOKEN",
                    "(hidden)",
                    "a secret of at least 16 characters",
                )
            })?),
        };
        Ok(Self {
            database_url,
            bind_addr,
            config,
            server,
            admin_token,
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A count that does not fit the platform's `usize` (only on 32-bit) is capped.
fn count(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// An environment variable whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// What it should look like.
    pub expected: &'static str,
}

impl ConfigError {
    fn new(variable: &'static str, value: &str, expected: &'static str) -> Self {
        Self {
            variable,
            value: value.to_owned(),
            expected,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?} is not valid: expected {}",
            self.variable, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_vars(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn defaults_apply_when_unset_or_empty() {
        let s = settings(&[("PAYMENT_LATENCY_MS", "")]).unwrap();
        assert_eq!(s.database_url, None);
        assert_eq!(s.bind_addr, "127.0.0.1:3000".parse().unwrap());
        assert_eq!(s.config, Config::default());
        assert_eq!(s.config.lease, Duration::from_secs(30));
        assert_eq!(s.config.ttl, Duration::from_secs(86400));
        assert_eq!(s.server, ServerConfig::default());
    }

    #[test]
    fn the_admin_token_is_read_long_enough_and_never_shown() {
        assert_eq!(settings(&[]).unwrap().admin_token, None);
        let s = settings(&[("ADMIN_TOKEN", "0123456789abcdef")]).unwrap();
        let token = s.admin_token.clone().expect("the token");
        assert!(token.matches(b"0123456789abcdef"));
        assert!(!token.matches(b"0123456789abcdeF"));
        assert!(!token.matches(b"0123456789abcde"));
        assert!(!format!("{s:?}").contains("0123456789abcdef"), "{s:?}");
        let short = settings(&[("ADMIN_TOKEN", "short")]).unwrap_err();
        assert_eq!(short.variable, "ADMIN_TOKEN");
        assert!(!short.to_string().contains("short"), "{short}");
    }

    #[test]
    fn values_are_read() {
        let s = settings(&[
            ("DATABASE_URL", "postgres://postgres@127.0.0.1/test"),
            ("BIND_ADDR", "127.0.0.1:0"),
            ("PAYMENT_LATENCY_MS", "3000"),
            ("IDEMPOTENCY_LEASE_MS", "1000"),
            ("IDEMPOTENCY_TTL_SECS", "60"),
            ("BODY_TIMEOUT_MS", "2000"),
            ("MAX_IN_FLIGHT_ORDERS", "8"),
            ("OUTBOX", "true"),
            ("HEADER_READ_TIMEOUT_MS", "1500"),
            ("MAX_CONNECTIONS", "100"),
            ("SHUTDOWN_GRACE_MS", "0"),
        ])
        .unwrap();
        assert_eq!(
            s.database_url.as_deref(),
            Some("postgres://postgres@127.0.0.1/test")
        );
        assert_eq!(s.bind_addr.port(), 0);
        assert_eq!(s.config.payment_latency, Duration::from_secs(3));
        assert_eq!(s.config.lease, Duration::from_secs(1));
        assert_eq!(s.config.ttl, Duration::from_secs(60));
        assert_eq!(s.config.body_timeout, Duration::from_secs(2));
        assert_eq!(s.config.max_in_flight_orders, 8);
        assert!(s.config.outbox);
        assert_eq!(
            s.server,
            ServerConfig {
                header_read_timeout: Duration::from_millis(1500),
                max_connections: 100,
                shutdown_grace: Duration::ZERO,
            }
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            ("PAYMENT_LATENCY_MS", "soon"),
            ("PAYMENT_LATENCY_MS", "-5"),
            ("IDEMPOTENCY_LEASE_MS", "0"),
            ("IDEMPOTENCY_TTL_SECS", "1.5"),
            ("BIND_ADDR", "localhost"),
            ("MAX_CONNECTIONS", "0"),
            ("HEADER_READ_TIMEOUT_MS", "0"),
            ("BODY_TIMEOUT_MS", "ten"),
            ("DATABASE_URL", "oracle://x"),
            ("OUTBOX", "yes"),
        ] {
            let err = settings(&[(name, value)]).unwrap_err();
            assert_eq!(err.variable, name);
            assert!(err.to_string().starts_with(name), "{err}");
        }
    }

    #[test]
    fn bind_addr_takes_a_host_name() {
        let local = settings(&[("BIND_ADDR", "localhost:3001")]).unwrap();
        assert!(local.bind_addr.ip().is_loopback(), "{}", local.bind_addr);
        assert_eq!(local.bind_addr.port(), 3001);
        let ip = settings(&[("BIND_ADDR", " 127.0.0.1:0 ")]).unwrap();
        assert_eq!(ip.bind_addr, "127.0.0.1:0".parse().unwrap());
    }

    #[test]
    fn the_outbox_needs_postgres() {
        let err = settings(&[("OUTBOX", "true")]).unwrap_err();
        assert_eq!(err.variable, "OUTBOX");
        let err = settings(&[("OUTBOX", "true"), ("DATABASE_URL", "sqlite://o.db")]).unwrap_err();
        assert_eq!(err.variable, "OUTBOX");
        let pg = "postgres://postgres@127.0.0.1/test";
        assert!(
            settings(&[("OUTBOX", "TRUE"), ("DATABASE_URL", pg)])
                .unwrap()
                .config
                .outbox
        );
        assert!(!settings(&[("OUTBOX", "false")]).unwrap().config.outbox);
    }
}
