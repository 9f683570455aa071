//! What hostile or careless clients type, shared by the parser properties
//! and the HTTP-level fuzz test.

use proptest::prelude::*;

pub const SCRIPT: &str = "<script>alert(1)</script>";

/// The fixed table every field and path id is tried with: (label, value as
/// it goes on the wire, already urlencoded). `%FF` is not UTF-8 at all.
pub fn hostile_values() -> Vec<(&'static str, String)> {
    let encode = |raw: &str| serde_urlencoded::to_string([("v", raw)]).unwrap()[2..].to_string();
    let mut values: Vec<(&'static str, String)> = [
        ("empty", ""),
        ("minus one", "-1"),
        ("zero", "0"),
        ("2^63", "9223372036854775808"),
        ("exponent", "1e3"),
        ("leading space", " 1"),
        ("fullwidth one", "１"),
        ("NUL", "\0"),
        ("markup", SCRIPT),
        ("SQL", "' OR 1=1 --"),
        ("emoji", "😀🛒"),
    ]
    .into_iter()
    .map(|(label, raw)| (label, encode(raw)))
    .collect();
    values.push(("10k characters", "9".repeat(10_000)));
    values.push(("invalid UTF-8", "%FF".to_string()));
    values
}

/// Text as a hostile or careless client sends it: anything at all, numbers
/// just out of range, lookalike digits, NUL, markup and SQL, and very long.
pub fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[-+ ]{0,2}[0-9]{0,25}[ .,e]{0,2}[0-9]{0,3}",
        "[０-９٠-٩]{1,4}",
        Just(String::new()),
        Just("\0".to_string()),
        Just(SCRIPT.to_string()),
        Just("' OR 1=1 --".to_string()),
        Just("9223372036854775808".to_string()),
        Just("😀🛒".to_string()),
        (any::<char>(), 1usize..12_000).prop_map(|(c, n)| c.to_string().repeat(n)),
        (any::<String>(), any::<String>()).prop_map(|(a, b)| format!("{a}\0{SCRIPT}{b}")),
    ]
}
