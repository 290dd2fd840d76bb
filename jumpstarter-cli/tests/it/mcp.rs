//! `jmp mcp serve` end to end: the real binary speaking MCP on its stdin/stdout, with a
//! client config for an in-process controller and a real `jmp run` exporter on loopback.

use std::{path::Path, process::Stdio, time::Duration};

use jumpstarter_controller::objects::ExporterStatusValue;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout},
};

use crate::{
    JMP,
    distributed::{Lab, lab},
};

/// An MCP host: drives `jmp mcp serve` over its stdio.
struct Host {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    next_id: i64,
}

impl Host {
    fn start(lab: &Lab, client: &Path) -> Self {
        let log = std::fs::File::create(lab.path("mcp.log")).unwrap();
        let mut child = lab
            .cmd(JMP)
            .args(["mcp", "serve", "--client-config"])
            .arg(client)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            stdout,
            next_id: 0,
        }
    }

    async fn send_line(&mut self, line: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// The next message from the server; every line must be JSON-RPC 2.0.
    async fn recv(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(90), self.stdout.next_line())
            .await
            .expect("no reply from the MCP server in time")
            .unwrap()
            .expect("the MCP server closed stdout");
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a non-JSON line {line:?}: {e}"));
        assert_eq!(v["jsonrpc"], "2.0", "{line}");
        v
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_line(msg.to_string().as_bytes()).await;
        let reply = self.recv().await;
        assert_eq!(reply["id"], id, "{reply}");
        reply
    }

    /// Calls a tool; returns the whole JSON-RPC reply.
    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await
    }

    /// Calls a tool that must succeed; returns its JSON output.
    async fn ok(&mut self, tool: &str, arguments: Value) -> Value {
        let reply = self.call(tool, arguments.clone()).await;
        let result = &reply["result"];
        assert_eq!(
            result["isError"], false,
            "{tool} {arguments} failed: {reply}"
        );
        assert_eq!(result["content"][0]["type"], "text", "{reply}");
        serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap()
    }

    /// Calls a tool that must fail as a tool (`isError`); returns its message.
    async fn tool_error(&mut self, tool: &str, arguments: Value) -> String {
        let reply = self.call(tool, arguments.clone()).await;
        assert_eq!(
            reply["result"]["isError"], true,
            "{tool} {arguments}: {reply}"
        );
        reply["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Closes stdin and waits for a clean exit.
    async fn finish(mut self) {
        drop(self.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the MCP server did not exit after end of input")
            .unwrap();
        assert_eq!(status.code(), Some(0));
        // Nothing but protocol messages on stdout, and none unasked for.
        assert!(self.stdout.next_line().await.unwrap().is_none());
    }

    async fn initialize(&mut self) {
        let init = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "it", "version": "1"},
                }),
            )
            .await;
        assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
        assert_eq!(init["result"]["serverInfo"]["name"], "jumpstarter");
        assert!(
            init["result"]["capabilities"]["tools"].is_object(),
            "{init}"
        );
        self.send_line(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
    }
}

async fn wait_log(lab: &Lab, name: &str, want: &str) {
    for _ in 0..100 {
        if lab.log(name).contains(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{want:?} never appeared in {name}:\n{}", lab.log(name));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_leases_connects_and_drives_an_exporter() {
    let lab = lab().await;
    let exporter_cfg = lab.exporter("mcp1", &[("board", "mcp")]).await;
    let client = lab.client("agent").await;
    let _exporter = lab.run_exporter(&exporter_cfg, "mcp1.log");
    lab.wait_status("mcp1", ExporterStatusValue::Available)
        .await;

    let mut host = Host::start(&lab, &client);
    host.initialize().await;

    let tools = host.request("tools/list", json!({})).await;
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for want in [
        "jmp_list_exporters",
        "jmp_list_leases",
        "jmp_create_lease",
        "jmp_delete_lease",
        "jmp_connect",
        "jmp_disconnect",
        "jmp_run",
        "jmp_drivers",
        "jmp_driver_methods",
        "jmp_call",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }

    // The exporter is listed, with labels and status.
    let exporters = host.ok("jmp_list_exporters", json!({})).await;
    let ex = exporters
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "mcp1")
        .unwrap_or_else(|| panic!("mcp1 not listed: {exporters}"));
    assert_eq!(ex["labels"]["board"], "mcp", "{ex}");
    assert_eq!(ex["online"], true, "{ex}");
    assert_eq!(ex["status"], "AVAILABLE", "{ex}");
    assert!(ex["lease"].is_null(), "{ex}");
    let none = host
        .ok("jmp_list_exporters", json!({"selector": "board=other"}))
        .await;
    assert_eq!(none, json!([]));

    // A lease by selector, then a connection to it.
    let lease = host
        .ok(
            "jmp_create_lease",
            json!({"selector": "board=mcp", "duration_seconds": 600}),
        )
        .await;
    assert_eq!(lease["status"], "created", "{lease}");
    let lease_name = lease["name"].as_str().unwrap().to_string();
    let leases = host.ok("jmp_list_leases", json!({})).await;
    assert!(
        leases
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["name"] == lease_name.as_str() && l["client"] == "agent"),
        "{leases}"
    );

    let conn = host
        .ok("jmp_connect", json!({"lease_id": lease_name}))
        .await;
    assert_eq!(conn["exporter_name"], "mcp1", "{conn}");
    assert_eq!(conn["lease_name"], lease_name.as_str(), "{conn}");
    assert_eq!(conn["lease_released_on_disconnect"], false, "{conn}");
    assert!(
        conn["drivers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["path"] == "power"),
        "{conn}"
    );
    let id = conn["connection_id"].as_str().unwrap().to_string();

    // The exporter is taken: a second connection gives up after its acquisition timeout.
    let msg = host
        .tool_error(
            "jmp_connect",
            json!({"exporter_name": "mcp1", "acquisition_timeout_seconds": 2}),
        )
        .await;
    assert!(msg.contains("was not ready within 2s"), "{msg}");

    // One driver method with JSON arguments: power.on reaches the exporter's driver.
    let on = host
        .ok(
            "jmp_call",
            json!({"connection_id": id, "method": "power.on"}),
        )
        .await;
    assert_eq!(on, json!({"method": "power.on", "result": null}));
    wait_log(&lab, "mcp1.log", "power on").await;
    let read = host
        .ok(
            "jmp_call",
            json!({"connection_id": id, "method": "power.read", "max_items": 5}),
        )
        .await;
    assert_eq!(read["items"][1]["voltage"], 5.0, "{read}");
    assert_eq!(read["ended"], true, "{read}");

    // A j command, output captured.
    let run = host
        .ok(
            "jmp_run",
            json!({"connection_id": id, "command": ["power", "read"]}),
        )
        .await;
    assert_eq!(run["exit_code"], 0, "{run}");
    assert!(
        run["stdout"].as_str().unwrap().contains("voltage=5.0 V"),
        "{run}"
    );
    let off = host
        .ok(
            "jmp_run",
            json!({"connection_id": id, "command": ["j", "power", "off"]}),
        )
        .await;
    assert_eq!(off["exit_code"], 0, "{off}");
    wait_log(&lab, "mcp1.log", "power off").await;
    let failed = host
        .ok(
            "jmp_run",
            json!({"connection_id": id, "command": ["power", "sideways"]}),
        )
        .await;
    assert_ne!(failed["exit_code"], 0, "{failed}");
    assert!(!failed["stderr"].as_str().unwrap().is_empty(), "{failed}");

    // Introspection.
    let methods = host
        .ok(
            "jmp_driver_methods",
            json!({"connection_id": id, "driver_path": ["power"]}),
        )
        .await;
    let method_names: Vec<&str> = methods["methods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(method_names, ["on", "off", "cycle", "read"], "{methods}");
    let explore = host
        .ok(
            "jmp_explore",
            json!({"connection_id": id, "command_path": ["storage"]}),
        )
        .await;
    assert!(
        explore["commands"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "flash"),
        "{explore}"
    );
    let env = host.ok("jmp_get_env", json!({"connection_id": id})).await;
    assert_eq!(env["env"]["JMP_LEASE"], lease_name.as_str(), "{env}");
    let conns = host.ok("jmp_list_connections", json!({})).await;
    assert_eq!(conns[0]["connection_id"], id.as_str(), "{conns}");

    // Disconnecting keeps a lease it did not create; deleting releases it.
    let gone = host
        .ok("jmp_disconnect", json!({"connection_id": id}))
        .await;
    assert_eq!(gone["lease_released"], false, "{gone}");
    assert!(!lab.lease(&lease_name).await.spec.release);
    let deleted = host
        .ok("jmp_delete_lease", json!({"lease_id": lease_name}))
        .await;
    assert_eq!(deleted["status"], "deleted", "{deleted}");
    assert!(lab.lease(&lease_name).await.spec.release);
    lab.wait_status("mcp1", ExporterStatusValue::Available)
        .await;

    // A connection by exporter name creates its lease and releases it on disconnect.
    let conn = host
        .ok(
            "jmp_connect",
            json!({"exporter_name": "mcp1", "duration_seconds": 300}),
        )
        .await;
    let own_lease = conn["lease_name"].as_str().unwrap().to_string();
    assert_eq!(conn["lease_released_on_disconnect"], true, "{conn}");
    let id = conn["connection_id"].as_str().unwrap().to_string();
    host.ok(
        "jmp_call",
        json!({"connection_id": id, "method": "power.on"}),
    )
    .await;
    let gone = host
        .ok("jmp_disconnect", json!({"connection_id": id}))
        .await;
    assert_eq!(gone["lease_released"], true, "{gone}");
    assert!(lab.lease(&own_lease).await.spec.release);

    // A connection left open at end of input: its lease is released on the way out.
    let conn = host
        .ok("jmp_connect", json!({"selector": "board=mcp"}))
        .await;
    let last_lease = conn["lease_name"].as_str().unwrap().to_string();
    host.finish().await;
    assert!(lab.lease(&last_lease).await.spec.release);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_answers_bad_input_with_errors_and_stays_up() {
    let lab = lab().await;
    let client = lab.client("agent").await;
    let mut host = Host::start(&lab, &client);
    host.initialize().await;

    // Not JSON.
    host.send_line(b"{\"jsonrpc\": \"2.0\", \"id\": 1,").await;
    let reply = host.recv().await;
    assert_eq!(reply["error"]["code"], -32700, "{reply}");
    assert!(reply["id"].is_null(), "{reply}");

    // Not a request.
    host.send_line(br#"{"jsonrpc":"2.0","id":"x"}"#).await;
    let reply = host.recv().await;
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert_eq!(reply["id"], "x", "{reply}");

    // A line beyond the limit is skipped whole, with an error.
    let mut huge = br#"{"jsonrpc":"2.0","id":99,"method":"ping","params":{"pad":""#.to_vec();
    huge.extend(std::iter::repeat_n(b'a', 2 * 1024 * 1024));
    huge.extend(br#""}}"#);
    host.send_line(&huge).await;
    let reply = host.recv().await;
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exceeds the limit"),
        "{reply}"
    );

    // Unknown method, unknown tool, bad and missing arguments: JSON-RPC errors.
    let reply = host.request("resources/read", json!({"uri": "x"})).await;
    assert_eq!(reply["error"]["code"], -32601, "{reply}");
    let reply = host.call("jmp_teleport", json!({})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("jmp_teleport"),
        "{reply}"
    );
    let reply = host.call("jmp_delete_lease", json!({})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("lease_id"),
        "{reply}"
    );
    let reply = host
        .call(
            "jmp_run",
            json!({"connection_id": "c", "command": "power on"}),
        )
        .await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    let reply = host.call("jmp_create_lease", json!({})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    let reply = host.request("tools/call", json!({"arguments": {}})).await;
    assert_eq!(reply["error"]["code"], -32602, "{reply}");

    // Unknown lease and connection: the tool fails, naming them.
    let msg = host
        .tool_error("jmp_delete_lease", json!({"lease_id": "no-such-lease"}))
        .await;
    assert!(msg.contains("no-such-lease"), "{msg}");
    let msg = host
        .tool_error("jmp_connect", json!({"lease_id": "no-such-lease"}))
        .await;
    assert!(msg.contains("no-such-lease"), "{msg}");
    let msg = host
        .tool_error(
            "jmp_call",
            json!({"connection_id": "nope", "method": "power.on"}),
        )
        .await;
    assert!(msg.contains("no connection with id \"nope\""), "{msg}");

    // Still serving.
    let pong = host.request("ping", json!({})).await;
    assert_eq!(pong["result"], json!({}), "{pong}");
    let leases = host.ok("jmp_list_leases", json!({})).await;
    assert_eq!(leases, json!([]));
    host.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_server_without_a_client_config_explains_and_stops_on_sigterm() {
    let lab = lab().await;
    let mut child = lab
        .cmd(JMP)
        .args(["mcp", "serve", "--client", "nosuch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut host = Host {
        stdin: child.stdin.take(),
        stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
        child,
        next_id: 0,
    };
    host.initialize().await;
    let msg = host.tool_error("jmp_list_exporters", json!({})).await;
    assert!(msg.contains("nosuch"), "{msg}");
    host.finish().await;

    // SIGTERM ends it cleanly even while its stdin stays open.
    let client = lab.client("agent").await;
    let mut host = Host::start(&lab, &client);
    host.initialize().await;
    let pid = host.child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(20), host.child.wait())
        .await
        .expect("the MCP server ignored SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", lab.log("mcp.log"));
}
