//! The controller as a client sees it (`ClientService`): leases (get, list, create, update,
//! delete) and exporters (get, list), every list with its paging, in the shape kube-rs gives
//! `Api<T>`: one [`ControllerClient`] per client config, one request type per write.
//!
//! Every lease request of this workspace is built here ([`LeaseRequest`], [`LeaseUpdate`]),
//! and every lease duration goes to the wire through [`proto_duration`] (exact, no float).

use std::{collections::BTreeMap, time::Duration, time::SystemTime};

use jumpstarter_proto::client_v1::{
    CreateLeaseRequest, DeleteLeaseRequest, Exporter, GetExporterRequest, GetLeaseRequest, Lease,
    ListExportersRequest, ListLeasesRequest, RotateTokenRequest, RotateTokenResponse,
    UpdateLeaseRequest, client_service_client::ClientServiceClient,
};
use tonic::Code;

use crate::{
    client::{
        channel::{AuthChannel, TlsSettings, client_credentials, connect_client},
        lease_error::LeaseError,
    },
    config::ClientConfig,
};

/// What to lease: by label selector, by exporter name, or both.
///
/// ```
/// use std::time::Duration;
/// use jumpstarter_core::LeaseRequest;
/// let request = LeaseRequest::new("board=rpi4", Duration::from_secs(1800)).with_tag("ci", "nightly");
/// assert!(request.check().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaseRequest {
    /// Label selector (`k=v,k2!=v2`), may be empty when `exporter_name` is set.
    pub selector: String,
    /// A specific exporter.
    pub exporter_name: Option<String>,
    /// How long.
    pub duration: Duration,
    /// When the lease should begin (default: as soon as possible).
    pub begin_time: Option<SystemTime>,
    /// Tags to set on the lease.
    pub tags: BTreeMap<String, String>,
    /// A lease name to ask for (default: the controller picks one).
    pub lease_id: Option<String>,
    /// Whether a disabled exporter may be leased (an admin's choice on the controller).
    pub allow_disabled: bool,
    /// Other clients of the namespace to share the lease with (their names): they may use,
    /// extend and release it too.
    pub shared_with: Vec<String>,
    /// What the lease is for (`build_id`, `image_digest`, a VCS ref): immutable once set,
    /// on every log line of the lease (upstream main's lease context).
    pub context: BTreeMap<String, String>,
}

impl LeaseRequest {
    /// A request by selector.
    pub fn new(selector: impl Into<String>, duration: Duration) -> Self {
        Self {
            selector: selector.into(),
            duration,
            ..Self::default()
        }
    }

    /// Asks for this exporter (with or without a selector).
    pub fn with_exporter(mut self, name: impl Into<String>) -> Self {
        self.exporter_name = Some(name.into());
        self
    }

    /// Adds a tag.
    pub fn with_tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }

    /// Adds an entry to the lease's context.
    pub fn with_context(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.context.insert(key.into(), value.into());
        self
    }

    /// Asks for this lease name, so that the lease can be released even when its creation
    /// was interrupted before the answer came.
    pub fn with_lease_id(mut self, id: impl Into<String>) -> Self {
        self.lease_id = Some(id.into());
        self
    }

    /// Shares the lease with these clients of the same namespace (their names).
    pub fn with_shared_with<I, T>(mut self, clients: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.shared_with.extend(clients.into_iter().map(Into::into));
        self
    }

    /// Begins the lease at `at` instead of as soon as possible.
    pub fn with_begin_time(mut self, at: SystemTime) -> Self {
        self.begin_time = Some(at);
        self
    }

    /// Refuses a request without a selector or exporter name, with an empty exporter name
    /// or with a zero duration.
    pub fn check(&self) -> Result<(), LeaseError> {
        if let Some(name) = &self.exporter_name
            && name.trim().is_empty()
        {
            return Err(LeaseError::Invalid(
                "the exporter name (--name/-n) must not be empty".into(),
            ));
        }
        if self.selector.trim().is_empty() && self.exporter_name.is_none() {
            return Err(LeaseError::Invalid(
                "one of --selector/-l or --name/-n is required".into(),
            ));
        }
        if self.duration.is_zero() {
            return Err(LeaseError::Invalid(
                "the lease duration must be positive".into(),
            ));
        }
        check_client_names("--share", &self.shared_with)
    }

    /// The `CreateLease` request for namespace `namespace` (the only builder of one).
    fn to_proto(&self, namespace: &str) -> Result<CreateLeaseRequest, LeaseError> {
        self.check()?;
        let lease = Lease {
            selector: self.selector.trim().to_string(),
            duration: Some(proto_duration(self.duration)?),
            begin_time: self.begin_time.map(prost_types::Timestamp::from),
            exporter_name: self.exporter_name.clone(),
            tags: self.tags.clone().into_iter().collect(),
            allow_disabled: self.allow_disabled,
            shared_with: self.shared_with.clone(),
            context: self.context.clone().into_iter().collect(),
            ..Default::default()
        };
        Ok(CreateLeaseRequest {
            parent: format!("namespaces/{namespace}"),
            lease_id: self.lease_id.clone().unwrap_or_default(),
            lease: Some(lease),
        })
    }
}

/// What to change on a lease (`UpdateLease`); fields left `None` stay as they are.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaseUpdate {
    /// A new duration.
    pub duration: Option<Duration>,
    /// A new begin time.
    pub begin_time: Option<SystemTime>,
    /// Transfer the lease to this client of the same namespace (its short name).
    pub to_client: Option<String>,
    /// Share the lease with these clients too (only its owner may).
    pub share_add: Vec<String>,
    /// Stop sharing the lease with these clients (only its owner may).
    pub share_remove: Vec<String>,
}

impl LeaseUpdate {
    fn to_proto(
        &self,
        resource: String,
        namespace: &str,
    ) -> Result<UpdateLeaseRequest, LeaseError> {
        if let Some(c) = &self.to_client
            && (c.is_empty() || c.contains('/'))
        {
            return Err(LeaseError::Invalid(format!(
                "invalid client {c:?}: give the name of a client in the same namespace"
            )));
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            return Err(LeaseError::Invalid(
                "the lease duration must be positive".into(),
            ));
        }
        check_client_names("--share-add", &self.share_add)?;
        check_client_names("--share-remove", &self.share_remove)?;
        let mut paths = Vec::new();
        if self.duration.is_some() {
            paths.push("duration".to_string());
        }
        if self.begin_time.is_some() {
            paths.push("begin_time".to_string());
        }
        if self.to_client.is_some() {
            paths.push("client".to_string());
        }
        let lease = Lease {
            name: resource,
            duration: self.duration.map(proto_duration).transpose()?,
            begin_time: self.begin_time.map(prost_types::Timestamp::from),
            client: self
                .to_client
                .as_deref()
                .map(|c| format!("namespaces/{namespace}/clients/{c}")),
            ..Default::default()
        };
        Ok(UpdateLeaseRequest {
            lease: Some(lease),
            update_mask: Some(prost_types::FieldMask { paths }),
            add_shared_with: self.share_add.clone(),
            remove_shared_with: self.share_remove.clone(),
        })
    }
}

/// Refuses an empty client name in a list given with `flag` (the controller checks the rest:
/// that each names a client of the namespace, once, and not the owner).
fn check_client_names(flag: &str, names: &[String]) -> Result<(), LeaseError> {
    if names.iter().any(|n| n.trim().is_empty()) {
        return Err(LeaseError::Invalid(format!(
            "{flag}: a client name must not be empty"
        )));
    }
    Ok(())
}

/// Which exporters to list.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExporterQuery {
    /// Label selector (empty: all).
    pub selector: String,
    /// Include the labels an admin hid from clients.
    pub show_hidden_labels: bool,
    /// Page size asked of the controller (0: its default).
    pub page_size: i32,
}

/// Which leases to list.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaseQuery {
    /// Label selector on the leases' exporters (empty: all).
    pub selector: String,
    /// Include ended leases.
    pub include_ended: bool,
    /// Tag selector (empty: all).
    pub tag_filter: String,
    /// Page size asked of the controller (0: its default).
    pub page_size: i32,
}

/// One page of a list, and the token of the next (`None` after the last).
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items of this page.
    pub items: Vec<T>,
    /// Pass to the next call to get the next page.
    pub next_page_token: Option<String>,
}

/// A lease duration as the wire carries it: exact to the nanosecond, no float on the way.
pub fn proto_duration(d: Duration) -> Result<prost_types::Duration, LeaseError> {
    let too_long = || LeaseError::Invalid(format!("the duration {d:?} is too long"));
    Ok(prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).map_err(|_| too_long())?,
        nanos: i32::try_from(d.subsec_nanos()).map_err(|_| too_long())?,
    })
}

/// A client's authenticated connection to its controller.
#[derive(Clone)]
pub struct ControllerClient {
    pub(crate) channel: AuthChannel,
    namespace: String,
    client_name: String,
    pub(crate) tls: TlsSettings,
}

impl std::fmt::Debug for ControllerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerClient")
            .field("namespace", &self.namespace)
            .field("client_name", &self.client_name)
            .finish_non_exhaustive()
    }
}

impl ControllerClient {
    /// Connects as the client of `cfg`, with its `grpcOptions` applied (an option that
    /// cannot be is refused, naming it).
    pub async fn connect(cfg: &ClientConfig) -> Result<Self, LeaseError> {
        let (_, tls, auth) = client_credentials(cfg).map_err(LeaseError::Connect)?;
        let channel = connect_client(cfg).await.map_err(LeaseError::Connect)?;
        Ok(Self {
            channel,
            namespace: auth.namespace,
            client_name: auth.name,
            tls,
        })
    }

    /// The client's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The client's name.
    pub fn client_name(&self) -> &str {
        &self.client_name
    }

    /// The authenticated channel, for services beyond `ClientService` (such as this
    /// controller's extension API).
    pub fn channel(&self) -> AuthChannel {
        self.channel.clone()
    }

    fn rpc(&self) -> ClientServiceClient<AuthChannel> {
        ClientServiceClient::new(self.channel.clone())
    }

    /// `namespaces/NS/leases/NAME` of a short lease name (a full one is kept).
    pub fn lease_resource(&self, name: &str) -> String {
        if name.starts_with("namespaces/") {
            name.to_string()
        } else {
            format!("namespaces/{}/leases/{name}", self.namespace)
        }
    }

    fn exporter_resource(&self, name: &str) -> String {
        if name.starts_with("namespaces/") {
            name.to_string()
        } else {
            format!("namespaces/{}/exporters/{name}", self.namespace)
        }
    }

    /// Whether `lease` belongs to this client (clients see only their own, but a
    /// controller may show more to an admin's client).
    pub fn owns(&self, lease: &Lease) -> bool {
        lease
            .client
            .as_deref()
            .is_some_and(|c| c.rsplit('/').next() == Some(self.client_name.as_str()))
    }

    /// Whether this client may use `lease`: it owns it, or its owner shares it with this
    /// client (`shared_with`).
    pub fn may_use(&self, lease: &Lease) -> bool {
        self.owns(lease) || lease.shared_with.contains(&self.client_name)
    }

    /// One lease (short or `namespaces/NS/leases/NAME`).
    pub async fn get_lease(&self, name: &str) -> Result<Lease, LeaseError> {
        self.rpc()
            .get_lease(GetLeaseRequest {
                name: self.lease_resource(name),
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| LeaseError::rpc("GetLease", s))
    }

    /// Creates a lease (checked first: nothing is sent for a request that cannot succeed).
    pub async fn create_lease(&self, req: &LeaseRequest) -> Result<Lease, LeaseError> {
        let request = req.to_proto(&self.namespace)?;
        self.rpc()
            .create_lease(request)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| LeaseError::rpc("CreateLease", s))
    }

    /// Changes lease `name` as `update` says.
    pub async fn update_lease(
        &self,
        name: &str,
        update: &LeaseUpdate,
    ) -> Result<Lease, LeaseError> {
        let request = update.to_proto(self.lease_resource(name), &self.namespace)?;
        self.rpc()
            .update_lease(request)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| LeaseError::rpc("UpdateLease", s))
    }

    /// Deletes (ends) lease `name`.
    pub async fn delete_lease(&self, name: &str) -> Result<(), LeaseError> {
        self.rpc()
            .delete_lease(DeleteLeaseRequest {
                name: self.lease_resource(name),
            })
            .await
            .map(|_| ())
            .map_err(|s| LeaseError::rpc("DeleteLease", s))
    }

    /// Releases lease `name`, e.g. one whose acquisition was interrupted; a lease that does
    /// not exist (never created, or already gone) is not an error.
    pub async fn release_lease(&self, name: &str) -> Result<(), LeaseError> {
        match self.delete_lease(name).await {
            Err(LeaseError::Rpc {
                code: Code::NotFound,
                ..
            }) => Ok(()),
            other => other,
        }
    }

    /// One page of leases; `page_token` from the previous page (`None` for the first).
    pub async fn list_leases_page(
        &self,
        query: &LeaseQuery,
        page_token: Option<String>,
    ) -> Result<Page<Lease>, LeaseError> {
        let resp = self
            .rpc()
            .list_leases(ListLeasesRequest {
                parent: format!("namespaces/{}", self.namespace),
                page_size: query.page_size,
                page_token: page_token.unwrap_or_default(),
                filter: query.selector.clone(),
                only_active: Some(!query.include_ended),
                tag_filter: query.tag_filter.clone(),
            })
            .await
            .map_err(|s| LeaseError::rpc("ListLeases", s))?
            .into_inner();
        Ok(Page {
            items: resp.leases,
            next_page_token: Some(resp.next_page_token).filter(|t| !t.is_empty()),
        })
    }

    /// Every lease `query` matches, all pages.
    pub async fn list_leases(&self, query: &LeaseQuery) -> Result<Vec<Lease>, LeaseError> {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self.list_leases_page(query, token).await?;
            out.extend(page.items);
            match page.next_page_token {
                Some(next) => token = Some(next),
                None => return Ok(out),
            }
        }
    }

    /// One exporter (short or `namespaces/NS/exporters/NAME`).
    pub async fn get_exporter(
        &self,
        name: &str,
        show_hidden_labels: bool,
    ) -> Result<Exporter, LeaseError> {
        self.rpc()
            .get_exporter(GetExporterRequest {
                name: self.exporter_resource(name),
                show_hidden_labels,
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| LeaseError::rpc("GetExporter", s))
    }

    /// One page of exporters; `page_token` from the previous page (`None` for the first).
    pub async fn list_exporters_page(
        &self,
        query: &ExporterQuery,
        page_token: Option<String>,
    ) -> Result<Page<Exporter>, LeaseError> {
        let resp = self
            .rpc()
            .list_exporters(ListExportersRequest {
                parent: format!("namespaces/{}", self.namespace),
                page_size: query.page_size,
                page_token: page_token.unwrap_or_default(),
                filter: query.selector.clone(),
                show_hidden_labels: query.show_hidden_labels,
            })
            .await
            .map_err(|s| LeaseError::rpc("ListExporters", s))?
            .into_inner();
        Ok(Page {
            items: resp.exporters,
            next_page_token: Some(resp.next_page_token).filter(|t| !t.is_empty()),
        })
    }

    /// Every exporter `query` matches, all pages.
    pub async fn list_exporters(&self, query: &ExporterQuery) -> Result<Vec<Exporter>, LeaseError> {
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let page = self.list_exporters_page(query, token).await?;
            out.extend(page.items);
            match page.next_page_token {
                Some(next) => token = Some(next),
                None => return Ok(out),
            }
        }
    }

    /// Asks the controller for a new token for this client (the old one stays valid until
    /// it expires).
    pub async fn rotate_token(&self) -> Result<RotateTokenResponse, LeaseError> {
        self.rpc()
            .rotate_token(RotateTokenRequest {
                parent: format!("namespaces/{}", self.namespace),
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| LeaseError::rpc("RotateToken", s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_go_to_the_wire_exactly() {
        let d = proto_duration(Duration::new(1800, 123_456_789)).unwrap();
        assert_eq!((d.seconds, d.nanos), (1800, 123_456_789));
        // 0.1 s is not exact in binary floating point; here it must stay 100 ms.
        let d = proto_duration(Duration::from_millis(100)).unwrap();
        assert_eq!((d.seconds, d.nanos), (0, 100_000_000));
        assert!(proto_duration(Duration::from_secs(u64::MAX)).is_err());
    }

    #[test]
    fn requests_need_a_target_and_a_positive_duration() {
        let r = LeaseRequest::new("", Duration::from_secs(60));
        assert!(r.check().unwrap_err().to_string().contains("--selector"));
        let r = LeaseRequest::new("a=b", Duration::ZERO);
        assert!(
            r.check()
                .unwrap_err()
                .to_string()
                .contains("must be positive")
        );
        let r = LeaseRequest::new("", Duration::from_secs(1)).with_exporter(" ");
        assert!(
            r.check()
                .unwrap_err()
                .to_string()
                .contains("must not be empty")
        );
        let r = LeaseRequest::new("", Duration::from_secs(1)).with_exporter("ex");
        assert!(r.check().is_ok());
    }

    #[test]
    fn a_create_request_carries_every_field() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_110_400);
        let mut r = LeaseRequest::new(" board=rpi4 ", Duration::from_millis(1500))
            .with_exporter("ex1")
            .with_tag("ci", "nightly")
            .with_lease_id("my-lease")
            .with_begin_time(at);
        r.allow_disabled = true;
        let p = r.to_proto("lab").unwrap();
        assert_eq!(p.parent, "namespaces/lab");
        assert_eq!(p.lease_id, "my-lease");
        let l = p.lease.unwrap();
        assert_eq!(l.selector, "board=rpi4");
        assert_eq!(l.exporter_name.as_deref(), Some("ex1"));
        let d = l.duration.unwrap();
        assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
        assert_eq!(l.begin_time.unwrap().seconds, 1_704_110_400);
        assert_eq!(l.tags.get("ci").map(String::as_str), Some("nightly"));
        assert!(l.allow_disabled);
    }

    #[test]
    fn an_update_names_only_the_fields_it_changes() {
        let u = LeaseUpdate {
            duration: Some(Duration::from_secs(600)),
            to_client: Some("bob".into()),
            ..LeaseUpdate::default()
        };
        let p = u.to_proto("namespaces/lab/leases/x".into(), "lab").unwrap();
        assert_eq!(p.update_mask.unwrap().paths, ["duration", "client"]);
        let l = p.lease.unwrap();
        assert_eq!(l.client.as_deref(), Some("namespaces/lab/clients/bob"));
        assert_eq!(l.duration.unwrap().seconds, 600);
        assert!(l.begin_time.is_none());
        let bad = LeaseUpdate {
            to_client: Some("other/bob".into()),
            ..LeaseUpdate::default()
        };
        assert!(bad.to_proto(String::new(), "lab").is_err());
    }

    #[test]
    fn sharing_goes_on_the_wire_and_empty_names_are_refused() {
        let req = LeaseRequest::new("board=rpi4", Duration::from_secs(60))
            .with_shared_with(["bob", "carol"]);
        let p = req.to_proto("lab").unwrap();
        assert_eq!(p.lease.unwrap().shared_with, ["bob", "carol"]);
        assert!(
            LeaseRequest::new("board=rpi4", Duration::from_secs(60))
                .with_shared_with([" "])
                .check()
                .is_err()
        );
        let u = LeaseUpdate {
            share_add: vec!["dave".into()],
            share_remove: vec!["bob".into()],
            ..LeaseUpdate::default()
        };
        let p = u.to_proto("namespaces/lab/leases/x".into(), "lab").unwrap();
        assert_eq!(p.add_shared_with, ["dave"]);
        assert_eq!(p.remove_shared_with, ["bob"]);
        assert!(p.update_mask.unwrap().paths.is_empty());
        let bad = LeaseUpdate {
            share_add: vec![String::new()],
            ..LeaseUpdate::default()
        };
        assert!(bad.to_proto(String::new(), "lab").is_err());
    }
}
