//! Copies of a kind's objects kept between uses and fed by the store's watch
//! ([`ObjectView`]): the reconcile loop's leases, and the clients whose uids authentication
//! checks.

use std::collections::BTreeMap;

#[cfg(doc)]
use crate::store::Store as _;
use crate::{
    objects::{ObjectKey, meta_key, selector::LabelSelector},
    store::{ListParams, Store, StoreError, StoreObject, WatchEvent, WatchStream},
};

/// Every object of kind `K` as the store's watch delivered it. A reader drains the events
/// that came since its last read instead of listing and decoding every object: with 1,000
/// leases asked at once, reconcile passes run back to back, and that list was up to half of
/// each one; every lease asked read its client. Kept only for a store whose watch is
/// synchronous ([`Store::watch_is_synchronous`]), so that a read still sees every write that
/// returned before it; elsewhere each read goes to the store.
pub struct ObjectView<K: StoreObject> {
    items: BTreeMap<ObjectKey, K>,
    events: WatchStream<K>,
}

/// The reconcile loop's leases.
pub type LeaseView = ObjectView<crate::objects::Lease>;

/// Where a view is kept between reads (`None`: none yet, or it fell behind).
pub type ViewSlot<K> = tokio::sync::Mutex<Option<ObjectView<K>>>;

/// An object's key in a view (`None`: no namespace or name).
fn key_of<K: StoreObject>(object: &K) -> Option<ObjectKey> {
    meta_key(object.meta()).map(|(ns, name)| (ns.to_string(), name.to_string()))
}

impl<K: StoreObject> ObjectView<K> {
    /// A view holding the listed `objects`, followed from then on by `events` (a watch from
    /// that list's resourceVersion).
    pub fn new(objects: &[K], events: WatchStream<K>) -> Self {
        let items = objects
            .iter()
            .filter_map(|o| Some((key_of(o)?, o.clone())))
            .collect();
        Self { items, events }
    }

    /// Every object, in (namespace, name) order.
    pub fn objects(&self) -> impl Iterator<Item = &K> {
        self.items.values()
    }

    /// Object `namespace/name`, if the view holds it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&K> {
        self.items.get(&(namespace.to_string(), name.to_string()))
    }

    /// Applies the events waiting in the stream; `false` when the stream failed or ended
    /// (it fell behind): the view must be listed again.
    pub fn catch_up(&mut self) -> bool {
        use futures::{FutureExt, StreamExt};
        loop {
            // Unconstrained: within tokio's cooperative budget, the channel under the stream
            // answers "not ready" after 128 events although more are waiting, and the view
            // would be stale without knowing it.
            match tokio::task::unconstrained(self.events.next()).now_or_never() {
                None => return true,
                Some(None | Some(Err(_))) => return false,
                Some(Some(Ok(event))) => {
                    let (object, gone) = match event {
                        WatchEvent::Added(o) | WatchEvent::Modified(o) => (o, false),
                        WatchEvent::Deleted(o) => (o, true),
                    };
                    let Some(key) = key_of(&object) else {
                        continue;
                    };
                    if gone {
                        self.items.remove(&key);
                    } else {
                        self.items.insert(key, object);
                    }
                }
            }
        }
    }
}

/// `read` of the view kept in `slot`, caught up first; when there is none or it fell behind,
/// of a new one from a list and a watch from there (then kept in `slot`). Only for a store
/// whose watch is synchronous.
pub async fn read_view<S: Store, K: StoreObject, R>(
    store: &S,
    slot: &ViewSlot<K>,
    read: impl FnOnce(&ObjectView<K>) -> R,
) -> Result<R, StoreError> {
    let mut view = slot.lock().await;
    if let Some(v) = view.as_mut() {
        if v.catch_up() {
            return Ok(read(v));
        }
        tracing::debug!(
            kind = %K::kind(&()),
            "a view of the store fell behind its watch; listing again"
        );
        *view = None;
    }
    let listed = store
        .list::<K>(None, &LabelSelector::everything(), &ListParams::default())
        .await?;
    let events = store
        .watch::<K>(None, Some(&listed.resource_version))
        .await?;
    let v = view.insert(ObjectView::new(&listed.items, events));
    Ok(read(v))
}
