//! Authentication of callers: tokens of our own issuer, or of a configured external OIDC
//! issuer (then authorized by the object's `spec.username`, optionally provisioning Clients).

use std::sync::Arc;

use jumpstarter_core::auth::ObjectKind;

use crate::auth::{AuthMetadata, TokenIssuer};
use tonic::{Status, metadata::MetadataMap};

use super::errors::store_status;
use crate::{
    external_auth::ExternalAuth,
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
    pub client_activity: crate::pending_guard::ClientActivity,
    /// Where an exporter's uid is looked up before the store (see
    /// [`super::ExporterCache::cached_uid`]).
    pub exporters: Option<Arc<super::ExporterCache>>,
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
            ObjectKind::Client => self
                .store
                .get::<Client>(&meta.namespace, &name)
                .await
                .map_err(store_status)?
                .and_then(|c| c.metadata.uid),
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
