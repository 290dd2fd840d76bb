//! Credential Secrets laid out as upstream's reconcilers keep them (§3.1): a Client's token in
//! the Secret `<name>-client`, an Exporter's in `<name>-exporter`, type `Opaque`, key `token`,
//! with a controller owner reference to the object (so the Secret goes when the object
//! does). `jmp admin create` of upstream reads them, so a cluster keeps its credentials when it
//! moves between controllers. Works on any [`Store`] (Secrets are namespaced objects).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Because, Store, StoreError, StoreObject, controller_reference};

/// The key of the token in the Secret's data.
pub const TOKEN_KEY: &str = "token";

/// How many times [`put_credential`] re-reads and retries after a conflicting write.
const CONFLICT_RETRIES: usize = 5;

fn invalid<K: StoreObject>(owner: &K, reason: &str) -> StoreError {
    StoreError::Invalid {
        kind: K::kind(&()).into_owned(),
        namespace: owner.meta().namespace.clone().unwrap_or_default(),
        name: owner.meta().name.clone().unwrap_or_default(),
        source: reason.into(),
    }
}

/// `<name>-client` for a Client, `<name>-exporter` for an Exporter (`<name>-<kind>` in
/// lowercase for any kind).
pub fn secret_name<K: StoreObject>(owner: &K) -> String {
    format!(
        "{}-{}",
        owner.meta().name.as_deref().unwrap_or_default(),
        K::kind(&()).to_lowercase()
    )
}

/// The Secret holding `token` for `owner` (which must be stored: it needs its uid for the
/// owner reference).
pub fn credential_secret<K: StoreObject>(owner: &K, token: &str) -> Result<Secret, StoreError> {
    let (Some(namespace), Some(owner_ref)) = (&owner.meta().namespace, controller_reference(owner))
    else {
        return Err(invalid(
            owner,
            "a credential Secret needs the owner's name, namespace and uid (store it first)",
        ));
    };
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(owner)),
            namespace: Some(namespace.clone()),
            owner_references: Some(vec![owner_ref]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            TOKEN_KEY.to_owned(),
            ByteString(token.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    })
}

/// Creates or updates `owner`'s credential Secret so that it holds `token`; returns it as
/// stored.
pub async fn put_credential<S: Store, K: StoreObject>(
    store: &S,
    owner: &K,
    token: &str,
) -> Result<Secret, StoreError> {
    let wanted = credential_secret(owner, token)?;
    let namespace = wanted.metadata.namespace.clone().unwrap_or_default();
    let name = wanted.metadata.name.clone().unwrap_or_default();
    match store.create(&wanted).await {
        Err(StoreError::AlreadyExists { .. }) => {}
        other => return other,
    }
    let mut attempt = 0;
    loop {
        let Some(mut current) = store.get::<Secret>(&namespace, &name).await? else {
            // Deleted since: create it again.
            return store.create(&wanted).await;
        };
        current.data = wanted.data.clone();
        current.type_ = wanted.type_.clone();
        current.metadata.owner_references = wanted.metadata.owner_references.clone();
        match store.update(&current).await {
            Err(e) if e.is_conflict() && attempt < CONFLICT_RETRIES => attempt += 1,
            other => return other,
        }
    }
}

/// The token in the Secret `namespace/name`, or `None` when the Secret or its `token` key is
/// missing.
pub async fn read_credential<S: Store>(
    store: &S,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, StoreError> {
    let Some(secret) = store.get::<Secret>(namespace, name).await? else {
        return Ok(None);
    };
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(TOKEN_KEY)) else {
        return Ok(None);
    };
    String::from_utf8(bytes.0.clone())
        .map(Some)
        .map_err(|e| StoreError::Corrupt {
            kind: "Secret".into(),
            namespace: namespace.into(),
            name: name.into(),
            source: Because::boxed(format!("{TOKEN_KEY} is not UTF-8"), e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{Client, ClientSpec, Exporter, ExporterSpec};
    use crate::store::SqliteStore;

    #[tokio::test]
    async fn secrets_are_named_owned_and_updated() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let mut e = Exporter::new("board-1", ExporterSpec::default());
        e.metadata.namespace = Some("lab".into());
        let unsaved = e.clone();
        let err = credential_secret(&unsaved, "t").unwrap_err();
        assert!(err.to_string().contains("Exporter lab/board-1"), "{err}");
        let e = store.create(&e).await.unwrap();
        let s = put_credential(&store, &e, "first").await.unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("board-1-exporter"));
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("Exporter", Some(true))
        );
        assert_eq!(owner.uid, e.metadata.uid.clone().unwrap());
        put_credential(&store, &e, "second").await.unwrap();
        assert_eq!(
            read_credential(&store, "lab", "board-1-exporter")
                .await
                .unwrap()
                .as_deref(),
            Some("second")
        );
        let mut c = Client::new("alice", ClientSpec::default());
        c.metadata.namespace = Some("lab".into());
        c.metadata.uid = Some("u".into());
        assert_eq!(secret_name(&c), "alice-client");
        assert_eq!(read_credential(&store, "lab", "nope").await.unwrap(), None);
    }

    #[tokio::test]
    async fn non_utf8_tokens_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).await.unwrap();
        let mut s = Secret::default();
        s.metadata.name = Some("x-client".into());
        s.metadata.namespace = Some("lab".into());
        s.data = Some(BTreeMap::from([(
            TOKEN_KEY.to_owned(),
            ByteString(vec![0xff, 0xfe]),
        )]));
        store.create(&s).await.unwrap();
        let err = read_credential(&store, "lab", "x-client")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("Secret lab/x-client"), "{err}");
    }
}
