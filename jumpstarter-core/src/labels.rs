//! Kubernetes name and label rules (`k8s.io/apimachinery/pkg/util/validation`), written once
//! for the CLI's `--label`/`--tag` flags and the controller's selectors and objects. Each
//! check's error says which part is wrong, in the words of the Kubernetes API server.

/// Exporter labels under this prefix are hidden from `jmp get exporters` (and the client
/// API's exporter listings) unless asked for with `--show-hidden` (`show_hidden_labels`).
pub const HIDDEN_LABEL_PREFIX: &str = "hidden.jumpstarter.dev/";

/// Whether an exporter label key is hidden by default ([`HIDDEN_LABEL_PREFIX`]).
pub fn is_hidden_label(key: &str) -> bool {
    key.starts_with(HIDDEN_LABEL_PREFIX)
}

/// The longest name part of a qualified name, and the longest label value.
const QUALIFIED_NAME_MAX: usize = 63;
/// The longest DNS subdomain.
const DNS1123_SUBDOMAIN_MAX: usize = 253;

/// Whether `s` matches `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_name_token(s: &str) -> bool {
    let b = s.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Check a Kubernetes qualified name (`[prefix/]name`, as label keys), like
/// `validation.IsQualifiedName`. The error says which part is wrong.
pub fn validate_qualified_name(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err("prefix part must be non-empty".to_string());
            }
            validate_dns1123_subdomain(prefix).map_err(|e| format!("prefix part {e}"))?;
            name
        }
        _ => {
            return Err(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', \
                 with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
                    .to_string(),
            );
        }
    };
    if name.is_empty() {
        return Err("name part must be non-empty".to_string());
    }
    if name.len() > QUALIFIED_NAME_MAX {
        return Err(format!(
            "name part must be no more than {QUALIFIED_NAME_MAX} characters"
        ));
    }
    if !is_name_token(name) {
        return Err(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must \
             start and end with an alphanumeric character (e.g. 'MyName', 'my.name' or '123-abc')"
                .to_string(),
        );
    }
    Ok(())
}

/// Check a lowercase RFC 1123 subdomain (as `validation.IsDNS1123Subdomain`).
pub fn validate_dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Err(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        match (b.first(), b.last()) {
            (Some(f), Some(e)) => {
                (f.is_ascii_lowercase() || f.is_ascii_digit())
                    && (e.is_ascii_lowercase() || e.is_ascii_digit())
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            }
            _ => false,
        }
    };
    if !s.split('.').all(label_ok) {
        return Err(format!(
            "{s:?} must be a lowercase RFC 1123 subdomain: lowercase alphanumeric characters, \
             '-' or '.', starting and ending with an alphanumeric character (e.g. 'example.com')"
        ));
    }
    Ok(())
}

/// Check a label value (as `validation.IsValidLabelValue`): empty, or at most 63 characters of
/// alphanumerics, `-`, `_`, `.`, starting and ending with an alphanumeric.
pub fn validate_label_value(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    if s.len() > QUALIFIED_NAME_MAX {
        return Err(format!(
            "must be no more than {QUALIFIED_NAME_MAX} characters"
        ));
    }
    if !is_name_token(s) {
        return Err(
            "a valid label value must be an empty string or consist of alphanumeric \
             characters, '-', '_' or '.', and must start and end with an alphanumeric character"
                .to_string(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names() {
        for ok in [
            "a",
            "A-b_c.d",
            "example.com/My.Name",
            "x/y",
            &"a".repeat(63),
        ] {
            assert_eq!(validate_qualified_name(ok), Ok(()), "{ok}");
        }
        for (bad, says) in [
            ("", "name part must be non-empty"),
            ("/x", "prefix part must be non-empty"),
            ("Foo.Bar/x", "prefix part"),
            ("-a", "must consist of"),
            ("a/b/c", "a qualified name"),
            (&"a".repeat(64), "no more than 63"),
        ] {
            let e = validate_qualified_name(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn subdomains_and_label_values() {
        assert_eq!(validate_dns1123_subdomain("a.b-c.d"), Ok(()));
        for bad in ["", "A.b", "a..b", "-a", "a-", &"a".repeat(254)] {
            assert!(validate_dns1123_subdomain(bad).is_err(), "{bad}");
        }
        for ok in ["", "v1", "a.b_c-d"] {
            assert_eq!(validate_label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["-b", "b ", "a/b", &"a".repeat(64)] {
            assert!(validate_label_value(bad).is_err(), "{bad}");
        }
    }
}
