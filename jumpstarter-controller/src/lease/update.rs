//! A client's change to its lease (UpdateLease): new times and/or a transfer to another
//! client, applied only when the changed lease passes the same ExporterAccessPolicy
//! evaluation as a new request ([`crate::lease::scheduler::check_access`]). Without that
//! check a client could extend a granted lease past a policy's `maximumDuration`, or hand it
//! to a client the policies refuse.

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use tonic::Status;

use crate::{
    lease::scheduler::check_access,
    objects::{
        Client, Exporter, ExporterAccessPolicy, Lease, LeaseTimes, duration::GoDuration,
        lease_labels, selector::LabelSelector,
    },
    state::store_status,
    store::{ListParams, Store},
};

/// What an UpdateLease asks to change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseChange {
    /// New begin/end/duration (already reconciled), if given.
    pub times: Option<LeaseTimes>,
    /// The client the lease is transferred to, if any.
    pub new_client: Option<String>,
}

/// The objects the access policies are evaluated over (one namespace).
#[derive(Debug, Clone, Default)]
pub struct AccessView {
    /// The namespace's exporters.
    pub exporters: Vec<Exporter>,
    /// The namespace's ExporterAccessPolicies.
    pub policies: Vec<ExporterAccessPolicy>,
    /// The namespace's clients (their labels select policy rules).
    pub clients: Vec<Client>,
}

impl AccessView {
    /// Reads the exporters, policies and clients of `namespace`.
    pub async fn load<S: Store>(store: &S, namespace: &str) -> Result<Self, Status> {
        let all = LabelSelector::everything();
        let params = ListParams::default();
        Ok(Self {
            exporters: store
                .list::<Exporter>(Some(namespace), &all, &params)
                .await
                .map_err(store_status)?
                .items,
            policies: store
                .list::<ExporterAccessPolicy>(Some(namespace), &all, &params)
                .await
                .map_err(store_status)?
                .items,
            clients: store
                .list::<Client>(Some(namespace), &all, &params)
                .await
                .map_err(store_status)?
                .items,
        })
    }
}

/// Applies `change` to `lease` if the result is allowed; returns whether anything is to be
/// written. A refusal leaves `lease` as it was: INVALID_ARGUMENT for a begin time change of
/// a started lease, FAILED_PRECONDITION for a transfer of a lease that is not active, and
/// PERMISSION_DENIED, with the reason and message a new request would end with, when the
/// access policies do not allow the changed lease.
pub fn apply_change(
    lease: &mut Lease,
    change: &LeaseChange,
    view: &AccessView,
) -> Result<bool, Status> {
    let mut l = lease.clone();
    if let Some(t) = &change.times {
        let started = l.assigned_exporter().is_some();
        if let Some(b) = t.begin
            && started
            && l.spec.begin_time.as_ref().map(|x| x.0) != Some(b)
        {
            return Err(Status::invalid_argument(
                "cannot update BeginTime: lease has already started",
            ));
        }
        if !started {
            l.spec.begin_time = t.begin.map(metav1::Time);
        }
        l.spec.duration = t.duration.map(GoDuration);
        l.spec.end_time = t.end.map(metav1::Time);
    }
    if let Some(c) = &change.new_client {
        if l.assigned_exporter().is_none() || l.is_ended() {
            return Err(Status::failed_precondition(
                "only an active lease can be transferred",
            ));
        }
        l.spec.client_ref.name = c.clone();
        // The new owner is no longer one of the clients the lease is shared with.
        l.spec.shared_with.retain(|n| n != c);
    }
    if !l.is_ended() {
        check_access(&l, &view.exporters, &view.policies, &view.clients).map_err(|denied| {
            Status::permission_denied(format!("the lease change is refused: {denied}"))
        })?;
    }
    let labels = lease_labels(&l);
    l.metadata.labels = (!labels.is_empty()).then_some(labels);
    *lease = l;
    Ok(true)
}

#[cfg(test)]
mod tests;
