//! A small PEM (RFC 7468) reader: enough for certificates and PKCS#8 keys, with errors that
//! say what is wrong so callers can name the file.

use std::path::Path;

use base64::{Engine, engine::general_purpose::STANDARD};

/// One `-----BEGIN <label>-----` … `-----END <label>-----` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemBlock {
    /// The label, e.g. `CERTIFICATE` or `PRIVATE KEY`.
    pub label: String,
    /// The decoded contents.
    pub der: Vec<u8>,
}

/// All PEM blocks of `text`, in order; text outside blocks is ignored, as RFC 7468 allows.
pub fn parse(text: &str) -> Result<Vec<PemBlock>, String> {
    let mut blocks = Vec::new();
    let mut current: Option<(String, String, usize)> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let line_no = index + 1;
        match current.take() {
            None => {
                if let Some(label) = line
                    .strip_prefix("-----BEGIN ")
                    .and_then(|l| l.strip_suffix("-----"))
                {
                    current = Some((label.to_owned(), String::new(), line_no));
                }
            }
            Some((label, mut body, start)) => {
                if let Some(end) = line
                    .strip_prefix("-----END ")
                    .and_then(|l| l.strip_suffix("-----"))
                {
                    if end != label {
                        return Err(format!(
                            "line {line_no}: END {end:?} does not match BEGIN {label:?} of line {start}"
                        ));
                    }
                    let der = STANDARD.decode(body.as_bytes()).map_err(|e| {
                        format!("PEM block {label:?} starting at line {start} is not base64: {e}")
                    })?;
                    blocks.push(PemBlock { label, der });
                } else {
                    body.extend(line.chars().filter(|c| !c.is_whitespace()));
                    current = Some((label, body, start));
                }
            }
        }
    }
    if let Some((label, _, start)) = current {
        return Err(format!(
            "PEM block {label:?} starting at line {start} has no END line"
        ));
    }
    Ok(blocks)
}

/// `der` as one PEM block labelled `label`, 64 base64 characters a line.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Writes `contents` to `path` with mode 0600, via a temporary file and a rename, so a crash
/// never leaves a half-written secret (see [`crate::private_file::write_private_file`]).
pub fn write_secret_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    crate::private_file::write_private_file(path, contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_blocks_and_ignores_text_around_them() {
        let text = "subject=foo\n-----BEGIN CERTIFICATE-----\nAAEC\nAw==\n-----END CERTIFICATE-----\n\
                    junk\n-----BEGIN PRIVATE KEY-----\nBAU=\n-----END PRIVATE KEY-----\n";
        let blocks = parse(text).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].label, "CERTIFICATE");
        assert_eq!(blocks[0].der, vec![0, 1, 2, 3]);
        assert_eq!(blocks[1].label, "PRIVATE KEY");
        assert_eq!(blocks[1].der, vec![4, 5]);
        assert!(parse("nothing here").unwrap().is_empty());
    }

    #[test]
    fn bad_pem_is_an_error() {
        assert!(
            parse("-----BEGIN X-----\nAAAA\n")
                .unwrap_err()
                .contains("no END")
        );
        assert!(
            parse("-----BEGIN X-----\nAAAA\n-----END Y-----\n")
                .unwrap_err()
                .contains("does not match")
        );
        assert!(
            parse("-----BEGIN X-----\n!!!!\n-----END X-----\n")
                .unwrap_err()
                .contains("not base64")
        );
    }
}
