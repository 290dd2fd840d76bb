//! Status and metadata writes, and creates, of the kinds the controller writes in bulk
//! (Lease, Exporter, Client, ExporterAccessPolicy, ExporterSet), done on the typed object.
//!
//! The embedded store keeps objects as JSON text. Through `serde_json::Value`, a status write
//! converted its object five times: the given object to a value, the stored text parsed to
//! another, the merged value encoded to text and decoded to the answer. That was two thirds
//! of the writer thread's instructions while 1,000 leases were granted at once. On the typed
//! object it is the stored text decoded, the new object encoded, and that text decoded to the
//! answer (so that the answer is what a later read returns, times cut to the second as their
//! JSON form has them).
//!
//! Against the value merge, one thing differs: fields of the stored text that the type does
//! not know (written by a newer controller, say) are not kept by a write, as an API server
//! prunes the fields a CRD's schema does not know. Spec updates (`update`) and other kinds
//! take the value merge.

use std::any::Any;

use kube::core::object::HasStatus;

use crate::objects::virtualtarget::ExporterSet;
use crate::objects::{Client, Exporter, ExporterAccessPolicy, Lease};
use crate::store::{StoreObject, take_written_metadata};

/// Which parts of the given object a replace writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Merge {
    /// `update`: everything but `status` and the server-owned metadata.
    Update,
    /// `update_status`: the status.
    Status,
    /// The metadata fields of [`crate::store::WRITTEN_METADATA`].
    Metadata,
    /// Both of the above.
    StatusAndMetadata,
    /// Nothing: the stored object is the answer.
    Keep,
}

/// A kind written on the typed object: it has a status and compares by value.
trait Typed: StoreObject + PartialEq {
    /// Takes `merge`'s parts of `given` (moved, not copied); whether anything changed.
    fn take_parts(&mut self, given: Self, merge: Merge) -> bool;
    /// Drops the status (a create writes none: it is the status subresource's).
    fn clear_status(&mut self);
}

impl<T> Typed for T
where
    T: StoreObject + PartialEq + HasStatus,
    T::Status: Clone + PartialEq,
{
    fn take_parts(&mut self, mut given: Self, merge: Merge) -> bool {
        let mut changed = false;
        if matches!(merge, Merge::Status | Merge::StatusAndMetadata)
            && self.status() != given.status()
        {
            *self.status_mut() = given.status_mut().take();
            changed = true;
        }
        if matches!(merge, Merge::Metadata | Merge::StatusAndMetadata) {
            changed |= take_written_metadata(given.meta_mut(), self.meta_mut());
        }
        changed
    }

    fn clear_status(&mut self) {
        *self.status_mut() = None;
    }
}

/// The typed operations, for `K` when it is one of the typed kinds.
pub(super) struct Ops<K> {
    take_parts: fn(&mut K, K, Merge) -> bool,
    clear_status: fn(&mut K),
    same: fn(&K, &K) -> bool,
}

impl<K: StoreObject> Ops<K> {
    /// The operations of `K`, or `None` when `K` takes the value merge.
    pub(super) fn of() -> Option<Self> {
        pick::<K, Lease>()
            .or_else(pick::<K, Exporter>)
            .or_else(pick::<K, Client>)
            .or_else(pick::<K, ExporterAccessPolicy>)
            .or_else(pick::<K, ExporterSet>)
            .or_else(Self::of_test_kinds)
    }

    /// The store tests' stand-in kind is typed too, so that the store's suite runs both
    /// merges (see `SqliteStore::open_with_value_merge`).
    #[cfg(test)]
    fn of_test_kinds() -> Option<Self> {
        pick::<K, crate::store::tests::Widget>()
    }

    #[cfg(not(test))]
    fn of_test_kinds() -> Option<Self> {
        None
    }

    /// Takes `merge`'s parts of `given` into `stored`; whether anything changed.
    pub(super) fn take_parts(&self, stored: &mut K, given: K, merge: Merge) -> bool {
        (self.take_parts)(stored, given, merge)
    }

    /// Drops the status of `object`.
    pub(super) fn clear_status(&self, object: &mut K) {
        (self.clear_status)(object)
    }

    /// Whether `a` and `b` are equal.
    pub(super) fn same(&self, a: &K, b: &K) -> bool {
        (self.same)(a, b)
    }
}

/// The operations of `T`, when `K` is `T`.
fn pick<K: StoreObject, T: Typed>() -> Option<Ops<K>> {
    (std::any::TypeId::of::<K>() == std::any::TypeId::of::<T>()).then_some(Ops {
        take_parts: |stored, given, merge| {
            let mut given = Some(given);
            match (
                (stored as &mut dyn Any).downcast_mut::<T>(),
                (&mut given as &mut dyn Any)
                    .downcast_mut::<Option<T>>()
                    .and_then(Option::take),
            ) {
                (Some(stored), Some(given)) => stored.take_parts(given, merge),
                _ => false,
            }
        },
        clear_status: |object| {
            if let Some(object) = (object as &mut dyn Any).downcast_mut::<T>() {
                object.clear_status();
            }
        },
        same: |a, b| match (
            (a as &dyn Any).downcast_ref::<T>(),
            (b as &dyn Any).downcast_ref::<T>(),
        ) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        },
    })
}
