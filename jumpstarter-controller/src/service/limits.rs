//! Size limits on everything a client, exporter or admin sends: the one place that defines
//! them. A request over a limit is refused with INVALID_ARGUMENT naming the field and the
//! limit, before anything is parsed further or stored (a 3.6 MB selector used to cost
//! seconds of controller CPU and megabytes of store).
//!
//! The limits are generous for real use: Kubernetes' own bounds where there are some (names,
//! label keys and values), and several times what a large lab needs elsewhere.

use tonic::Status;

/// Bytes of a label selector or filter (`board=rpi4,env in (a,b)`).
pub const MAX_SELECTOR: usize = 4096;
/// Bytes of an identifier (`namespaces/<ns>/leases/<name>`, a parent, a page token).
pub const MAX_IDENTIFIER: usize = 512;
/// Bytes of a name (an object name or lease id; Kubernetes allows 253).
pub const MAX_NAME: usize = 253;
/// Labels on one object, tags on one lease, labels of one driver report.
pub const MAX_LABELS: usize = 128;
/// Bytes of a label key or value reported by an exporter (driver reports carry free text).
pub const MAX_LABEL_TEXT: usize = 4096;
/// Bytes of a description, status message or user name.
pub const MAX_TEXT: usize = 4096;
/// Driver instances one exporter reports.
pub const MAX_REPORTS: usize = 4096;
/// Rules in one access policy; client selectors in one rule.
pub const MAX_RULES: usize = 256;

/// Refuses `value` longer than `max` bytes, naming `field`.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        return Err(Status::invalid_argument(format!(
            "{field} is too long: {} bytes (the limit is {max})",
            value.len()
        )));
    }
    Ok(())
}

/// Refuses more than `max` items, naming `field`.
pub fn check_count(field: &str, n: usize, max: usize) -> Result<(), Status> {
    if n > max {
        return Err(Status::invalid_argument(format!(
            "{field} has too many entries: {n} (the limit is {max})"
        )));
    }
    Ok(())
}

/// Refuses a map with more than [`MAX_LABELS`] entries or a key/value over `max_text`
/// bytes, naming `field` and the key.
pub fn check_labels<'a>(
    field: &str,
    labels: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
    max_text: usize,
) -> Result<(), Status> {
    check_count(field, labels.len(), MAX_LABELS)?;
    for (k, v) in labels {
        check_len(&format!("{field} key"), k, max_text)?;
        check_len(&format!("{field}[{}] value", short(k)), v, max_text)?;
    }
    Ok(())
}

/// The start of `s`, for naming an over-long key in an error.
fn short(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field_and_the_limit() {
        check_len("selector", "a=b", MAX_SELECTOR).unwrap();
        let e = check_len(
            "lease.selector",
            &"a".repeat(MAX_SELECTOR + 1),
            MAX_SELECTOR,
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("lease.selector"), "{}", e.message());
        assert!(e.message().contains("4096"), "{}", e.message());
        let e = check_count("rules", MAX_RULES + 1, MAX_RULES).unwrap_err();
        assert!(e.message().contains("rules") && e.message().contains("256"));
        let many: std::collections::HashMap<String, String> = (0..=MAX_LABELS)
            .map(|i| (i.to_string(), String::new()))
            .collect();
        let e = check_labels("labels", many.iter(), 63).unwrap_err();
        assert!(e.message().contains("labels"), "{}", e.message());
        let long: std::collections::HashMap<String, String> =
            [("k".to_string(), "é".repeat(40))].into();
        let e = check_labels("labels", long.iter(), 63).unwrap_err();
        assert!(e.message().contains("labels[k] value"), "{}", e.message());
    }
}
