//! External OIDC issuers the controller accepts tokens from (upstream's `authentication.jwt`,
//! a list of Kubernetes `JWTAuthenticator` documents), and Client provisioning.
//!
//! As in upstream's union of authenticators, a token goes to the external issuer whose URL
//! equals its (unverified) `iss`; every other token goes to the internal issuer, which comes
//! last. An external token's username is `claimMappings.username.prefix` + the claim; the
//! object it acts as is the `spec.username` match described in
//! [`crate::state::Authenticator::authenticate`].
//!
//! Two issuers must not be able to yield the same username, or a user of one could act as
//! (and take the clients of) a user of the other. Since a username is the prefix followed
//! by any non-empty claim value, two entries can yield the same one exactly when one's
//! prefix is a prefix of the other's (equal prefixes, both unset, or `dex` and `dex:`);
//! such a configuration is refused naming both entries ([`prefixes_collide`]).

use std::path::Path;

use jumpstarter_core::oidc::{OidcError, token_issuer};

use crate::auth::{ExternalVerifier, JwtAuthenticatorConfig};

use crate::kubernetes::cluster_config::{Authentication, ClusterConfigError};

/// The external issuers and whether unknown Clients are created on first login.
#[derive(Debug, Default)]
pub struct ExternalAuth {
    verifiers: Vec<ExternalVerifier>,
    /// `provisioning.enabled`: a Client that does not exist yet is created (with
    /// `spec.username` = the caller's username) when an external token authenticates.
    pub provisioning: bool,
}

impl ExternalAuth {
    /// From the `authentication.jwt` documents; refuses unusable ones, naming the issuer and
    /// field, duplicate issuers, and two issuers whose username prefixes collide
    /// (`prefixes_collide`).
    pub fn from_documents(
        docs: &[serde_json::Value],
        provisioning: bool,
    ) -> Result<Self, OidcError> {
        let mut verifiers: Vec<ExternalVerifier> = Vec::with_capacity(docs.len());
        for doc in docs {
            let v = ExternalVerifier::new(JwtAuthenticatorConfig::from_value(doc)?)?;
            if verifiers.iter().any(|o| o.issuer() == v.issuer()) {
                return Err(OidcError::Config {
                    issuer: v.issuer().to_owned(),
                    field: "issuer.url".into(),
                    source: "the same issuer is configured twice".into(),
                });
            }
            if v.issuer() == jumpstarter_core::auth::DEFAULT_ISSUER {
                return Err(OidcError::Config {
                    issuer: v.issuer().to_owned(),
                    field: "issuer.url".into(),
                    source: "is the internal issuer's URL".into(),
                });
            }
            if let Some((i, o)) = verifiers
                .iter()
                .enumerate()
                .find(|(_, o)| prefixes_collide(o.username_prefix(), v.username_prefix()))
            {
                return Err(OidcError::Config {
                    issuer: v.issuer().to_owned(),
                    field: "claimMappings.username.prefix".into(),
                    source: format!(
                        "jwt[{}] (prefix {:?}) and jwt[{i}] (issuer {:?}, prefix {:?}) can \
                         yield the same username, so a user of one issuer could act as a user \
                         of the other: give each issuer a prefix that does not start with \
                         another's, e.g. \"dex:\" and \"gitlab:\"",
                        verifiers.len(),
                        v.username_prefix(),
                        o.issuer(),
                        o.username_prefix(),
                    )
                    .into(),
                });
            }
            verifiers.push(v);
        }
        Ok(Self {
            verifiers,
            provisioning,
        })
    }

    /// Whether any external issuer is configured.
    pub fn is_empty(&self) -> bool {
        self.verifiers.is_empty()
    }

    /// The issuers, in configuration order.
    pub fn issuers(&self) -> impl Iterator<Item = &ExternalVerifier> {
        self.verifiers.iter()
    }

    /// The external verifier responsible for `token` (by its unverified `iss`), if any.
    pub fn verifier_for(&self, token: &str) -> Option<&ExternalVerifier> {
        if self.verifiers.is_empty() {
            return None;
        }
        let iss = token_issuer(token)?;
        self.verifiers.iter().find(|v| v.issuer() == iss)
    }
}

/// Whether two issuers with these username prefixes can yield the same username. A username
/// is the prefix followed by a non-empty claim value of any text, so `a + x == b + y` has a
/// solution exactly when one prefix starts with the other (`"dex"` + `":bob"` is `"dex:"` +
/// `"bob"`); when neither does, they differ at a position both have, and so do all their
/// usernames.
pub fn prefixes_collide(a: &str, b: &str) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Reads `--authentication-config FILE`: upstream's `authentication:` section (`jwt: [...]`,
/// optionally `internal`, `k8s`), or a whole controller `config` document (`authentication:`
/// and `provisioning:`), or an `AuthenticationConfiguration` manifest (`apiVersion`/`kind`
/// plus `jwt`). Returns the section and `provisioning.enabled` (false when absent).
pub fn read_authentication_file(path: &Path) -> Result<(Authentication, bool), ClusterConfigError> {
    let source_name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ClusterConfigError::Read {
        what: "the authentication file",
        path: source_name.clone(),
        source,
    })?;
    parse_authentication_text(&text, &source_name, "file")
}

/// [`read_authentication_file`] on text: the file's, or the ConfigMap's legacy
/// `authentication` key (an `AuthenticationConfiguration` document). `key` names it in
/// errors.
pub fn parse_authentication_text(
    text: &str,
    source_name: &str,
    key: &str,
) -> Result<(Authentication, bool), ClusterConfigError> {
    let source_name = source_name.to_owned();
    let yaml_err = |source: jumpstarter_core::BoxError| ClusterConfigError::Yaml {
        source_name: source_name.clone(),
        key: key.into(),
        source,
    };
    let mut value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| yaml_err(e.into()))?;
    if value.is_null() {
        return Ok((Authentication::default(), false));
    }
    let obj = value
        .as_object_mut()
        .ok_or_else(|| yaml_err("expected a YAML map".into()))?;
    if obj.contains_key("authentication") || obj.contains_key("provisioning") {
        // The ConfigMap's other settings are not read from this file: refused, not ignored.
        if let Some(other) = obj
            .keys()
            .find(|k| *k != "authentication" && *k != "provisioning")
        {
            return Err(ClusterConfigError::Invalid {
                source_name: source_name.clone(),
                field: other.clone(),
                reason: "this file takes only `authentication` and `provisioning`; the other \
                         settings of the ConfigMap's `config` key apply with --store kubernetes"
                    .into(),
            });
        }
        let settings = crate::kubernetes::cluster_config::parse_settings(text, &source_name)?;
        return Ok((settings.authentication, settings.provisioning.enabled));
    }
    // An AuthenticationConfiguration manifest carries apiVersion/kind around the same fields.
    obj.remove("apiVersion");
    obj.remove("kind");
    let auth: Authentication = serde_json::from_value(value).map_err(|e| yaml_err(e.into()))?;
    Ok((auth, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    const JWT: &str = "jwt:
  - issuer:
      url: https://dex.example.com
      audiences: [jumpstarter-cli]
    claimMappings:
      username:
        claim: email
        prefix: 'dex:'
";

    #[test]
    fn all_three_file_shapes_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let (a, prov) = read_authentication_file(&write("a.yaml", JWT)).unwrap();
        assert_eq!(a.jwt.len(), 1);
        assert!(!prov);
        let whole = format!(
            "authentication:\n{}provisioning:\n  enabled: true\n",
            JWT.lines().map(|l| format!("  {l}\n")).collect::<String>()
        );
        let (a, prov) = read_authentication_file(&write("b.yaml", &whole)).unwrap();
        assert_eq!(a.jwt.len(), 1);
        assert!(prov);
        let manifest = format!(
            "apiVersion: apiserver.config.k8s.io/v1beta1\nkind: AuthenticationConfiguration\n{JWT}"
        );
        let (a, _) = read_authentication_file(&write("c.yaml", &manifest)).unwrap();
        let ext = ExternalAuth::from_documents(&a.jwt, false).unwrap();
        assert_eq!(
            ext.issuers().next().map(|v| v.issuer()),
            Some("https://dex.example.com")
        );
        assert_eq!(
            ext.issuers().next().map(|v| v.username_prefix()),
            Some("dex:")
        );
    }

    #[test]
    fn the_configmap_s_other_settings_in_the_file_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.yaml");
        std::fs::write(
            &path,
            "authentication:\n  jwt: []\nhiddenLabels:\n  keys: [rack]\n",
        )
        .unwrap();
        let err = jumpstarter_core::error_chain(&read_authentication_file(&path).unwrap_err());
        assert!(err.contains("hiddenLabels"), "{err}");
    }

    #[test]
    fn bad_files_name_the_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.yaml");
        std::fs::write(&p, "jwt: 3\n").unwrap();
        let e = jumpstarter_core::error_chain(&read_authentication_file(&p).unwrap_err());
        assert!(e.contains("bad.yaml"), "{e}");
        std::fs::write(&p, "jwtt: []\n").unwrap();
        assert!(read_authentication_file(&p).is_err());
        let e = jumpstarter_core::error_chain(
            &read_authentication_file(&dir.path().join("none.yaml")).unwrap_err(),
        );
        assert!(e.contains("none.yaml"), "{e}");
        let dup: serde_json::Value = serde_json::json!({
            "issuer": {"url": "https://a.example", "audiences": ["x"]},
            "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
        });
        let e = jumpstarter_core::error_chain(
            &ExternalAuth::from_documents(&[dup.clone(), dup], false).unwrap_err(),
        );
        assert!(e.contains("twice"), "{e}");
    }

    fn issuer(url: &str, prefix: Option<&str>) -> serde_json::Value {
        let mut username = serde_json::json!({"claim": "sub"});
        if let Some(p) = prefix {
            username["prefix"] = p.into();
        }
        serde_json::json!({
            "issuer": {"url": url, "audiences": ["x"]},
            "claimMappings": {"username": username},
        })
    }

    #[test]
    fn issuers_that_can_yield_the_same_username_are_refused_naming_both() {
        for (a, b) in [
            (None, None),
            (Some(""), None),
            (Some("dex:"), Some("dex:")),
            (None, Some("dex:")),
            (Some("gitlab:"), Some("")),
            (Some("dex"), Some("dex:")),
            (Some("dex:ci:"), Some("dex:")),
        ] {
            let docs = [
                issuer("https://one.example", a),
                issuer("https://two.example", b),
            ];
            let e = jumpstarter_core::error_chain(
                &ExternalAuth::from_documents(&docs, false).unwrap_err(),
            );
            for want in [
                "claimMappings.username.prefix",
                "https://two.example",
                "jwt[1]",
                "jwt[0]",
                "https://one.example",
                "same username",
            ] {
                assert!(e.contains(want), "{a:?} {b:?}: {want} not in {e}");
            }
        }
        // Among others: the later entry is named with the one it collides with.
        let docs = [
            issuer("https://a.example", Some("a:")),
            issuer("https://dex.example", Some("dex:")),
            issuer("https://b.example", Some("b:")),
            issuer("https://dex-ci.example", Some("dex:ci:")),
        ];
        let e =
            jumpstarter_core::error_chain(&ExternalAuth::from_documents(&docs, false).unwrap_err());
        assert!(
            e.contains("\"https://dex-ci.example\"")
                && e.contains(
                    "jwt[3] (prefix \"dex:ci:\") and jwt[1] (issuer \"https://dex.example\""
                ),
            "{e}"
        );
    }

    #[test]
    fn issuers_with_distinct_prefixes_are_accepted() {
        let docs = [
            issuer("https://dex.example", Some("dex:")),
            issuer("https://gitlab.example", Some("gitlab:")),
            issuer("https://k8s.example", Some("k8s:")),
            issuer("https://dex2.example", Some("dex2:")),
        ];
        let ext = ExternalAuth::from_documents(&docs, false).unwrap();
        assert_eq!(ext.issuers().count(), 4);
        // One issuer alone may leave the prefix empty (as a shared API server config does).
        ExternalAuth::from_documents(&[issuer("https://dex.example", None)], false).unwrap();
        ExternalAuth::from_documents(&[issuer("https://dex.example", Some(""))], false).unwrap();
    }

    #[test]
    fn prefixes_collide_when_one_starts_with_the_other() {
        for (a, b, collide) in [
            ("", "", true),
            ("", "dex:", true),
            ("dex", "dex:", true),
            ("dex:", "dex:", true),
            ("dex:", "dex2:", false),
            ("dex:", "gitlab:", false),
            ("Dex:", "dex:", false),
        ] {
            assert_eq!(prefixes_collide(a, b), collide, "{a:?} {b:?}");
            assert_eq!(prefixes_collide(b, a), collide, "{b:?} {a:?}");
        }
    }

    #[test]
    fn tokens_go_to_the_issuer_they_name() {
        use base64::Engine;
        let docs = [serde_json::json!({
            "issuer": {"url": "https://a.example", "audiences": ["x"]},
            "claimMappings": {"username": {"claim": "sub", "prefix": "a:"}},
        })];
        let ext = ExternalAuth::from_documents(&docs, false).unwrap();
        let tok = |iss: &str| {
            let b = |s: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
            format!(
                "{}.{}.x",
                b("{}".into()),
                b(format!("{{\"iss\":\"{iss}\"}}"))
            )
        };
        assert!(ext.verifier_for(&tok("https://a.example")).is_some());
        assert!(ext.verifier_for(&tok("https://localhost:8085")).is_none());
        assert!(ext.verifier_for("garbage").is_none());
        assert!(
            ExternalAuth::default()
                .verifier_for(&tok("https://a.example"))
                .is_none()
        );
    }
}
