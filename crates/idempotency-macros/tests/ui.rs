//! Compile-time behaviour of `#[idempotent]`: the shapes that must compile, and one clear
//! error for each misuse.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
