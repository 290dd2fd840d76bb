//! What every crate's fuzz targets share: the case count and byte mutations. Included with
//! `#[path]` by the `fuzz_tests` modules of jumpstarter-core, -controller, -drivers and
//! -exporter (test code only; proptest is their dev-dependency).

// Each includer uses a part of it.
#![allow(dead_code)]

use proptest::prelude::*;

/// The environment variable that sets the number of cases of every fuzz target (what
/// `cargo xtask fuzz --cases N` sets).
pub(crate) const CASES_ENV: &str = "JUMPSTARTER_FUZZ_CASES";

/// Cases per target without [`CASES_ENV`] (or `PROPTEST_CASES`): few enough that `cargo
/// test` stays fast.
pub(crate) const DEFAULT_CASES: u32 = 512;

/// The proptest config of every fuzz target: the case count from [`CASES_ENV`], else
/// `PROPTEST_CASES`, else [`DEFAULT_CASES`] (set explicitly, so that one variable sets them
/// all); no regression files.
pub(crate) fn fuzz_config() -> ProptestConfig {
    let cases = [CASES_ENV, "PROPTEST_CASES"]
        .iter()
        .find_map(|var| {
            let v = std::env::var(var).ok()?;
            Some(
                v.trim()
                    .parse::<u32>()
                    .unwrap_or_else(|_| panic!("{var}={v:?}: expected a number of cases")),
            )
        })
        .unwrap_or(DEFAULT_CASES);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Replaces, inserts or removes bytes of `seed` at the given places.
pub(crate) fn mutate_bytes(seed: &[u8], edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    let mut b = seed.to_vec();
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
    b
}

/// Up to eight byte edits for [`mutate_bytes`].
pub(crate) fn edits() -> impl Strategy<Value = Vec<(prop::sample::Index, u8, u8)>> {
    prop::collection::vec(
        (any::<prop::sample::Index>(), any::<u8>(), any::<u8>()),
        0..8,
    )
}
