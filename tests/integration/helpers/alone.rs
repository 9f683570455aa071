//! Some things a process has only one of: the metrics registry and the
//! global log subscriber. A test that reads them runs in a process of its
//! own whichever runner started it (nextest gives every test a process,
//! `cargo test` runs them all in one), so no other test counts into its
//! figures or writes into its log.

use std::process::Command;

use super::die_with_parent;

/// Names the test a child process of this binary was started to run.
const ALONE: &str = "FLASHSALE_TEST_ALONE";

/// True in the process of its own, where the test goes on. Elsewhere, runs
/// `test` (its path in this binary, e.g. `observability::some_test`) in a
/// new process, fails if it failed there, and returns false.
pub fn alone_in_process(test: &str) -> bool {
    if std::env::var(ALONE).as_deref() == Ok(test) {
        return true;
    }
    let binary = std::env::current_exe().expect("the test binary's path");
    let output = die_with_parent(&mut Command::new(binary))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE, test)
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{test} failed in its own process");
    assert!(
        stdout.contains(" 1 passed;"),
        "no test {test} ran in the process of its own"
    );
    false
}
