//! What the benchmark ran on, for the report's first table.

use std::process::Command;

use diesel::prelude::*;

pub(super) fn machine() -> Vec<(String, String)> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1_048_576.0))
        .unwrap_or_default();
    let command = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    vec![
        ("CPU".into(), cpu),
        (
            "cores".into(),
            format!(
                "{} (shared with other work on the machine)",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            ),
        ),
        ("memory".into(), memory),
        ("kernel".into(), command("uname", &["-sr"])),
        ("pgbench".into(), command("pgbench", &["--version"])),
    ]
}

pub(super) fn pg_settings(db_url: &str) -> Vec<(String, String)> {
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        setting: String,
    }
    let Ok(mut conn) = PgConnection::establish(db_url) else {
        return Vec::new();
    };
    diesel::sql_query(
        "SELECT name, setting FROM pg_settings WHERE name IN \
         ('server_version', 'fsync', 'synchronous_commit', 'shared_buffers', 'max_connections', 'wal_level') ORDER BY name",
    )
    .load::<Setting>(&mut conn)
    .unwrap_or_default()
    .into_iter()
    .map(|s| (format!("postgres {}", s.name), s.setting))
    .collect()
}
