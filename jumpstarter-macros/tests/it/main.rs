//! Tests of the `#[driver]` attribute: its compile errors, checked with trybuild against the
//! `.stderr` files in `tests/ui` (regenerate them with `TRYBUILD=overwrite` after changing a
//! message on purpose).

/// Every way `#[driver]` refuses its input names the fault at the right place.
#[test]
fn driver_attribute_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
