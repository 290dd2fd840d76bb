//! The Python drivers of an exporter: the child started, its subtrees grafted into our tree.

use std::{collections::BTreeMap, sync::Arc};

use jumpstarter_core::{
    DriverNode,
    client::ClientNode,
    driver::{CLIENT_LABEL, ConsoleFanout, NAME_LABEL},
};
use tokio::task::JoinHandle;

use super::{
    host::{self, Host, StartError, State},
    plan::Subtree,
    proxy::PythonDriver,
};

/// A Python subtree grafted into our tree.
pub(crate) struct Grafted {
    /// Its config field.
    pub field: String,
    /// Its nodes.
    pub node: DriverNode,
    /// The descendants the child left to Rust drivers (names from `node`), to build and hang
    /// under their Python parents.
    pub rust_paths: Vec<Vec<String>>,
}

/// The Python drivers of an exporter: keep it while their tree is served. Dropping it kills
/// the child and its process group.
pub struct PythonDrivers {
    host: Option<Arc<Host>>,
    supervisor: Option<JoinHandle<()>>,
}

impl Drop for PythonDrivers {
    fn drop(&mut self) {
        if let Some(s) = self.supervisor.take() {
            s.abort();
        }
        if let Some(h) = &self.host {
            h.set(State::Down("the exporter is stopping".into()));
        }
    }
}

impl PythonDrivers {
    /// No Python drivers.
    pub fn none() -> Self {
        Self {
            host: None,
            supervisor: None,
        }
    }

    /// Checks that a Python interpreter can import the types of `subtrees` (nothing is built).
    pub(crate) async fn check(subtrees: Vec<Subtree>) -> Result<(), StartError> {
        Host::new(subtrees)?.check().await
    }

    /// Starts the child for `subtrees`; returns the grafted nodes by config field, each with
    /// the paths (from it) of the descendants the child left to Rust drivers.
    pub(crate) async fn start(subtrees: Vec<Subtree>) -> Result<(Self, Vec<Grafted>), StartError> {
        let host = Arc::new(Host::new(subtrees)?);
        let (running, conn) = host.spawn(0).await?;
        let root = conn.session.root();
        let mut nodes = Vec::new();
        for (i, st) in host.subtrees().iter().enumerate() {
            let child = root
                .child(&st.key)
                .ok_or_else(|| host.child_error(format!("reported no driver for {}", st.field)))?;
            let mut uuids = BTreeMap::new();
            collect_uuids(child.node(), "", &mut uuids);
            host.set_uuids(i, uuids);
            nodes.push(Grafted {
                field: st.field.clone(),
                node: graft(&host, child.node(), &st.type_name),
                rust_paths: host.rust_paths(i),
            });
        }
        host.set(State::Up(conn));
        let supervisor = tokio::spawn(host::supervise(host.clone(), running));
        Ok((
            Self {
                host: Some(host),
                supervisor: Some(supervisor),
            },
            nodes,
        ))
    }
}

fn collect_uuids(node: &ClientNode, path: &str, out: &mut BTreeMap<String, String>) {
    out.insert(path.to_string(), node.uuid.clone());
    for (name, c) in &node.children {
        let p = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        collect_uuids(c, &p, out);
    }
}

/// Our node for a reported Python node (and its children): same uuid, labels, client class
/// and descriptions; calls go to the child.
fn graft(host: &Arc<Host>, node: &ClientNode, type_name: &str) -> DriverNode {
    let mut labels = node.labels.clone();
    let client_class = labels.remove(CLIENT_LABEL).unwrap_or_default();
    labels.remove(NAME_LABEL);
    let console = super::proxy::CONSOLE_CLIENTS
        .contains(&client_class.as_str())
        .then(ConsoleFanout::default);
    let driver = Arc::new(PythonDriver {
        host: host.clone(),
        uuid: node.uuid.clone(),
        path: node.path.clone(),
        client_class,
        labels,
        type_name: type_name.to_string(),
        console,
    });
    let uuid = uuid::Uuid::parse_str(&node.uuid).unwrap_or_else(|_| uuid::Uuid::new_v4());
    DriverNode {
        uuid,
        driver,
        labels: BTreeMap::new(),
        description: node.description.clone(),
        methods_description: node.methods_description.clone(),
        children: node
            .children
            .iter()
            .map(|(name, c)| (name.clone(), graft(host, c, type_name)))
            .collect(),
    }
}
