//! `jmp mcp serve`: a Model Context Protocol server on stdin/stdout, so that AI agents (in
//! Cursor, Claude Code, ...) can list exporters, lease them, connect and drive their drivers.
//!
//! The transport is MCP's stdio one: JSON-RPC 2.0 messages, one per line. Only protocol
//! messages go to stdout; logs go to stderr. Requests run concurrently (a long `jmp_run` does
//! not hold up a `ping`), at most [`MAX_IN_FLIGHT`] at a time. End of input ends the server:
//! it closes its connections, releasing the leases they created.

mod connections;
mod introspect;
mod protocol;
mod tools;

use std::{
    future::Future,
    io::{BufReader, Read, Write},
    sync::Arc,
    time::Duration,
};

use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};
use tokio::{
    sync::{Semaphore, mpsc, oneshot},
    task::JoinSet,
};

use crate::resources::ClientSelect;
use protocol::{Incoming, Line};

/// Requests handled at once; further input waits.
pub const MAX_IN_FLIGHT: usize = 16;
/// How long requests still running at end of input may take to finish.
const GRACE: Duration = Duration::from_secs(5);
/// Protocol versions we speak, newest first.
const PROTOCOL_VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];

/// What agents are told about the server when they connect.
const INSTRUCTIONS: &str = "\
Jumpstarter gives remote access to physical hardware devices (exporters) through a \
controller that manages leases.

Typical workflow:
1. jmp_list_exporters to see the devices, jmp_list_leases to see existing leases
2. jmp_connect with a selector or exporter_name (creates a lease) or a lease_id
3. jmp_explore / jmp_drivers / jmp_driver_methods to discover what the device offers
4. jmp_run to run j commands (e.g. [\"power\", \"on\"]), or jmp_call to call one driver \
method with JSON arguments (e.g. method \"power.on\")
5. jmp_disconnect (releases a lease jmp_connect created) and jmp_delete_lease when done

Connections are persistent: connect once, run many commands. jmp_run kills a command after \
timeout_seconds (default 120): give streaming commands a short timeout.";

/// `jmp mcp` subcommands.
#[derive(Subcommand, Debug)]
pub enum McpCommand {
    /// Start the MCP server with stdio transport.
    ///
    /// This is meant to be invoked by an MCP-compatible host (e.g. Cursor) as a subprocess.
    /// All communication happens over stdin/stdout.
    Serve(ServeArgs),
}

/// Options of `jmp mcp serve`; all optional (upstream has none): without them the client
/// config is chosen as for other commands (`JMP_*` variables, then the current client).
#[derive(Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// Which client config the tools use.
    #[command(flatten)]
    pub client: ClientSelect,
}

/// Runs `jmp mcp ...`.
pub async fn run(cmd: McpCommand, toolkit: crate::Toolkit) -> Result<i32> {
    match cmd {
        McpCommand::Serve(args) => serve(args, toolkit).await.map(|()| 0),
    }
}

/// Serves MCP on stdin/stdout until end of input or SIGINT/SIGTERM.
/// The `j` commands and program of `toolkit` serve the tools that run `j`.
pub async fn serve(args: ServeArgs, toolkit: crate::Toolkit) -> Result<()> {
    let lines = read_lines(std::io::stdin());
    serve_lines(
        lines,
        std::io::stdout(),
        args,
        toolkit,
        crate::signals::shutdown_signal(),
    )
    .await
}

/// Reads lines of `input` on a thread of its own, into a bounded queue. A plain thread,
/// not the runtime's blocking pool: a read that never returns must not hold up exit.
fn read_lines(input: impl Read + Send + 'static) -> mpsc::Receiver<std::io::Result<Line>> {
    let (tx, rx) = mpsc::channel(8);
    let spawned = std::thread::Builder::new()
        .name("mcp-stdin".into())
        .spawn(move || {
            let mut reader = BufReader::with_capacity(64 * 1024, input);
            loop {
                let line = match protocol::read_line(&mut reader, protocol::MAX_LINE) {
                    Ok(Some(l)) => Ok(l),
                    Ok(None) => return,
                    Err(e) => Err(e),
                };
                let failed = line.is_err();
                if tx.blocking_send(line).is_err() || failed {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the stdin reader: {e}");
    }
    rx
}

/// The server loop over a queue of input lines and an output stream.
async fn serve_lines(
    mut lines: mpsc::Receiver<std::io::Result<Line>>,
    output: impl Write + Send + 'static,
    args: ServeArgs,
    toolkit: crate::Toolkit,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let server = Arc::new(Server {
        tools: tools::Tools::new(args.client, toolkit),
    });
    let (out, out_rx) = mpsc::channel::<Value>(64);
    let writer = write_messages(output, out_rx);
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    tracing::info!("MCP server ready on stdio");
    loop {
        while tasks.try_join_next().is_some() {}
        let line = tokio::select! {
            l = lines.recv() => l,
            () = &mut shutdown => {
                tracing::info!("signal received; shutting down");
                break;
            }
        };
        let bytes = match line {
            None => break,
            Some(Err(e)) => {
                tracing::warn!(
                    "cannot read stdin: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
                break;
            }
            Some(Ok(Line::TooLong(n))) => {
                let message = format!(
                    "Invalid Request: message of {n} bytes exceeds the limit of {} bytes",
                    protocol::MAX_LINE
                );
                let _ = out
                    .send(protocol::error(
                        &Value::Null,
                        protocol::INVALID_REQUEST,
                        message,
                    ))
                    .await;
                continue;
            }
            Some(Ok(Line::Text(b))) => b,
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let (id, method, params) = match protocol::classify(&bytes) {
            Err(message) => {
                let _ = out
                    .send(protocol::error(
                        &Value::Null,
                        protocol::PARSE_ERROR,
                        message,
                    ))
                    .await;
                continue;
            }
            Ok(Incoming::Invalid { id, message }) => {
                let _ = out
                    .send(protocol::error(&id, protocol::INVALID_REQUEST, message))
                    .await;
                continue;
            }
            Ok(Incoming::Response) => {
                tracing::debug!("ignoring a response: we send no requests");
                continue;
            }
            Ok(Incoming::Notification { method }) => {
                tracing::debug!("notification {method}");
                continue;
            }
            Ok(Incoming::Request { id, method, params }) => (id, method, params),
        };
        let permit = tokio::select! {
            p = Arc::clone(&limit).acquire_owned() => p?,
            () = &mut shutdown => break,
        };
        let server = Arc::clone(&server);
        let out = out.clone();
        tasks.spawn(async move {
            let reply = server.handle(&id, &method, params).await;
            let _ = out.send(reply).await;
            drop(permit);
        });
    }
    let finished =
        tokio::time::timeout(GRACE, async { while tasks.join_next().await.is_some() {} }).await;
    if finished.is_err() {
        tracing::warn!("abandoning requests still running at exit");
        tasks.abort_all();
    }
    server.tools.shutdown().await;
    drop(out);
    let _ = writer.await;
    tracing::info!("MCP server stopped");
    Ok(())
}

/// Writes each message as one line, flushing after each, on a thread of its own (like
/// reading, so a stalled host cannot hold up the runtime). The receiver resolves when the
/// queue is closed and drained.
fn write_messages(
    mut output: impl Write + Send + 'static,
    mut rx: mpsc::Receiver<Value>,
) -> oneshot::Receiver<()> {
    let (done, finished) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("mcp-stdout".into())
        .spawn(move || {
            while let Some(msg) = rx.blocking_recv() {
                let mut bytes = match serde_json::to_vec(&msg) {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::error!("cannot encode a reply: {e}");
                        continue;
                    }
                };
                bytes.push(b'\n');
                if let Err(e) = output.write_all(&bytes).and_then(|()| output.flush()) {
                    tracing::warn!(
                        "cannot write to stdout: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    );
                    break;
                }
            }
            let _ = done.send(());
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start the stdout writer: {e}");
    }
    finished
}

struct Server {
    tools: tools::Tools,
}

impl Server {
    /// The reply to one request.
    async fn handle(&self, id: &Value, method: &str, params: Option<Map<String, Value>>) -> Value {
        let params = params.unwrap_or_default();
        match method {
            "initialize" => {
                let Some(asked) = params.get("protocolVersion").and_then(Value::as_str) else {
                    return protocol::error(
                        id,
                        protocol::INVALID_PARAMS,
                        "Invalid params: initialize needs \"protocolVersion\"",
                    );
                };
                let version = PROTOCOL_VERSIONS
                    .iter()
                    .find(|v| **v == asked)
                    .unwrap_or(&PROTOCOL_VERSIONS[0]);
                protocol::response(
                    id,
                    json!({
                        "protocolVersion": version,
                        "capabilities": {"tools": {"listChanged": false}},
                        "serverInfo": {
                            "name": "jumpstarter",
                            "title": "Jumpstarter",
                            "version": env!("CARGO_PKG_VERSION"),
                        },
                        "instructions": INSTRUCTIONS,
                    }),
                )
            }
            "ping" => protocol::response(id, json!({})),
            "tools/list" => protocol::response(id, tools::list()),
            "tools/call" => self.call_tool(id, &params).await,
            other => protocol::error(
                id,
                protocol::METHOD_NOT_FOUND,
                format!("Method not found: {other}"),
            ),
        }
    }

    async fn call_tool(&self, id: &Value, params: &Map<String, Value>) -> Value {
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return protocol::error(
                id,
                protocol::INVALID_PARAMS,
                "Invalid params: tools/call needs the tool's \"name\"",
            );
        };
        let empty = Map::new();
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(a)) => a,
            Some(_) => {
                return protocol::error(
                    id,
                    protocol::INVALID_PARAMS,
                    "Invalid params: \"arguments\" must be an object",
                );
            }
        };
        tracing::info!("tool {name}");
        match self.tools.call(name, arguments).await {
            Ok(result) => {
                let text = serde_json::to_string_pretty(&result).unwrap_or_default();
                protocol::response(
                    id,
                    json!({"content": [{"type": "text", "text": text}], "isError": false}),
                )
            }
            Err(
                e @ (tools::ToolError::UnknownTool(_) | tools::ToolError::InvalidArguments { .. }),
            ) => protocol::error(
                id,
                protocol::INVALID_PARAMS,
                jumpstarter_core::error_chain(&e),
            ),
            Err(e) => {
                tracing::info!(
                    "tool {name} failed: {e}",
                    e = jumpstarter_core::error_chain(&e)
                );
                protocol::response(
                    id,
                    json!({"content": [{"type": "text", "text": jumpstarter_core::error_chain(&e)}], "isError": true}),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Output collected in memory.
    #[derive(Clone, Default)]
    struct Collected(Arc<Mutex<Vec<u8>>>);

    impl Write for Collected {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Runs the server over in-memory input to its end; returns the reply lines.
    async fn exchange(input: &'static [u8]) -> Vec<Value> {
        let output = Collected::default();
        serve_lines(
            read_lines(input),
            output.clone(),
            ServeArgs::default(),
            crate::Toolkit::stock(),
            std::future::pending(),
        )
        .await
        .unwrap();
        let bytes = output.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn answers_requests_and_survives_bad_input() {
        let replies = exchange(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-03-26\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n\
              {\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n\
              not json\n\
              \n\
              {\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"nope\"}\n\
              {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"jmp_nope\"}}\n\
              {\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{\"name\":\"jmp_drivers\",\"arguments\":{\"connection_id\":\"zz\"}}}\n\
              {\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"initialize\",\"params\":{}}\n\
              {\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"ping\"}",
        )
        .await;
        let by_id = |id: i64| {
            replies
                .iter()
                .find(|r| r["id"] == id)
                .unwrap_or_else(|| panic!("no reply {id} in {replies:?}"))
        };
        assert_eq!(replies.len(), 7, "{replies:?}");
        assert_eq!(by_id(1)["result"]["protocolVersion"], "2025-03-26");
        assert_eq!(by_id(1)["result"]["serverInfo"]["name"], "jumpstarter");
        assert!(by_id(1)["result"]["capabilities"]["tools"].is_object());
        let parse = replies.iter().find(|r| r["id"].is_null()).unwrap();
        assert_eq!(parse["error"]["code"], -32700);
        assert_eq!(by_id(2)["error"]["code"], -32601);
        assert_eq!(by_id(3)["error"]["code"], -32602);
        assert!(
            by_id(3)["error"]["message"]
                .as_str()
                .unwrap()
                .contains("jmp_nope")
        );
        assert_eq!(by_id(4)["result"]["isError"], true);
        assert_eq!(by_id(5)["error"]["code"], -32602);
        assert_eq!(by_id(6)["result"], json!({}));
    }

    #[tokio::test]
    async fn unknown_protocol_versions_get_ours() {
        let replies = exchange(
            b"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"1999-01-01\"}}\n",
        )
        .await;
        assert_eq!(
            replies[0]["result"]["protocolVersion"],
            PROTOCOL_VERSIONS[0]
        );
    }
}
