//! `grpcOptions` of exporter and client configs: upstream hands them to its gRPC channels
//! (towards the controller and the routers). The options that map onto our HTTP/2 channels
//! are applied; any other is refused with an error naming it, so that no option is silently
//! ignored.
//!
//! | option | effect |
//! | --- | --- |
//! | `grpc.keepalive_time_ms` | time between keepalive pings (default 20000) |
//! | `grpc.keepalive_timeout_ms` | how long a ping may go unanswered (default 180000) |
//! | `grpc.keepalive_permit_without_calls` | must be `1`: pings are always sent, also when idle |
//! | `grpc.http2.max_pings_without_data` | must be `0`: pings are never limited |

use std::{collections::BTreeMap, time::Duration};

/// A `grpcOptions` entry that cannot be applied.
#[derive(Debug, thiserror::Error)]
#[error("grpcOptions.{key}: {message}")]
pub struct GrpcOptionError {
    /// The option.
    pub key: String,
    /// Why it is refused.
    pub message: String,
}

fn integer(key: &str, value: &serde_json::Value) -> Result<u64, GrpcOptionError> {
    let n = match value {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    n.ok_or_else(|| GrpcOptionError {
        key: key.to_string(),
        message: format!("expected a non-negative integer, found {value}"),
    })
}

/// The keepalive `options` ask for, starting from `base`; errors name the option.
pub fn keepalive(
    options: &BTreeMap<String, serde_json::Value>,
    base: Keepalive,
) -> Result<Keepalive, GrpcOptionError> {
    let mut k = base;
    for (key, value) in options {
        let fixed = |want: u64| -> Result<(), GrpcOptionError> {
            let got = integer(key, value)?;
            if got == want {
                Ok(())
            } else {
                Err(GrpcOptionError {
                    key: key.clone(),
                    message: format!("only {want} is supported (found {got})"),
                })
            }
        };
        match key.as_str() {
            "grpc.keepalive_time_ms" => {
                let ms = integer(key, value)?;
                if ms == 0 {
                    return Err(GrpcOptionError {
                        key: key.clone(),
                        message: "must be at least 1".into(),
                    });
                }
                k.interval = Duration::from_millis(ms);
            }
            "grpc.keepalive_timeout_ms" => {
                k.timeout = Duration::from_millis(integer(key, value)?.max(1));
            }
            "grpc.keepalive_permit_without_calls" => fixed(1)?,
            "grpc.http2.max_pings_without_data" => fixed(0)?,
            _ => {
                return Err(GrpcOptionError {
                    key: key.clone(),
                    message: "not supported (supported: grpc.keepalive_time_ms, \
                              grpc.keepalive_timeout_ms, grpc.keepalive_permit_without_calls, \
                              grpc.http2.max_pings_without_data)"
                        .into(),
                });
            }
        }
    }
    Ok(k)
}

/// HTTP/2 keepalive of a channel: how often to ping, how long to wait for the answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Keepalive {
    /// Time between pings.
    pub interval: Duration,
    /// How long an unanswered ping may wait before the connection is closed.
    pub timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::channel::CONTROLLER_KEEPALIVE;

    fn opts(pairs: &[(&str, serde_json::Value)]) -> BTreeMap<String, serde_json::Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn keepalive_options_apply_and_others_are_refused_by_name() {
        assert_eq!(
            keepalive(&BTreeMap::new(), CONTROLLER_KEEPALIVE).unwrap(),
            CONTROLLER_KEEPALIVE
        );
        let k = keepalive(
            &opts(&[
                ("grpc.keepalive_time_ms", serde_json::json!(5000)),
                ("grpc.keepalive_timeout_ms", serde_json::json!("7000")),
                ("grpc.keepalive_permit_without_calls", serde_json::json!(1)),
                ("grpc.http2.max_pings_without_data", serde_json::json!(0)),
            ]),
            CONTROLLER_KEEPALIVE,
        )
        .unwrap();
        assert_eq!(k.interval, Duration::from_secs(5));
        assert_eq!(k.timeout, Duration::from_secs(7));
        let e = keepalive(
            &opts(&[("grpc.lb_policy_name", serde_json::json!("pick_first"))]),
            CONTROLLER_KEEPALIVE,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("grpcOptions.grpc.lb_policy_name: not supported"),
            "{e}"
        );
        let e = keepalive(
            &opts(&[("grpc.keepalive_time_ms", serde_json::json!("soon"))]),
            CONTROLLER_KEEPALIVE,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "grpcOptions.grpc.keepalive_time_ms: expected a non-negative integer, found \"soon\""
        );
        let e = keepalive(
            &opts(&[("grpc.keepalive_permit_without_calls", serde_json::json!(0))]),
            CONTROLLER_KEEPALIVE,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "grpcOptions.grpc.keepalive_permit_without_calls: only 1 is supported (found 0)"
        );
    }
}
