//! What the compiler says of a batch handler: one that drops its partial batch response
//! does not compile under `#![deny(unused_must_use)]`; one that returns it does.

#[test]
fn a_dropped_batch_response_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.pass("tests/batch/ui/pass/*.rs");
    t.compile_fail("tests/batch/ui/fail/*.rs");
}
