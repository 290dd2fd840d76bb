//! An in-memory stand-in for the Kubernetes API server, for tests and local development only
//! (nothing persists, nothing is authenticated).
//!
//! [`FakeApiServer`] is a `tower::Service` that `kube::Client::new` accepts, so a
//! [`crate::store::KubeStore`] over [`FakeApiServer::client`] runs the same code paths as against a
//! cluster. It serves any namespaced resource under `/api/v1/...` and `/apis/<group>/<version>/...`
//! (the four jumpstarter kinds, Secrets, test kinds) with the API server's semantics:
//!
//! - create (POST; `generateName`; uid, creationTimestamp, generation and resourceVersion set;
//!   `status` dropped for custom resources, which all have a status subresource), get, list
//!   (label selectors, `limit`/`continue` in (namespace, name) order), replace (PUT, 409 on a
//!   stale resourceVersion, status kept, generation bumped on spec changes, no-op writes not
//!   stored), replace of the `status` subresource, delete (resourceVersion/uid
//!   preconditions; answers `Status{Success}`, as a real server does for custom resources and
//!   Secrets, while the watch's `DELETED` event carries the last state);
//! - watch (`watch=true`, from a resourceVersion, with `labelSelector` and `timeoutSeconds`):
//!   the last [`HISTORY`] events per resource are kept; an older resourceVersion gets
//!   `410 Gone`, and a watcher that falls [`WATCH_BUFFER`] events behind has its
//!   connection closed, as the real server does;
//! - errors are `Status` objects with the real codes and reasons (404 NotFound, 409
//!   AlreadyExists / Conflict, 422 Invalid, 400 BadRequest, 410 Expired).
//!
//! One deliberate difference: every resourceVersion, `"0"` included, is an exact revision
//! (a real server reads `"0"` as "any"; it never hands out `"0"`, while this one does before
//! the first write).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::objects::selector::{LabelSelector, validate_dns1123_subdomain};
use crate::store::WATCH_BUFFER;
use jumpstarter_core::sync::LockExt;

/// How many events per resource are kept for watches that start in the past.
pub const HISTORY: usize = WATCH_BUFFER;

/// The response body of [`FakeApiServer`].
pub type FakeBody = UnsyncBoxBody<Bytes, Infallible>;

/// The in-memory API server; clones share the same state.
#[derive(Clone, Default)]
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock_or_recover();
        f.debug_struct("FakeApiServer")
            .field("revision", &st.revision)
            .field("requests", &st.requests)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    revision: u64,
    requests: u64,
    resources: HashMap<String, Resource>,
}

/// One resource type (e.g. `jumpstarter.dev/leases`).
struct Resource {
    objects: BTreeMap<(String, String), Value>,
    history: VecDeque<Arc<Event>>,
    /// Every event with a revision above this one is in `history`.
    floor: u64,
    sender: broadcast::Sender<Arc<Event>>,
}

impl Default for Resource {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            floor: 0,
            sender: broadcast::channel(WATCH_BUFFER).0,
        }
    }
}

impl Resource {
    fn publish(&mut self, event: Event) {
        let event = Arc::new(event);
        if self.history.len() == HISTORY
            && let Some(old) = self.history.pop_front()
        {
            self.floor = old.revision;
        }
        self.history.push_back(event.clone());
        // Nobody watching is fine.
        let _ = self.sender.send(event);
    }
}

struct Event {
    kind: &'static str,
    namespace: String,
    revision: u64,
    object: Value,
}

/// The parsed request path.
struct Route {
    /// `v1` or `<group>/<version>`.
    api_version: String,
    group: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Route {
    fn parse(path: &str) -> Option<Self> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segs.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            rest => (None, rest),
        };
        let (plural, name, subresource) = match rest {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(name.to_string()), None),
            [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        Some(Self {
            api_version: if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            },
            group: group.to_string(),
            plural: plural.to_string(),
            namespace,
            name,
            subresource,
        })
    }

    fn key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    /// `leases.jumpstarter.dev` (or `secrets`), as the API server names a resource in messages.
    fn resource_name(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn custom(&self) -> bool {
        !self.group.is_empty()
    }
}

fn full(bytes: Vec<u8>) -> FakeBody {
    Full::new(Bytes::from(bytes)).boxed_unsync()
}

fn json_response(code: StatusCode, body: &Value) -> Response<FakeBody> {
    let mut resp = Response::new(full(body.to_string().into_bytes()));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn failure(code: StatusCode, reason: &str, message: impl Into<String>) -> Response<FakeBody> {
    json_response(code, &status_body(code.as_u16(), reason, &message.into()))
}

fn not_found(route: &Route, name: &str) -> Response<FakeBody> {
    failure(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", route.resource_name()),
    )
}

fn invalid(message: impl Into<String>) -> Response<FakeBody> {
    failure(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
}

fn bad_request(message: impl Into<String>) -> Response<FakeBody> {
    failure(StatusCode::BAD_REQUEST, "BadRequest", message)
}

fn conflict(route: &Route, name: &str, detail: &str) -> Response<FakeBody> {
    failure(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": {detail}",
            route.resource_name()
        ),
    )
}

/// Decodes `a=b&c=d` with `%XX` and `+` escapes.
fn query_pairs(query: &str) -> HashMap<String, String> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex = |b: u8| char::from(b).to_digit(16);
                    match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                        (Some(h), Some(l)) => {
                            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                            i += 2;
                        }
                        _ => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

fn now_rfc3339() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// `generateName` + 5 characters from the API server's alphabet.
fn generated_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let random = uuid::Uuid::new_v4();
    let suffix: String = random.as_bytes()[..5]
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect();
    format!("{prefix}{suffix}")
}

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn set_meta(object: &mut Value, field: &str, value: Value) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if value.is_null() {
            meta.remove(field);
        } else {
            meta.insert(field.to_owned(), value);
        }
    }
}

/// `v` without `metadata` and `status`: what bumps `generation` when it changes.
fn spec_part(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "metadata" && k.as_str() != "status")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// What a real API server finds missing in a core/v1 Event that sets `eventTime` (such events
/// must name the action and who reported it), in its words; `None` when nothing is.
fn event_missing_fields(event: &Value) -> Option<String> {
    let set = |field: &str| {
        event
            .get(field)
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
    };
    if !set("eventTime") {
        return None;
    }
    let missing: Vec<String> = [
        ("reportingComponent", "reportingComponent"),
        ("reportingInstance", "reportingInstance"),
        ("action", "action"),
    ]
    .into_iter()
    .filter(|(field, _)| !set(field))
    .map(|(_, label)| format!("{label}: Required value"))
    .collect();
    (!missing.is_empty()).then(|| format!("[{}]", missing.join(", ")))
}

fn parse_object(body: &[u8]) -> Result<Value, Box<Response<FakeBody>>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) if v.get("metadata").is_some_and(Value::is_object) => Ok(v),
        Ok(_) => Err(Box::new(bad_request("the object has no metadata"))),
        Err(e) => Err(Box::new(bad_request(format!(
            "the body is not a JSON object: {e}",
            e = jumpstarter_core::error_chain(&e)
        )))),
    }
}

impl FakeApiServer {
    /// An empty server.
    pub fn new() -> Self {
        Self::default()
    }

    /// A client talking to this server, with default namespace `default`.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    /// The current revision (the resourceVersion of the latest write).
    pub fn revision(&self) -> u64 {
        self.state.lock_or_recover().revision
    }

    /// How many requests were served.
    pub fn requests(&self) -> u64 {
        self.state.lock_or_recover().requests
    }

    fn handle(&self, method: &Method, path: &str, query: &str, body: &[u8]) -> Response<FakeBody> {
        let Some(route) = Route::parse(path) else {
            return failure(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("the server could not find the requested resource ({path})"),
            );
        };
        let query = query_pairs(query);
        let mut st = self.state.lock_or_recover();
        st.requests += 1;
        match (method, &route.name, route.subresource.as_deref()) {
            (&Method::GET, None, None) => {
                if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
                    self.watch(&mut st, &route, &query)
                } else {
                    Self::list(&mut st, &route, &query)
                }
            }
            (&Method::GET, Some(name), None | Some("status")) => {
                let ns = route.namespace.clone().unwrap_or_default();
                let res = st.resources.entry(route.key()).or_default();
                match res.objects.get(&(ns, name.clone())) {
                    Some(o) => json_response(StatusCode::OK, o),
                    None => not_found(&route, name),
                }
            }
            (&Method::POST, None, None) => Self::create(&mut st, &route, body),
            (&Method::PUT, Some(name), sub @ (None | Some("status"))) => {
                Self::replace(&mut st, &route, name, sub.is_some(), body)
            }
            (&Method::DELETE, Some(name), None) => Self::delete(&mut st, &route, name, body),
            _ => failure(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{method} {path} is not supported by the fake API server"),
            ),
        }
    }

    fn list(st: &mut State, route: &Route, query: &HashMap<String, String>) -> Response<FakeBody> {
        let selector = match LabelSelector::parse(query.get("labelSelector").map_or("", |s| s)) {
            Ok(s) => s,
            Err(e) => {
                return bad_request(format!(
                    "unable to parse requirement: {e}",
                    e = jumpstarter_core::error_chain(&e)
                ));
            }
        };
        let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
            None => usize::MAX,
            Some(Ok(0)) => usize::MAX,
            Some(Ok(n)) => n,
            Some(Err(_)) => return bad_request("limit must be a non-negative integer"),
        };
        let after = match query.get("continue").filter(|c| !c.is_empty()) {
            None => None,
            Some(token) => match token
                .strip_prefix("fake1:")
                .and_then(|rest| rest.split_once('/'))
            {
                Some((ns, name)) if !name.is_empty() => Some((ns.to_owned(), name.to_owned())),
                _ => return bad_request(format!("continue key is not valid: {token}")),
            },
        };
        let revision = st.revision;
        let res = st.resources.entry(route.key()).or_default();
        let mut items = Vec::new();
        let mut last = None;
        let mut token = None;
        for ((ns, name), object) in &res.objects {
            if after
                .as_ref()
                .is_some_and(|(a_ns, a_name)| (ns, name) <= (a_ns, a_name))
            {
                continue;
            }
            if route.namespace.as_ref().is_some_and(|want| want != ns) {
                continue;
            }
            if !selector.matches(&labels_of(object)) {
                continue;
            }
            if items.len() == limit {
                token = last.take();
                break;
            }
            items.push(object.clone());
            last = Some(format!("fake1:{ns}/{name}"));
        }
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if let Some(t) = token {
            metadata["continue"] = Value::String(t);
        }
        json_response(
            StatusCode::OK,
            &json!({
                "apiVersion": route.api_version,
                "kind": "List",
                "metadata": metadata,
                "items": items,
            }),
        )
    }

    fn create(st: &mut State, route: &Route, body: &[u8]) -> Response<FakeBody> {
        let Some(ns) = route.namespace.clone() else {
            return failure(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "only namespaced resources are served",
            );
        };
        let mut object = match parse_object(body) {
            Ok(o) => o,
            Err(resp) => return *resp,
        };
        if meta_str(&object, "namespace").is_some_and(|n| n != ns) {
            return bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            );
        }
        if meta_str(&object, "resourceVersion").is_some() {
            return invalid(
                "metadata.resourceVersion: resourceVersion should not be set on objects to be created",
            );
        }
        let name = match (meta_str(&object, "name"), meta_str(&object, "generateName")) {
            (Some(n), _) => n.to_owned(),
            (None, Some(prefix)) => generated_name(prefix),
            (None, None) => {
                return invalid("metadata.name: Required value: name or generateName is required");
            }
        };
        if let Err(e) = validate_dns1123_subdomain(&name) {
            return invalid(format!("metadata.name: Invalid value: \"{name}\": {e}"));
        }
        if route.group.is_empty()
            && route.plural == "events"
            && let Some(missing) = event_missing_fields(&object)
        {
            return invalid(format!("Event \"{name}\" is invalid: {missing}"));
        }
        let key = (ns.clone(), name.clone());
        if st
            .resources
            .get(&route.key())
            .is_some_and(|r| r.objects.contains_key(&key))
        {
            return failure(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", route.resource_name()),
            );
        }
        st.revision += 1;
        let revision = st.revision;
        set_meta(&mut object, "name", json!(name));
        set_meta(&mut object, "namespace", json!(ns));
        set_meta(&mut object, "uid", json!(uuid::Uuid::new_v4().to_string()));
        set_meta(&mut object, "creationTimestamp", json!(now_rfc3339()));
        set_meta(&mut object, "generation", json!(1));
        set_meta(&mut object, "resourceVersion", json!(revision.to_string()));
        if route.custom()
            && let Some(map) = object.as_object_mut()
        {
            // Custom resources here all have a status subresource: status is not created.
            map.remove("status");
        }
        let res = st.resources.entry(route.key()).or_default();
        res.objects.insert(key, object.clone());
        res.publish(Event {
            kind: "ADDED",
            namespace: ns,
            revision,
            object: object.clone(),
        });
        json_response(StatusCode::CREATED, &object)
    }

    fn replace(
        st: &mut State,
        route: &Route,
        name: &str,
        status_only: bool,
        body: &[u8],
    ) -> Response<FakeBody> {
        let ns = route.namespace.clone().unwrap_or_default();
        let given = match parse_object(body) {
            Ok(o) => o,
            Err(resp) => return *resp,
        };
        if meta_str(&given, "name").is_some_and(|n| n != name) {
            return bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&given, "name").unwrap_or_default()
            ));
        }
        if meta_str(&given, "namespace").is_some_and(|n| n != ns) {
            return bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            );
        }
        let key = (ns.clone(), name.to_owned());
        let Some(stored) = st
            .resources
            .get(&route.key())
            .and_then(|r| r.objects.get(&key))
            .cloned()
        else {
            return not_found(route, name);
        };
        let stored_rv = meta_str(&stored, "resourceVersion")
            .unwrap_or_default()
            .to_owned();
        match meta_str(&given, "resourceVersion") {
            None => {
                return invalid(
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                );
            }
            Some(rv) if rv != stored_rv => {
                return conflict(
                    route,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                );
            }
            Some(_) => {}
        }
        if let Some(uid) = meta_str(&given, "uid")
            && Some(uid) != meta_str(&stored, "uid")
        {
            return invalid(format!(
                "metadata.uid: Invalid value: \"{uid}\": field is immutable"
            ));
        }
        let mut next = if status_only {
            let mut next = stored.clone();
            if let Some(map) = next.as_object_mut() {
                match given.get("status").filter(|s| !s.is_null()) {
                    Some(s) => map.insert("status".into(), s.clone()),
                    None => map.remove("status"),
                };
            }
            next
        } else {
            let mut next = given;
            for field in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
                let value = stored
                    .get("metadata")
                    .and_then(|m| m.get(field))
                    .cloned()
                    .unwrap_or(Value::Null);
                set_meta(&mut next, field, value);
            }
            set_meta(&mut next, "namespace", json!(ns));
            if route.custom()
                && let Some(map) = next.as_object_mut()
            {
                match stored.get("status") {
                    Some(s) => map.insert("status".into(), s.clone()),
                    None => map.remove("status"),
                };
            }
            if spec_part(&next) != spec_part(&stored) {
                let generation = stored
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                set_meta(&mut next, "generation", json!(generation + 1));
            }
            next
        };
        if next == stored {
            // Nothing changed: not written, same resourceVersion, no event.
            return json_response(StatusCode::OK, &stored);
        }
        st.revision += 1;
        let revision = st.revision;
        set_meta(&mut next, "resourceVersion", json!(revision.to_string()));
        let res = st.resources.entry(route.key()).or_default();
        res.objects.insert(key, next.clone());
        res.publish(Event {
            kind: "MODIFIED",
            namespace: ns,
            revision,
            object: next.clone(),
        });
        json_response(StatusCode::OK, &next)
    }

    fn delete(st: &mut State, route: &Route, name: &str, body: &[u8]) -> Response<FakeBody> {
        let ns = route.namespace.clone().unwrap_or_default();
        let options: Value = if body.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice(body) {
                Ok(v) => v,
                Err(e) => {
                    return bad_request(format!(
                        "DeleteOptions are not JSON: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    ));
                }
            }
        };
        let key = (ns.clone(), name.to_owned());
        let Some(stored) = st
            .resources
            .get(&route.key())
            .and_then(|r| r.objects.get(&key))
            .cloned()
        else {
            return not_found(route, name);
        };
        for (field, label) in [("resourceVersion", "ResourceVersion"), ("uid", "UID")] {
            let wanted = options
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str);
            let current = meta_str(&stored, field).unwrap_or_default();
            if let Some(wanted) = wanted
                && wanted != current
            {
                return conflict(
                    route,
                    name,
                    &format!(
                        "the {label} in the precondition ({wanted}) does not match the {label} in record ({current}). The object might have been modified"
                    ),
                );
            }
        }
        st.revision += 1;
        let revision = st.revision;
        let mut last = stored;
        set_meta(&mut last, "resourceVersion", json!(revision.to_string()));
        let res = st.resources.entry(route.key()).or_default();
        res.objects.remove(&key);
        let uid = meta_str(&last, "uid").unwrap_or_default().to_owned();
        res.publish(Event {
            kind: "DELETED",
            namespace: ns,
            revision,
            object: last,
        });
        // As a real server answers an immediate delete of a custom resource or a Secret (only
        // a few built-in kinds return the deleted object).
        json_response(
            StatusCode::OK,
            &json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {
                    "name": name,
                    "group": route.group,
                    "kind": route.plural,
                    "uid": uid,
                },
            }),
        )
    }

    fn watch(
        &self,
        st: &mut State,
        route: &Route,
        query: &HashMap<String, String>,
    ) -> Response<FakeBody> {
        let selector = match LabelSelector::parse(query.get("labelSelector").map_or("", |s| s)) {
            Ok(s) => s,
            Err(e) => {
                return bad_request(format!(
                    "unable to parse requirement: {e}",
                    e = jumpstarter_core::error_chain(&e)
                ));
            }
        };
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_secs);
        let revision = st.revision;
        let since = match query.get("resourceVersion").map(String::as_str) {
            None | Some("") => None,
            Some(rv) => match rv.parse::<u64>() {
                Ok(n) => Some(n),
                Err(_) => return bad_request(format!("invalid resource version: {rv}")),
            },
        };
        let res = st.resources.entry(route.key()).or_default();
        let replay: Vec<Arc<Event>> = match since {
            Some(since) if since < res.floor => {
                return failure(
                    StatusCode::GONE,
                    "Expired",
                    format!("too old resource version: {since} ({})", res.floor),
                );
            }
            Some(since) => res
                .history
                .iter()
                .filter(|e| e.revision > since)
                .cloned()
                .collect(),
            // No version: the current objects as ADDED, then what follows.
            None => res
                .objects
                .iter()
                .map(|((ns, _), o)| {
                    Arc::new(Event {
                        kind: "ADDED",
                        namespace: ns.clone(),
                        revision,
                        object: o.clone(),
                    })
                })
                .collect(),
        };
        let receiver = res.sender.subscribe();
        let namespace = route.namespace.clone();
        let wanted = move |e: &Event| {
            namespace.as_ref().is_none_or(|ns| *ns == e.namespace)
                && selector.matches(&labels_of(&e.object))
        };
        let live = futures::stream::unfold(receiver, |mut rx| async move {
            match rx.recv().await {
                Ok(e) => Some((e, rx)),
                // Fell behind (or the server went away): close, as the API server closes
                // unresponsive watchers; the client re-watches from what it last saw.
                Err(_) => None,
            }
        });
        let events = futures::stream::iter(replay)
            .chain(live)
            .filter(move |e| std::future::ready(wanted(e)))
            .map(|e| {
                let mut line = json!({"type": e.kind, "object": e.object}).to_string();
                line.push('\n');
                Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(line)))
            });
        let events: Pin<Box<dyn futures::Stream<Item = _> + Send>> = match timeout {
            Some(t) => Box::pin(events.take_until(tokio::time::sleep(t))),
            None => Box::pin(events),
        };
        let mut resp = Response::new(StreamBody::new(events).boxed_unsync());
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }
}

impl tower::Service<Request<kube::client::Body>> for FakeApiServer {
    type Response = Response<FakeBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let server = self.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = match body.collect().await {
                Ok(c) => c.to_bytes(),
                Err(e) => {
                    return Ok(bad_request(format!(
                        "cannot read the request body: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    )));
                }
            };
            let path = parts.uri.path().to_owned();
            let query = parts.uri.query().unwrap_or_default().to_owned();
            Ok(server.handle(&parts.method, &path, &query, &body))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse() {
        let r =
            Route::parse("/apis/jumpstarter.dev/v1alpha1/namespaces/lab/leases/l1/status").unwrap();
        assert_eq!(r.key(), "jumpstarter.dev/leases");
        assert_eq!(r.namespace.as_deref(), Some("lab"));
        assert_eq!(r.name.as_deref(), Some("l1"));
        assert_eq!(r.subresource.as_deref(), Some("status"));
        assert_eq!(r.resource_name(), "leases.jumpstarter.dev");
        let r = Route::parse("/api/v1/namespaces/lab/secrets").unwrap();
        assert_eq!(r.key(), "/secrets");
        assert_eq!(r.api_version, "v1");
        assert!(r.name.is_none());
        let r = Route::parse("/apis/jumpstarter.dev/v1alpha1/leases").unwrap();
        assert!(r.namespace.is_none());
        assert!(Route::parse("/healthz").is_none());
        assert!(Route::parse("/apis/g/v/namespaces/a/b/c/d/e").is_none());
    }

    #[test]
    fn queries_decode() {
        let q = query_pairs("labelSelector=a%3Db%2Cc+in+%28x%29&limit=2&watch");
        assert_eq!(q["labelSelector"], "a=b,c in (x)");
        assert_eq!(q["limit"], "2");
        assert_eq!(q["watch"], "");
        assert_eq!(query_pairs("x=%zz%4")["x"], "%zz%4");
    }

    #[test]
    fn events_with_an_event_time_need_action_and_reporter() {
        let s = FakeApiServer::new();
        let path = "/api/v1/namespaces/lab/events";
        let bare =
            br#"{"metadata":{"name":"e1"},"eventTime":"2026-01-01T00:00:00.000000Z","reason":"R"}"#;
        let resp = s.handle(&Method::POST, path, "", bare);
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
        // Legacy events (no eventTime) need none of them.
        let legacy = br#"{"metadata":{"name":"e2"},"reason":"R"}"#;
        assert_eq!(
            s.handle(&Method::POST, path, "", legacy).status(),
            StatusCode::CREATED
        );
        let full = br#"{"metadata":{"name":"e3"},"eventTime":"2026-01-01T00:00:00.000000Z","reason":"R","action":"Connect","reportingComponent":"c","reportingInstance":"c-h"}"#;
        assert_eq!(
            s.handle(&Method::POST, path, "", full).status(),
            StatusCode::CREATED
        );
        assert_eq!(
            event_missing_fields(&serde_json::from_slice(bare).unwrap()).as_deref(),
            Some(
                "[reportingComponent: Required value, reportingInstance: Required value, action: Required value]"
            )
        );
    }

    #[tokio::test]
    async fn deletes_answer_a_success_status_as_a_real_server() {
        let s = FakeApiServer::new();
        let path = "/apis/g.dev/v1/namespaces/lab/things";
        let created = s.handle(&Method::POST, path, "", br#"{"metadata":{"name":"x"}}"#);
        assert_eq!(created.status(), StatusCode::CREATED);
        let resp = s.handle(&Method::DELETE, &format!("{path}/x"), "", b"");
        assert_eq!(resp.status(), StatusCode::OK);
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["status"], "Success");
        assert_eq!(v["details"]["name"], "x");
        assert_eq!(v["details"]["kind"], "things");
    }

    #[test]
    fn bad_requests_get_statuses() {
        let s = FakeApiServer::new();
        let path = "/apis/g.dev/v1/namespaces/lab/things";
        let resp = s.handle(&Method::POST, path, "", b"not json");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let resp = s.handle(&Method::POST, path, "", br#"{"metadata":{}}"#);
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let resp = s.handle(
            &Method::POST,
            path,
            "",
            br#"{"metadata":{"name":"Bad_Name"}}"#,
        );
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let resp = s.handle(
            &Method::POST,
            path,
            "",
            br#"{"metadata":{"name":"x","namespace":"other"}}"#,
        );
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let resp = s.handle(&Method::GET, path, "labelSelector=%3D%3D", b"");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let resp = s.handle(&Method::GET, path, "watch=true&resourceVersion=x", b"");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let resp = s.handle(&Method::PATCH, &format!("{path}/x"), "", b"{}");
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        let resp = s.handle(&Method::GET, "/version", "", b"");
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        // Nothing was written.
        assert_eq!(s.revision(), 0);
    }
}
