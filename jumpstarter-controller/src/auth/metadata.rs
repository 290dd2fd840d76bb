//! The authentication metadata of controller RPCs, parsed with upstream's codes and messages.

use jumpstarter_core::auth::{KIND_KEY, NAME_KEY, NAMESPACE_KEY, bearer_token};
use tonic::{Status, metadata::MetadataMap};

/// What a caller of a controller RPC claims to be, before its token is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthMetadata {
    /// The bearer token (without `Bearer `).
    pub token: String,
    /// `jumpstarter-kind`, verbatim. Use [`jumpstarter_core::auth::ObjectKind::from_metadata`]; upstream's
    /// authorizer denies unknown kinds.
    pub kind: String,
    /// `jumpstarter-namespace`.
    pub namespace: String,
    /// `jumpstarter-name`, when sent. Required for internal (controller-issued) tokens; for
    /// external OIDC tokens the name can be derived from the username instead
    /// ([`resolve_object_name`]).
    pub name: Option<String>,
}

impl AuthMetadata {
    /// Parses the metadata of a controller RPC:
    /// - `authorization`: exactly one, `Bearer <token>` (scheme case-insensitive); missing →
    ///   `UNAUTHENTICATED "missing authorization header"`, several → `INVALID_ARGUMENT
    ///   "multiple authorization headers"`, other → `INVALID_ARGUMENT "malformed authorization
    ///   header"`;
    /// - `jumpstarter-kind` and `jumpstarter-namespace`: exactly one each, else
    ///   `INVALID_ARGUMENT "missing metadata: <key>"` / `"multiple metadata: <key>"`;
    /// - `jumpstarter-name`: at most one.
    pub fn from_metadata(md: &MetadataMap) -> Result<Self, Status> {
        let token = bearer_token(md)?;
        let kind = single(md, KIND_KEY)?
            .ok_or_else(|| Status::invalid_argument(format!("missing metadata: {KIND_KEY}")))?;
        let namespace = single(md, NAMESPACE_KEY)?.ok_or_else(|| {
            Status::invalid_argument(format!("missing metadata: {NAMESPACE_KEY}"))
        })?;
        let name = single(md, NAME_KEY)?;
        Ok(AuthMetadata {
            token,
            kind,
            namespace,
            name,
        })
    }
}

/// The one value of `key`, `None` when absent; several values or a non-ASCII value are
/// `INVALID_ARGUMENT`.
fn single(md: &MetadataMap, key: &str) -> Result<Option<String>, Status> {
    let mut values = md.get_all(key).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Status::invalid_argument(format!(
            "multiple metadata: {key}"
        )));
    }
    first
        .to_str()
        .map(|v| Some(v.to_owned()))
        .map_err(|_| Status::invalid_argument(format!("invalid metadata: {key}")))
}

/// The object name upstream derives from an external OIDC username: drop the provider prefix
/// (up to the first `:`; for `system:serviceaccount:<ns>:<name>` keep `<ns>:<name>`),
/// lowercase, replace every character outside `[-a-zA-Z0-9]` with `-`, collapse runs of `-`,
/// trim `-` at both ends, and cut to 63 characters.
pub fn derive_object_name(username: &str) -> String {
    let rest = match username.split_once(':') {
        Some((_, rest)) => rest.strip_prefix("system:serviceaccount:").unwrap_or(rest),
        None => username,
    };
    let mut out = String::with_capacity(rest.len());
    for c in rest.chars().flat_map(char::to_lowercase) {
        let c = if c.is_ascii_alphanumeric() || c == '-' {
            c
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    let trimmed = out.trim_matches('-');
    trimmed.chars().take(63).collect()
}

/// The object name a caller acts as (upstream's attribute extraction, §2.1 step 3).
///
/// - Internal tokens (username starting with `internal_prefix`) and service accounts
///   (`<provider>:system:serviceaccount:…`): `jumpstarter-name` is required and used as is.
/// - Other (external OIDC) usernames: the name is [`derive_object_name`]; a supplied
///   `jumpstarter-name` must equal it, else `INVALID_ARGUMENT "resource name mismatch …"`.
pub fn resolve_object_name(
    username: &str,
    internal_prefix: &str,
    supplied: Option<&str>,
) -> Result<String, Status> {
    let service_account = username
        .split_once(':')
        .is_some_and(|(_, rest)| rest.starts_with("system:serviceaccount:"));
    if username.starts_with(internal_prefix) || service_account {
        return supplied
            .map(str::to_owned)
            .ok_or_else(|| Status::invalid_argument(format!("missing metadata: {NAME_KEY}")));
    }
    let derived = derive_object_name(username);
    match supplied {
        Some(name) if name != derived => Err(Status::invalid_argument(format!(
            "resource name mismatch: {NAME_KEY} is {name:?} but the name derived from username {username:?} is {derived:?}"
        ))),
        _ => Ok(derived),
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn md(pairs: &[(&'static str, &str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.append(*k, v.parse().unwrap());
        }
        m
    }

    fn full() -> Vec<(&'static str, &'static str)> {
        vec![
            ("authorization", "Bearer tok.en"),
            (KIND_KEY, "Client"),
            (NAMESPACE_KEY, "lab"),
            (NAME_KEY, "alice"),
        ]
    }

    #[test]
    fn parses_complete_metadata() {
        let got = AuthMetadata::from_metadata(&md(&full())).unwrap();
        assert_eq!(
            got,
            AuthMetadata {
                token: "tok.en".into(),
                kind: "Client".into(),
                namespace: "lab".into(),
                name: Some("alice".into()),
            }
        );
        let mut no_name = full();
        no_name.pop();
        assert_eq!(
            AuthMetadata::from_metadata(&md(&no_name)).unwrap().name,
            None
        );
        let lower = md(&[("authorization", "bEaReR abc")]);
        assert_eq!(bearer_token(&lower).unwrap(), "abc");
    }

    fn err(pairs: &[(&'static str, &str)]) -> Status {
        AuthMetadata::from_metadata(&md(pairs)).unwrap_err()
    }

    #[test]
    fn authorization_errors_match_upstream() {
        let st = err(&full()[1..]);
        assert_eq!(
            (st.code(), st.message()),
            (Code::Unauthenticated, "missing authorization header")
        );
        let mut two = full();
        two.push(("authorization", "Bearer other"));
        let st = err(&two);
        assert_eq!(
            (st.code(), st.message()),
            (Code::InvalidArgument, "multiple authorization headers")
        );
        for bad in ["Basic abc", "Bearer", "Bearerabc", "token"] {
            let mut m = full();
            m[0] = ("authorization", bad);
            let st = err(&m);
            assert_eq!(
                (st.code(), st.message()),
                (Code::InvalidArgument, "malformed authorization header"),
                "{bad:?}"
            );
        }
        // "Bearer " with an empty token is well-formed here; the verifier rejects it.
        assert_eq!(
            bearer_token(&md(&[("authorization", "Bearer ")])).unwrap(),
            ""
        );
    }

    #[test]
    fn attribute_errors_match_upstream() {
        let st = err(&[full()[0], full()[2]]);
        assert_eq!(
            (st.code(), st.message()),
            (Code::InvalidArgument, "missing metadata: jumpstarter-kind")
        );
        let st = err(&[full()[0], full()[1]]);
        assert_eq!(
            (st.code(), st.message()),
            (
                Code::InvalidArgument,
                "missing metadata: jumpstarter-namespace"
            )
        );
        let mut m = full();
        m.push((NAMESPACE_KEY, "other"));
        let st = err(&m);
        assert_eq!(
            (st.code(), st.message()),
            (
                Code::InvalidArgument,
                "multiple metadata: jumpstarter-namespace"
            )
        );
        let mut m = full();
        m.push((NAME_KEY, "bob"));
        assert_eq!(err(&m).message(), "multiple metadata: jumpstarter-name");
    }

    #[test]
    fn name_derivation_follows_upstream_rules() {
        assert_eq!(
            derive_object_name("dex:Alice.Smith@Example.com"),
            "alice-smith-example-com"
        );
        assert_eq!(derive_object_name("kc:__weird__name__"), "weird-name");
        assert_eq!(
            derive_object_name("k8s:system:serviceaccount:lab:runner"),
            "lab-runner"
        );
        assert_eq!(derive_object_name("noprefix"), "noprefix");
        assert_eq!(
            derive_object_name(&format!("p:{}", "a".repeat(100))).len(),
            63
        );
        assert_eq!(derive_object_name("p:---"), "");
    }

    #[test]
    fn name_resolution() {
        assert_eq!(
            resolve_object_name("internal:client:lab:alice:uid", "internal:", Some("alice"))
                .unwrap(),
            "alice"
        );
        let st =
            resolve_object_name("internal:client:lab:alice:uid", "internal:", None).unwrap_err();
        assert_eq!(st.message(), "missing metadata: jumpstarter-name");
        assert_eq!(
            resolve_object_name("dex:Bob", "internal:", None).unwrap(),
            "bob"
        );
        assert_eq!(
            resolve_object_name("dex:Bob", "internal:", Some("bob")).unwrap(),
            "bob"
        );
        let st = resolve_object_name("dex:Bob", "internal:", Some("alice")).unwrap_err();
        assert_eq!(st.code(), Code::InvalidArgument);
        assert!(st.message().starts_with("resource name mismatch"));
        assert_eq!(
            resolve_object_name(
                "sa:system:serviceaccount:lab:runner",
                "internal:",
                Some("x")
            )
            .unwrap(),
            "x"
        );
    }
}
