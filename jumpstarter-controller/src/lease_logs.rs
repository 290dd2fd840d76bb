//! Log gathering: each lease's story as the controller keeps it, its own events (lease
//! created, granted, dial, ended) and the entries its exporter pushes through upstream
//! main's `TelemetryService.PushLogs`, for `jmp get lease NAME --logs` and
//! `jmp admin logs --lease NAME`.
//!
//! Kept in the controller's memory, with both backends: a restart forgets them (the log
//! lines on stderr remain the durable record). Bounded twice: per lease
//! ([`LeaseLogLimits::max_entries`], [`LeaseLogLimits::max_bytes`]; entries beyond them are
//! dropped and counted) and over all leases ([`LeaseLogLimits::max_leases`] logs at most,
//! the least recently written removed first; a log not written for
//! [`LeaseLogLimits::retention`] is removed).
//!
//! A lease's console transcript entries (those the exporter marks `stream=console`, see
//! [`is_console`]) have a budget of their own of the same size, so that a chatty console
//! can never push out the lease's driver calls and events (nor they its transcript).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use jumpstarter_core::sync::LockExt;
use jumpstarter_proto::v1::LogEntry;
use prost::Message as _;

/// Entries a `PushLogs` request may carry.
pub const MAX_BATCH: usize = 1000;
/// Characters an entry's `message` may have.
pub const MAX_MESSAGE: usize = 16 * 1024;
/// Characters each of an entry's short fields (severity, component, names, operation,
/// result, driver_type) may have.
pub const MAX_SHORT_FIELD: usize = 253;
/// `extra_fields` an entry may have (upstream main's bound).
pub const MAX_EXTRA_FIELDS: usize = 16;
/// Characters of an `extra_fields` key (upstream main's bound).
pub const MAX_EXTRA_KEY: usize = 64;
/// Characters of an `extra_fields` value (upstream main's bound).
pub const MAX_EXTRA_VALUE: usize = 256;

/// How much the controller keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseLogLimits {
    /// Entries kept per lease; later ones are dropped (and counted).
    pub max_entries: usize,
    /// Encoded bytes kept per lease; later entries are dropped (and counted).
    pub max_bytes: usize,
    /// Leases whose logs are kept; beyond it the least recently written is removed.
    pub max_leases: usize,
    /// A lease's log is removed once it has not been written for this long.
    pub retention: Duration,
}

impl Default for LeaseLogLimits {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            max_bytes: 4 * 1024 * 1024,
            max_leases: 1000,
            retention: Duration::from_secs(24 * 3600),
        }
    }
}

/// The `extra_fields` key and value marking an entry of a console transcript.
pub const CONSOLE_STREAM: (&str, &str) = ("stream", "console");

/// Whether `e` is a record of a console transcript (the exporter marks them
/// `stream=console`, with `console` and `direction`).
pub fn is_console(e: &LogEntry) -> bool {
    e.extra_fields
        .get(CONSOLE_STREAM.0)
        .is_some_and(|v| v == CONSOLE_STREAM.1)
}

/// Entries within one budget of a lease.
#[derive(Debug, Default)]
struct Budget {
    entries: Vec<LogEntry>,
    bytes: usize,
    dropped: u64,
}

/// One lease's entries: its story (events, driver calls, driver lines) and its consoles'
/// transcripts, each within the per-lease bounds.
#[derive(Debug)]
struct LeaseLog {
    story: Budget,
    console: Budget,
    written: Instant,
}

/// Which of a lease's entries a read returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Every entry.
    All,
    /// All but the console transcripts' (`jmp get lease NAME --logs`).
    Story,
    /// The console transcripts' (`jmp get lease NAME --console`).
    Console,
}

/// The logs of the leases (see the module docs).
#[derive(Debug)]
pub struct LeaseLogs {
    limits: LeaseLogLimits,
    leases: Mutex<HashMap<(String, String), LeaseLog>>,
}

/// What a read returns: the entries in time order and how many were dropped.
#[derive(Debug, Default)]
pub struct LeaseStory {
    /// Oldest first.
    pub entries: Vec<LogEntry>,
    /// Entries not kept (the per-lease bounds).
    pub dropped: u64,
}

impl LeaseLogs {
    /// Logs kept within `limits`.
    pub fn new(limits: LeaseLogLimits) -> Self {
        Self {
            limits,
            leases: Mutex::default(),
        }
    }

    /// The bounds.
    pub fn limits(&self) -> LeaseLogLimits {
        self.limits
    }

    /// Appends `entries` (already checked) to lease `namespace/lease`; returns how many
    /// were kept and how many dropped.
    pub fn append(&self, namespace: &str, lease: &str, entries: Vec<LogEntry>) -> (u32, u32) {
        self.append_at(namespace, lease, entries, Instant::now())
    }

    fn append_at(
        &self,
        namespace: &str,
        lease: &str,
        entries: Vec<LogEntry>,
        now: Instant,
    ) -> (u32, u32) {
        let mut leases = self.leases.lock_or_recover();
        self.prune(&mut leases, now);
        let key = (namespace.to_string(), lease.to_string());
        if !leases.contains_key(&key) && leases.len() >= self.limits.max_leases {
            let oldest = leases
                .iter()
                .min_by_key(|(_, l)| l.written)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                leases.remove(&k);
            }
        }
        if self.limits.max_leases == 0 {
            return (0, u32::try_from(entries.len()).unwrap_or(u32::MAX));
        }
        let log = leases.entry(key).or_insert_with(|| LeaseLog {
            story: Budget::default(),
            console: Budget::default(),
            written: now,
        });
        log.written = now;
        let (mut accepted, mut dropped) = (0u32, 0u32);
        for e in entries {
            let size = e.encoded_len();
            let budget = if is_console(&e) {
                &mut log.console
            } else {
                &mut log.story
            };
            if budget.entries.len() >= self.limits.max_entries
                || budget.bytes.saturating_add(size) > self.limits.max_bytes
            {
                dropped = dropped.saturating_add(1);
                budget.dropped = budget.dropped.saturating_add(1);
                continue;
            }
            budget.bytes += size;
            budget.entries.push(e);
            accepted = accepted.saturating_add(1);
        }
        (accepted, dropped)
    }

    /// Removes the logs not written within the retention time.
    fn prune(&self, leases: &mut HashMap<(String, String), LeaseLog>, now: Instant) {
        let retention = self.limits.retention;
        leases.retain(|_, l| now.saturating_duration_since(l.written) < retention);
    }

    /// The story of lease `namespace/lease`, oldest first (entries with the same time in the
    /// order they came); empty when none is kept.
    pub fn read(&self, namespace: &str, lease: &str) -> LeaseStory {
        self.read_part(namespace, lease, Part::All)
    }

    /// [`LeaseLogs::read`] of only `part` of the entries (its `dropped` of that part).
    pub fn read_part(&self, namespace: &str, lease: &str, part: Part) -> LeaseStory {
        self.read_at(namespace, lease, part, Instant::now())
    }

    fn read_at(&self, namespace: &str, lease: &str, part: Part, now: Instant) -> LeaseStory {
        let mut leases = self.leases.lock_or_recover();
        self.prune(&mut leases, now);
        let Some(log) = leases.get(&(namespace.to_string(), lease.to_string())) else {
            return LeaseStory::default();
        };
        let budgets: &[&Budget] = match part {
            Part::All => &[&log.story, &log.console],
            Part::Story => &[&log.story],
            Part::Console => &[&log.console],
        };
        let mut entries = Vec::new();
        let mut dropped = 0u64;
        for b in budgets {
            entries.extend(b.entries.iter().cloned());
            dropped = dropped.saturating_add(b.dropped);
        }
        drop(leases);
        entries.sort_by_key(|e| {
            e.timestamp
                .as_ref()
                .map(|t| (t.seconds, t.nanos))
                .unwrap_or_default()
        });
        LeaseStory { entries, dropped }
    }

    /// Records one of the controller's own events of a lease (`lease created`, ...), with the
    /// lease's context and `fields` among its `extra_fields`.
    pub fn event(&self, lease: &LeaseFacts<'_>, message: &str, fields: &[(&str, String)]) {
        let mut extra: HashMap<String, String> = lease
            .context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in fields {
            extra.insert((*k).to_string(), v.clone());
        }
        let entry = LogEntry {
            timestamp: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
            severity: "info".into(),
            message: message.into(),
            component: "controller".into(),
            exporter: lease.exporter.into(),
            lease: lease.name.into(),
            client: lease.client.into(),
            namespace: lease.namespace.into(),
            extra_fields: extra,
            ..Default::default()
        };
        self.append(lease.namespace, lease.name, vec![entry]);
    }
}

/// A lease as [`LeaseLogs::event`] names it.
#[derive(Debug, Clone, Copy)]
pub struct LeaseFacts<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its client.
    pub client: &'a str,
    /// The exporter serving it (empty before one is).
    pub exporter: &'a str,
    /// Its `spec.context`.
    pub context: &'a BTreeMap<String, String>,
}

/// The span a controller line about a lease is written in: with JSON logs each entry of the
/// lease's context becomes a field of the line, as on the exporter's lines. No span (none
/// to show) when the context is empty.
pub fn context_span(context: &BTreeMap<String, String>) -> tracing::Span {
    jumpstarter_core::logging::context_span(context)
}

/// Why a `PushLogs` batch is refused (INVALID_ARGUMENT; nothing of it is kept). Every
/// entry names a lease, but a health check's run (`stream=health`), which has none.
pub fn check_batch(entries: &[LogEntry]) -> Result<(), String> {
    if entries.len() > MAX_BATCH {
        return Err(format!(
            "{} entries in one PushLogs request; at most {MAX_BATCH}",
            entries.len()
        ));
    }
    for (i, e) in entries.iter().enumerate() {
        check_entry(e).map_err(|why| format!("entry {i}: {why}"))?;
    }
    Ok(())
}

fn check_entry(e: &LogEntry) -> Result<(), String> {
    let long = |name: &str, value: &str, max: usize| {
        let n = value.chars().count();
        if n > max {
            Err(format!("{name} has {n} characters; at most {max}"))
        } else {
            Ok(())
        }
    };
    if e.lease.is_empty()
        && e.extra_fields.get("stream").map(String::as_str)
            != Some(jumpstarter_core::hooks::HEALTH_CHECK_STREAM)
    {
        return Err(format!(
            "lease is empty: entries belong to a lease, but for a health check's run \
             (extra_fields stream={:?})",
            jumpstarter_core::hooks::HEALTH_CHECK_STREAM
        ));
    }
    long("message", &e.message, MAX_MESSAGE)?;
    for (name, value) in [
        ("severity", &e.severity),
        ("component", &e.component),
        ("exporter", &e.exporter),
        ("lease", &e.lease),
        ("client", &e.client),
        ("operation", &e.operation),
        ("result", &e.result),
        ("driver_type", &e.driver_type),
        ("namespace", &e.namespace),
    ] {
        long(name, value, MAX_SHORT_FIELD)?;
    }
    if e.extra_fields.len() > MAX_EXTRA_FIELDS {
        return Err(format!(
            "{} extra_fields; at most {MAX_EXTRA_FIELDS}",
            e.extra_fields.len()
        ));
    }
    for (k, v) in &e.extra_fields {
        long("an extra_fields key", k, MAX_EXTRA_KEY)?;
        long(&format!("extra_fields[{k:?}]"), v, MAX_EXTRA_VALUE)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(message: &str, seconds: i64) -> LogEntry {
        LogEntry {
            timestamp: Some(prost_types::Timestamp { seconds, nanos: 0 }),
            message: message.into(),
            lease: "l".into(),
            ..Default::default()
        }
    }

    fn limits() -> LeaseLogLimits {
        LeaseLogLimits {
            max_entries: 3,
            max_bytes: 1 << 20,
            max_leases: 2,
            retention: Duration::from_secs(60),
        }
    }

    #[test]
    fn entries_beyond_the_per_lease_cap_are_dropped_and_counted() {
        let logs = LeaseLogs::new(limits());
        let got = logs.append("ns", "l", (0..5).map(|i| entry("x", i)).collect());
        assert_eq!(got, (3, 2));
        let story = logs.read("ns", "l");
        assert_eq!(story.entries.len(), 3);
        assert_eq!(story.dropped, 2);
    }

    #[test]
    fn a_chatty_console_has_its_own_budget_and_cannot_push_out_the_story() {
        let logs = LeaseLogs::new(limits());
        let console = |i| {
            let mut e = entry("tty", i);
            e.extra_fields
                .insert(CONSOLE_STREAM.0.into(), CONSOLE_STREAM.1.into());
            e
        };
        assert_eq!(
            logs.append("ns", "l", (0..10).map(console).collect()),
            (3, 7)
        );
        assert_eq!(
            logs.append("ns", "l", (0..4).map(|i| entry("call", i)).collect()),
            (3, 1)
        );
        let story = logs.read_part("ns", "l", Part::Story);
        assert!(story.entries.iter().all(|e| e.message == "call"));
        assert_eq!((story.entries.len(), story.dropped), (3, 1));
        let tty = logs.read_part("ns", "l", Part::Console);
        assert!(tty.entries.iter().all(is_console));
        assert_eq!((tty.entries.len(), tty.dropped), (3, 7));
        let all = logs.read("ns", "l");
        assert_eq!((all.entries.len(), all.dropped), (6, 8));
    }

    #[test]
    fn the_byte_cap_bounds_a_lease_too() {
        let one = entry(&"y".repeat(100), 1).encoded_len();
        let logs = LeaseLogs::new(LeaseLogLimits {
            max_entries: 100,
            max_bytes: one * 2 + 1,
            ..limits()
        });
        let got = logs.append(
            "ns",
            "l",
            (0..4).map(|i| entry(&"y".repeat(100), i)).collect(),
        );
        assert_eq!(got, (2, 2));
    }

    #[test]
    fn a_read_is_in_time_order() {
        let logs = LeaseLogs::new(limits());
        logs.append("ns", "l", vec![entry("b", 2), entry("a", 1)]);
        logs.append("ns", "l", vec![entry("c", 3)]);
        let got: Vec<_> = logs
            .read("ns", "l")
            .entries
            .into_iter()
            .map(|e| e.message)
            .collect();
        assert_eq!(got, ["a", "b", "c"]);
        assert!(logs.read("other", "l").entries.is_empty());
    }

    #[test]
    fn the_least_recently_written_lease_goes_beyond_max_leases() {
        let logs = LeaseLogs::new(limits());
        let t = Instant::now();
        logs.append_at("ns", "a", vec![entry("a", 1)], t);
        logs.append_at("ns", "b", vec![entry("b", 1)], t + Duration::from_secs(1));
        logs.append_at("ns", "a", vec![entry("a2", 2)], t + Duration::from_secs(2));
        logs.append_at("ns", "c", vec![entry("c", 1)], t + Duration::from_secs(3));
        let now = t + Duration::from_secs(4);
        assert_eq!(logs.read_at("ns", "a", Part::All, now).entries.len(), 2);
        assert!(
            logs.read_at("ns", "b", Part::All, now).entries.is_empty(),
            "b was evicted"
        );
        assert_eq!(logs.read_at("ns", "c", Part::All, now).entries.len(), 1);
    }

    #[test]
    fn a_log_not_written_within_the_retention_is_removed() {
        let logs = LeaseLogs::new(limits());
        let t = Instant::now();
        logs.append_at("ns", "a", vec![entry("a", 1)], t);
        assert_eq!(
            logs.read_at("ns", "a", Part::All, t + Duration::from_secs(59))
                .entries
                .len(),
            1
        );
        assert!(
            logs.read_at("ns", "a", Part::All, t + Duration::from_secs(60))
                .entries
                .is_empty()
        );
    }

    #[test]
    fn bad_batches_are_refused_naming_what_is_wrong() {
        let ok = entry("fine", 1);
        assert_eq!(check_batch(std::slice::from_ref(&ok)), Ok(()));
        let many = vec![ok.clone(); MAX_BATCH + 1];
        assert!(check_batch(&many).unwrap_err().contains("at most 1000"));
        let mut huge = ok.clone();
        huge.message = "m".repeat(MAX_MESSAGE + 1);
        assert!(
            check_batch(&[ok.clone(), huge])
                .unwrap_err()
                .starts_with("entry 1: message has")
        );
        let mut fields = ok.clone();
        fields.extra_fields = (0..17).map(|i| (i.to_string(), "v".into())).collect();
        assert!(
            check_batch(&[fields])
                .unwrap_err()
                .contains("17 extra_fields")
        );
        let mut value = ok.clone();
        value.extra_fields.insert("k".into(), "v".repeat(257));
        assert!(
            check_batch(&[value])
                .unwrap_err()
                .contains("extra_fields[\"k\"]")
        );
        let mut no_lease = ok;
        no_lease.lease.clear();
        assert!(
            check_batch(&[no_lease.clone()])
                .unwrap_err()
                .contains("lease is empty")
        );
        // A health check's run has none.
        no_lease
            .extra_fields
            .insert("stream".into(), "health".into());
        assert_eq!(check_batch(&[no_lease]), Ok(()));
    }

    #[test]
    fn an_event_carries_the_leases_context() {
        let logs = LeaseLogs::new(limits());
        let context = [("build_id".to_string(), "7".to_string())].into();
        let facts = LeaseFacts {
            namespace: "ns",
            name: "l",
            client: "ci",
            exporter: "",
            context: &context,
        };
        logs.event(&facts, "lease created", &[("priority", "1".into())]);
        let e = &logs.read("ns", "l").entries[0];
        assert_eq!(e.message, "lease created");
        assert_eq!(e.component, "controller");
        assert_eq!(e.extra_fields["build_id"], "7");
        assert_eq!(e.extra_fields["priority"], "1");
    }
}
