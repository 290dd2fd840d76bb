//! What a connected exporter offers, for agents: its `j` command tree, its drivers, and the
//! methods of the client classes we know.
//!
//! The exporter's report names each driver's client class but not its methods (upstream reads
//! them from the Python client class), so methods come from a table of the stock classes.

use clap::{Arg, Command};
use jumpstarter_core::client::{ClientNode, ExporterSession};
use jumpstarter_drivers::{
    COMPOSITE_CLIENT, OPENDAL_CLIENT, POWER_CLIENT, STORAGE_MUX_CLIENT, STORAGE_MUX_FLASHER_CLIENT,
};
use serde_json::{Value, json};

/// How a method is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStyle {
    /// `DriverCall`: one result.
    Unary,
    /// `StreamingDriverCall`: a stream of results.
    Streaming,
    /// Needs a byte stream from or to the client: use the `j` command (`jmp_run`).
    Resource,
    /// Implemented by the client out of other calls.
    ClientSide,
}

impl CallStyle {
    fn as_str(self) -> &'static str {
        match self {
            CallStyle::Unary => "unary",
            CallStyle::Streaming => "streaming",
            CallStyle::Resource => "resource (use jmp_run with the j command)",
            CallStyle::ClientSide => "client-side",
        }
    }
}

/// One method of a client class.
#[derive(Debug)]
pub struct MethodInfo {
    /// Its name, as called.
    pub name: &'static str,
    /// How it is called.
    pub style: CallStyle,
    /// Positional parameters: name and type.
    pub params: &'static [(&'static str, &'static str)],
    /// What it does.
    pub doc: &'static str,
}

const fn m(
    name: &'static str,
    style: CallStyle,
    params: &'static [(&'static str, &'static str)],
    doc: &'static str,
) -> MethodInfo {
    MethodInfo {
        name,
        style,
        params,
        doc,
    }
}

use CallStyle::{ClientSide, Resource, Streaming, Unary};

const POWER: &[MethodInfo] = &[
    m("on", Unary, &[], "Turn the power on."),
    m("off", Unary, &[], "Turn the power off."),
    m(
        "cycle",
        ClientSide,
        &[("wait", "number of seconds, default 2")],
        "Power off, wait, power on.",
    ),
    m(
        "read",
        Streaming,
        &[],
        "Stream power readings ({voltage, current}).",
    ),
];

const STORAGE_MUX: &[MethodInfo] = &[
    m(
        "host",
        Unary,
        &[],
        "Connect the storage to the host (exporter).",
    ),
    m(
        "dut",
        Unary,
        &[],
        "Connect the storage to the device under test.",
    ),
    m("off", Unary, &[], "Disconnect the storage."),
    m(
        "write",
        Resource,
        &[("src", "resource handle")],
        "Write an image to the storage (j storage flash PATH).",
    ),
    m(
        "read",
        Resource,
        &[("dst", "resource handle")],
        "Read the storage back (j storage dump PATH).",
    ),
    m(
        "hash",
        Unary,
        &[
            ("algo", "\"sha256\" (default) or \"md5\", optional"),
            ("length", "integer byte count, optional"),
        ],
        "Hex digest of the first `length` bytes of the medium (all of it when absent).",
    ),
];

const OPENDAL: &[MethodInfo] = &[
    m("stat", Unary, &[("path", "string")], "Metadata of a path."),
    m(
        "hash",
        Unary,
        &[
            ("path", "string"),
            ("algo", "\"sha256\" or \"md5\", optional"),
        ],
        "Hex digest of a file.",
    ),
    m(
        "exists",
        Unary,
        &[("path", "string")],
        "Whether a path exists.",
    ),
    m(
        "list",
        Streaming,
        &[("path", "string")],
        "Entries directly under a directory.",
    ),
    m(
        "scan",
        Streaming,
        &[("path", "string")],
        "Every entry under a directory, recursively.",
    ),
    m(
        "copy",
        Unary,
        &[("source", "string"), ("target", "string")],
        "Copy a file.",
    ),
    m(
        "rename",
        Unary,
        &[("source", "string"), ("target", "string")],
        "Rename a file.",
    ),
    m("delete", Unary, &[("path", "string")], "Delete a file."),
    m(
        "remove_all",
        Unary,
        &[("path", "string")],
        "Delete a directory recursively.",
    ),
    m(
        "create_dir",
        Unary,
        &[("path", "string")],
        "Create a directory.",
    ),
    m(
        "capability",
        Unary,
        &[],
        "What the storage service supports.",
    ),
    m(
        "write_from_path",
        Resource,
        &[("dst", "string"), ("src", "local path")],
        "Upload a local file (j storage write-from-path).",
    ),
    m(
        "read_into_path",
        Resource,
        &[("src", "string"), ("dst", "local path")],
        "Download a file (j storage read-into-path).",
    ),
];

/// The methods of a client class, if we know the class.
pub fn known_methods(client_class: &str) -> Option<&'static [MethodInfo]> {
    match client_class {
        POWER_CLIENT => Some(POWER),
        STORAGE_MUX_CLIENT | STORAGE_MUX_FLASHER_CLIENT => Some(STORAGE_MUX),
        OPENDAL_CLIENT => Some(OPENDAL),
        COMPOSITE_CLIENT => Some(&[]),
        _ => None,
    }
}

/// The method `name` of `client_class`, if known.
pub fn method_info(client_class: &str, name: &str) -> Option<&'static MethodInfo> {
    known_methods(client_class)?.iter().find(|m| m.name == name)
}

/// Every driver of the tree, parents first: path, client class, description, methods.
pub fn drivers(session: &ExporterSession) -> Vec<Value> {
    fn walk(node: &ClientNode, out: &mut Vec<Value>) {
        let class = node.client_class();
        out.push(json!({
            "path": node.path,
            "client_class": class,
            "description": node.description,
            "methods": known_methods(class).map(|ms| ms.iter().map(|m| m.name).collect::<Vec<_>>()),
            "children": node.children.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        }));
        for (_, child) in &node.children {
            walk(child, out);
        }
    }
    let mut out = Vec::new();
    walk(session.root().node(), &mut out);
    out
}

/// The methods of the driver at `path` (dotted parts; empty for the root), with call
/// examples for `jmp_call` and the driver's `j` commands.
pub async fn driver_methods(
    session: &ExporterSession,
    connection_id: &str,
    path: &[String],
    commands: &jumpstarter_drivers::CommandTable,
) -> Result<Value, String> {
    let dotted = path.join(".");
    let driver = session
        .driver(&dotted)
        .map_err(|e| jumpstarter_core::error_chain(&e))?;
    let node = driver.node();
    let class = node.client_class();
    let methods = known_methods(class).map(|ms| {
        ms.iter()
            .map(|m| {
                let call = if dotted.is_empty() {
                    m.name.to_string()
                } else {
                    format!("{dotted}.{}", m.name)
                };
                let example = match m.style {
                    CallStyle::Resource => Value::Null,
                    _ => json!({
                        "tool": "jmp_call",
                        "arguments": {
                            "connection_id": connection_id,
                            "method": call,
                            "args": m.params.iter().map(|(n, _)| format!("<{n}>")).collect::<Vec<_>>(),
                        }
                    }),
                };
                json!({
                    "name": m.name,
                    "call": m.style.as_str(),
                    "params": m.params.iter().map(|(n, t)| json!({"name": n, "type": t})).collect::<Vec<_>>(),
                    "doc": m.doc,
                    "example": example,
                })
            })
            .collect::<Vec<_>>()
    });
    let j = jumpstarter_drivers::j_command_with(session, commands).await;
    let cli = find_command(&j, path).ok().map(command_tree);
    let mut out = json!({
        "path": dotted,
        "client_class": class,
        "description": node.description,
        "methods": methods,
        "children": node.children.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        "cli": cli,
    });
    if methods_unknown(class)
        && let Some(o) = out.as_object_mut()
    {
        o.insert(
            "note".into(),
            json!(format!(
                "the methods of {class} are not known here; call them by name with jmp_call \
                 (e.g. method \"{}\") or use its j commands",
                if dotted.is_empty() {
                    "METHOD".to_string()
                } else {
                    format!("{dotted}.METHOD")
                }
            )),
        );
    }
    Ok(out)
}

fn methods_unknown(class: &str) -> bool {
    known_methods(class).is_none()
}

/// The subcommand at `path` (a leading `j` is allowed), or an error naming what exists.
pub fn find_command<'a>(root: &'a Command, path: &[String]) -> Result<&'a Command, String> {
    let mut cmd = root;
    let parts = match path.split_first() {
        Some((first, rest)) if first == "j" => rest,
        _ => path,
    };
    for part in parts {
        cmd = cmd.find_subcommand(part).ok_or_else(|| {
            let names: Vec<&str> = cmd.get_subcommands().map(Command::get_name).collect();
            format!(
                "command {part:?} not found under {:?} (available: {})",
                cmd.get_name(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )
        })?;
    }
    Ok(cmd)
}

/// A command and its subcommands: names, help, parameters.
pub fn command_tree(cmd: &Command) -> Value {
    let params: Vec<Value> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .map(arg_json)
        .collect();
    let commands: Vec<Value> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(command_tree)
        .collect();
    json!({
        "name": cmd.get_name(),
        "help": cmd.get_about().map(ToString::to_string),
        "params": params,
        "commands": commands,
    })
}

fn arg_json(a: &Arg) -> Value {
    let mut flags = Vec::new();
    if let Some(l) = a.get_long() {
        flags.push(format!("--{l}"));
    }
    if let Some(s) = a.get_short() {
        flags.push(format!("-{s}"));
    }
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    json!({
        "name": a.get_id().as_str(),
        "kind": if a.is_positional() { "argument" } else { "option" },
        "flags": flags,
        "help": a.get_help().map(ToString::to_string),
        "required": a.is_required_set(),
        "takes_value": a.get_action().takes_values(),
        "default": defaults,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stock_classes_have_methods() {
        let power = known_methods(POWER_CLIENT).unwrap();
        assert!(power.iter().any(|m| m.name == "on" && m.style == Unary));
        assert_eq!(method_info(POWER_CLIENT, "read").unwrap().style, Streaming);
        assert!(method_info(POWER_CLIENT, "nope").is_none());
        assert!(known_methods("some.other.Client").is_none());
        assert_eq!(known_methods(COMPOSITE_CLIENT).unwrap().len(), 0);
    }

    #[test]
    fn command_paths_are_found_or_explained() {
        let root = Command::new("j").subcommand(
            Command::new("power")
                .about("Power")
                .subcommand(Command::new("on").about("Power on"))
                .subcommand(
                    Command::new("cycle").arg(Arg::new("wait").long("wait").default_value("2")),
                ),
        );
        let on = find_command(&root, &["j".into(), "power".into(), "on".into()]).unwrap();
        assert_eq!(on.get_name(), "on");
        let err = find_command(&root, &["power".into(), "of".into()]).unwrap_err();
        assert!(err.contains("\"of\"") && err.contains("on, cycle"), "{err}");
        let tree = command_tree(&root);
        assert_eq!(tree["commands"][0]["name"], "power");
        let wait = &tree["commands"][0]["commands"][1]["params"][0];
        assert_eq!(wait["flags"][0], "--wait");
        assert_eq!(wait["default"][0], "2");
    }
}
