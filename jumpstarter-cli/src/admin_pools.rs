//! `jmp admin apply -f FILE` (objects of any of our kinds from upstream-format YAML/JSON, as
//! `kubectl apply`), and the virtual target pools: `jmp admin get|describe|delete exporterset`
//! and `virtualtargetclass`.

use std::{io::Read, path::PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use jiff::Timestamp;
use jumpstarter_proto::admin_v1::{
    ApplyRequest, ExporterSet, ListRequest, ObjectRef, VirtualTargetClass,
};
use serde::Serialize;
use serde_json::Value;

use crate::{
    admin_api::{AdminApi, AdminConnect, KubeFlags},
    output::{OutputMode, Table, format_age, print_structured, timestamp},
    resources::rpc_error,
};

const OUTPUT_HELP: &str = "Output mode. Use \"-o name\" for shorter output (resource/name).";
/// The group of the virtual target kinds.
const POOL_GROUP: &str = "virtualtarget.jumpstarter.dev";

/// `jmp admin apply`.
#[derive(Args, Debug)]
#[command(after_help = "\
Each document is one object of upstream's format (apiVersion, kind, metadata, spec): Client,
Exporter, ExporterAccessPolicy (jumpstarter.dev/v1alpha1), ExporterSet, VirtualTargetClass
(virtualtarget.jumpstarter.dev/v1alpha1). A file may hold several, separated by `---`; a
`kind: List` (kubectl get -o yaml) is applied item by item. Every document is checked before
any is written: one bad document writes nothing. An object that exists is updated to the
document's spec, labels and annotations (no three-way merge); `status` is ignored.

Examples:
  jmp admin apply -f pool.yaml
  cat pool.yaml | jmp admin apply -f -
  jmp admin apply -f class.yaml -f pool.yaml -o name")]
pub struct ApplyArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// The file with the objects (YAML or JSON; `-` reads stdin); may be given several times
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    kube: KubeFlags,
    #[arg(short, long, value_parser = ["json", "yaml", "name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// Where a document came from, for messages.
#[derive(Debug, Clone, PartialEq)]
struct Origin {
    file: String,
    /// 1-based, in its file.
    index: usize,
    /// The line its text starts on.
    line: usize,
}

/// The documents of one file's text, each as JSON, with where it starts; a document that
/// does not parse is an error naming the file, the document and its line.
fn split_documents(file: &str, text: &str) -> Result<Vec<(Origin, String)>> {
    // (first line, text) of each `---`-separated chunk.
    let mut chunks: Vec<(usize, String)> = vec![(1, String::new())];
    for (i, line) in text.lines().enumerate() {
        let marker = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t'));
        if marker {
            chunks.push((i + 2, String::new()));
        } else if let Some((_, body)) = chunks.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    let mut out = Vec::new();
    let mut index = 0;
    for (line, body) in chunks {
        let blank = body
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        if blank {
            continue;
        }
        index += 1;
        let origin = Origin {
            file: file.to_string(),
            index,
            line,
        };
        // Blank lines in front keep the parser's line numbers those of the file.
        let padded = format!("{}{body}", "\n".repeat(line - 1));
        let value: Value = serde_saphyr::from_str(&padded).map_err(|e| {
            anyhow::anyhow!(
                "{file}: document {index} (from line {line}) does not parse: {e}",
                e = yaml_error(&e)
            )
        })?;
        let items = match value.get("kind").and_then(Value::as_str) {
            Some("List") => match value.get("items") {
                Some(Value::Array(items)) => items.clone(),
                _ => bail!("{file}: document {index} (from line {line}): a List without items"),
            },
            _ => vec![value],
        };
        for item in items {
            if !item.is_object() {
                bail!(
                    "{file}: document {index} (from line {line}) is not an object (a mapping \
                     with apiVersion, kind, metadata and spec)"
                );
            }
            out.push((origin.clone(), serde_json::to_string(&item)?));
        }
    }
    if out.is_empty() {
        bail!("{file}: no documents");
    }
    Ok(out)
}

/// A YAML parse error on one line: where and what (the parser's first line; the rest is a
/// picture of the text).
fn yaml_error<E: std::error::Error + 'static>(e: &E) -> String {
    let text = jumpstarter_core::error_chain(e);
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

fn read_file(path: &PathBuf) -> Result<(String, String)> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read stdin")?;
        return Ok(("stdin".into(), text));
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok((path.display().to_string(), text))
}

/// `<kind>.<group>/<name>`, as kubectl names an object.
fn resource_name(api_version: &str, kind: &str, name: &str) -> String {
    let group = api_version.split('/').next().unwrap_or_default();
    format!("{}.{group}/{name}", kind.to_lowercase())
}

/// What `jmp admin apply -o json|yaml` prints for one object.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AppliedView {
    api_version: String,
    kind: String,
    namespace: String,
    name: String,
    action: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    note: String,
}

/// `jmp admin apply -f FILE...`.
pub async fn apply(a: ApplyArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    if a.files.iter().filter(|f| f.as_os_str() == "-").count() > 1 {
        bail!("-f - (stdin) can be given once");
    }
    let mut origins = Vec::new();
    let mut documents = Vec::new();
    for path in &a.files {
        let (name, text) = read_file(path)?;
        for (origin, doc) in split_documents(&name, &text)? {
            origins.push(origin);
            documents.push(doc);
        }
    }
    let namespace = a.kube.namespace()?;
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let resp = api
        .rpc
        .apply(ApplyRequest {
            documents,
            namespace,
        })
        .await
        .map_err(|s| {
            // The controller names documents by their place in the request: say which file
            // and line that is.
            let origin = s
                .message()
                .strip_prefix("document ")
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<usize>().ok())
                .and_then(|n| origins.get(n.checked_sub(1)?));
            let what = match origin {
                Some(o) => format!(
                    "cannot apply (document {} of {}, from line {})",
                    o.index, o.file, o.line
                ),
                None => "cannot apply".to_string(),
            };
            rpc_error(&what, s)
        })?
        .into_inner();
    let views: Vec<AppliedView> = resp
        .results
        .into_iter()
        .map(|r| AppliedView {
            api_version: r.api_version,
            kind: r.kind,
            namespace: r.namespace,
            name: r.name,
            action: r.action,
            note: r.note,
        })
        .collect();
    match mode {
        OutputMode::Json | OutputMode::Yaml => {
            #[derive(Serialize)]
            struct Items {
                items: Vec<AppliedView>,
            }
            print_structured(mode, &Items { items: views })?;
        }
        _ => {
            for v in &views {
                let id = resource_name(&v.api_version, &v.kind, &v.name);
                if mode == OutputMode::Name {
                    println!("{id}");
                } else {
                    println!("{id} {}", v.action);
                }
                if !v.note.is_empty() {
                    eprintln!("{id}: {}", v.note);
                }
            }
        }
    }
    Ok(0)
}

/// `jmp admin get exportersets|virtualtargetclasses [NAME]`.
#[derive(Args, Debug)]
pub struct PoolGetArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// Name of one object (default: all)
    name: Option<String>,
    #[command(flatten)]
    kube: KubeFlags,
    /// Label selector to filter on
    #[arg(short = 'l', long = "selector", value_name = "TEXT")]
    selector: Option<String>,
    #[arg(short, long, value_parser = ["json", "yaml", "name"], help = OUTPUT_HELP)]
    output: Option<String>,
}

/// `jmp admin describe`.
#[derive(Subcommand, Debug)]
pub enum AdminDescribe {
    /// Describe an ExporterSet: its spec, status counts, conditions and the controller's
    /// recent scaling decisions
    #[command(
        name = "exporterset",
        alias = "exportersets",
        alias = "es",
        alias = "exporterset.virtualtarget.jumpstarter.dev"
    )]
    ExporterSet(PoolNameArgs),
    /// Describe a VirtualTargetClass
    #[command(
        name = "virtualtargetclass",
        alias = "virtualtargetclasses",
        alias = "vtc",
        alias = "virtualtargetclass.virtualtarget.jumpstarter.dev"
    )]
    VirtualTargetClass(PoolNameArgs),
}

/// `jmp admin describe|delete exporterset|virtualtargetclass NAME`.
#[derive(Args, Debug)]
pub struct PoolNameArgs {
    #[command(flatten)]
    connect: AdminConnect,
    /// Name of the object
    name: String,
    #[command(flatten)]
    kube: KubeFlags,
    #[arg(short, long, value_parser = ["name"], help = OUTPUT_HELP)]
    output: Option<String>,
    /// Disable interactive prompts (for use in scripts); nothing here prompts.
    #[arg(long)]
    nointeractive: bool,
}

fn object_ref(kube: &KubeFlags, name: &str) -> Result<ObjectRef> {
    Ok(ObjectRef {
        namespace: kube.namespace()?,
        name: name.to_string(),
    })
}

fn list_request(a: &PoolGetArgs) -> Result<ListRequest> {
    Ok(ListRequest {
        namespace: a.kube.namespace()?,
        selector: a.selector.clone().unwrap_or_default(),
    })
}

/// The objects' upstream JSON, printed as `kubectl get -o json|yaml` does: one object, or a
/// `List` of them.
fn print_objects(mode: OutputMode, objects: &[&str], one: bool) -> Result<()> {
    let values: Vec<Value> = objects
        .iter()
        .map(|o| serde_json::from_str(o).context("the controller sent an unreadable object"))
        .collect::<Result<_>>()?;
    match values.as_slice() {
        [v] if one => print_structured(mode, v),
        _ => print_structured(
            mode,
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": values}),
        ),
    }
}

fn age(t: &Option<prost_types::Timestamp>, now: Timestamp) -> String {
    t.as_ref()
        .and_then(timestamp)
        .map(|t| format_age(now.as_second() - t.as_second()))
        .unwrap_or_default()
}

/// `maxReplicas` as shown: 0 is no bound.
fn max_text(max: i32) -> String {
    if max == 0 {
        "none".into()
    } else {
        max.to_string()
    }
}

/// `jmp admin get exportersets`.
pub async fn get_exporter_sets(a: PoolGetArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let sets: Vec<ExporterSet> = match &a.name {
        Some(name) => vec![
            api.rpc
                .get_exporter_set(object_ref(&a.kube, name)?)
                .await
                .map_err(|s| rpc_error(&format!("cannot get exporterset {name:?}"), s))?
                .into_inner(),
        ],
        None => {
            api.rpc
                .list_exporter_sets(list_request(&a)?)
                .await
                .map_err(|s| rpc_error("cannot list exportersets", s))?
                .into_inner()
                .exporter_sets
        }
    };
    match mode {
        OutputMode::Json | OutputMode::Yaml => {
            let objects: Vec<&str> = sets.iter().map(|s| s.object_json.as_str()).collect();
            print_objects(mode, &objects, a.name.is_some())?;
        }
        OutputMode::Name => {
            for s in &sets {
                println!("exporterset.{POOL_GROUP}/{}", s.name);
            }
        }
        _ => print!("{}", exporter_sets_table(&sets).render(0)),
    }
    Ok(0)
}

fn exporter_sets_table(sets: &[ExporterSet]) -> Table {
    let mut t = Table::new([
        "NAME",
        "CLASS",
        "REPLICAS",
        "READY",
        "AVAILABLE",
        "LEASED",
        "MIN",
        "MAX",
    ]);
    for s in sets {
        t.row([
            s.name.clone(),
            s.virtual_target_class_name.clone(),
            s.replicas.to_string(),
            s.ready_replicas.to_string(),
            s.available_replicas.to_string(),
            s.leased_replicas.to_string(),
            s.min_replicas.to_string(),
            max_text(s.max_replicas),
        ]);
    }
    t
}

/// `jmp admin get virtualtargetclasses`.
pub async fn get_classes(a: PoolGetArgs) -> Result<i32> {
    let mode = OutputMode::from_flag(a.output.as_deref())?;
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let classes: Vec<VirtualTargetClass> = match &a.name {
        Some(name) => vec![
            api.rpc
                .get_virtual_target_class(object_ref(&a.kube, name)?)
                .await
                .map_err(|s| rpc_error(&format!("cannot get virtualtargetclass {name:?}"), s))?
                .into_inner(),
        ],
        None => {
            api.rpc
                .list_virtual_target_classes(list_request(&a)?)
                .await
                .map_err(|s| rpc_error("cannot list virtualtargetclasses", s))?
                .into_inner()
                .classes
        }
    };
    match mode {
        OutputMode::Json | OutputMode::Yaml => {
            let objects: Vec<&str> = classes.iter().map(|c| c.object_json.as_str()).collect();
            print_objects(mode, &objects, a.name.is_some())?;
        }
        OutputMode::Name => {
            for c in &classes {
                println!("virtualtargetclass.{POOL_GROUP}/{}", c.name);
            }
        }
        _ => {
            let now = Timestamp::now();
            let mut t = Table::new(["NAME", "PROVISIONER", "BINDING", "RECLAIM", "AGE"]);
            for c in &classes {
                t.row([
                    c.name.clone(),
                    c.provisioner.clone(),
                    c.binding_mode.clone(),
                    c.reclaim_policy.clone(),
                    age(&c.created, now),
                ]);
            }
            print!("{}", t.render(0));
        }
    }
    Ok(0)
}

/// `jmp admin describe exporterset|virtualtargetclass NAME`.
pub async fn describe(cmd: AdminDescribe) -> Result<i32> {
    match cmd {
        AdminDescribe::ExporterSet(a) => describe_exporter_set(a).await,
        AdminDescribe::VirtualTargetClass(a) => describe_class(a).await,
    }
}

fn time_text(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref()
        .and_then(timestamp)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// The describe text of an ExporterSet (and its class, when it could be read).
fn exporter_set_text(s: &ExporterSet, class: Option<&VirtualTargetClass>) -> String {
    let object: Value = serde_json::from_str(&s.object_json).unwrap_or_default();
    let mut out = String::new();
    let mut field = |k: &str, v: String| out.push_str(&format!("{:<14}{v}\n", format!("{k}:")));
    field("Name", s.name.clone());
    field("Namespace", s.namespace.clone());
    field(
        "Class",
        match class {
            Some(c) => format!(
                "{} (provisioner {})",
                s.virtual_target_class_name, c.provisioner
            ),
            None => format!("{} (not found)", s.virtual_target_class_name),
        },
    );
    field("Selector", s.selector.clone());
    field(
        "Replicas",
        format!(
            "min {}, max {}, min available {}",
            s.min_replicas,
            max_text(s.max_replicas),
            s.min_available_replicas
        ),
    );
    field(
        "Scale down",
        format!("after {} idle", s.scale_down_cooldown),
    );
    field("Recycle", s.recycle_strategy.clone());
    let labels = object
        .pointer("/spec/template/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    field("Labels", labels);
    let drivers: Vec<String> = object
        .pointer("/spec/template/spec/drivers")
        .and_then(Value::as_array)
        .map(|ds| {
            ds.iter()
                .map(|d| {
                    let name = d["name"].as_str().unwrap_or_default();
                    match (d["type"].as_str(), d["ref"].as_str()) {
                        (Some(t), _) => format!("{name} ({t})"),
                        (None, Some(r)) => format!("{name} (ref {r})"),
                        _ => name.to_string(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    field(
        "Drivers",
        if drivers.is_empty() {
            "<none>".into()
        } else {
            drivers.join(", ")
        },
    );
    field(
        "Status",
        format!(
            "{} replicas: {} ready, {} available, {} unavailable, {} leased",
            s.replicas,
            s.ready_replicas,
            s.available_replicas,
            s.unavailable_replicas,
            s.leased_replicas
        ),
    );
    field("Created", time_text(&s.created));
    out.push_str("Conditions:\n");
    if s.conditions.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"]);
        for c in &s.conditions {
            t.row([
                c.r#type.clone(),
                c.status.clone(),
                c.reason.clone(),
                time_text(&c.last_transition_time),
                c.message.clone(),
            ]);
        }
        out.push_str(&t.render(2));
    }
    out.push_str("Recent scaling decisions:\n");
    if s.decisions.is_empty() {
        out.push_str("  <none> (the controller keeps the last ones in memory)\n");
    } else {
        let mut t = Table::new(["TIME", "ACTION", "REPLICA", "REASON"]);
        for d in &s.decisions {
            t.row([
                time_text(&d.time),
                d.action.clone(),
                d.replica.clone(),
                d.reason.clone(),
            ]);
        }
        out.push_str(&t.render(2));
    }
    out
}

async fn describe_exporter_set(a: PoolNameArgs) -> Result<i32> {
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let r = object_ref(&a.kube, &a.name)?;
    let set = api
        .rpc
        .get_exporter_set(r.clone())
        .await
        .map_err(|s| rpc_error(&format!("cannot describe exporterset {:?}", a.name), s))?
        .into_inner();
    if a.output.as_deref() == Some("name") {
        println!("exporterset.{POOL_GROUP}/{}", set.name);
        return Ok(0);
    }
    // The class only adds its provisioner: a missing one is shown as such.
    let class = api
        .rpc
        .get_virtual_target_class(ObjectRef {
            namespace: set.namespace.clone(),
            name: set.virtual_target_class_name.clone(),
        })
        .await
        .ok()
        .map(|r| r.into_inner());
    print!("{}", exporter_set_text(&set, class.as_ref()));
    Ok(0)
}

async fn describe_class(a: PoolNameArgs) -> Result<i32> {
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let c = api
        .rpc
        .get_virtual_target_class(object_ref(&a.kube, &a.name)?)
        .await
        .map_err(|s| {
            rpc_error(
                &format!("cannot describe virtualtargetclass {:?}", a.name),
                s,
            )
        })?
        .into_inner();
    if a.output.as_deref() == Some("name") {
        println!("virtualtargetclass.{POOL_GROUP}/{}", c.name);
        return Ok(0);
    }
    let object: Value = serde_json::from_str(&c.object_json).unwrap_or_default();
    let parameters = object
        .pointer("/spec/parameters")
        .map(|p| serde_json::to_string(p).unwrap_or_default())
        .unwrap_or_else(|| "<none>".into());
    println!("Name:         {}", c.name);
    println!("Namespace:    {}", c.namespace);
    println!("Provisioner:  {}", c.provisioner);
    println!("Binding:      {}", c.binding_mode);
    println!("Reclaim:      {}", c.reclaim_policy);
    println!("Parameters:   {parameters}");
    println!("Created:      {}", time_text(&c.created));
    Ok(0)
}

/// `jmp admin delete exporterset|virtualtargetclass NAME`.
pub async fn delete(a: PoolNameArgs, set: bool) -> Result<i32> {
    let mut api = AdminApi::connect(&a.connect, false).await?;
    let r = object_ref(&a.kube, &a.name)?;
    let kind = if set {
        "exporterset"
    } else {
        "virtualtargetclass"
    };
    let failed = |s| rpc_error(&format!("cannot delete {kind} {:?}", a.name), s);
    if set {
        api.rpc.delete_exporter_set(r).await.map_err(failed)?;
    } else {
        api.rpc
            .delete_virtual_target_class(r)
            .await
            .map_err(failed)?;
    }
    match a.output.as_deref() {
        Some("name") => println!("{kind}.{POOL_GROUP}/{}", a.name),
        _ => println!("{kind}.{POOL_GROUP} \"{}\" deleted", a.name),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_split_into_documents_with_their_lines() {
        let text = "\
# a class and a pool
---
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: VirtualTargetClass
metadata: {name: local}
spec: {provisioner: local}
--- # the pool
apiVersion: virtualtarget.jumpstarter.dev/v1alpha1
kind: ExporterSet
metadata: {name: p}
---
";
        let docs = split_documents("pool.yaml", text).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!((docs[0].0.index, docs[0].0.line), (1, 3));
        assert_eq!((docs[1].0.index, docs[1].0.line), (2, 8));
        let v: Value = serde_json::from_str(&docs[1].1).unwrap();
        assert_eq!(v["kind"], "ExporterSet");
        // JSON is YAML.
        let docs =
            split_documents("x.json", r#"{"kind": "Client", "metadata": {"name": "a"}}"#).unwrap();
        assert_eq!(docs.len(), 1);
        // A List is applied item by item.
        let list = "kind: List\napiVersion: v1\nitems:\n- {kind: Client}\n- {kind: Exporter}\n";
        assert_eq!(split_documents("l.yaml", list).unwrap().len(), 2);
    }

    #[test]
    fn a_document_that_does_not_parse_is_named_with_its_line() {
        let text = "kind: Client\n---\nkind: Exporter\nmetadata:\n  name: [unclosed\n";
        let e = split_documents("bad.yaml", text).unwrap_err().to_string();
        assert!(
            e.starts_with("bad.yaml: document 2 (from line 3) does not parse"),
            "{e}"
        );
        assert!(e.contains("line 5") || e.contains("line 6"), "{e}");
        for (text, want) in [
            ("# nothing\n---\n", "bad.yaml: no documents"),
            ("- a\n- b\n", "document 1 (from line 1) is not an object"),
            ("kind: List\n", "a List without items"),
        ] {
            let e = split_documents("bad.yaml", text).unwrap_err().to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    #[test]
    fn objects_are_named_as_kubectl_names_them() {
        assert_eq!(
            resource_name("virtualtarget.jumpstarter.dev/v1alpha1", "ExporterSet", "p"),
            "exporterset.virtualtarget.jumpstarter.dev/p"
        );
        assert_eq!(
            resource_name("jumpstarter.dev/v1alpha1", "Client", "ci"),
            "client.jumpstarter.dev/ci"
        );
    }

    #[test]
    fn describe_shows_spec_status_conditions_and_decisions() {
        let set = ExporterSet {
            namespace: "default".into(),
            name: "mock-pool".into(),
            virtual_target_class_name: "local".into(),
            max_replicas: 3,
            min_available_replicas: 1,
            scale_down_cooldown: "10s".into(),
            recycle_strategy: "ExitAndReplace".into(),
            selector: "pool=mock".into(),
            replicas: 2,
            ready_replicas: 2,
            available_replicas: 1,
            leased_replicas: 1,
            conditions: vec![jumpstarter_proto::admin_v1::Condition {
                r#type: "Ready".into(),
                status: "True".into(),
                reason: "WarmPoolReady".into(),
                message: "1 available".into(),
                last_transition_time: Some(prost_types::Timestamp {
                    seconds: 0,
                    nanos: 0,
                }),
            }],
            decisions: vec![jumpstarter_proto::admin_v1::ScalingDecision {
                time: Some(prost_types::Timestamp {
                    seconds: 60,
                    nanos: 0,
                }),
                action: "ScaleUp".into(),
                replica: "mock-pool-1".into(),
                reason: "1 lease waiting".into(),
            }],
            object_json: r#"{"spec":{"template":{"metadata":{"labels":{"pool":"mock"}},
                "spec":{"drivers":[{"name":"power","type":"MockPower"}]}}}}"#
                .into(),
            ..Default::default()
        };
        let text = exporter_set_text(&set, None);
        for want in [
            "Name:         mock-pool\n",
            "Class:        local (not found)\n",
            "Replicas:     min 0, max 3, min available 1\n",
            "Scale down:   after 10s idle\n",
            "Labels:       pool=mock\n",
            "Drivers:      power (MockPower)\n",
            "Status:       2 replicas: 2 ready, 1 available, 0 unavailable, 1 leased\n",
            "  Ready  True    WarmPoolReady  1970-01-01T00:00:00Z  1 available\n",
            "  1970-01-01T00:01:00Z  ScaleUp  mock-pool-1  1 lease waiting\n",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
    }
}
