//! Reading one setting from the environment: unset and blank are the same,
//! a value that does not parse stops the start with the setting's name.

use anyhow::bail;

pub(super) fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

pub(super) fn parse_var<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match var(name) {
        Some(raw) => raw
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={raw:?}: {e}")),
        None => Ok(default),
    }
}

/// A switch read as `on`/`off` (also true/false, 1/0).
pub(super) fn on_off(name: &str, default: bool) -> anyhow::Result<bool> {
    match var(name).as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => Ok(default),
        Some("on" | "true" | "1") => Ok(true),
        Some("off" | "false" | "0") => Ok(false),
        Some(other) => bail!("{name}={other:?}: use on or off"),
    }
}

pub(super) fn split_urls(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}
