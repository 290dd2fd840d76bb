//! The MCP tools: their schemas, argument checks and what they do.
//!
//! Names and arguments follow upstream's `jumpstarter-mcp` (`jmp_list_exporters`,
//! `jmp_connect`, `jmp_run`, ...); `jmp_call` (call one driver method with JSON arguments)
//! is ours. Results are JSON text, as upstream returns them.

use std::{collections::BTreeMap, path::PathBuf, process::Stdio, time::Duration};

use anyhow::Context;
use futures::StreamExt;
use jiff::Timestamp;
use jumpstarter_core::{
    client::{ExporterQuery, LeaseQuery, LeaseRequest, lease::LeaseSource},
    config::ClientConfig,
    value,
};
use jumpstarter_drivers::{POWER_CLIENT, PowerClient};
use jumpstarter_proto::client_v1::Lease;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{
    connections::{Connection, Connections},
    introspect::{self, CallStyle},
};
use crate::{
    output::short_name,
    resources::{ClientSelect, ExporterView, LeaseView, active_leases, api_error, connect},
};

/// Why a tool call failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// No tool of that name (a JSON-RPC error).
    #[error("unknown tool {0:?}; tools/list shows the tools")]
    UnknownTool(String),
    /// The arguments do not fit the tool's schema (a JSON-RPC error).
    #[error("invalid arguments for {tool}: {message}")]
    InvalidArguments {
        /// The tool.
        tool: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The tool ran and failed (a result with `isError`, which the agent reads).
    #[error("{0}")]
    Failed(String),
}

impl From<anyhow::Error> for ToolError {
    fn from(e: anyhow::Error) -> Self {
        ToolError::Failed(crate::output::format_error(&e))
    }
}

/// The JSON type of an argument.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    String,
    Integer,
    Boolean,
    StringList,
    Array,
}

/// One argument of a tool.
struct Param {
    name: &'static str,
    kind: Kind,
    required: bool,
    default: Option<i64>,
    description: &'static str,
}

const fn opt(name: &'static str, kind: Kind, description: &'static str) -> Param {
    Param {
        name,
        kind,
        required: false,
        default: None,
        description,
    }
}

const fn req(name: &'static str, kind: Kind, description: &'static str) -> Param {
    Param {
        name,
        kind,
        required: true,
        default: None,
        description,
    }
}

const fn int(name: &'static str, default: i64, description: &'static str) -> Param {
    Param {
        name,
        kind: Kind::Integer,
        required: false,
        default: Some(default),
        description,
    }
}

/// One tool.
struct ToolSpec {
    name: &'static str,
    description: &'static str,
    params: &'static [Param],
}

const CONNECTION_ID: Param = req(
    "connection_id",
    Kind::String,
    "ID of the active connection (from jmp_connect)",
);
const DEFAULT_DURATION: i64 = 1800;
const DEFAULT_RUN_TIMEOUT: i64 = 120;
const DEFAULT_CALL_TIMEOUT: i64 = 60;
const DEFAULT_MAX_ITEMS: i64 = 10;
/// Longest lease an agent may ask for (a week), and the longest command timeout (an hour).
const MAX_DURATION: i64 = 7 * 24 * 3600;
const MAX_TIMEOUT: i64 = 3600;
/// Most items a streaming call collects.
const MAX_ITEMS: i64 = 1000;
/// Most output kept per stream of a `j` command.
const MAX_OUTPUT: usize = 256 * 1024;

const TOOLS: &[ToolSpec] = &[
    ToolSpec {
        name: "jmp_list_exporters",
        description: "List exporters registered on the Jumpstarter controller: the hardware \
                      devices with their labels, online status and current lease.",
        params: &[
            opt(
                "selector",
                Kind::String,
                "Optional label selector to filter exporters (e.g. \"board=qemu\")",
            ),
            opt(
                "include_leases",
                Kind::Boolean,
                "Include current lease info for each exporter (default: true)",
            ),
            opt(
                "include_online",
                Kind::Boolean,
                "Include online/offline status (default: true)",
            ),
        ],
    },
    ToolSpec {
        name: "jmp_list_leases",
        description: "List active leases from the Jumpstarter controller.",
        params: &[opt(
            "selector",
            Kind::String,
            "Optional label selector to filter leases",
        )],
    },
    ToolSpec {
        name: "jmp_create_lease",
        description: "Create a new lease for a hardware device, by label selector or exporter \
                      name (one is required). Does not wait for it to be ready; jmp_connect \
                      with its name does.",
        params: &[
            int(
                "duration_seconds",
                DEFAULT_DURATION,
                "Lease duration in seconds (default: 1800 = 30 minutes)",
            ),
            opt(
                "selector",
                Kind::String,
                "Label selector to match exporters (e.g. \"board=qemu\")",
            ),
            opt(
                "exporter_name",
                Kind::String,
                "Specific exporter name to lease",
            ),
        ],
    },
    ToolSpec {
        name: "jmp_delete_lease",
        description: "Delete (release) a lease. Connections using it are closed.",
        params: &[req("lease_id", Kind::String, "Name of the lease to delete")],
    },
    ToolSpec {
        name: "jmp_connect",
        description: "Connect to a hardware device, keeping a persistent connection. Uses an \
                      existing lease (lease_id) or creates one (selector or exporter_name) and \
                      waits until it is ready. Returns a connection ID plus the device's CLI \
                      command tree and drivers. A lease created here is released by \
                      jmp_disconnect.",
        params: &[
            opt(
                "lease_id",
                Kind::String,
                "Existing lease name to connect to",
            ),
            opt(
                "selector",
                Kind::String,
                "Label selector to create a new lease (e.g. \"board=qemu\")",
            ),
            opt(
                "exporter_name",
                Kind::String,
                "Specific exporter name to create a new lease",
            ),
            int(
                "duration_seconds",
                DEFAULT_DURATION,
                "Lease duration in seconds when creating one (default: 1800 = 30 minutes)",
            ),
            opt(
                "acquisition_timeout_seconds",
                Kind::Integer,
                "How long to wait for the lease to be ready (default: the client config's \
                 leases.acquisition_timeout)",
            ),
        ],
    },
    ToolSpec {
        name: "jmp_disconnect",
        description: "Disconnect from a device; releases the lease if jmp_connect created it.",
        params: &[req(
            "connection_id",
            Kind::String,
            "ID of the connection to disconnect",
        )],
    },
    ToolSpec {
        name: "jmp_list_connections",
        description: "List all active persistent connections.",
        params: &[],
    },
    ToolSpec {
        name: "jmp_run",
        description: "Run a `j` CLI command on a connected device, capturing stdout, stderr \
                      and exit code. The command is killed after timeout_seconds; use a short \
                      timeout for streaming commands.",
        params: &[
            CONNECTION_ID,
            req(
                "command",
                Kind::StringList,
                "Command parts as a list (e.g. [\"power\", \"on\"] or [\"storage\", \"flash\", \"/path/to/image\"])",
            ),
            int(
                "timeout_seconds",
                DEFAULT_RUN_TIMEOUT,
                "Maximum execution time in seconds (default: 120)",
            ),
        ],
    },
    ToolSpec {
        name: "jmp_get_env",
        description: "Environment variables and paths for running `j` commands against this \
                      connection directly in a shell.",
        params: &[CONNECTION_ID],
    },
    ToolSpec {
        name: "jmp_explore",
        description: "Explore the `j` CLI commands of a connected device: names, help text, \
                      parameters and nested subcommands.",
        params: &[
            CONNECTION_ID,
            opt(
                "command_path",
                Kind::StringList,
                "Optional path to drill into (e.g. [\"storage\"])",
            ),
        ],
    },
    ToolSpec {
        name: "jmp_drivers",
        description: "List all drivers in the connected device's driver tree: path, client \
                      class, description and method names.",
        params: &[CONNECTION_ID],
    },
    ToolSpec {
        name: "jmp_driver_methods",
        description: "Inspect the methods of one driver: parameters, call style, docs and \
                      ready-to-use jmp_call examples.",
        params: &[
            CONNECTION_ID,
            req(
                "driver_path",
                Kind::StringList,
                "Path to the driver in the tree (e.g. [\"power\"]; [] for the root)",
            ),
        ],
    },
    ToolSpec {
        name: "jmp_call",
        description: "Call one driver method on a connected device with JSON arguments and \
                      return its result (e.g. method \"power.on\"). Streaming methods return \
                      up to max_items results.",
        params: &[
            CONNECTION_ID,
            req(
                "method",
                Kind::String,
                "Driver path and method, dotted (e.g. \"power.on\", \"storage.hash\")",
            ),
            opt(
                "args",
                Kind::Array,
                "Positional arguments as a JSON array (default: [])",
            ),
            opt(
                "streaming",
                Kind::Boolean,
                "Call as a streaming method (default: known from the driver class, else false)",
            ),
            int(
                "max_items",
                DEFAULT_MAX_ITEMS,
                "Streaming calls: stop after this many results (default: 10)",
            ),
            int(
                "timeout_seconds",
                DEFAULT_CALL_TIMEOUT,
                "Maximum time in seconds (default: 60); a streaming call returns what it has",
            ),
        ],
    },
];

/// The `tools/list` result.
pub fn list() -> Value {
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|t| {
            let mut properties = Map::new();
            for p in t.params {
                let mut schema = match p.kind {
                    Kind::String => json!({"type": "string"}),
                    Kind::Integer => json!({"type": "integer", "minimum": 1}),
                    Kind::Boolean => json!({"type": "boolean"}),
                    Kind::StringList => json!({"type": "array", "items": {"type": "string"}}),
                    Kind::Array => json!({"type": "array"}),
                };
                if let Some(o) = schema.as_object_mut() {
                    o.insert("description".into(), json!(p.description));
                    if let Some(d) = p.default {
                        o.insert("default".into(), json!(d));
                    }
                }
                properties.insert(p.name.into(), schema);
            }
            let required: Vec<&str> = t
                .params
                .iter()
                .filter(|p| p.required)
                .map(|p| p.name)
                .collect();
            json!({
                "name": t.name,
                "description": t.description,
                "inputSchema": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": false,
                },
            })
        })
        .collect();
    json!({ "tools": tools })
}

/// Checked arguments of one call.
struct Arguments<'a> {
    tool: &'static str,
    map: &'a Map<String, Value>,
    params: &'static [Param],
}

fn as_integer(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
            .map(|f| f as i64)
    })
}

impl<'a> Arguments<'a> {
    /// Checks `map` against the tool's parameters: no unknown names, required ones present
    /// (and not empty), each of its type.
    fn check(spec: &ToolSpec, map: &'a Map<String, Value>) -> Result<Self, ToolError> {
        let bad = |message: String| ToolError::InvalidArguments {
            tool: spec.name,
            message,
        };
        for key in map.keys() {
            if !spec.params.iter().any(|p| p.name == key) {
                let known: Vec<&str> = spec.params.iter().map(|p| p.name).collect();
                return Err(bad(format!(
                    "unknown argument {key:?} (arguments: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
        for p in spec.params {
            let v = match map.get(p.name) {
                None | Some(Value::Null) => {
                    if p.required {
                        return Err(bad(format!("missing required argument {:?}", p.name)));
                    }
                    continue;
                }
                Some(v) => v,
            };
            let ok = match p.kind {
                Kind::String => v
                    .as_str()
                    .is_some_and(|s| !p.required || !s.trim().is_empty()),
                Kind::Integer => as_integer(v).is_some_and(|i| i >= 1),
                Kind::Boolean => v.is_boolean(),
                Kind::StringList => v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
                Kind::Array => v.is_array(),
            };
            if !ok {
                let want = match p.kind {
                    Kind::String if p.required => "a non-empty string",
                    Kind::String => "a string",
                    Kind::Integer => "a positive integer",
                    Kind::Boolean => "true or false",
                    Kind::StringList => "an array of strings",
                    Kind::Array => "a JSON array",
                };
                return Err(bad(format!("{:?} must be {want}, not {v}", p.name)));
            }
        }
        Ok(Self {
            tool: spec.name,
            map,
            params: spec.params,
        })
    }

    /// A string argument; empty counts as absent.
    fn str(&self, name: &str) -> Option<&'a str> {
        self.map
            .get(name)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    /// A required string argument ([`Arguments::check`] made sure it is there).
    fn required_str(&self, name: &str) -> Result<&'a str, ToolError> {
        self.str(name).ok_or_else(|| ToolError::InvalidArguments {
            tool: self.tool,
            message: format!("missing required argument {name:?}"),
        })
    }

    fn bool(&self, name: &str, default: bool) -> bool {
        self.map
            .get(name)
            .and_then(Value::as_bool)
            .unwrap_or(default)
    }

    /// An integer argument, its default when absent, at most `max`.
    fn int(&self, name: &str, max: i64) -> Result<i64, ToolError> {
        let default = self
            .params
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.default)
            .unwrap_or(1);
        let v = self.map.get(name).and_then(as_integer).unwrap_or(default);
        if v > max {
            return Err(ToolError::InvalidArguments {
                tool: self.tool,
                message: format!("{name:?} must be at most {max}, not {v}"),
            });
        }
        Ok(v)
    }

    fn list(&self, name: &str) -> Option<Vec<String>> {
        self.map.get(name).and_then(Value::as_array).map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
    }
}

/// The tools' state: which client config to use and the open connections.
pub struct Tools {
    client: ClientSelect,
    toolkit: crate::Toolkit,
    connections: Connections,
}

/// An integer the checks made positive, as unsigned.
fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(1)
}

impl Tools {
    /// Tools using the client config `client` selects (resolved at each call, as upstream,
    /// so `jmp config client use` takes effect without a restart).
    /// `toolkit`'s `j` commands and program serve the tools that run or describe `j`.
    pub fn new(client: ClientSelect, toolkit: crate::Toolkit) -> Self {
        Self {
            client,
            toolkit,
            connections: Connections::default(),
        }
    }

    /// Closes every connection, releasing the leases they created.
    pub async fn shutdown(&self) {
        self.connections.close_all().await;
    }

    /// Runs the tool `name`; the result is the tool's JSON output.
    pub async fn call(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
    ) -> Result<Value, ToolError> {
        let spec = TOOLS
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ToolError::UnknownTool(name.to_string()))?;
        let a = Arguments::check(spec, arguments)?;
        match spec.name {
            "jmp_list_exporters" => self.list_exporters(&a).await,
            "jmp_list_leases" => self.list_leases(&a).await,
            "jmp_create_lease" => self.create_lease(&a).await,
            "jmp_delete_lease" => self.delete_lease(&a).await,
            "jmp_connect" => self.connect(&a).await,
            "jmp_disconnect" => self.disconnect(&a).await,
            "jmp_list_connections" => Ok(self.list_connections().await),
            "jmp_run" => self.run(&a).await,
            "jmp_get_env" => self.get_env(&a).await,
            "jmp_explore" => self.explore(&a).await,
            "jmp_drivers" => {
                let conn = self.conn(&a).await?;
                Ok(json!(introspect::drivers(&conn.session)))
            }
            "jmp_driver_methods" => self.driver_methods(&a).await,
            "jmp_call" => self.call_method(&a).await,
            other => Err(ToolError::UnknownTool(other.to_string())),
        }
    }

    fn config(&self) -> Result<ClientConfig, ToolError> {
        Ok(ClientConfig::resolve(
            self.client.client_config.as_deref(),
            self.client.client.as_deref(),
        )
        .map_err(anyhow::Error::from)?)
    }

    async fn conn(&self, a: &Arguments<'_>) -> Result<std::sync::Arc<Connection>, ToolError> {
        Ok(self
            .connections
            .get(a.required_str("connection_id")?)
            .await?)
    }

    async fn list_exporters(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let include_leases = a.bool("include_leases", true);
        let include_online = a.bool("include_online", true);
        let api = connect(&self.client).await?;
        let query = ExporterQuery {
            selector: a.str("selector").unwrap_or("").to_string(),
            ..ExporterQuery::default()
        };
        let exporters = api
            .list_exporters(&query)
            .await
            .map_err(|e| api_error("cannot list exporters", e))?;
        let leases = if include_leases {
            active_leases(&api).await?
        } else {
            Vec::new()
        };
        let now = Timestamp::now();
        let mut by_exporter: BTreeMap<String, &Lease> = BTreeMap::new();
        for l in &leases {
            if let Some(e) = l.exporter.as_deref()
                && l.effective_end_time.is_none()
            {
                by_exporter.insert(short_name(e).to_string(), l);
            }
        }
        let mut views: Vec<ExporterView> = exporters
            .iter()
            .map(ExporterView::from_proto)
            .filter(|v| v.enabled != Some(false))
            .collect();
        views.sort_by(|x, y| x.name.cmp(&y.name));
        let out: Vec<Value> = views
            .into_iter()
            .map(|v| {
                let mut e = json!({"name": v.name, "labels": v.labels});
                let name = v.name;
                if let Some(o) = e.as_object_mut() {
                    if !v.deprecated_labels.is_empty() {
                        o.insert("deprecated_labels".into(), json!(v.deprecated_labels));
                    }
                    if include_online {
                        o.insert("online".into(), json!(v.online));
                    }
                    o.insert("status".into(), json!(v.status));
                    if include_leases {
                        let lease = by_exporter.get(&name).map(|l| {
                            let lv = LeaseView::from_proto(l, now);
                            json!({
                                "name": lv.name,
                                "client": lv.client,
                                "status": lease_status(l),
                                "duration": lv.duration.map(timedelta_text),
                                "begin_time": lv.effective_begin_time,
                                "end_time": lv.effective_end_time,
                                "expected_end_time": lv.expected_end(),
                            })
                        });
                        o.insert("lease".into(), lease.unwrap_or(Value::Null));
                    }
                }
                e
            })
            .collect();
        Ok(json!(out))
    }

    async fn list_leases(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let api = connect(&self.client).await?;
        let query = LeaseQuery {
            selector: a.str("selector").unwrap_or("").to_string(),
            ..LeaseQuery::default()
        };
        let leases = api
            .list_leases(&query)
            .await
            .map_err(|e| api_error("cannot list leases", e))?;
        let now = Timestamp::now();
        let out: Vec<Value> = leases
            .iter()
            .map(|l| {
                let v = LeaseView::from_proto(l, now);
                json!({
                    "name": v.name,
                    "client": v.client,
                    "exporter": v.exporter,
                    "selector": v.selector,
                    "status": lease_status(l),
                    "begin_time": v.effective_begin_time,
                    "end_time": v.effective_end_time,
                    "expected_end_time": v.expected_end(),
                    "duration": v.duration.map(timedelta_text),
                })
            })
            .collect();
        Ok(json!(out))
    }

    async fn create_lease(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let secs = a.int("duration_seconds", MAX_DURATION)?;
        let selector = a.str("selector");
        let exporter_name = a.str("exporter_name");
        if selector.is_none() && exporter_name.is_none() {
            return Err(ToolError::InvalidArguments {
                tool: a.tool,
                message: "one of \"selector\" or \"exporter_name\" is required".into(),
            });
        }
        let request = LeaseRequest {
            selector: selector.unwrap_or_default().to_string(),
            exporter_name: exporter_name.map(str::to_string),
            duration: Duration::from_secs(unsigned(secs)),
            ..LeaseRequest::default()
        };
        let created = connect(&self.client)
            .await?
            .create_lease(&request)
            .await
            .map_err(|e| api_error("cannot create the lease", e))?;
        let mut out = json!({
            "name": short_name(&created.name),
            "status": "created",
            "duration_seconds": secs,
            "selector": selector,
            "exporter_name": exporter_name,
            "tags": null,
        });
        if !created.deprecated_labels.is_empty()
            && let Some(o) = out.as_object_mut()
        {
            o.insert("deprecated_labels".into(), json!(created.deprecated_labels));
        }
        Ok(out)
    }

    async fn delete_lease(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let id = a.required_str("lease_id")?;
        if id.contains('/') && !id.starts_with("namespaces/") {
            return Err(ToolError::InvalidArguments {
                tool: a.tool,
                message: format!("invalid lease name {id:?}"),
            });
        }
        connect(&self.client)
            .await?
            .delete_lease(id)
            .await
            .map_err(|e| api_error(&format!("cannot delete lease {id:?}"), e))?;
        let name = short_name(id);
        let closed = self.connections.forget_lease(name).await;
        Ok(json!({"name": name, "status": "deleted", "connections_closed": closed}))
    }

    async fn connect(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let secs = a.int("duration_seconds", MAX_DURATION)?;
        let source = match (a.str("lease_id"), a.str("selector"), a.str("exporter_name")) {
            (Some(lease), None, None) => LeaseSource::Existing(lease.to_string()),
            (Some(_), _, _) => {
                return Err(ToolError::InvalidArguments {
                    tool: a.tool,
                    message: "give \"lease_id\", or \"selector\"/\"exporter_name\", not both"
                        .into(),
                });
            }
            (None, None, None) => {
                return Err(ToolError::InvalidArguments {
                    tool: a.tool,
                    message: "one of \"lease_id\", \"selector\" or \"exporter_name\" is required"
                        .into(),
                });
            }
            (None, selector, exporter) => LeaseSource::Create(LeaseRequest {
                selector: selector.unwrap_or_default().to_string(),
                exporter_name: exporter.map(str::to_string),
                duration: Duration::from_secs(unsigned(secs)),
                ..LeaseRequest::default()
            }),
        };
        let timeout = match a.map.get("acquisition_timeout_seconds") {
            Some(v) if !v.is_null() => Some(Duration::from_secs(unsigned(
                a.int("acquisition_timeout_seconds", MAX_DURATION)?,
            ))),
            _ => None,
        };
        let cfg = self.config()?;
        let conn = self.connections.open(&cfg, source, timeout).await?;
        let j = jumpstarter_drivers::j_command_with(&conn.session, self.toolkit.commands()).await;
        Ok(json!({
            "connection_id": conn.id,
            "lease_name": conn.lease_name,
            "exporter_name": conn.exporter_name,
            "exporter_labels": conn.exporter_labels,
            "socket_path": conn.socket_path,
            "lease_released_on_disconnect": conn.owns_lease(),
            "cli_tree": introspect::command_tree(&j),
            "drivers": introspect::drivers(&conn.session),
        }))
    }

    async fn disconnect(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let (conn, released) = self
            .connections
            .close(a.required_str("connection_id")?)
            .await?;
        Ok(json!({
            "connection_id": conn.id,
            "status": "disconnected",
            "lease_name": conn.lease_name,
            "lease_released": released,
        }))
    }

    async fn list_connections(&self) -> Value {
        let now = Timestamp::now();
        let out: Vec<Value> = self
            .connections
            .list()
            .await
            .iter()
            .map(|c| {
                json!({
                    "connection_id": c.id,
                    "lease_name": c.lease_name,
                    "exporter_name": c.exporter_name,
                    "socket_path": c.socket_path,
                    "uptime_seconds": now.duration_since(c.created_at).as_secs_f64(),
                    "created_at": c.created_at,
                })
            })
            .collect();
        json!(out)
    }

    async fn run(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let conn = self.conn(a).await?;
        let timeout = a.int("timeout_seconds", MAX_TIMEOUT)?;
        let mut command = a.list("command").unwrap_or_default();
        // Agents often include the program name.
        if command.first().is_some_and(|c| c == "j") {
            command.remove(0);
        }
        if command.is_empty() {
            return Err(ToolError::InvalidArguments {
                tool: a.tool,
                message: "\"command\" must name a j command (e.g. [\"power\", \"on\"])".into(),
            });
        }
        let j = j_program(&self.toolkit);
        Ok(run_j(&j, &conn, &command, Duration::from_secs(unsigned(timeout))).await?)
    }

    async fn get_env(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let conn = self.conn(a).await?;
        let j = j_program(&self.toolkit);
        let env = j_env(&conn);
        Ok(json!({
            "connection_id": conn.id,
            "lease_name": conn.lease_name,
            "exporter_name": conn.exporter_name,
            "env": env,
            "j_path": j,
            "shell_example": format!(
                "JUMPSTARTER_HOST={} {} power on",
                conn.socket_path.display(),
                j.display()
            ),
            "note": "Run j commands (or scripts calling them) with these variables set. The \
                     socket lives as long as the connection.",
        }))
    }

    async fn explore(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let conn = self.conn(a).await?;
        let j = jumpstarter_drivers::j_command_with(&conn.session, self.toolkit.commands()).await;
        let path = a.list("command_path").unwrap_or_default();
        let cmd = introspect::find_command(&j, &path).map_err(ToolError::Failed)?;
        Ok(introspect::command_tree(cmd))
    }

    async fn driver_methods(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let conn = self.conn(a).await?;
        let path = a.list("driver_path").unwrap_or_default();
        introspect::driver_methods(&conn.session, &conn.id, &path, self.toolkit.commands())
            .await
            .map_err(ToolError::Failed)
    }

    async fn call_method(&self, a: &Arguments<'_>) -> Result<Value, ToolError> {
        let conn = self.conn(a).await?;
        let target = a.required_str("method")?;
        let (path, method) = match target.rsplit_once('.') {
            Some((p, m)) => (p, m),
            None => ("", target),
        };
        if method.is_empty() {
            return Err(ToolError::InvalidArguments {
                tool: a.tool,
                message: format!("\"method\" {target:?} names no method (e.g. \"power.on\")"),
            });
        }
        let timeout = Duration::from_secs(unsigned(a.int("timeout_seconds", MAX_TIMEOUT)?));
        let max_items = usize::try_from(a.int("max_items", MAX_ITEMS)?).unwrap_or(1);
        let args: Vec<Value> = a
            .map
            .get("args")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let driver = conn
            .session
            .driver(path)
            .map_err(|e| ToolError::Failed(jumpstarter_core::error_chain(&e)))?;
        let class = driver.node().client_class().to_string();
        let info = introspect::method_info(&class, method);
        let streaming = match a.map.get("streaming").and_then(Value::as_bool) {
            Some(s) => s,
            None => info.is_some_and(|i| i.style == CallStyle::Streaming),
        };
        if info.is_some_and(|i| i.style == CallStyle::Resource) {
            return Err(ToolError::Failed(format!(
                "{target} moves data through a byte stream and cannot be called with JSON \
                 arguments; use jmp_run with the driver's j command (jmp_explore lists them)"
            )));
        }
        // The one client-side method of the stock classes: power cycle.
        if class == POWER_CLIENT && method == "cycle" {
            let wait = args.first().and_then(Value::as_f64).unwrap_or(2.0);
            if !(0.0..=3600.0).contains(&wait) {
                return Err(ToolError::InvalidArguments {
                    tool: a.tool,
                    message: format!("power cycle wait must be 0 to 3600 seconds, not {wait}"),
                });
            }
            let power = PowerClient(driver);
            tokio::time::timeout(timeout, power.cycle(Duration::from_secs_f64(wait)))
                .await
                .map_err(|_| ToolError::Failed(format!("{target} timed out")))?
                .map_err(|e| ToolError::Failed(jumpstarter_core::error_chain(&e)))?;
            return Ok(json!({"method": target, "result": null}));
        }
        let wire: Vec<_> = args.into_iter().map(value::from_json).collect();
        if streaming {
            let mut items = Vec::new();
            let mut ended = false;
            let mut error = None;
            let collect = async {
                let mut stream = driver
                    .streaming_call::<Value>(method, wire)
                    .await
                    .map_err(|e| jumpstarter_core::error_chain(&e))?;
                while items.len() < max_items {
                    match stream.next().await {
                        Some(Ok(item)) => items.push(item),
                        Some(Err(e)) => {
                            error = Some(jumpstarter_core::error_chain(&e));
                            break;
                        }
                        None => {
                            ended = true;
                            break;
                        }
                    }
                }
                Ok::<(), String>(())
            };
            let timed_out = match tokio::time::timeout(timeout, collect).await {
                Ok(r) => {
                    r.map_err(ToolError::Failed)?;
                    false
                }
                Err(_) => true,
            };
            if let Some(e) = &error
                && items.is_empty()
            {
                return Err(ToolError::Failed(e.clone()));
            }
            return Ok(json!({
                "method": target,
                "items": items,
                "ended": ended,
                "timed_out": timed_out,
                "error": error,
            }));
        }
        let result = tokio::time::timeout(timeout, driver.call_raw(method, wire))
            .await
            .map_err(|_| ToolError::Failed(format!("{target} did not answer within {timeout:?}")))?
            .map_err(|e| ToolError::Failed(jumpstarter_core::error_chain(&e)))?;
        Ok(json!({"method": target, "result": value::to_json(result)}))
    }
}

/// Upstream's MCP lease status words, from the lease's conditions.
fn lease_status(l: &Lease) -> &'static str {
    let is_true = |kind: &str| {
        l.conditions
            .iter()
            .any(|c| c.r#type.as_deref() == Some(kind) && c.status.as_deref() == Some("True"))
    };
    if is_true("Ready") {
        "ready"
    } else if is_true("Pending") {
        "pending"
    } else if is_true("Unsatisfiable") {
        "unsatisfiable"
    } else if is_true("Invalid") {
        "invalid"
    } else if l.effective_end_time.is_some() {
        "ended"
    } else {
        "unknown"
    }
}

/// A duration as Python's `str(timedelta)` shows it (`0:30:00`, `1 day, 2:00:00`), which
/// is what upstream's tools return.
fn timedelta_text(secs: f64) -> String {
    let total = secs.max(0.0).round() as u64;
    let (days, rest) = (total / 86_400, total % 86_400);
    let clock = format!("{}:{:02}:{:02}", rest / 3600, rest % 3600 / 60, rest % 60);
    match days {
        0 => clock,
        1 => format!("1 day, {clock}"),
        d => format!("{d} days, {clock}"),
    }
}

/// The `j` next to this `jmp`, else `j` from `PATH` (a lab's `jmp` names its own, see
/// `Toolkit::with_j_program`).
fn j_program(toolkit: &crate::Toolkit) -> PathBuf {
    std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(toolkit.j_program()))
        .filter(|j| j.is_file())
        .unwrap_or_else(|| PathBuf::from(toolkit.j_program()))
}

/// The environment a `j` command of `conn` gets, as inside `jmp shell`.
fn j_env(conn: &Connection) -> BTreeMap<String, String> {
    let mut env = crate::shell::base_env(&conn.socket_path.to_string_lossy());
    env.insert("JMP_DRIVERS_ALLOW".into(), conn.drivers_allow.clone());
    env.insert("JMP_LEASE".into(), conn.lease_name.clone());
    env.insert("JMP_EXPORTER".into(), conn.exporter_name.clone());
    env.insert(
        "JMP_EXPORTER_LABELS".into(),
        conn.exporter_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    env
}

/// Reads `r` to its end, keeping the first `max` bytes; returns them and how many were
/// dropped.
async fn capture(mut r: impl AsyncRead + Unpin, max: usize) -> (Vec<u8>, usize) {
    let mut kept = Vec::new();
    let mut dropped = 0usize;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, dropped),
            Ok(n) => {
                let take = n.min(max.saturating_sub(kept.len()));
                kept.extend_from_slice(&buf[..take]);
                dropped += n - take;
            }
        }
    }
}

fn output_text((bytes, dropped): (Vec<u8>, usize)) -> String {
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if dropped > 0 {
        text.push_str(&format!("\n[... {dropped} more bytes not shown]"));
    }
    text
}

/// Runs `j COMMAND...` against the connection, capturing its output.
async fn run_j(
    j: &std::path::Path,
    conn: &Connection,
    command: &[String],
    timeout: Duration,
) -> anyhow::Result<Value> {
    let mut child = tokio::process::Command::new(j)
        .args(command)
        .envs(j_env(conn))
        // Settings for other exporters must not leak in from our own environment.
        .env_remove("JMP_GRPC_INSECURE")
        .env_remove("JMP_GRPC_PASSPHRASE")
        .env_remove("JMP_GRPC_CA")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run {}", j.display()))?;
    let stdout = child
        .stdout
        .take()
        .map(|o| tokio::spawn(capture(o, MAX_OUTPUT)));
    let stderr = child
        .stderr
        .take()
        .map(|e| tokio::spawn(capture(e, MAX_OUTPUT)));
    let (status, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(s) => (s.context("waiting for j")?, false),
        Err(_) => {
            let _ = child.start_kill();
            (child.wait().await.context("waiting for j")?, true)
        }
    };
    let collect = |h: Option<tokio::task::JoinHandle<(Vec<u8>, usize)>>| async move {
        match h {
            Some(h) => tokio::time::timeout(Duration::from_secs(2), h)
                .await
                .ok()
                .and_then(Result::ok)
                .map(output_text)
                .unwrap_or_default(),
            None => String::new(),
        }
    };
    let stdout = collect(stdout).await;
    let stderr = collect(stderr).await;
    let exit_code = {
        use std::os::unix::process::ExitStatusExt;
        status.code().or_else(|| status.signal().map(|s| -s))
    };
    let mut full = vec![j.to_string_lossy().into_owned()];
    full.extend(command.iter().cloned());
    let mut out = json!({
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "command": full,
    });
    if timed_out && let Some(o) = out.as_object_mut() {
        o.insert("timed_out".into(), json!(true));
        o.insert("timeout_seconds".into(), json!(timeout.as_secs()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn spec(name: &str) -> &'static ToolSpec {
        TOOLS.iter().find(|t| t.name == name).unwrap()
    }

    #[test]
    fn every_tool_has_a_schema() {
        let list = list();
        let tools = list["tools"].as_array().unwrap();
        assert_eq!(tools.len(), TOOLS.len());
        for name in [
            "jmp_list_exporters",
            "jmp_list_leases",
            "jmp_create_lease",
            "jmp_delete_lease",
            "jmp_connect",
            "jmp_disconnect",
            "jmp_list_connections",
            "jmp_run",
            "jmp_get_env",
            "jmp_explore",
            "jmp_drivers",
            "jmp_driver_methods",
            "jmp_call",
        ] {
            let t = tools.iter().find(|t| t["name"] == name).unwrap();
            assert_eq!(t["inputSchema"]["type"], "object", "{name}");
        }
        let run = tools.iter().find(|t| t["name"] == "jmp_run").unwrap();
        assert_eq!(
            run["inputSchema"]["required"],
            json!(["connection_id", "command"])
        );
        assert_eq!(
            run["inputSchema"]["properties"]["timeout_seconds"]["default"],
            120
        );
    }

    #[test]
    fn arguments_are_checked() {
        let run = spec("jmp_run");
        let ok = args(json!({"connection_id": "c1", "command": ["power", "on"]}));
        let a = Arguments::check(run, &ok).unwrap();
        assert_eq!(a.int("timeout_seconds", MAX_TIMEOUT).unwrap(), 120);
        assert_eq!(a.list("command").unwrap(), vec!["power", "on"]);
        let cases = [
            (
                json!({"command": ["x"]}),
                "missing required argument \"connection_id\"",
            ),
            (
                json!({"connection_id": " ", "command": ["x"]}),
                "non-empty string",
            ),
            (
                json!({"connection_id": "c", "command": "power on"}),
                "array of strings",
            ),
            (
                json!({"connection_id": "c", "command": [1]}),
                "array of strings",
            ),
            (
                json!({"connection_id": "c", "command": [], "timeout_seconds": 0}),
                "positive integer",
            ),
            (
                json!({"connection_id": "c", "command": [], "timeout_seconds": "5"}),
                "positive integer",
            ),
            (
                json!({"connection_id": "c", "command": [], "cmd": []}),
                "unknown argument \"cmd\"",
            ),
        ];
        for (v, want) in cases {
            let m = args(v.clone());
            let err = Arguments::check(run, &m).err().unwrap().to_string();
            assert!(err.contains(want), "{v}: {err}");
            assert!(err.contains("jmp_run"), "{err}");
        }
        let big = args(json!({"connection_id": "c", "command": ["x"], "timeout_seconds": 99999}));
        let a = Arguments::check(run, &big).unwrap();
        assert!(a.int("timeout_seconds", MAX_TIMEOUT).is_err());
        let whole = args(json!({"connection_id": "c", "command": ["x"], "timeout_seconds": 5.0}));
        let a = Arguments::check(run, &whole).unwrap();
        assert_eq!(a.int("timeout_seconds", MAX_TIMEOUT).unwrap(), 5);
        // Null counts as absent.
        let none = args(json!({"selector": null}));
        assert!(Arguments::check(spec("jmp_list_leases"), &none).is_ok());
    }

    #[test]
    fn durations_read_as_upstream_shows_them() {
        assert_eq!(timedelta_text(1800.0), "0:30:00");
        assert_eq!(timedelta_text(90061.0), "1 day, 1:01:01");
        assert_eq!(timedelta_text(3.0 * 86400.0), "3 days, 0:00:00");
    }

    #[test]
    fn lease_status_words() {
        use jumpstarter_proto::v1::Condition;
        let cond = |t: &str, s: &str| Condition {
            r#type: Some(t.into()),
            status: Some(s.into()),
            ..Default::default()
        };
        let mut l = Lease::default();
        assert_eq!(lease_status(&l), "unknown");
        l.conditions = vec![cond("Pending", "True")];
        assert_eq!(lease_status(&l), "pending");
        l.conditions = vec![cond("Pending", "False"), cond("Ready", "True")];
        assert_eq!(lease_status(&l), "ready");
        l.conditions = vec![cond("Unsatisfiable", "True")];
        assert_eq!(lease_status(&l), "unsatisfiable");
    }

    #[tokio::test]
    async fn unknown_tools_and_connections_are_errors() {
        let tools = Tools::new(ClientSelect::default(), crate::Toolkit::stock());
        let e = tools.call("jmp_nope", &Map::new()).await.unwrap_err();
        assert!(matches!(e, ToolError::UnknownTool(_)), "{e}");
        let e = tools
            .call("jmp_drivers", &args(json!({"connection_id": "abc"})))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ToolError::Failed(m) if m.contains("no connection with id \"abc\"")),
            "{e}"
        );
        let e = tools.call("jmp_connect", &Map::new()).await.unwrap_err();
        assert!(matches!(e, ToolError::InvalidArguments { .. }), "{e}");
        let e = tools
            .call("jmp_create_lease", &args(json!({"duration_seconds": 60})))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("selector"), "{e}");
        assert!(
            tools
                .list_connections()
                .await
                .as_array()
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn capture_keeps_a_bounded_prefix() {
        let data = [b'x'; 100];
        let (kept, dropped) = capture(&data[..], 30).await;
        assert_eq!((kept.len(), dropped), (30, 70));
        assert!(output_text((kept, dropped)).ends_with("[... 70 more bytes not shown]"));
    }
}
