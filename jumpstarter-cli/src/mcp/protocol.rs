//! JSON-RPC 2.0 as MCP's stdio transport carries it: one message per line, UTF-8, no
//! embedded newlines.

use std::io::{self, BufRead};

use serde_json::{Map, Value, json};

/// The line is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// The JSON is not a valid request (or is too long to read).
pub const INVALID_REQUEST: i64 = -32600;
/// No such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// The method's parameters are wrong (also: unknown tool, bad tool arguments).
pub const INVALID_PARAMS: i64 = -32602;

/// The longest message read; longer lines are skipped and answered with an error. Tool
/// arguments are small (names, selectors, short JSON), so this is generous.
pub const MAX_LINE: usize = 1024 * 1024;

/// One line of input.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A complete line (without its newline).
    Text(Vec<u8>),
    /// A line longer than the limit, skipped; holds its length in bytes.
    TooLong(usize),
}

/// Reads the next line, keeping at most `max` bytes of it: a longer line is read to its end
/// and dropped, so one huge message cannot exhaust memory. `None` at end of input.
pub fn read_line<R: BufRead>(r: &mut R, max: usize) -> io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut len = 0usize;
    let mut skipping = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            // End of input: a last line without a newline still counts.
            return Ok(match (len, skipping) {
                (0, _) => None,
                (n, true) => Some(Line::TooLong(n)),
                (_, false) => Some(Line::Text(trim_cr(line))),
            });
        }
        let (part, used, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], i + 1, true),
            None => (chunk, chunk.len(), false),
        };
        len = len.saturating_add(part.len());
        if len > max {
            skipping = true;
            line = Vec::new();
        } else {
            line.extend_from_slice(part);
        }
        r.consume(used);
        if done {
            return Ok(Some(if skipping {
                Line::TooLong(len)
            } else {
                Line::Text(trim_cr(line))
            }));
        }
    }
}

fn trim_cr(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    line
}

/// A message from the host, sorted by what it asks of us.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// A request: must be answered with the same id.
    Request {
        /// Its id (string or number).
        id: Value,
        /// The method.
        method: String,
        /// Its parameters (an object), if any.
        params: Option<Map<String, Value>>,
    },
    /// A notification: never answered.
    Notification {
        /// The method.
        method: String,
    },
    /// A response to a request of ours (we send none, so it is dropped).
    Response,
    /// Not a valid JSON-RPC message: answered with [`INVALID_REQUEST`].
    Invalid {
        /// The id, when one could be read (else `null`).
        id: Value,
        /// What is wrong.
        message: String,
    },
}

/// Sorts one line. `Err` (a parse error message) when it is not JSON at all.
pub fn classify(line: &[u8]) -> Result<Incoming, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        format!(
            "Parse error: invalid JSON: {e}",
            e = jumpstarter_core::error_chain(&e)
        )
    })?;
    let invalid = |id: Value, message: &str| Incoming::Invalid {
        id,
        message: format!("Invalid Request: {message}"),
    };
    let mut obj = match value {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Ok(invalid(Value::Null, "batches are not supported"));
        }
        _ => return Ok(invalid(Value::Null, "a message must be a JSON object")),
    };
    let id = match obj.remove("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_))) => Some(id),
        Some(_) => {
            return Ok(invalid(Value::Null, "\"id\" must be a string or a number"));
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Ok(invalid(
            id.unwrap_or(Value::Null),
            "\"jsonrpc\" must be \"2.0\"",
        ));
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => {
            return Ok(invalid(
                id.unwrap_or(Value::Null),
                "\"method\" must be a string",
            ));
        }
        None if obj.contains_key("result") || obj.contains_key("error") => {
            return Ok(Incoming::Response);
        }
        None => return Ok(invalid(id.unwrap_or(Value::Null), "\"method\" is missing")),
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => {
            return Ok(invalid(
                id.unwrap_or(Value::Null),
                "\"params\" must be an object",
            ));
        }
    };
    Ok(match id {
        Some(id) => Incoming::Request { id, method, params },
        None => Incoming::Notification { method },
    })
}

/// A successful response.
pub fn response(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// An error response.
pub fn error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &str, max: usize) -> Vec<Line> {
        let mut r = io::BufReader::with_capacity(4, input.as_bytes());
        let mut out = Vec::new();
        while let Some(l) = read_line(&mut r, max).unwrap() {
            out.push(l);
        }
        out
    }

    #[test]
    fn lines_are_split_and_bounded() {
        assert_eq!(
            lines("ab\r\n\nlonger-than-ten\nok\nlast", 10),
            vec![
                Line::Text(b"ab".to_vec()),
                Line::Text(Vec::new()),
                Line::TooLong(15),
                Line::Text(b"ok".to_vec()),
                Line::Text(b"last".to_vec()),
            ]
        );
        assert_eq!(lines("", 10), vec![]);
        assert_eq!(lines("way-too-long", 3), vec![Line::TooLong(12)]);
    }

    #[test]
    fn messages_are_classified() {
        let req = classify(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap();
        assert_eq!(
            req,
            Incoming::Request {
                id: json!(1),
                method: "ping".into(),
                params: None
            }
        );
        let note = classify(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert_eq!(
            note.unwrap(),
            Incoming::Notification {
                method: "notifications/initialized".into()
            }
        );
        let resp = classify(br#"{"jsonrpc":"2.0","id":"x","result":{}}"#).unwrap();
        assert_eq!(resp, Incoming::Response);
        assert!(classify(b"{nope").unwrap_err().contains("Parse error"));
        assert!(classify(b"\xff\xfe").is_err());
        for (bad, id, why) in [
            (
                r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
                json!(null),
                "batch",
            ),
            ("3", json!(null), "object"),
            (
                r#"{"jsonrpc":"1.0","id":4,"method":"ping"}"#,
                json!(4),
                "2.0",
            ),
            (
                r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#,
                json!(null),
                "id",
            ),
            (r#"{"jsonrpc":"2.0","id":5,"method":7}"#, json!(5), "method"),
            (r#"{"jsonrpc":"2.0","id":6}"#, json!(6), "missing"),
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"x","params":[1]}"#,
                json!(7),
                "params",
            ),
        ] {
            match classify(bad.as_bytes()).unwrap() {
                Incoming::Invalid { id: got, message } => {
                    assert_eq!(got, id, "{bad}");
                    assert!(message.contains(why), "{bad}: {message}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn responses_are_single_lines() {
        let e = error(&json!(3), METHOD_NOT_FOUND, "no\nsuch");
        let text = serde_json::to_string(&e).unwrap();
        assert!(!text.contains('\n'));
        assert_eq!(e["error"]["code"], -32601);
        assert_eq!(response(&json!("a"), json!({}))["id"], "a");
    }
}
