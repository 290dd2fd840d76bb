//! Authentication of callers: tokens of our own issuer, or of a configured external OIDC
//! issuer (then authorized by the object's `spec.username`, optionally provisioning Clients).

use std::sync::Arc;

use jumpstarter_core::auth::ObjectKind;

use crate::auth::{AuthMetadata, TokenIssuer};
use tonic::{Status, metadata::MetadataMap};

use super::errors::store_status;
use crate::{
    auth::external_auth::ExternalAuth,
    lease::object_view::{ViewSlot, read_view},
    objects::{Client, Exporter},
    store::{Store, StoreError},
};

/// Who called an RPC, after authentication.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    /// Client or Exporter.
    pub kind: ObjectKind,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

/// Authenticates the callers of the controller's RPCs against a store.
pub struct Authenticator<S: Store> {
    store: S,
    /// Mints and verifies client and exporter tokens.
    pub issuer: Arc<TokenIssuer>,
    /// External OIDC issuers (tried before the internal issuer) and Client provisioning.
    pub external_auth: ExternalAuth,
    /// When each client was last heard from (every authenticated client call notes it).
    pub client_activity: crate::lease::pending_guard::ClientActivity,
    /// Where an exporter's uid is looked up before the store (see
    /// [`super::ExporterCache::cached_uid`]).
    pub exporters: Option<Arc<super::ExporterCache>>,
    /// The clients, whose uids a client's token must match, when the store's watch is
    /// synchronous (see [`crate::lease::object_view`]): with 1,000 leases asked at once, each
    /// one read and decoded its client, and a reconcile pass's own reads queued behind them.
    clients: ViewSlot<Client>,
}

impl<S: Store> Authenticator<S> {
    /// Verifies our own tokens with `issuer`; no external issuers.
    pub fn new(store: S, issuer: Arc<TokenIssuer>) -> Self {
        Self {
            store,
            issuer,
            external_auth: ExternalAuth::default(),
            client_activity: Default::default(),
            exporters: None,
            clients: ViewSlot::default(),
        }
    }

    /// Authenticates a caller of the expected kind (§2.1 of the protocol notes).
    ///
    /// - A token whose `iss` is a configured external issuer is verified by it; the object
    ///   is the one named by `jumpstarter-name` or derived from the username, and its
    ///   `spec.username` must equal the username (see `authorize_external`).
    /// - Any other token must be ours: subject matching the `jumpstarter-*` metadata, object
    ///   existing with the token's uid.
    pub async fn authenticate(
        &self,
        md: &MetadataMap,
        expected: ObjectKind,
    ) -> Result<Caller, Status> {
        let caller = self.authenticate_caller(md, expected).await?;
        if caller.kind == ObjectKind::Client {
            self.client_activity.note(&caller.namespace, &caller.name);
        }
        Ok(caller)
    }

    /// Where the view of the clients is kept (for the reconcile loop, which needs every
    /// client's labels when there are access policies).
    pub(crate) fn client_view(&self) -> &ViewSlot<Client> {
        &self.clients
    }

    /// The uid of client `namespace/name` (`None`: no such client): from the client view when
    /// the store's watch is synchronous (then as exact as a read), else read.
    async fn client_uid(&self, namespace: &str, name: &str) -> Result<Option<String>, Status> {
        let uid = |c: &Client| c.metadata.uid.clone();
        if self.store.watch_is_synchronous() {
            return read_view(&self.store, &self.clients, |v| {
                v.get(namespace, name).and_then(uid)
            })
            .await
            .map_err(store_status);
        }
        Ok(self
            .store
            .get::<Client>(namespace, name)
            .await
            .map_err(store_status)?
            .as_ref()
            .and_then(uid))
    }

    async fn authenticate_caller(
        &self,
        md: &MetadataMap,
        expected: ObjectKind,
    ) -> Result<Caller, Status> {
        let meta = AuthMetadata::from_metadata(md)?;
        if let Some(verifier) = self.external_auth.verifier_for(&meta.token) {
            let username = verifier
                .verify(&meta.token)
                .await
                .map_err(|e| e.to_controller_status())?;
            return self.authorize_external(meta, expected, &username).await;
        }
        let subject = self
            .issuer
            .verify(&meta.token)
            .map_err(|e| e.to_controller_status())?;
        let kind = ObjectKind::from_metadata(&meta.kind).ok_or_else(|| {
            Status::invalid_argument(format!("unknown object kind {:?}", meta.kind))
        })?;
        if kind != expected {
            return Err(Status::invalid_argument("object kind mismatch"));
        }
        let name = meta
            .name
            .ok_or_else(|| Status::invalid_argument("missing metadata: jumpstarter-name"))?;
        let denied = || {
            Status::permission_denied(format!(
                "permission denied for {} {}/{}",
                kind.as_str().to_lowercase(),
                meta.namespace,
                name
            ))
        };
        if subject.kind != kind || subject.namespace != meta.namespace || subject.name != name {
            return Err(denied());
        }
        let uid = match kind {
            ObjectKind::Client => self.client_uid(&meta.namespace, &name).await?,
            ObjectKind::Exporter => match self
                .exporters
                .as_ref()
                .and_then(|c| c.cached_uid(&meta.namespace, &name))
            {
                Some(uid) => Some(uid),
                None => self
                    .store
                    .get::<Exporter>(&meta.namespace, &name)
                    .await
                    .map_err(store_status)?
                    .and_then(|e| e.metadata.uid),
            },
        };
        match uid {
            Some(uid) if uid == subject.uid => Ok(Caller {
                kind,
                namespace: meta.namespace,
                name,
                uid,
            }),
            _ => Err(denied()),
        }
    }

    /// Authorizes an externally authenticated `username` (upstream's BasicAuthorizer): the
    /// object named by `jumpstarter-name` (or derived from the username) must have
    /// `spec.username == username`. A missing Client is created with that username when
    /// provisioning is on; otherwise a missing object is `NOT_FOUND`.
    async fn authorize_external(
        &self,
        meta: AuthMetadata,
        expected: ObjectKind,
        username: &str,
    ) -> Result<Caller, Status> {
        let kind = ObjectKind::from_metadata(&meta.kind).ok_or_else(|| {
            Status::invalid_argument(format!("unknown object kind {:?}", meta.kind))
        })?;
        if kind != expected {
            return Err(Status::invalid_argument("object kind mismatch"));
        }
        let name = crate::auth::resolve_object_name(
            username,
            crate::auth::INTERNAL_USERNAME_PREFIX,
            meta.name.as_deref(),
        )?;
        let namespace = meta.namespace;
        let denied = || {
            Status::permission_denied(format!(
                "permission denied for {} {namespace}/{name}",
                kind.as_str().to_lowercase(),
            ))
        };
        let not_found = || {
            Status::not_found(format!(
                "{} {namespace}/{name} not found",
                kind.as_str().to_lowercase()
            ))
        };
        let (owner, uid) = match kind {
            ObjectKind::Client => {
                let found = self
                    .store
                    .get::<Client>(&namespace, &name)
                    .await
                    .map_err(store_status)?;
                let client = match found {
                    Some(c) => c,
                    None if self.external_auth.provisioning => {
                        self.provision_client(&namespace, &name, username).await?
                    }
                    None => return Err(not_found()),
                };
                (client.spec.username, client.metadata.uid)
            }
            ObjectKind::Exporter => {
                let e = self
                    .store
                    .get::<Exporter>(&namespace, &name)
                    .await
                    .map_err(store_status)?
                    .ok_or_else(not_found)?;
                (e.spec.username, e.metadata.uid)
            }
        };
        if owner.as_deref() != Some(username) {
            return Err(denied());
        }
        Ok(Caller {
            kind,
            namespace: namespace.clone(),
            name: name.clone(),
            uid: uid.unwrap_or_default(),
        })
    }

    /// Creates the Client `namespace/name` for `username` (provisioning); a concurrent
    /// creation by another call is fine: the stored object is used.
    async fn provision_client(
        &self,
        namespace: &str,
        name: &str,
        username: &str,
    ) -> Result<Client, Status> {
        let mut obj = Client::new(
            name,
            crate::objects::ClientSpec {
                username: Some(username.to_owned()),
            },
        );
        obj.metadata.namespace = Some(namespace.to_owned());
        match self.store.create(&obj).await {
            Ok(c) => {
                tracing::info!("provisioned client {namespace}/{name} for {username}");
                Ok(c)
            }
            Err(StoreError::AlreadyExists { .. }) => self
                .store
                .get::<Client>(namespace, name)
                .await
                .map_err(store_status)?
                .ok_or_else(|| Status::aborted(format!("client {namespace}/{name} vanished"))),
            Err(e) => Err(store_status(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use jumpstarter_core::auth::{KIND_KEY, NAME_KEY, NAMESPACE_KEY, Subject};

    use super::*;
    use crate::store::SqliteStore;

    /// A client's call metadata with a token for `uid`.
    fn metadata(issuer: &TokenIssuer, name: &str, uid: &str) -> MetadataMap {
        let subject = Subject::new(ObjectKind::Client, "default", name, uid);
        let token = issuer.issue(&subject).unwrap().token;
        let mut md = MetadataMap::new();
        md.insert("authorization", format!("Bearer {token}").parse().unwrap());
        md.insert(KIND_KEY, "Client".parse().unwrap());
        md.insert(NAMESPACE_KEY, "default".parse().unwrap());
        md.insert(NAME_KEY, name.parse().unwrap());
        md
    }

    async fn create_client(store: &SqliteStore, name: &str) -> String {
        let mut c = Client::new(name, Default::default());
        c.metadata.namespace = Some("default".into());
        store.create(&c).await.unwrap().metadata.uid.unwrap()
    }

    /// Issue 27: with the embedded store a client's uid comes from the client view, not a
    /// read per call; the view must be as exact as the read: a client created, deleted or
    /// re-created under the same name is seen at once.
    #[tokio::test]
    async fn client_tokens_follow_the_clients_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let issuer = Arc::new(TokenIssuer::generate().unwrap());
        let auth = Authenticator::new(store.clone(), issuer.clone());
        let ok = |r: Result<Caller, Status>| r.map(|c| c.uid).map_err(|s| s.code());
        // Before the first client exists (the view starts empty).
        let md = metadata(&issuer, "alice", "no-such-uid");
        assert_eq!(
            ok(auth.authenticate(&md, ObjectKind::Client).await),
            Err(tonic::Code::PermissionDenied)
        );
        let uid = create_client(&store, "alice").await;
        let md = metadata(&issuer, "alice", &uid);
        assert_eq!(
            ok(auth.authenticate(&md, ObjectKind::Client).await),
            Ok(uid.clone())
        );
        // Deleted: refused right away.
        store
            .delete::<Client>("default", "alice", None)
            .await
            .unwrap();
        assert_eq!(
            ok(auth.authenticate(&md, ObjectKind::Client).await),
            Err(tonic::Code::PermissionDenied)
        );
        // Re-created: the old token is refused, a new one for the new uid accepted.
        let new_uid = create_client(&store, "alice").await;
        assert_ne!(new_uid, uid);
        assert_eq!(
            ok(auth.authenticate(&md, ObjectKind::Client).await),
            Err(tonic::Code::PermissionDenied)
        );
        let md = metadata(&issuer, "alice", &new_uid);
        assert_eq!(
            ok(auth.authenticate(&md, ObjectKind::Client).await),
            Ok(new_uid)
        );
        // More clients made between two calls than tokio lets a task take from a channel at
        // once: the last one is still seen.
        for i in 0..200 {
            create_client(&store, &format!("c-{i}")).await;
        }
        let last = create_client(&store, "last").await;
        let md = metadata(&issuer, "last", &last);
        assert_eq!(
            ok(auth.authenticate(&md, ObjectKind::Client).await),
            Ok(last)
        );
    }
}
