//! The pool engine's recent scaling decisions, kept per ExporterSet for `jmp admin describe
//! exporterset` (in memory: a restarted controller starts with none).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use jiff::Timestamp;
use jumpstarter_core::sync::LockExt;

/// How many decisions are kept per set.
pub const KEPT_PER_SET: usize = 20;

/// What the engine decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A replica was created.
    ScaleUp,
    /// An idle replica was disabled and removed.
    ScaleDown,
    /// A replica that exited, failed or was quarantined was removed to be replaced.
    Replace,
    /// A replica left from before a restart was adopted again.
    Adopt,
    /// A leftover replica (no Exporter, or unknown) was stopped.
    Reap,
    /// Scaling was wanted but not possible (at `maxReplicas`, provisioner unavailable).
    Blocked,
}

impl Action {
    /// The name shown to users.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ScaleUp => "ScaleUp",
            Self::ScaleDown => "ScaleDown",
            Self::Replace => "Replace",
            Self::Adopt => "Adopt",
            Self::Reap => "Reap",
            Self::Blocked => "Blocked",
        }
    }
}

/// One scaling decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// When it was made.
    pub time: Timestamp,
    /// What was decided.
    pub action: Action,
    /// The replica it concerns, if one.
    pub replica: Option<String>,
    /// Why, in words (e.g. "1 lease waiting, 0 available").
    pub reason: String,
}

/// The recent decisions of every set, newest last, at most [`KEPT_PER_SET`] per set.
#[derive(Debug, Default)]
pub struct Decisions {
    sets: Mutex<BTreeMap<(String, String), VecDeque<Decision>>>,
}

impl Decisions {
    /// Records `d` for set `namespace/name`, dropping that set's oldest beyond the bound.
    pub fn record(&self, namespace: &str, name: &str, d: Decision) {
        let mut sets = self.sets.lock_or_recover();
        let q = sets
            .entry((namespace.to_string(), name.to_string()))
            .or_default();
        if q.len() >= KEPT_PER_SET {
            q.pop_front();
        }
        q.push_back(d);
    }

    /// The recent decisions of set `namespace/name`, oldest first.
    pub fn recent(&self, namespace: &str, name: &str) -> Vec<Decision> {
        self.sets
            .lock_or_recover()
            .get(&(namespace.to_string(), name.to_string()))
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets a deleted set's decisions.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.sets
            .lock_or_recover()
            .remove(&(namespace.to_string(), name.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_per_set() {
        let d = Decisions::default();
        for i in 0..(KEPT_PER_SET + 5) {
            d.record(
                "ns",
                "a",
                Decision {
                    time: Timestamp::UNIX_EPOCH,
                    action: Action::ScaleUp,
                    replica: Some(format!("a-{i}")),
                    reason: String::new(),
                },
            );
        }
        let recent = d.recent("ns", "a");
        assert_eq!(recent.len(), KEPT_PER_SET);
        assert_eq!(recent[0].replica.as_deref(), Some("a-5"));
        assert!(d.recent("ns", "b").is_empty());
        d.forget("ns", "a");
        assert!(d.recent("ns", "a").is_empty());
    }
}
