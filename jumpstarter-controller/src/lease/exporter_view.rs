//! The reconcile loop's copy of the exporters ([`ExporterView`]), kept between passes in the
//! controller's state and updated from the exporter cache's changes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use jiff::Timestamp;

#[cfg(doc)]
use crate::objects::EXPORTER_OFFLINE_AFTER;
use crate::objects::{Exporter, ObjectKey, older_version};

/// How often a pass looks at every exporter, not only those that changed or are due: a
/// safety net for changes no feed reports (the liveness deadlines and the lease holders
/// already cover everything the loop knows of).
const FULL_SWEEP_EVERY: jiff::SignedDuration = jiff::SignedDuration::from_secs(300);

/// The reconcile loop's copy of the exporters: updated from the exporter cache's changes
/// (and from its own writes) instead of listing and decoding every exporter on every pass.
///
/// It also knows which exporters a pass must look at, so a pass costs what changed, not the
/// size of the lab: those that changed, those whose lease changed, and those whose `Online`
/// condition may have lapsed by now (last seen + [`EXPORTER_OFFLINE_AFTER`]).
pub(crate) struct ExporterView {
    pub(crate) items: Vec<Exporter>,
    index: HashMap<ObjectKey, usize>,
    /// Changed since the last pass.
    dirty: HashSet<ObjectKey>,
    /// When each exporter's liveness must be looked at again, ordered by time.
    due: BTreeSet<(Timestamp, ObjectKey)>,
    due_of: HashMap<ObjectKey, Timestamp>,
    /// The lease holding each exporter after the last pass.
    holders: BTreeMap<ObjectKey, String>,
    /// When every exporter was last looked at (a safety net, see [`FULL_SWEEP_EVERY`]).
    swept_at: Option<Timestamp>,
}

impl ExporterView {
    pub(crate) fn new(mut items: Vec<Exporter>) -> Self {
        // In (namespace, name) order, as the scheduler wants them: it sorts them on every pass,
        // and sorting what is in order already is one look at each (the cache hands them over
        // in no order; 10,000 of them took milliseconds per pass to sort).
        fn key(e: &Exporter) -> (Option<&str>, Option<&str>) {
            (e.metadata.namespace.as_deref(), e.metadata.name.as_deref())
        }
        items.sort_by(|a, b| key(a).cmp(&key(b)));
        let mut view = ExporterView {
            items: Vec::with_capacity(items.len()),
            index: HashMap::with_capacity(items.len()),
            dirty: HashSet::with_capacity(items.len()),
            due: BTreeSet::new(),
            due_of: HashMap::new(),
            holders: BTreeMap::new(),
            swept_at: None,
        };
        for e in items {
            view.set(e);
        }
        view
    }

    fn key(e: &Exporter) -> ObjectKey {
        (
            e.metadata.namespace.clone().unwrap_or_default(),
            e.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// Stores `e` unless the view already holds a newer version of it.
    pub(crate) fn set(&mut self, e: Exporter) {
        let key = Self::key(&e);
        match self.index.get(&key) {
            Some(&i) => {
                if !older_version(&e, &self.items[i]) {
                    self.items[i] = e;
                    self.dirty.insert(key);
                }
            }
            None => {
                self.index.insert(key.clone(), self.items.len());
                self.items.push(e);
                self.dirty.insert(key);
            }
        }
    }

    pub(crate) fn remove(&mut self, key: &ObjectKey) {
        if let Some(i) = self.index.remove(key) {
            self.items.swap_remove(i);
            if let Some(moved) = self.items.get(i) {
                self.index.insert(Self::key(moved), i);
            }
        }
        self.dirty.remove(key);
        self.check_at(key, None);
    }

    pub(crate) fn get(&self, key: &ObjectKey) -> Option<&Exporter> {
        self.index.get(key).and_then(|&i| self.items.get(i))
    }

    /// Looks at `key` again at `at` (`None`: only when it changes).
    pub(crate) fn check_at(&mut self, key: &ObjectKey, at: Option<Timestamp>) {
        if let Some(old) = self.due_of.remove(key) {
            self.due.remove(&(old, key.clone()));
        }
        if let Some(at) = at {
            self.due.insert((at, key.clone()));
            self.due_of.insert(key.clone(), at);
        }
    }

    /// The exporters this pass must look at, given the lease holders `holders` it computed;
    /// `None` means all of them.
    pub(crate) fn take_targets(
        &mut self,
        now: Timestamp,
        holders: &BTreeMap<ObjectKey, String>,
    ) -> Option<Vec<ObjectKey>> {
        let full = self
            .swept_at
            .is_none_or(|t| now.duration_since(t) >= FULL_SWEEP_EVERY);
        let mut keys = std::mem::take(&mut self.dirty);
        for (k, v) in holders {
            if self.holders.get(k) != Some(v) {
                keys.insert(k.clone());
            }
        }
        for (k, v) in &self.holders {
            if holders.get(k) != Some(v) {
                keys.insert(k.clone());
            }
        }
        self.holders.clone_from(holders);
        while let Some((at, _)) = self.due.first()
            && *at <= now
        {
            if let Some((_, k)) = self.due.pop_first() {
                self.due_of.remove(&k);
                keys.insert(k);
            }
        }
        if full {
            self.swept_at = Some(now);
            return None;
        }
        Some(keys.into_iter().collect())
    }

    /// The earliest time an exporter's liveness must be looked at again.
    pub(crate) fn next_due(&self) -> Option<Timestamp> {
        self.due.first().map(|(t, _)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::ExporterSpec;

    #[test]
    fn targets_are_the_changed_the_due_and_those_whose_holder_changed() {
        let named = |name: &str| {
            let mut e = Exporter::new(name, ExporterSpec::default());
            e.metadata.namespace = Some("ns".into());
            e.metadata.resource_version = Some("1".into());
            e
        };
        let key = |name: &str| ("ns".to_string(), name.to_string());
        let now = Timestamp::now();
        let mut view = ExporterView::new((0..5).map(|i| named(&format!("e{i}"))).collect());
        // The first pass looks at everything.
        assert_eq!(view.take_targets(now, &BTreeMap::new()), None);
        assert_eq!(view.take_targets(now, &BTreeMap::new()), Some(vec![]));

        let mut changed = named("e1");
        changed.metadata.resource_version = Some("2".into());
        view.set(changed);
        view.check_at(&key("e2"), Some(now));
        view.check_at(&key("e3"), Some(now + jiff::SignedDuration::from_secs(30)));
        let holders = BTreeMap::from([(key("e4"), "lease-a".to_string())]);
        let mut got = view.take_targets(now, &holders).unwrap();
        got.sort();
        assert_eq!(got, vec![key("e1"), key("e2"), key("e4")]);
        assert_eq!(
            view.next_due(),
            Some(now + jiff::SignedDuration::from_secs(30))
        );

        // The lease lets go of e4: it is looked at again; an older version changes nothing.
        let mut stale = named("e1");
        stale.metadata.resource_version = Some("1".into());
        view.set(stale);
        assert_eq!(
            view.take_targets(now, &BTreeMap::new()),
            Some(vec![key("e4")])
        );
        view.remove(&key("e3"));
        assert_eq!(view.next_due(), None);
    }
}
