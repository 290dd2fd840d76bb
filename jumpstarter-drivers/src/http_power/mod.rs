//! HTTP power: switch a smart plug or an HTTP-controlled PDU with HTTP requests (upstream
//! `jumpstarter_driver_http_power.driver.HttpPower`, client
//! `jumpstarter_driver_power.client.PowerClient`: `on`, `off`, `read`, and `cycle`).
//!
//! Config as upstream: `name` (for the log, default `device`), `power_on` and `power_off`
//! (each `url`, `method` default `GET`, `data` sent as the body of POST/PUT/PATCH),
//! `power_read` (optional; its JSON answer gives `voltage` and `current`, at the dotted
//! paths `voltage_path` / `current_path` such as `meters.0.voltage`, else at the top level,
//! a missing default key reading 0) and `auth.basic` (`user`, `password`).
//!
//! A non-2xx answer fails the call naming the method and URL. URLs in errors (which reach
//! the lease holder) are redacted: no query, no `user:password@`; the basic-auth password
//! and request bodies appear in no error and no `Debug`. Where upstream's `requests`
//! would wait forever, each request here has [`REQUEST_TIMEOUT`]; redirects are not followed
//! (the error names where it points). A key upstream reads and ignores (`data` with a method
//! that sends no body, paths on `power_on`/`power_off`) is refused naming it.

mod http;

use std::{sync::Arc, time::Duration};

use ::http::Method;
use futures::{StreamExt, stream::BoxStream};
use jumpstarter_core::{CallContext, Driver, DriverError, driver, driver::DriverArgs, error_chain};
use serde::Deserialize;
use serde_json::Value as Json;
use tokio_rustls::rustls;

use crate::power::PowerReading;

pub use http::HttpError;

/// How long one request may take, connect to last byte.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointConfig {
    url: String,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    voltage_path: Option<String>,
    #[serde(default)]
    current_path: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BasicAuth {
    #[serde(default)]
    user: String,
    #[serde(default)]
    password: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthConfig {
    #[serde(default)]
    basic: Option<BasicAuth>,
}

fn default_name() -> String {
    "device".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_name")]
    name: String,
    power_on: EndpointConfig,
    power_off: EndpointConfig,
    #[serde(default)]
    power_read: Option<EndpointConfig>,
    #[serde(default)]
    auth: Option<AuthConfig>,
}

/// One checked endpoint.
#[derive(Debug, Clone)]
struct Endpoint {
    method: Method,
    url: http::Url,
    data: Option<String>,
    voltage_path: Option<String>,
    current_path: Option<String>,
}

fn invalid(field: &str, message: impl std::fmt::Display) -> DriverError {
    DriverError::InvalidArgument(format!("{field}: {message}"))
}

impl Endpoint {
    fn from_config(field: &str, c: EndpointConfig, reads: bool) -> Result<Self, DriverError> {
        let method_text = c.method.as_deref().unwrap_or("GET").to_ascii_uppercase();
        let method = Method::from_bytes(method_text.as_bytes())
            .map_err(|e| invalid(&format!("{field}.method"), e))?;
        let url = http::Url::parse(&c.url).map_err(|e| invalid(&format!("{field}.url"), e))?;
        if c.data.is_some() && !matches!(method_text.as_str(), "POST" | "PUT" | "PATCH") {
            return Err(invalid(
                &format!("{field}.data"),
                format!("only sent with POST, PUT or PATCH, not {method_text}"),
            ));
        }
        if !reads {
            for (name, v) in [
                ("voltage_path", &c.voltage_path),
                ("current_path", &c.current_path),
            ] {
                if v.is_some() {
                    return Err(invalid(
                        &format!("{field}.{name}"),
                        "only used on power_read",
                    ));
                }
            }
        }
        Ok(Endpoint {
            method,
            url,
            data: c.data,
            voltage_path: c.voltage_path,
            current_path: c.current_path,
        })
    }
}

/// Power through HTTP requests (upstream `jumpstarter_driver_http_power.driver.HttpPower`).
/// Its `Debug` shows the name and the redacted URLs only.
pub struct HttpPower {
    name: String,
    power_on: Endpoint,
    power_off: Endpoint,
    power_read: Option<Endpoint>,
    basic: Option<(String, String)>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for HttpPower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpPower")
            .field("name", &self.name)
            .field("power_on", &self.power_on.url)
            .field("power_off", &self.power_off.url)
            .field("power_read", &self.power_read.as_ref().map(|e| &e.url))
            .finish_non_exhaustive()
    }
}

impl HttpPower {
    /// Constructor for the registry: reads and checks the config.
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let cfg: Config = args.parse()?;
        Ok(Arc::new(Self::from_config(cfg)?))
    }

    fn from_config(cfg: Config) -> Result<Self, DriverError> {
        let power_on = Endpoint::from_config("power_on", cfg.power_on, false)?;
        let power_off = Endpoint::from_config("power_off", cfg.power_off, false)?;
        let power_read = cfg
            .power_read
            .map(|c| Endpoint::from_config("power_read", c, true))
            .transpose()?;
        let basic = cfg.auth.and_then(|a| a.basic).map(|b| (b.user, b.password));
        let needs_tls = [Some(&power_on), Some(&power_off), power_read.as_ref()]
            .into_iter()
            .flatten()
            .any(|e| e.url.is_https());
        let tls = if needs_tls {
            Some(Arc::new(http::tls_config().map_err(|e| {
                DriverError::because("cannot set up TLS for https:// endpoints", e)
            })?))
        } else {
            None
        };
        Ok(HttpPower {
            name: cfg.name,
            power_on,
            power_off,
            power_read,
            basic,
            tls,
        })
    }

    async fn call(&self, field: &str, e: &Endpoint) -> Result<bytes::Bytes, DriverError> {
        http::request(
            self.tls.as_ref(),
            http::Call {
                method: &e.method,
                url: &e.url,
                body: e.data.as_deref(),
                basic: self.basic.as_ref().map(|(u, p)| (u.as_str(), p.as_str())),
            },
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(|err| DriverError::failed(format!("{field}: {}", error_chain(&err))))
    }
}

/// Walks a dotted path (`meters.0.power`) through objects and arrays.
fn json_path<'a>(data: &'a Json, path: &str) -> Option<&'a Json> {
    path.split('.').try_fold(data, |cur, part| match cur {
        Json::Array(items) => part.parse::<usize>().ok().and_then(|i| items.get(i)),
        Json::Object(map) => map.get(part),
        _ => None,
    })
}

/// One reading: a configured path must exist; a missing default key reads 0.
fn extract(data: &Json, path: Option<&str>, default_key: &str) -> Result<f64, DriverError> {
    let key = path.unwrap_or(default_key);
    let Some(value) = json_path(data, key) else {
        return match path {
            Some(_) => Err(DriverError::failed(format!(
                "configured path {key:?} not found in read response"
            ))),
            None => Ok(0.0),
        };
    };
    match value {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => s.trim().parse::<f64>().ok(),
        Json::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
    .ok_or_else(|| DriverError::failed(format!("value at {key:?} is not numeric (got {value})")))
}

#[driver(client = "jumpstarter_driver_power.client.PowerClient")]
impl HttpPower {
    /// Powers on with the `power_on` request.
    #[export]
    async fn on(&self, ctx: &CallContext) -> Result<(), DriverError> {
        ctx.log_info(format!("Powering on {} via HTTP", self.name));
        self.call("power_on", &self.power_on).await.map(|_| ())
    }

    /// Powers off with the `power_off` request.
    #[export]
    async fn off(&self, ctx: &CallContext) -> Result<(), DriverError> {
        ctx.log_info(format!("Powering off {} via HTTP", self.name));
        self.call("power_off", &self.power_off).await.map(|_| ())
    }

    /// One reading from the `power_read` request's JSON answer.
    #[export(streaming)]
    async fn read(
        &self,
    ) -> Result<BoxStream<'static, Result<PowerReading, DriverError>>, DriverError> {
        let Some(endpoint) = &self.power_read else {
            return Err(DriverError::failed("power_read endpoint is not configured"));
        };
        let body = self.call("power_read", endpoint).await?;
        let data: Json = serde_json::from_slice(&body)
            .map_err(|e| DriverError::because("read endpoint did not return JSON", e))?;
        let reading = PowerReading {
            voltage: extract(&data, endpoint.voltage_path.as_deref(), "voltage")?,
            current: extract(&data, endpoint.current_path.as_deref(), "current")?,
        };
        Ok(futures::stream::iter([Ok(reading)]).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: Json) -> Result<HttpPower, DriverError> {
        let cfg: Config = DriverArgs { config }.parse()?;
        HttpPower::from_config(cfg)
    }

    #[test]
    fn upstream_example_config_is_accepted() {
        let p = build(json!({
            "name": "device",
            "power_on": {"url": "http://power-controller.local/api/power/on", "method": "POST", "data": "action=on"},
            "power_off": {"url": "http://power-controller.local/api/power/off", "method": "post", "data": "action=off"},
            "power_read": {"url": "http://power-controller.local/api/power/status", "method": "GET"},
            "auth": {"basic": {"user": "admin", "password": "secret"}}
        }))
        .unwrap();
        assert_eq!(p.power_off.method, Method::POST);
        assert!(p.tls.is_none());
        assert_eq!(p.basic, Some(("admin".into(), "secret".into())));
    }

    #[test]
    fn bad_configs_name_the_field() {
        let on = json!({"url": "http://h/on"});
        for (cfg, field) in [
            (json!({"power_off": on}), "power_on"),
            (
                json!({"power_on": on, "power_off": {"url": "ftp://h/x"}}),
                "power_off.url",
            ),
            (
                json!({"power_on": on, "power_off": {"url": "http://h/", "method": "G T"}}),
                "power_off.method",
            ),
            (
                json!({"power_on": {"url": "http://h/", "data": "x"}, "power_off": on}),
                "power_on.data",
            ),
            (
                json!({"power_on": {"url": "http://h/", "voltage_path": "a"}, "power_off": on}),
                "power_on.voltage_path",
            ),
            (
                json!({"power_on": on, "power_off": on, "auth": {"digest": {}}}),
                "digest",
            ),
            (
                json!({"power_on": on, "power_off": on, "timeout": 3}),
                "timeout",
            ),
        ] {
            let err = build(cfg.clone()).unwrap_err().to_string();
            assert!(err.contains(field), "{cfg}: {err}");
        }
    }

    #[test]
    fn config_errors_and_debug_show_no_secret() {
        let on = json!({"url": "http://h/on"});
        let e = build(json!({"power_on": on, "power_off": {"url": "http://admin:hunter2@h/off"}}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("power_off.url"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let p = build(json!({
            "power_on": {"url": "http://h/cm?cmnd=Power%20On&password=hunter2"},
            "power_off": {"url": "http://h/off", "method": "POST", "data": "pw=hunter2"},
            "auth": {"basic": {"user": "admin", "password": "hunter2"}}
        }))
        .unwrap();
        let shown = format!("{p:?}");
        assert!(shown.contains("http://h/cm?[REDACTED]"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn readings_follow_paths_as_upstream() {
        let data = json!({"emeter": {"voltage": 231.0, "current": 0.45}, "meters": [{"v": "1.5"}]});
        assert_eq!(
            extract(&data, Some("emeter.voltage"), "voltage").unwrap(),
            231.0
        );
        assert_eq!(extract(&data, Some("meters.0.v"), "voltage").unwrap(), 1.5);
        assert_eq!(extract(&data, None, "current").unwrap(), 0.0);
        let e = extract(&data, Some("nope.here"), "voltage").unwrap_err();
        assert!(e.to_string().contains("not found in read response"));
        let e = extract(&data, Some("meters.x.v"), "voltage").unwrap_err();
        assert!(e.to_string().contains("not found in read response"));
        let e = extract(&data, Some("emeter"), "voltage").unwrap_err();
        assert!(e.to_string().contains("not numeric"));
    }
}
