//! What talking to an SNMP agent can fail with.

use std::{net::SocketAddr, time::Duration};

/// What talking to an SNMP agent can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SnmpError {
    /// The host name did not resolve.
    #[error("cannot resolve {host} (config field `host`)")]
    Resolve {
        /// The configured host.
        host: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Nothing answered before the timeout.
    #[error(
        "SNMP agent at {addr} (config field `host`) did not answer within {timeout:?} \
         (config field `timeout`)"
    )]
    NoAnswer {
        /// Where we sent.
        addr: SocketAddr,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The agent answered engine discovery but not the request: it dropped it, as net-snmp
    /// does with a request it cannot decrypt.
    #[error(
        "SNMP agent at {addr} answered engine discovery but not the request within {timeout:?}: \
         check config fields `priv_protocol` and `priv_key` (and `auth_key`)"
    )]
    RequestDropped {
        /// Where we sent.
        addr: SocketAddr,
        /// The configured timeout.
        timeout: Duration,
    },
    /// A socket operation failed.
    #[error("cannot {what}")]
    Io {
        /// What we tried.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An OID that has no BER encoding an agent reads (the configured one, with the plug).
    #[error("OID {oid} cannot be encoded: {why} (config fields `oid`, `plug`)")]
    BadOid {
        /// The OID, dotted.
        oid: String,
        /// Why it has no encoding.
        why: String,
    },
    /// The agent sent something we cannot read.
    #[error("malformed SNMP message: {0}")]
    Malformed(String),
    /// The answer's HMAC did not match our key.
    #[error("the agent's answer failed authentication (config fields `auth_protocol`, `auth_key`)")]
    WrongDigest,
    /// The agent answered with an error status.
    #[error("SNMP error: {status} at {oid} (config fields `oid`, `plug`)")]
    Status {
        /// The status name, e.g. `notWritable`.
        status: String,
        /// The OID it names.
        oid: String,
    },
    /// The agent answered with a Report PDU (unknown user, wrong key, ...).
    #[error("SNMP agent refused the request: {what} (config field `{field}`)")]
    Report {
        /// What the report says.
        what: String,
        /// The config field at fault.
        field: &'static str,
    },
}
