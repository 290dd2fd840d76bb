//! The `j` command: built at run time from the exporter's driver tree.
//!
//! Each driver client class may bring a [`DriverCommand`]; composites become groups of their
//! children, and drivers whose class we do not know get generic `call` / `stream-call`
//! commands taking JSON arguments.

use std::{collections::HashMap, sync::Arc};

use clap::{Arg, ArgAction, ArgMatches, Command};
use futures::StreamExt;
use jumpstarter_core::{
    ClientError,
    client::{DriverClient, ExporterSession},
    value,
};

use crate::{
    composite::COMPOSITE_CLIENT, http_server, network, power, qemu, serial, shell, snmp, storage,
    tftp,
};

use crate::command::{CliFuture, CommandTable};

/// The `j` commands of the stock drivers' client classes.
pub fn stock_commands() -> CommandTable {
    let mut t = CommandTable::new();
    t.insert(power::POWER_CLIENT, power::cli())
        .insert(snmp::SNMP_CLIENT, power::cli())
        .insert(storage::STORAGE_MUX_CLIENT, storage::mux_cli())
        .insert(storage::STORAGE_MUX_FLASHER_CLIENT, storage::mux_cli())
        .insert(storage::OPENDAL_CLIENT, storage::opendal_cli())
        .insert(storage::FLASHER_CLIENT, storage::flasher_cli())
        .insert(network::NETWORK_CLIENT, network::cli())
        .insert(serial::PYSERIAL_CLIENT, serial::cli())
        .insert(qemu::QEMU_CLIENT, qemu::cli())
        .insert(qemu::QEMU_FLASHER_CLIENT, qemu::flasher_cli())
        .insert(shell::SHELL_CLIENT, shell::cli())
        .insert(http_server::HTTP_SERVER_CLIENT, http_server::cli())
        .insert(tftp::TFTP_CLIENT, tftp::cli());
    t
}

/// The method names of each Shell in a driver tree, by node uuid, as its `get_methods` lists
/// them.
type ShellMethods = HashMap<String, Vec<String>>;

/// Asks every Shell in the tree for its methods, as upstream's client does when it builds its
/// commands: a report describes only the methods configured with a description.
async fn shell_methods(root: DriverClient) -> ShellMethods {
    let mut out = HashMap::new();
    let mut todo = vec![root];
    while let Some(client) = todo.pop() {
        if client.node().client_class() == shell::SHELL_CLIENT {
            // When the exporter cannot list them, the methods its report describes.
            if let Ok(names) = shell::ShellClient(client.clone()).get_methods().await {
                out.insert(client.node().uuid.clone(), names);
            }
        }
        todo.extend(client.children().into_iter().map(|(_, c)| c));
    }
    out
}

fn group(
    name: String,
    client: &DriverClient,
    table: &CommandTable,
    shells: &ShellMethods,
) -> Command {
    let node = client.node();
    let class = node.client_class().to_string();
    let mut cmd = if class == COMPOSITE_CLIENT
        || (!node.children.is_empty() && table.get(&class).is_none())
    {
        let mut cmd = Command::new(name)
            .about("Generic composite device")
            .subcommand_required(true);
        for (child_name, child) in client.children() {
            cmd = cmd.subcommand(group(child_name, &child, table, shells));
        }
        cmd
    } else if let Some(dc) = table.get(&class) {
        // A class with commands of its own may have children too (a board): both.
        let mut cmd = (dc.build)(Command::new(name).about(dc.about));
        // A shell's commands are its configured methods.
        if class == shell::SHELL_CLIENT {
            cmd = shell::add_methods(cmd, node, shells.get(&node.uuid).map(Vec::as_slice));
        }
        let mut cmd = cmd.subcommand(open_stream_command());
        for (child_name, child) in client.children() {
            cmd = cmd.subcommand(group(child_name, &child, table, shells));
        }
        cmd
    } else {
        generic(Command::new(name).about(format!("Driver {class} (generic commands)")))
            .after_help(friendly_commands_hint(&class))
            .subcommand(open_stream_command())
    };
    if let Some(d) = &node.description {
        cmd = cmd.about(d.clone());
    }
    // methods_description is keyed by CLI command name.
    let overrides: Vec<(String, String)> = node
        .methods_description
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (sub, help) in overrides {
        if cmd.find_subcommand(&sub).is_some() {
            cmd = cmd.mut_subcommand(sub, |c| c.about(help));
        }
    }
    cmd
}

/// Where the friendly commands of a client class we have none for live: the upstream
/// package of its module (`jumpstarter_driver_x.client.XClient` → `jumpstarter-driver-x`).
fn friendly_commands_hint(client_class: &str) -> String {
    let module = client_class.split('.').next().unwrap_or(client_class);
    format!(
        "This j has no commands of its own for {client_class}: use call, stream-call and \
         open-stream with the driver's method names. Upstream's j with the package {} \
         installed (pip install {}) has its friendly commands.",
        module.replace('_', "-"),
        module.replace('_', "-")
    )
}

fn generic(cmd: Command) -> Command {
    let args = Arg::new("args")
        .num_args(0..)
        .action(ArgAction::Append)
        .help(
            "Arguments as JSON values (e.g. 1, '\"text\"', '{\"k\": 2}'); bare words are strings",
        );
    cmd.subcommand_required(true)
        .subcommand(
            Command::new("call")
                .about("Call a method and print its result as JSON")
                .arg(Arg::new("method").required(true))
                .arg(args.clone()),
        )
        .subcommand(
            Command::new("stream-call")
                .about("Call a streaming method and print each result as JSON")
                .arg(Arg::new("method").required(true))
                .arg(args),
        )
}

/// `open-stream [METHOD]`: any driver's byte-stream method piped to stdin/stdout.
fn open_stream_command() -> Command {
    Command::new("open-stream")
        .about("Open a byte-stream method and pipe it to stdin/stdout")
        .long_about(
            "Open a byte-stream method (upstream @exportstream) and pipe it: its \
                     bytes to stdout, stdin's to it (when stdin is not a terminal, or with \
                     --input). Ends when the stream ends.",
        )
        .arg(Arg::new("method").default_value("connect"))
        .arg(
            Arg::new("input")
                .short('i')
                .long("input")
                .action(ArgAction::SetTrue)
                .help("Send stdin even when it is a terminal"),
        )
        .arg(
            Arg::new("no-input")
                .long("no-input")
                .action(ArgAction::SetTrue)
                .conflicts_with("input")
                .help("Do not send stdin"),
        )
}

/// The whole `j` command for a session, with the stock drivers' commands.
/// (Asks each Shell for its methods.)
pub async fn j_command(session: &ExporterSession) -> Command {
    j_command_with(session, &stock_commands()).await
}

/// The whole `j` command for a session, with the commands of `table`. (Asks each Shell for
/// its methods.)
pub async fn j_command_with(session: &ExporterSession, table: &CommandTable) -> Command {
    let root = session.root();
    let shells = shell_methods(root.clone()).await;
    let mut cmd = group("j".into(), &root, table, &shells)
        .about(
            root.node()
                .description
                .clone()
                .unwrap_or_else(|| "Generic composite device".into()),
        )
        .arg(
            Arg::new("log-level")
                .long("log-level")
                .global(true)
                .value_parser(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
                .help("Set the log level"),
        );
    cmd = cmd.subcommand_required(true).arg_required_else_help(true);
    cmd
}

/// Runs what the user chose in [`j_command`].
pub fn run(client: DriverClient, matches: ArgMatches) -> CliFuture {
    run_with(client, matches, Arc::new(stock_commands()))
}

/// Runs what the user chose in [`j_command_with`] (`table` as given to it).
pub fn run_with(client: DriverClient, matches: ArgMatches, table: Arc<CommandTable>) -> CliFuture {
    Box::pin(async move {
        let class = client.node().client_class().to_string();
        if let Some(("open-stream", m)) = matches.subcommand() {
            return run_open_stream(client, m).await;
        }
        if let Some(dc) = table.get(&class) {
            if let Some((name, sub)) = matches.subcommand()
                && let Some(child) = client.child(name)
            {
                return run_with(child, sub.clone(), table).await;
            }
            return (dc.run)(client, matches).await;
        }
        let Some((name, sub)) = matches.subcommand() else {
            return Err(ClientError::Value("missing command".into()));
        };
        if let Some(child) = client.child(name) {
            return run_with(child, sub.clone(), table).await;
        }
        run_generic(client, name, sub).await
    })
}

fn parse_args(m: &ArgMatches) -> Vec<value::Value> {
    m.get_many::<String>("args")
        .into_iter()
        .flatten()
        .map(|a| {
            let json =
                serde_json::from_str(a).unwrap_or_else(|_| serde_json::Value::String(a.clone()));
            value::from_json(json)
        })
        .collect()
}

async fn run_open_stream(client: DriverClient, m: &ArgMatches) -> Result<(), ClientError> {
    use std::io::IsTerminal;
    let method = m.get_one::<String>("method").map_or("connect", |s| s);
    let input = !m.get_flag("no-input") && (m.get_flag("input") || !std::io::stdin().is_terminal());
    let stream = client.open_stream(method).await?;
    let mode = serial::client::PipeMode {
        output: None,
        input,
        append: false,
        no_output: false,
        observe: false,
    };
    serial::client::pipe_stream(stream, &mode).await
}

async fn run_generic(client: DriverClient, name: &str, m: &ArgMatches) -> Result<(), ClientError> {
    let method = m.get_one::<String>("method").cloned().unwrap_or_default();
    let args = parse_args(m);
    match name {
        "call" => {
            let v = client.call_raw(&method, args).await?;
            println!("{}", value::to_json(v));
            Ok(())
        }
        "stream-call" => {
            let mut s = client
                .streaming_call::<serde_json::Value>(&method, args)
                .await?;
            while let Some(item) = s.next().await {
                println!("{}", item?);
            }
            Ok(())
        }
        other => Err(ClientError::Value(format!("unknown command {other}"))),
    }
}
