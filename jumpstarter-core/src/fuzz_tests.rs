//! Fuzz targets of core's parsers of outside input (issue 22, "harden the classes"):
//! exporter and client configs, JWTs, the `google.protobuf.Value` codec, HTTP/2 authority
//! rewriting. (The stream-frame decoder's targets sit beside it in `wire/stream_rpc.rs`:
//! `any_frames_cut_anywhere_decode_to_the_same_stream` and
//! `garbage_never_panics_and_an_error_ends_the_stream`.)
//!
//! They run under `cargo test` (and so in `cargo xtask ci`) with proptest: a bounded number
//! of random inputs and mutations of valid ones, asserting no panic and the round-trip
//! properties. (cargo-fuzz needs a nightly compiler, which this project does not use.)
//! [`fuzz_config`] is the one knob of their case count, the stream-frame targets' too:
//! `JUMPSTARTER_FUZZ_CASES`, else `PROPTEST_CASES`, else 512 (`jumpstarter-core/src/fuzz_support.rs`); `cargo xtask
//! fuzz` runs them all with many more.

use std::path::Path;

use proptest::prelude::*;

use crate::{
    auth::jwt::{self, Alg, Key},
    config::{ClientConfig, ExporterConfig},
    server::h2_authority::AuthorityRewriter,
    value::{from_json, to_json},
};

#[path = "fuzz_support.rs"]
mod fuzz_support;
pub(crate) use fuzz_support::{edits, fuzz_config, mutate_bytes};

const EXPORTER: &str = "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: demo
endpoint: grpc.example.com:443
token: abc
export:
  storage:
    type: jumpstarter_driver_opendal.driver.MockStorageMux
  power:
    type: jumpstarter_driver_power.driver.MockPower
    description: the bench supply
    config:
      voltage: 5
  group:
    children:
      inner:
        ref: power
";

const CLIENT: &str = "apiVersion: jumpstarter.dev/v1alpha1\nkind: ClientConfig\nmetadata:\n  \
    namespace: lab\n  name: hello\nendpoint: grpc.example.com:443\ntls:\n  ca: ''\n  \
    insecure: true\ntoken: abc\ngrpcOptions: {}\ndrivers:\n  allow: [a.b]\n  unsafe: false\n\
    shell:\n  use_profiles: false\nleases:\n  acquisition_timeout: 60\n  retry_timeout: 5.0\n";

/// A parsed exporter config serializes to YAML that parses back to the same config
/// (compared as YAML: the parsed form also records source positions).
fn exporter_round_trip(cfg: &ExporterConfig) -> Result<(), TestCaseError> {
    let yaml = serde_saphyr::to_string(cfg).expect("an exporter config serializes");
    let again = ExporterConfig::parse(&yaml, Path::new("again.yaml"))
        .unwrap_or_else(|e| panic!("re-serialized config does not parse: {e}\n{yaml}"));
    let yaml_again = serde_saphyr::to_string(&again).expect("serializes");
    prop_assert_eq!(yaml_again, yaml);
    Ok(())
}

/// Writes `text` as a client config and loads it; a loaded config saves and loads back
/// the same.
fn client_round_trip(dir: &Path, text: &[u8]) -> Result<(), TestCaseError> {
    let path = dir.join("client.yaml");
    std::fs::write(&path, text).expect("write");
    if let Ok(cfg) = ClientConfig::load(&path) {
        let saved = dir.join("saved.yaml");
        cfg.save(&saved).expect("save");
        let mut again = ClientConfig::load(&saved)
            .unwrap_or_else(|e| panic!("a saved client config does not load: {e}"));
        again.path = cfg.path.clone();
        prop_assert_eq!(&again, &cfg);
    }
    Ok(())
}

fn hmac_token(claims: &serde_json::Value) -> String {
    jwt::encode(Alg::Hs256, Key::Hmac(b"fuzz key"), None, claims).expect("encode")
}

/// JSON a `google.protobuf.Value` carries without loss: finite numbers that are integers
/// within ±2^53 (the codec turns integral doubles into JSON integers), strings, nesting.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        (-(1i64 << 53)..(1i64 << 53)).prop_map(|n| serde_json::json!(n)),
        (-1.0e6f64..1.0e6).prop_map(|f| serde_json::json!(f + 0.5)),
        any::<String>().prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(fuzz_config())]

    #[test]
    fn exporter_config_text_never_panics_and_round_trips(text in any::<String>()) {
        if let Ok(cfg) = ExporterConfig::parse(&text, Path::new("fuzz.yaml")) {
            exporter_round_trip(&cfg)?;
        }
    }

    #[test]
    fn mutated_exporter_configs_never_panic_and_round_trip(e in edits()) {
        let text = String::from_utf8_lossy(&mutate_bytes(EXPORTER.as_bytes(), &e)).into_owned();
        if let Ok(cfg) = ExporterConfig::parse(&text, Path::new("fuzz.yaml")) {
            exporter_round_trip(&cfg)?;
        }
    }

    #[test]
    fn client_configs_never_panic_and_round_trip(e in edits(), random in any::<Vec<u8>>()) {
        let dir = tempfile::tempdir().expect("tempdir");
        client_round_trip(dir.path(), &mutate_bytes(CLIENT.as_bytes(), &e))?;
        client_round_trip(dir.path(), &random)?;
    }

    /// Any text is refused as a JWT; `peek` never panics; a signed token verifies to its
    /// claims, and an edited one is refused unless it decodes to the same bytes.
    #[test]
    fn jwts_from_outside_never_panic(text in any::<String>(), e in edits(), sub in "[a-z]{1,12}") {
        let allowed = [Alg::Hs256];
        prop_assert!(jwt::verify(&text, Key::Hmac(b"fuzz key"), &allowed).is_err());
        let _ = jwt::peek(&text);
        let claims = serde_json::json!({"sub": sub, "exp": 4_000_000_000i64});
        let token = hmac_token(&claims);
        let got = jwt::verify(&token, Key::Hmac(b"fuzz key"), &allowed).expect("own token");
        prop_assert_eq!(serde_json::Value::Object(got), claims);
        let edited = String::from_utf8_lossy(&mutate_bytes(token.as_bytes(), &e)).into_owned();
        let _ = jwt::peek(&edited);
        if edited != token && jwt::verify(&edited, Key::Hmac(b"fuzz key"), &allowed).is_ok() {
            prop_assert_eq!(segments(&edited), segments(&token), "{} accepted", edited);
        }
    }

    /// JSON → Value → JSON is the identity on what a Value carries.
    #[test]
    fn value_codec_round_trips(v in json_value()) {
        prop_assert_eq!(to_json(from_json(v.clone())), v);
    }

    /// Any bytes decoded as a protobuf Value (as a driver call's arguments arrive) convert
    /// to JSON without panicking, and that JSON converts back to a Value of the same JSON.
    #[test]
    fn values_from_the_wire_never_panic(bytes in any::<Vec<u8>>()) {
        use prost::Message as _;
        if let Ok(v) = prost_types::Value::decode(&bytes[..]) {
            let json = to_json(v);
            prop_assert_eq!(to_json(from_json(json.clone())), json);
        }
    }

    /// The authority rewriter never panics on any bytes after the preface, and gives the
    /// same output however the stream is split.
    #[test]
    fn h2_authority_rewriting_never_panics_and_ignores_splits(
        body in any::<Vec<u8>>(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
    ) {
        let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        input.extend_from_slice(&body);
        let mut whole = Vec::new();
        let whole_result = AuthorityRewriter::new().feed(&input, &mut whole);
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
        at.sort_unstable();
        let mut split = Vec::new();
        let mut rw = AuthorityRewriter::new();
        let mut prev = 0;
        let mut split_result = Ok(());
        for cut in at.into_iter().chain([input.len()]) {
            split_result = rw.feed(&input[prev..cut], &mut split);
            prev = cut;
            if split_result.is_err() {
                break;
            }
        }
        prop_assert_eq!(whole_result.is_ok(), split_result.is_ok());
        if whole_result.is_ok() {
            prop_assert_eq!(whole, split);
        }
    }

    /// A well-formed HEADERS frame carrying an authority goes through in any split.
    #[test]
    fn h2_authority_rewriting_of_headers_frames_ignores_splits(
        authority in "[a-z0-9%@.:/]{0,40}",
        cut in any::<prop::sample::Index>(),
    ) {
        let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        input.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS
        let mut enc = loona_hpack::Encoder::new();
        let block = enc.encode([
            (&b":method"[..], &b"POST"[..]),
            (&b":scheme"[..], &b"http"[..]),
            (&b":path"[..], &b"/jumpstarter.v1.ExporterService/GetReport"[..]),
            (&b":authority"[..], authority.as_bytes()),
        ]);
        let len = block.len() as u32;
        input.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, 1, 4, 0, 0, 0, 1]);
        input.extend_from_slice(&block);
        let mut whole = Vec::new();
        let r = AuthorityRewriter::new().feed(&input, &mut whole);
        prop_assert!(r.is_ok(), "{:?}", r);
        let c = cut.index(input.len() + 1);
        let mut split = Vec::new();
        let mut rw = AuthorityRewriter::new();
        rw.feed(&input[..c], &mut split).expect("first part");
        rw.feed(&input[c..], &mut split).expect("second part");
        prop_assert_eq!(whole, split);
    }
}

fn segments(token: &str) -> Vec<Vec<u8>> {
    use base64::Engine as _;
    token
        .split('.')
        .map(|p| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p)
                .unwrap_or_default()
        })
        .collect()
}
