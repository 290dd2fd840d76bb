//! Fuzz targets of the controller's parsers of outside input (issue 22, "harden the
//! classes"): label selectors and controller tokens. They run under `cargo test` (and so in
//! `cargo xtask ci`) with proptest: a bounded number of random inputs and mutations of valid
//! ones, asserting no panic and the round-trip properties. (cargo-fuzz needs a nightly
//! compiler, which this project does not use.) [`fuzz_config`] is the one knob of their
//! case count: `JUMPSTARTER_FUZZ_CASES`, else `PROPTEST_CASES`, else 512 (`jumpstarter-core/src/fuzz_support.rs`);
//! `cargo xtask fuzz` runs them with many more.

use std::collections::BTreeMap;

use jumpstarter_core::auth::{ObjectKind, Subject};
use proptest::prelude::*;

use crate::{auth::TokenIssuer, objects::selector::LabelSelector};

/// Valid selectors the mutations start from.
const SELECTORS: &[&str] = &[
    "board=rpi4",
    "board=rpi4,!busy,team in (a,b),env notin (prod)",
    "example.com/arch!=arm64, dut",
    "a in (x), b",
];

/// Replaces, inserts or removes bytes of `seed` at the given places.
fn mutate(seed: &str, edits: &[(prop::sample::Index, u8, u8)]) -> String {
    let mut b = seed.as_bytes().to_vec();
    for (at, op, byte) in edits {
        let i = at.index(b.len() + 1);
        match op % 3 {
            0 if i < b.len() => b[i] = *byte,
            1 => b.insert(i, *byte),
            _ if i < b.len() => {
                b.remove(i);
            }
            _ => {}
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

#[path = "../../jumpstarter-core/src/fuzz_support.rs"]
mod fuzz_support;
use fuzz_support::fuzz_config;

/// Label maps the parsed selectors are matched against.
fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map("[a-z]{1,3}", "[a-z0-9]{0,3}", 0..4)
}

proptest! {
    #![proptest_config(fuzz_config())]

    /// Any text: an error or a selector; its canonical text (`to_selector_string`) parses back to
    /// the same selector, which matches the same label sets.
    #[test]
    fn selector_parse_never_panics_and_round_trips(
        text in any::<String>(),
        l in labels(),
    ) {
        if let Ok(sel) = LabelSelector::parse(&text) {
            let again = LabelSelector::parse(&sel.to_selector_string())
                .unwrap_or_else(|e| panic!("{sel} (from {text:?}) does not parse: {e}"));
            prop_assert_eq!(&again, &sel);
            prop_assert_eq!(again.matches(&l), sel.matches(&l));
        }
    }

    /// Mutations of valid selectors (near misses exercise the parser's deep paths).
    #[test]
    fn mutated_selectors_never_panic_and_round_trip(
        seed in prop::sample::select(SELECTORS),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<u8>()), 0..6),
        l in labels(),
    ) {
        let text = mutate(seed, &edits);
        if let Ok(sel) = LabelSelector::parse(&text) {
            let again = LabelSelector::parse(&sel.to_selector_string())
                .unwrap_or_else(|e| panic!("{sel} (from {text:?}) does not parse: {e}"));
            prop_assert_eq!(&again, &sel);
            prop_assert_eq!(again.matches(&l), sel.matches(&l));
        }
    }

    /// Any text is refused as a controller token (no panic); a mutated real token is
    /// refused unless it still decodes to the very same signed bytes.
    #[test]
    fn controller_tokens_from_outside_are_refused(
        text in any::<String>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<u8>()), 1..4),
    ) {
        let issuer = issuer();
        prop_assert!(issuer.verify(&text).is_err());
        let subject = Subject::new(ObjectKind::Client, "default", "alice", "uid-1");
        let token = issuer.issue(&subject).expect("issue").token;
        prop_assert_eq!(&issuer.verify(&token).expect("own token verifies"), &subject);
        let mutated = mutate(&token, &edits);
        if mutated != token {
            match issuer.verify(&mutated) {
                Err(_) => {}
                // base64url ignores the unused low bits of a segment's last character, so
                // a few edits decode to identical bytes; anything else must be refused.
                Ok(s) => prop_assert_eq!(decoded(&mutated), decoded(&token), "{} accepted as {:?}", mutated, s),
            }
        }
    }
}

fn issuer() -> &'static TokenIssuer {
    static ISSUER: std::sync::OnceLock<TokenIssuer> = std::sync::OnceLock::new();
    ISSUER.get_or_init(|| TokenIssuer::generate().expect("a key"))
}

/// The decoded bytes of a token's segments.
fn decoded(token: &str) -> Vec<Vec<u8>> {
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
