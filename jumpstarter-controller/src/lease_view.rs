//! The reconcile loop's copy of the leases ([`LeaseView`]), kept between passes in the
//! controller's state and fed by the store's watch.

use std::collections::BTreeMap;

#[cfg(doc)]
use crate::store::Store;
use crate::{
    objects::{Lease, ObjectKey, meta_key},
    store::WatchEvent,
};

/// Every lease as the store's watch delivered it. A pass drains the events that came since
/// the last one instead of listing and decoding every lease: with 1,000 leases asked at once,
/// passes run back to back, and that list was up to half of each one. Kept only for a store
/// whose watch is synchronous ([`Store::watch_is_synchronous`]), so that a pass still sees
/// every write that returned before it started; elsewhere each pass lists.
pub struct LeaseView {
    items: BTreeMap<ObjectKey, Lease>,
    events: crate::store::WatchStream<Lease>,
}

/// A lease's key in the view (`None`: no namespace or name).
fn key_of(lease: &Lease) -> Option<ObjectKey> {
    meta_key(&lease.metadata).map(|(ns, name)| (ns.to_string(), name.to_string()))
}

impl LeaseView {
    /// A view holding the listed `leases`, followed from then on by `events` (a watch from
    /// that list's resourceVersion).
    pub fn new(leases: &[Lease], events: crate::store::WatchStream<Lease>) -> Self {
        let items = leases
            .iter()
            .filter_map(|l| Some((key_of(l)?, l.clone())))
            .collect();
        Self { items, events }
    }

    /// Every lease, in (namespace, name) order.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.items.values()
    }

    /// Applies the events waiting in the stream; `false` when the stream failed or ended
    /// (it fell behind): the view must be listed again.
    pub fn catch_up(&mut self) -> bool {
        use futures::{FutureExt, StreamExt};
        loop {
            match self.events.next().now_or_never() {
                None => return true,
                Some(None | Some(Err(_))) => return false,
                Some(Some(Ok(event))) => {
                    let (lease, gone) = match event {
                        WatchEvent::Added(l) | WatchEvent::Modified(l) => (l, false),
                        WatchEvent::Deleted(l) => (l, true),
                    };
                    let Some(key) = key_of(&lease) else {
                        continue;
                    };
                    if gone {
                        self.items.remove(&key);
                    } else {
                        self.items.insert(key, lease);
                    }
                }
            }
        }
    }
}
