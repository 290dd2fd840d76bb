//! Kubernetes Events about exporters, as upstream's Exporter reconciler records them: when
//! an Exporter's `Registered` or `Online` condition flips, a core/v1 Event about the Exporter
//! (`involvedObject`) goes to its namespace, so `kubectl get events` and `kubectl describe
//! exporter` show when a board came and went:
//!
//! | reason | type | message |
//! |---|---|---|
//! | `ExporterRegistered` | Normal | `Exporter registered its capabilities: deviceCount=<n>` |
//! | `ExporterUnregistered` | Warning | `Exporter lost its device registration: exporter=<name>` |
//! | `ExporterOnline` | Normal | `Exporter is online: exporter=<name> lastSeen=<time>` |
//! | `ExporterOffline` | Warning | `Exporter reported offline (graceful shutdown): exporter=<name> message=<statusMessage>` or `Exporter went offline (connection lost): exporter=<name> lastSeen=<time>` |
//!
//! (`<time>` is RFC 3339 to the second here; upstream prints Go's `time.Time` format.) Events are core/v1
//! like those of client-go's recorder, so upstream's RBAC (`events` in the core group) is
//! enough. Only the Kubernetes store has an [`EventRecorder`] that posts
//! ([`crate::store::Store::event_recorder`]); with SQLite it is disabled.
//!
//! Recording never waits and never fails the caller: events go through a bounded queue
//! ([`EVENT_QUEUE`]) to one task that posts them, [`POSTS_IN_FLIGHT`] at a time; when the
//! queue is full the event is dropped and counted, with a warning at most every
//! [`DROP_WARN_EVERY`] (the first drop, then how many since); failed posts are logged as
//! sparingly. Posted one at a time, a real API server on a busy machine took about 200 events
//! a second: 1,000 exporters registering at once called for about 2,000 (registered, online),
//! and 1,652–1,678 were dropped, each with a warning line of its own.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use jiff::Timestamp;
use jumpstarter_core::sync::LockExt;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use tokio::sync::mpsc;

use crate::objects::{EXPORTER_OFFLINE_AFTER, Exporter, ExporterStatusValue, conditions};

/// How many events may wait to be posted; more are dropped (and counted).
pub const EVENT_QUEUE: usize = 1024;

/// How many posts are in flight at once.
pub const POSTS_IN_FLIGHT: usize = 8;

/// At most one warning about dropped events, and one about failed posts, in this time.
pub const DROP_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The component named as the events' source and reporting controller.
pub const COMPONENT: &str = "jumpstarter-controller";

/// How long one post may take before it is given up.
#[cfg(feature = "kubernetes")]
const POST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The event reasons (upstream's).
pub mod reasons {
    /// The exporter registered its devices.
    pub const REGISTERED: &str = "ExporterRegistered";
    /// The exporter's devices are gone (it unregistered).
    pub const UNREGISTERED: &str = "ExporterUnregistered";
    /// The exporter came online.
    pub const ONLINE: &str = "ExporterOnline";
    /// The exporter went offline (shut down, or not seen for a minute).
    pub const OFFLINE: &str = "ExporterOffline";
}

/// The `type` of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something that may need attention happened.
    Warning,
}

impl EventType {
    /// `Normal` or `Warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One event about an exporter, before it becomes a Kubernetes Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExporterEvent {
    /// Normal or Warning.
    pub type_: EventType,
    /// One of [`reasons`].
    pub reason: &'static str,
    /// What happened, for people.
    pub message: String,
}

fn last_seen(e: &Exporter) -> String {
    e.status
        .as_ref()
        .and_then(|s| s.last_seen.as_ref())
        .map_or_else(|| "never".to_owned(), |t| format!("{:.0}", t.0))
}

/// The events that the change of an exporter from `old` to `new` calls for, judged (as
/// upstream) by its `Registered` and `Online` conditions: registration first, then
/// online/offline. `now` tells a graceful shutdown (reported Offline within the minute) from
/// a lost connection.
pub fn exporter_transitions(old: &Exporter, new: &Exporter, now: Timestamp) -> Vec<ExporterEvent> {
    let name = new.metadata.name.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    let (was, is) = (
        old.condition_is_true(conditions::REGISTERED),
        new.condition_is_true(conditions::REGISTERED),
    );
    if !was && is {
        let devices = new
            .status
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .map_or(0, Vec::len);
        out.push(ExporterEvent {
            type_: EventType::Normal,
            reason: reasons::REGISTERED,
            message: format!("Exporter registered its capabilities: deviceCount={devices}"),
        });
    } else if was && !is {
        out.push(ExporterEvent {
            type_: EventType::Warning,
            reason: reasons::UNREGISTERED,
            message: format!("Exporter lost its device registration: exporter={name}"),
        });
    }
    let (was, is) = (
        old.condition_is_true(conditions::ONLINE),
        new.condition_is_true(conditions::ONLINE),
    );
    if !was && is {
        out.push(ExporterEvent {
            type_: EventType::Normal,
            reason: reasons::ONLINE,
            message: format!(
                "Exporter is online: exporter={name} lastSeen={}",
                last_seen(new)
            ),
        });
    } else if was && !is {
        let status = new.status.as_ref();
        let graceful = status.is_some_and(|s| {
            s.exporter_status == Some(ExporterStatusValue::Offline)
                && s.last_seen
                    .as_ref()
                    .is_some_and(|t| now.duration_since(t.0) <= EXPORTER_OFFLINE_AFTER)
        });
        let message = if graceful {
            format!(
                "Exporter reported offline (graceful shutdown): exporter={name} message={}",
                status
                    .map(|s| s.status_message.as_str())
                    .unwrap_or_default()
            )
        } else {
            format!(
                "Exporter went offline (connection lost): exporter={name} lastSeen={}",
                last_seen(new)
            )
        };
        out.push(ExporterEvent {
            type_: EventType::Warning,
            reason: reasons::OFFLINE,
            message,
        });
    }
    out
}

/// The last event-name suffix handed out, so that names stay unique within the process even
/// when two events are made in the same nanosecond.
static LAST_SUFFIX: AtomicU64 = AtomicU64::new(0);

fn unique_suffix(now: Timestamp) -> u64 {
    let nanos = u64::try_from(now.as_nanosecond()).unwrap_or(0);
    let mut next = nanos;
    let _ = LAST_SUFFIX.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
        next = nanos.max(last.wrapping_add(1));
        Some(next)
    });
    next
}

/// The core/v1 Event recording `event` about `exporter` at `now` (named `<exporter>.<hex>`
/// as client-go names them), or `None` when the exporter has no name or namespace.
pub fn core_event(exporter: &Exporter, event: &ExporterEvent, now: Timestamp) -> Option<Event> {
    let meta = &exporter.metadata;
    let (name, namespace) = (meta.name.as_deref()?, meta.namespace.as_deref()?);
    // Object names are at most 253 characters; keep room for `.` and 16 hex digits.
    let mut prefix: String = name.chars().take(236).collect();
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    let host = host_name();
    Some(Event {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}.{:x}", unique_suffix(now))),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some(format!(
                "{}/{}",
                crate::objects::GROUP,
                crate::objects::VERSION
            )),
            kind: Some("Exporter".to_owned()),
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            field_path: None,
        },
        reason: Some(event.reason.to_owned()),
        message: Some(truncated(&event.message, MESSAGE_LIMIT)),
        type_: Some(event.type_.as_str().to_owned()),
        source: Some(EventSource {
            component: Some(COMPONENT.to_owned()),
            host: host.clone(),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        count: Some(1),
        // An Event with `eventTime` must name the action and who reported it (the API server
        // refuses it with 422 otherwise).
        reporting_component: Some(COMPONENT.to_owned()),
        reporting_instance: Some(reporting_instance(host.as_deref())),
        action: Some(action_of(event.reason).to_owned()),
        related: None,
        series: None,
    })
}

/// At most this many bytes of an event's message are posted (the API server's limit).
pub const MESSAGE_LIMIT: usize = 1024;
/// At most this many bytes of `reportingInstance` (the API server's limit).
const REPORTING_INSTANCE_LIMIT: usize = 128;

/// The action an event of `reason` reports (`action` of a core/v1 Event that has an
/// `eventTime`).
pub fn action_of(reason: &str) -> &'static str {
    match reason {
        reasons::REGISTERED => "Register",
        reasons::UNREGISTERED => "Unregister",
        reasons::ONLINE => "Connect",
        reasons::OFFLINE => "Disconnect",
        _ => "Update",
    }
}

/// This host's name: `HOSTNAME` (the pod name in a cluster), else the kernel's.
fn host_name() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// `jumpstarter-controller-<host>` (as client-go's recorder names an instance), at most 128
/// bytes; the component alone without a host name.
fn reporting_instance(host: Option<&str>) -> String {
    match host {
        Some(h) => truncated(&format!("{COMPONENT}-{h}"), REPORTING_INSTANCE_LIMIT),
        None => COMPONENT.to_owned(),
    }
}

/// `text` cut to at most `limit` bytes on a character boundary.
fn truncated(text: &str, limit: usize) -> String {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

struct Queue {
    tx: mpsc::Sender<Event>,
    dropped: AtomicU64,
    drops: std::sync::Mutex<WarnPacer>,
}

/// When a warning (about dropped events, or about failed posts) was last logged, and how many
/// of the same were held back since.
#[derive(Debug, Default)]
struct WarnPacer {
    warned_at: Option<std::time::Instant>,
    since: u64,
}

impl WarnPacer {
    /// Notes one more at `now`; `Some(n)` when it is to be logged (`n` before it were not),
    /// `None` within [`DROP_WARN_EVERY`] of the last warning.
    fn note(&mut self, now: std::time::Instant) -> Option<u64> {
        if self
            .warned_at
            .is_some_and(|at| now.saturating_duration_since(at) < DROP_WARN_EVERY)
        {
            self.since += 1;
            return None;
        }
        self.warned_at = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

/// Where exporter events go: nowhere ([`EventRecorder::disabled`], the SQLite store) or, with
/// the Kubernetes store, through a bounded queue to a task that posts them. Cloning gives
/// another handle on the same queue; the task ends when the last handle is dropped.
#[derive(Clone, Default)]
pub struct EventRecorder {
    queue: Option<Arc<Queue>>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("enabled", &self.is_enabled())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl EventRecorder {
    /// A recorder that records nothing.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// A recorder posting through `client` (needs a tokio runtime for its task; without one
    /// it is disabled, with a warning).
    #[cfg(feature = "kubernetes")]
    pub fn kubernetes(client: kube::Client) -> Self {
        Self::kubernetes_with_queue(client, EVENT_QUEUE)
    }

    /// [`EventRecorder::kubernetes`] with a queue of `capacity` (at least 1) events.
    #[cfg(feature = "kubernetes")]
    pub fn kubernetes_with_queue(client: kube::Client, capacity: usize) -> Self {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no tokio runtime: Kubernetes events about exporters are disabled");
            return Self::disabled();
        };
        let (tx, rx) = mpsc::channel(capacity.max(1));
        runtime.spawn(post_events(client, rx, Arc::default()));
        Self {
            queue: Some(Arc::new(Queue {
                tx,
                dropped: AtomicU64::new(0),
                drops: std::sync::Mutex::new(WarnPacer::default()),
            })),
        }
    }

    /// Whether events are posted anywhere.
    pub fn is_enabled(&self) -> bool {
        self.queue.is_some()
    }

    /// How many events were dropped because the queue was full or the poster had stopped.
    pub fn dropped(&self) -> u64 {
        self.queue
            .as_ref()
            .map_or(0, |q| q.dropped.load(Ordering::Relaxed))
    }

    /// Queues `event` about `exporter` (never waits).
    pub fn record(&self, exporter: &Exporter, event: &ExporterEvent) {
        let Some(queue) = &self.queue else {
            return;
        };
        let Some(ev) = core_event(exporter, event, Timestamp::now()) else {
            return;
        };
        if let Err(e) = queue.tx.try_send(ev) {
            let all = queue.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            let Some(unreported) = queue
                .drops
                .lock_or_recover()
                .note(std::time::Instant::now())
            else {
                return;
            };
            let why = match e {
                mpsc::error::TrySendError::Full(_) => "the event queue is full",
                mpsc::error::TrySendError::Closed(_) => "the event poster has stopped",
            };
            let more = if unreported > 0 {
                format!("; {unreported} more dropped since the last warning")
            } else {
                String::new()
            };
            tracing::warn!(
                "event {} about exporter {}/{} dropped: {why}{more} ({all} dropped since \
                 the controller started; at most one warning every {}s)",
                event.reason,
                exporter.metadata.namespace.as_deref().unwrap_or_default(),
                exporter.metadata.name.as_deref().unwrap_or_default(),
                DROP_WARN_EVERY.as_secs(),
            );
        }
    }

    /// Records the events the change of an exporter from `old` to `new` calls for (see
    /// [`exporter_transitions`]).
    pub fn exporter_changed(&self, old: &Exporter, new: &Exporter) {
        if !self.is_enabled() {
            return;
        }
        for event in exporter_transitions(old, new, Timestamp::now()) {
            self.record(new, &event);
        }
    }
}

/// Posts the queued events, [`POSTS_IN_FLIGHT`] at a time, until every sender is gone.
/// Failed posts are logged at most once every [`DROP_WARN_EVERY`] (`failures` paces them):
/// when the API server refuses Events (RBAC), every exporter coming or going would otherwise
/// add a warning line.
#[cfg(feature = "kubernetes")]
async fn post_events(
    client: kube::Client,
    rx: mpsc::Receiver<Event>,
    failures: Arc<std::sync::Mutex<WarnPacer>>,
) {
    use futures::StreamExt;
    tokio_stream::wrappers::ReceiverStream::new(rx)
        .for_each_concurrent(POSTS_IN_FLIGHT, |ev| post_event(&client, ev, &failures))
        .await;
}

/// Posts one event (a failure is logged, paced by `failures`).
#[cfg(feature = "kubernetes")]
async fn post_event(client: &kube::Client, ev: Event, failures: &std::sync::Mutex<WarnPacer>) {
    use kube::{Api, api::PostParams};
    let namespace = ev.metadata.namespace.clone().unwrap_or_default();
    let about = || {
        format!(
            "event {} about exporter {namespace}/{}",
            ev.reason.as_deref().unwrap_or_default(),
            ev.involved_object.name.as_deref().unwrap_or_default()
        )
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let why =
        match tokio::time::timeout(POST_TIMEOUT, api.create(&PostParams::default(), &ev)).await {
            Ok(Ok(_)) => {
                tracing::debug!("{} posted", about());
                return;
            }
            Ok(Err(e)) => jumpstarter_core::error_chain(&e),
            Err(_) => format!("no answer within {POST_TIMEOUT:?}"),
        };
    if let Some(held) = failures.lock_or_recover().note(std::time::Instant::now()) {
        let more = if held > 0 {
            format!(" ({held} more not posted since the last warning)")
        } else {
            String::new()
        };
        tracing::warn!(
            "{} not posted: {why}{more}; at most one such warning every {}s",
            about(),
            DROP_WARN_EVERY.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

    use super::*;
    use crate::objects::{Device, ExporterSpec, ExporterStatus, set_condition};

    fn exporter(online: bool, registered: bool) -> Exporter {
        let now = Timestamp::now();
        let mut e = Exporter::new("board-1", ExporterSpec::default());
        e.metadata.namespace = Some("lab".into());
        e.metadata.uid = Some("u-1".into());
        e.metadata.resource_version = Some("7".into());
        let mut s = ExporterStatus {
            last_seen: Some(metav1::Time(now)),
            devices: registered.then(|| vec![Device::default(), Device::default()]),
            ..ExporterStatus::default()
        };
        set_condition(
            &mut s.conditions,
            conditions::ONLINE,
            online,
            "Seen",
            "",
            None,
            now,
        );
        set_condition(
            &mut s.conditions,
            conditions::REGISTERED,
            registered,
            "Register",
            "",
            None,
            now,
        );
        e.status = Some(s);
        e
    }

    fn reasons_of(events: &[ExporterEvent]) -> Vec<&str> {
        events.iter().map(|e| e.reason).collect()
    }

    #[test]
    fn online_and_registration_flips_make_events() {
        let now = Timestamp::now();
        let off = exporter(false, false);
        let on = exporter(true, true);
        let up = exporter_transitions(&off, &on, now);
        assert_eq!(reasons_of(&up), [reasons::REGISTERED, reasons::ONLINE]);
        assert_eq!(up[0].type_, EventType::Normal);
        assert_eq!(
            up[0].message,
            "Exporter registered its capabilities: deviceCount=2"
        );
        assert!(
            up[1]
                .message
                .starts_with("Exporter is online: exporter=board-1 lastSeen=20")
                && up[1].message.ends_with('Z')
                && !up[1].message.contains('.'),
            "{}",
            up[1].message
        );
        let down = exporter_transitions(&on, &off, now);
        assert_eq!(reasons_of(&down), [reasons::UNREGISTERED, reasons::OFFLINE]);
        assert!(down.iter().all(|e| e.type_ == EventType::Warning));
        assert_eq!(
            down[0].message,
            "Exporter lost its device registration: exporter=board-1"
        );
        // Nothing flips: nothing to say.
        assert!(exporter_transitions(&on, &on, now).is_empty());
        assert!(exporter_transitions(&off, &off, now).is_empty());
        // No status at all reads as offline and unregistered.
        let mut bare = off.clone();
        bare.status = None;
        assert!(exporter_transitions(&bare, &off, now).is_empty());
        assert_eq!(
            reasons_of(&exporter_transitions(&bare, &on, now)),
            [reasons::REGISTERED, reasons::ONLINE]
        );
    }

    #[test]
    fn offline_tells_graceful_shutdown_from_lost_connection() {
        let now = Timestamp::now();
        let on = exporter(true, true);
        let mut gone = exporter(false, true);
        let s = gone.status.as_mut().unwrap();
        s.exporter_status = Some(ExporterStatusValue::Offline);
        s.status_message = "shutting down".into();
        let ev = exporter_transitions(&on, &gone, now);
        assert_eq!(
            ev,
            [ExporterEvent {
                type_: EventType::Warning,
                reason: reasons::OFFLINE,
                message:
                    "Exporter reported offline (graceful shutdown): exporter=board-1 message=shutting down"
                        .into(),
            }]
        );
        // Reported Offline, but two minutes ago: the connection was lost.
        let old = now - jiff::SignedDuration::from_mins(2);
        gone.status.as_mut().unwrap().last_seen = Some(metav1::Time(old));
        let ev = exporter_transitions(&on, &gone, now);
        assert_eq!(
            ev[0].message,
            format!("Exporter went offline (connection lost): exporter=board-1 lastSeen={old:.0}")
        );
        gone.status.as_mut().unwrap().last_seen = None;
        let ev = exporter_transitions(&on, &gone, now);
        assert!(
            ev[0].message.ends_with("lastSeen=never"),
            "{}",
            ev[0].message
        );
    }

    #[test]
    fn core_events_name_the_exporter() {
        let now = Timestamp::now();
        let e = exporter(true, true);
        let what = ExporterEvent {
            type_: EventType::Normal,
            reason: reasons::ONLINE,
            message: "m".into(),
        };
        let ev = core_event(&e, &what, now).unwrap();
        assert_eq!(ev.metadata.namespace.as_deref(), Some("lab"));
        assert!(ev.metadata.name.as_deref().unwrap().starts_with("board-1."));
        let o = &ev.involved_object;
        assert_eq!(o.api_version.as_deref(), Some("jumpstarter.dev/v1alpha1"));
        assert_eq!(o.kind.as_deref(), Some("Exporter"));
        assert_eq!(o.name.as_deref(), Some("board-1"));
        assert_eq!(o.namespace.as_deref(), Some("lab"));
        assert_eq!(o.uid.as_deref(), Some("u-1"));
        assert_eq!(
            (ev.reason.as_deref(), ev.type_.as_deref(), ev.count),
            (Some("ExporterOnline"), Some("Normal"), Some(1))
        );
        assert_eq!(
            ev.source.and_then(|s| s.component).as_deref(),
            Some(COMPONENT)
        );
        // What the API server requires of an Event with an eventTime.
        assert!(ev.event_time.is_some());
        assert_eq!(ev.action.as_deref(), Some("Connect"));
        assert_eq!(ev.reporting_component.as_deref(), Some(COMPONENT));
        let instance = ev.reporting_instance.as_deref().unwrap();
        assert!(instance.starts_with(COMPONENT) && instance.len() <= 128);
        // A long status message is cut to the server's limit.
        let long_message = ExporterEvent {
            message: "é".repeat(1000),
            ..what.clone()
        };
        let cut = core_event(&e, &long_message, now).unwrap().message.unwrap();
        assert!(cut.len() <= MESSAGE_LIMIT && cut.len() >= MESSAGE_LIMIT - 1);
        assert_eq!(reporting_instance(Some(&"h".repeat(300))).len(), 128);
        assert_eq!(reporting_instance(None), COMPONENT);
        // Same instant, still distinct names.
        let again = core_event(&e, &what, now).unwrap();
        assert_ne!(again.metadata.name, ev.metadata.name);
        // A maximal name is cut so that the event's name stays valid.
        let mut long = e.clone();
        long.metadata.name = Some(format!("{}-{}", "a".repeat(235), "b".repeat(17)));
        let name = core_event(&long, &what, now)
            .unwrap()
            .metadata
            .name
            .unwrap();
        assert!(name.len() <= 253, "{}", name.len());
        crate::objects::selector::validate_dns1123_subdomain(&name).unwrap();
        // Not an object in a namespace: no event.
        let mut nowhere = e;
        nowhere.metadata.namespace = None;
        assert!(core_event(&nowhere, &what, now).is_none());
    }

    #[test]
    fn a_disabled_recorder_records_nothing() {
        let r = EventRecorder::disabled();
        assert!(!r.is_enabled());
        r.exporter_changed(&exporter(false, false), &exporter(true, true));
        assert_eq!(r.dropped(), 0);
        assert!(format!("{r:?}").contains("enabled: false"));
    }

    #[cfg(feature = "kubernetes")]
    mod kubernetes {
        use std::{
            convert::Infallible,
            future::Future,
            pin::Pin,
            task::{Context, Poll},
            time::Duration,
        };

        use super::*;
        use crate::objects::selector::LabelSelector;
        use crate::store::{KubeStore, ListParams, Store};
        use crate::testing::{FakeApiServer, FakeBody};

        async fn events_in(store: &KubeStore, namespace: &str, want: usize) -> Vec<Event> {
            for _ in 0..200 {
                let list = store
                    .list::<Event>(
                        Some(namespace),
                        &LabelSelector::everything(),
                        &ListParams::default(),
                    )
                    .await
                    .unwrap();
                if list.items.len() >= want {
                    return list.items;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("fewer than {want} events in {namespace}");
        }

        #[tokio::test]
        async fn online_then_offline_posts_two_events_about_the_exporter() {
            let api = FakeApiServer::new();
            let store = KubeStore::new(api.client());
            let recorder = store.event_recorder();
            assert!(recorder.is_enabled());
            let mut on = exporter(true, true);
            on.metadata.uid = None;
            on.metadata.resource_version = None;
            on.status = None;
            let stored = store.create(&on).await.unwrap();
            let with = |online: bool| {
                let mut e = exporter(online, true);
                e.metadata = stored.metadata.clone();
                e
            };
            recorder.exporter_changed(&with(false), &with(true));
            let mut offline = with(false);
            offline.status.as_mut().unwrap().last_seen = None;
            recorder.exporter_changed(&with(true), &offline);
            // Registered did not flip: exactly the two online/offline events.
            let mut events = events_in(&store, "lab", 2).await;
            assert_eq!(events.len(), 2);
            events.sort_by_key(|e| e.metadata.name.clone());
            let reasons: Vec<_> = events.iter().map(|e| e.reason.as_deref()).collect();
            assert_eq!(reasons, [Some("ExporterOnline"), Some("ExporterOffline")]);
            for (ev, type_) in events.iter().zip(["Normal", "Warning"]) {
                assert_eq!(ev.type_.as_deref(), Some(type_));
                assert_eq!(ev.metadata.namespace.as_deref(), Some("lab"));
                let o = &ev.involved_object;
                assert_eq!(o.kind.as_deref(), Some("Exporter"));
                assert_eq!(o.name.as_deref(), Some("board-1"));
                assert_eq!(o.namespace.as_deref(), Some("lab"));
                assert_eq!(o.uid, stored.metadata.uid);
            }
            assert!(
                events[1]
                    .message
                    .as_deref()
                    .unwrap()
                    .contains("connection lost")
            );
            // Nothing went elsewhere.
            assert!(
                store
                    .list::<Event>(
                        Some("default"),
                        &LabelSelector::everything(),
                        &ListParams::default()
                    )
                    .await
                    .unwrap()
                    .items
                    .is_empty()
            );
            assert_eq!(recorder.dropped(), 0);
        }

        /// How a stand-in API server answers a request.
        type Answer =
            Pin<Box<dyn Future<Output = Result<http::Response<FakeBody>, Infallible>> + Send>>;

        /// A stand-in API server: every request is answered by calling `F`.
        #[derive(Clone)]
        struct Api<F>(F);

        impl<F: FnMut() -> Answer> tower::Service<http::Request<kube::client::Body>> for Api<F> {
            type Response = http::Response<FakeBody>;
            type Error = Infallible;
            type Future = Answer;

            fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, _req: http::Request<kube::client::Body>) -> Answer {
                (self.0)()
            }
        }

        /// An answer with status `code` and `body`.
        fn answer(code: u16, body: &'static [u8]) -> Result<http::Response<FakeBody>, Infallible> {
            let body = http_body_util::BodyExt::boxed_unsync(http_body_util::Full::new(
                bytes::Bytes::from_static(body),
            ));
            Ok(http::Response::builder().status(code).body(body).unwrap())
        }

        #[tokio::test]
        async fn a_stuck_api_server_drops_events_instead_of_blocking() {
            // An API server that never answers.
            let silent = Api(|| -> Answer { Box::pin(std::future::pending()) });
            let recorder =
                EventRecorder::kubernetes_with_queue(kube::Client::new(silent, "default"), 2);
            let (off, on) = (exporter(false, true), exporter(true, true));
            let started = std::time::Instant::now();
            let n = 10 + POSTS_IN_FLIGHT as u64;
            for _ in 0..n {
                recorder.exporter_changed(&off, &on);
            }
            assert!(started.elapsed() < Duration::from_secs(1));
            // Two queued, up to POSTS_IN_FLIGHT taken by the poster (on this one-thread
            // runtime it has not run yet); the rest dropped.
            let dropped = recorder.dropped();
            assert!(
                (n - 2 - POSTS_IN_FLIGHT as u64..=n - 2).contains(&dropped),
                "{dropped}"
            );
        }

        /// What an API server that holds every request until the test lets it go (then
        /// answers 500) counts: how many it holds, and the most at once.
        #[derive(Clone)]
        struct Gate {
            held: Arc<std::sync::atomic::AtomicUsize>,
            most: Arc<std::sync::atomic::AtomicUsize>,
            open: Arc<tokio::sync::Semaphore>,
        }

        #[tokio::test]
        async fn events_are_posted_several_at_a_time_and_no_more() {
            let gate = Gate {
                held: Arc::default(),
                most: Arc::default(),
                open: Arc::new(tokio::sync::Semaphore::new(0)),
            };
            let held = gate.clone();
            let api = Api(move || -> Answer {
                let gate = held.clone();
                Box::pin(async move {
                    let now = gate.held.fetch_add(1, Ordering::SeqCst) + 1;
                    gate.most.fetch_max(now, Ordering::SeqCst);
                    let _pass = gate.open.acquire().await;
                    gate.held.fetch_sub(1, Ordering::SeqCst);
                    answer(500, b"")
                })
            });
            let recorder =
                EventRecorder::kubernetes_with_queue(kube::Client::new(api, "default"), 64);
            let (off, on) = (exporter(false, true), exporter(true, true));
            for _ in 0..3 * POSTS_IN_FLIGHT {
                recorder.exporter_changed(&off, &on);
            }
            assert_eq!(recorder.dropped(), 0);
            for _ in 0..500 {
                if gate.held.load(Ordering::SeqCst) == POSTS_IN_FLIGHT {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // Let the other posts start, if the poster would start more.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(gate.most.load(Ordering::SeqCst), POSTS_IN_FLIGHT);
            gate.open.add_permits(1000);
        }

        /// What the API server answers a request RBAC refuses.
        const FORBIDDEN: &[u8] = br#"{"kind":"Status","apiVersion":"v1","status":"Failure",
            "message":"events is forbidden","reason":"Forbidden","code":403}"#;

        /// The log lines written while the returned guard lives (on this thread).
        fn capture_logs() -> (
            Arc<std::sync::Mutex<Vec<u8>>>,
            tracing::subscriber::DefaultGuard,
        ) {
            #[derive(Clone)]
            struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);
            impl std::io::Write for Sink {
                fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                    self.0.lock_or_recover().extend_from_slice(buf);
                    Ok(buf.len())
                }
                fn flush(&mut self) -> std::io::Result<()> {
                    Ok(())
                }
            }
            let buf = Arc::new(std::sync::Mutex::new(Vec::new()));
            let sink = Sink(buf.clone());
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::WARN)
                .with_ansi(false)
                .with_writer(move || sink.clone())
                .finish();
            (buf, tracing::subscriber::set_default(subscriber))
        }

        #[tokio::test]
        async fn refused_posts_are_warned_about_once_in_a_while() {
            let (logs, _guard) = capture_logs();
            // An API server that refuses every request at once (as RBAC would), counting them.
            let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = calls.clone();
            let api = Api(move || -> Answer {
                counted.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { answer(403, FORBIDDEN) })
            });
            let recorder =
                EventRecorder::kubernetes_with_queue(kube::Client::new(api, "default"), 64);
            let (off, on) = (exporter(false, true), exporter(true, true));
            let n = 20;
            for _ in 0..n {
                recorder.exporter_changed(&off, &on);
            }
            for _ in 0..500 {
                if calls.load(Ordering::SeqCst) >= n {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(calls.load(Ordering::SeqCst), n, "every event was tried");
            tokio::time::sleep(Duration::from_millis(50)).await;
            let text = String::from_utf8(logs.lock_or_recover().clone()).unwrap();
            let warned: Vec<&str> = text.lines().filter(|l| l.contains("not posted")).collect();
            assert_eq!(warned.len(), 1, "{text}");
            assert!(warned[0].contains("forbidden"), "{text}");
            assert_eq!(recorder.dropped(), 0, "refused, not dropped");
        }

        #[test]
        fn drops_are_warned_about_once_in_a_while_with_how_many_were_not() {
            let mut log = WarnPacer::default();
            let t0 = std::time::Instant::now();
            assert_eq!(log.note(t0), Some(0), "the first drop is warned about");
            for i in 1..=5 {
                assert_eq!(log.note(t0 + Duration::from_millis(i)), None);
            }
            assert_eq!(
                log.note(t0 + DROP_WARN_EVERY - Duration::from_millis(1)),
                None
            );
            assert_eq!(
                log.note(t0 + DROP_WARN_EVERY),
                Some(6),
                "the next warning counts the six not warned about"
            );
            assert_eq!(log.note(t0 + DROP_WARN_EVERY), None);
        }

        #[test]
        fn without_a_runtime_the_recorder_is_disabled() {
            let client = {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                let _guard = rt.enter();
                FakeApiServer::new().client()
            };
            let r = EventRecorder::kubernetes(client);
            assert!(!r.is_enabled());
        }
    }
}
