//! SNMP power: switch one outlet of a PDU with an SNMPv3 SET (upstream
//! `jumpstarter_driver_snmp.driver.SNMPServer`, client
//! `jumpstarter_driver_snmp.client.SNMPServerClient`, a power client: `on`, `off`, and
//! `cycle` built from them on the client side).
//!
//! Config as upstream: `host`, `user` (the SNMPv3 USM user), `plug` (the outlet number,
//! appended to `oid`), `port` (161), `oid` (`1.3.6.1.4.1.13742.6.4.1.2.1.2.1`, Raritan's
//! outlet state), `auth_protocol` (`NONE`, `MD5`, `SHA`), `auth_key`, `priv_protocol`
//! (`NONE`, `DES`, `AES`), `priv_key` and `timeout` (seconds for the whole exchange, 5).
//! `on` sets `OID.PLUG` to INTEGER 1, `off` to 0. The security level follows from the
//! protocols as upstream's: noAuthNoPriv, authNoPriv or authPriv. Upstream speaks SNMPv3 only
//! (no community string field), and so does this driver.
//!
//! Unlike upstream, the host name is resolved at each call rather than when the exporter
//! starts, so a PDU that is down or unknown to DNS fails its calls, naming `host`, while the
//! exporter and its other drivers keep working. A key given with its protocol `NONE`, or
//! privacy without authentication, which upstream silently ignores, is refused.

mod agent;
mod ber;
mod error;
#[cfg(test)]
mod fuzz_tests;
mod usm;

use std::{sync::Arc, time::Duration};

use jumpstarter_core::{CallContext, Driver, DriverError, driver, driver::DriverArgs, error_chain};
use serde::Deserialize;

use agent::{Agent, Security};
pub use error::SnmpError;
use usm::{AuthProto, PrivProto};

/// Upstream client class of the SNMP power driver.
pub const SNMP_CLIENT: &str = "jumpstarter_driver_snmp.client.SNMPServerClient";

/// Upstream's default outlet-state OID (Raritan PX `outletSwitchingState`, without the plug).
const DEFAULT_OID: &str = "1.3.6.1.4.1.13742.6.4.1.2.1.2.1";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
enum AuthField {
    #[default]
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "MD5")]
    Md5,
    #[serde(rename = "SHA")]
    Sha,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
enum PrivField {
    #[default]
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "DES")]
    Des,
    #[serde(rename = "AES")]
    Aes,
}

fn default_port() -> u16 {
    161
}
fn default_oid() -> String {
    DEFAULT_OID.to_string()
}
fn default_timeout() -> f64 {
    5.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    host: String,
    user: String,
    plug: u32,
    #[serde(default = "default_port")]
    port: u16,
    #[serde(default = "default_oid")]
    oid: String,
    #[serde(default)]
    auth_protocol: AuthField,
    #[serde(default)]
    auth_key: Option<String>,
    #[serde(default)]
    priv_protocol: PrivField,
    #[serde(default)]
    priv_key: Option<String>,
    #[serde(default = "default_timeout")]
    timeout: f64,
}

fn invalid(field: &str, message: impl std::fmt::Display) -> DriverError {
    DriverError::InvalidArgument(format!("{field}: {message}"))
}

/// The largest second arc under the first arc 2 (`2.N` is encoded as the 32-bit `80 + N`).
const MAX_SECOND_ARC_UNDER_2: u32 = u32::MAX - 80;

/// Parses a dotted OID (a leading dot allowed).
fn parse_oid(s: &str) -> Result<Vec<u32>, DriverError> {
    let arcs = s
        .strip_prefix('.')
        .unwrap_or(s)
        .split('.')
        .map(|a| a.parse::<u32>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid("oid", format!("{s:?} is not a dotted OID: {e}")))?;
    if arcs.len() < 2 || arcs[0] > 2 || (arcs[0] < 2 && arcs[1] >= 40) || arcs.len() > 120 {
        return Err(invalid("oid", format!("{s:?} is not a valid OID")));
    }
    // BER encodes the first two arcs as one subidentifier, 40 * first + second, which agents
    // read as 32 bits.
    if arcs[0] == 2 && arcs[1] > MAX_SECOND_ARC_UNDER_2 {
        return Err(invalid(
            "oid",
            format!(
                "{s:?}: its second arc {} is over {MAX_SECOND_ARC_UNDER_2}, the largest under 2 \
                 whose BER encoding (80 + second arc) fits in 32 bits",
                arcs[1]
            ),
        ));
    }
    Ok(arcs)
}

/// Switches one PDU outlet over SNMPv3 (upstream `jumpstarter_driver_snmp.driver.SNMPServer`).
/// Its `Debug` names the security level, never the keys (a master key stands for the
/// password at every agent).
pub struct SnmpServer {
    host: String,
    port: u16,
    user: String,
    security: Security,
    full_oid: Vec<u32>,
    timeout: Duration,
}

impl std::fmt::Debug for SnmpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let level = match &self.security {
            Security::None => "noAuthNoPriv",
            Security::Auth { .. } => "authNoPriv",
            Security::Priv { .. } => "authPriv",
        };
        f.debug_struct("SnmpServer")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("security", &level)
            .field("full_oid", &self.full_oid)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl SnmpServer {
    /// Constructor for the registry: reads and checks the config.
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let cfg: Config = args.parse()?;
        Ok(Arc::new(Self::from_config(cfg)?))
    }

    fn from_config(cfg: Config) -> Result<Self, DriverError> {
        if cfg.host.trim().is_empty() {
            return Err(invalid("host", "empty"));
        }
        if cfg.port == 0 {
            return Err(invalid("port", "must be 1-65535"));
        }
        if !(cfg.timeout.is_finite() && cfg.timeout > 0.0 && cfg.timeout <= 3600.0) {
            return Err(invalid(
                "timeout",
                format!("expected seconds in (0, 3600], got {}", cfg.timeout),
            ));
        }
        let mut full_oid = parse_oid(&cfg.oid)?;
        full_oid.push(cfg.plug);
        let key = |field: &str, proto: &str, v: &Option<String>| match v.as_deref() {
            Some(k) if !k.is_empty() => Ok(k.as_bytes().to_vec()),
            _ => Err(invalid(field, format!("required when {proto} is not NONE"))),
        };
        let auth = match cfg.auth_protocol {
            AuthField::None => None,
            AuthField::Md5 => Some(AuthProto::Md5),
            AuthField::Sha => Some(AuthProto::Sha),
        };
        let privacy = match cfg.priv_protocol {
            PrivField::None => None,
            PrivField::Des => Some(PrivProto::Des),
            PrivField::Aes => Some(PrivProto::Aes),
        };
        if auth.is_none() && cfg.auth_key.is_some() {
            return Err(invalid("auth_key", "given, but auth_protocol is NONE"));
        }
        if privacy.is_none() && cfg.priv_key.is_some() {
            return Err(invalid("priv_key", "given, but priv_protocol is NONE"));
        }
        let security = match (auth, privacy) {
            (None, None) => Security::None,
            (None, Some(_)) => {
                return Err(invalid(
                    "priv_protocol",
                    "privacy needs authentication: set auth_protocol (MD5 or SHA) too",
                ));
            }
            (Some(proto), None) => Security::Auth {
                proto,
                key: usm::password_to_key(proto, &key("auth_key", "auth_protocol", &cfg.auth_key)?),
            },
            (Some(proto), Some(priv_proto)) => Security::Priv {
                proto,
                key: usm::password_to_key(proto, &key("auth_key", "auth_protocol", &cfg.auth_key)?),
                priv_proto,
                priv_key: usm::password_to_key(
                    proto,
                    &key("priv_key", "priv_protocol", &cfg.priv_key)?,
                ),
            },
        };
        Ok(SnmpServer {
            host: cfg.host,
            port: cfg.port,
            user: cfg.user,
            security,
            full_oid,
            timeout: Duration::from_secs_f64(cfg.timeout),
        })
    }

    async fn set(&self, ctx: &CallContext, state: &str, value: i64) -> Result<String, DriverError> {
        ctx.log_info(format!("Sending power {state} command to {}", self.host));
        self.set_inner(value).await.map_err(|e| {
            let msg = format!(
                "SNMP set failed: power {state} of plug {} at {}:{}: {}",
                self.full_oid.last().copied().unwrap_or_default(),
                self.host,
                self.port,
                error_chain(&e)
            );
            ctx.log_warning(msg.clone());
            DriverError::Failed(msg)
        })?;
        Ok(format!("Power {state} command sent successfully"))
    }

    async fn set_inner(&self, value: i64) -> Result<(), SnmpError> {
        let addr = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|source| SnmpError::Resolve {
                host: self.host.clone(),
                source,
            })?
            .next()
            .ok_or_else(|| SnmpError::Resolve {
                host: self.host.clone(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no addresses"),
            })?;
        let agent = Agent {
            addr,
            user: self.user.clone(),
            security: self.security.clone(),
        };
        agent.set_integer(&self.full_oid, value, self.timeout).await
    }
}

#[driver(client = "jumpstarter_driver_snmp.client.SNMPServerClient")]
impl SnmpServer {
    /// Turns the outlet on (sets `oid.plug` to 1).
    #[export]
    async fn on(&self, ctx: &CallContext) -> Result<String, DriverError> {
        self.set(ctx, "ON", 1).await
    }

    /// Turns the outlet off (sets `oid.plug` to 0).
    #[export]
    async fn off(&self, ctx: &CallContext) -> Result<String, DriverError> {
        self.set(ctx, "OFF", 0).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<SnmpServer, DriverError> {
        let cfg: Config = DriverArgs { config }.parse()?;
        SnmpServer::from_config(cfg)
    }

    #[test]
    fn upstream_example_config_is_accepted() {
        let s = build(json!({
            "host": "pdu.mgmt.com", "user": "labuser", "plug": 32, "port": 161,
            "oid": "1.3.6.1.4.1.13742.6.4.1.2.1.2.1", "auth_protocol": "NONE", "auth_key": null,
            "priv_protocol": "NONE", "priv_key": null, "timeout": 5.0
        }))
        .unwrap();
        assert_eq!(s.full_oid.last(), Some(&32));
        assert_eq!(s.full_oid.len(), 15);
        assert!(matches!(s.security, Security::None));
    }

    #[test]
    fn debug_shows_no_key() {
        let s = build(json!({
            "host": "h", "user": "u", "plug": 1, "auth_protocol": "SHA", "auth_key": "authpass",
            "priv_protocol": "AES", "priv_key": "privpass"
        }))
        .unwrap();
        let shown = format!("{s:?}");
        assert!(shown.contains("authPriv"), "{shown}");
        for secret in [b"authpass".as_slice(), b"privpass"] {
            let key = usm::password_to_key(AuthProto::Sha, secret);
            let key_text = format!("{key:?}");
            assert!(!shown.contains(&key_text[1..key_text.len() - 1]), "{shown}");
        }
    }

    #[test]
    fn bad_configs_name_the_field() {
        for (cfg, field) in [
            (json!({"user": "u", "plug": 1}), "host"),
            (json!({"host": "h", "plug": 1}), "user"),
            (json!({"host": "h", "user": "u"}), "plug"),
            (json!({"host": "h", "user": "u", "plug": -1}), "-1"),
            (
                json!({"host": "h", "user": "u", "plug": 1, "oid": "1.3.x"}),
                "oid",
            ),
            (
                json!({"host": "h", "user": "u", "plug": 1, "oid": "2.4294967216.1"}),
                "4294967216",
            ),
            (
                json!({"host": "h", "user": "u", "plug": 1, "timeout": 0}),
                "timeout",
            ),
            (
                json!({"host": "h", "user": "u", "plug": 1, "auth_protocol": "SHA1"}),
                "SHA1",
            ),
            (
                json!({"host": "h", "user": "u", "plug": 1, "auth_protocol": "MD5"}),
                "auth_key",
            ),
            (
                json!({"host": "h", "user": "u", "plug": 1, "auth_key": "k"}),
                "auth_key",
            ),
            (
                json!({"host": "h", "user": "u", "plug": 1, "priv_protocol": "AES", "priv_key": "p"}),
                "priv_protocol",
            ),
            (
                json!({"host": "h", "user": "u", "plug": 1, "auth_protocol": "SHA", "auth_key": "a", "priv_protocol": "DES"}),
                "priv_key",
            ),
            (
                json!({"host": "h", "user": "u", "plug": 1, "community": "public"}),
                "community",
            ),
        ] {
            let err = build(cfg.clone()).unwrap_err().to_string();
            assert!(err.contains(field), "{cfg}: {err}");
        }
    }
}
