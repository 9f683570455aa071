//! `flashsale bench`: its command-line arguments, and the run they ask
//! for: every scenario and the whole drop into one report, or the drop alone.

use std::process::ExitCode;

use super::{
    chart, render as render_bench, render_drop, run_bench, run_drop, BenchConfig, DropConfig,
};
use crate::config::Settings;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Seconds of load per shop scenario and per pgbench point.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// A short smoke run: 2 s per point, one fresh shop process for the hot product.
    #[arg(long)]
    pub quick: bool,
    /// pgbench client counts, comma-separated; the ceiling is the best of them.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    pub pgbench_clients: Vec<usize>,
    /// Only the crowd's answers (`/healthz`, pages, status polls, sold-out
    /// buys, joins): no pgbench and no purchases. For working on those
    /// answers; the report's purchase targets then read "–" and fail.
    #[arg(long)]
    pub crowd_only: bool,
    /// Signed-in customers the requests rotate over.
    #[arg(long, default_value_t = 256)]
    pub customers: usize,
    /// Signed-in customers who join the waiting rooms (each joins every room once).
    #[arg(long, default_value_t = 2048)]
    pub join_customers: usize,
    /// Fresh shop processes the headline (hot product, limit 1) is measured in.
    #[arg(long)]
    pub hot_repeats: Option<usize>,
    /// Markdown report to write.
    #[arg(long)]
    pub output: Option<std::path::PathBuf>,
    /// SVG chart to write.
    #[arg(long)]
    pub chart: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
    /// Only the whole drop of issue #38 (no other scenario): its report section goes to stdout.
    #[arg(long)]
    pub drop_only: bool,
    /// The drop's crowd: distinct signed-in customers.
    #[arg(long, default_value_t = 50_000)]
    pub drop_customers: usize,
    /// The drop's units (limit one per customer).
    #[arg(long, default_value_t = 1_000)]
    pub drop_units: i32,
    /// Requests the drop's driver keeps on the wire at once.
    #[arg(long, default_value_t = 256)]
    pub drop_connections: usize,
}

pub async fn bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if args.drop_only {
        return bench_drop(args).await;
    }
    let seconds = args.seconds.unwrap_or(if args.quick { 2.0 } else { 5.0 });
    let config = BenchConfig {
        database_url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| Settings::DEFAULT_DATABASE_URL.into()),
        seconds,
        pgbench_seconds: seconds,
        pgbench_clients: args.pgbench_clients.clone(),
        customers: args.customers.max(1),
        join_customers: args.join_customers.max(1),
        hot_repeats: args.hot_repeats.unwrap_or(if args.quick { 1 } else { 3 }),
        sell_out_units: if args.quick { 10_000 } else { 100_000 },
        crowd_only: args.crowd_only,
        output: args.output.clone(),
        chart: args.chart.clone(),
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    // The shell's runtime has one thread; the run's probes (activity sampling
    // beside wrk, sign-ins) get a runtime of their own. The load is wrk's.
    let run_config = config.clone();
    let report = tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(run_bench(&run_config))
    })
    .await??;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    for target in report.targets() {
        eprintln!(
            "{} {}: {} (target {} {})",
            if target.pass { "PASS" } else { "FAIL" },
            target.what,
            target.value.map_or("none".into(), |v| format!("{v:.2}")),
            target.bound,
            target.limit
        );
    }
    let mut document = render_bench(&report, &config, &command);
    // The whole drop ends a full run's report (it takes minutes: not in a
    // quick or a crowd-only run).
    if !args.quick && !config.crowd_only {
        document.push('\n');
        document.push_str(&render_drop(&whole_drop(&args).await?));
    }
    if let Some(path) = &config.output {
        std::fs::write(path, &document)?;
        eprintln!("wrote {}", path.display());
    } else if !args.json {
        print!("{document}");
    }
    if let Some(path) = &config.chart {
        chart(&report, path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `flashsale bench --drop-only`: the whole drop, on a runtime of its own
/// as `bench` gives the run (the shell's has one thread).
async fn bench_drop(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let report = whole_drop(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    let document = render_drop(&report);
    match &args.output {
        Some(path) => {
            std::fs::write(path, &document)?;
            eprintln!("wrote {}", path.display());
        }
        None if !args.json => print!("{document}"),
        None => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// The whole drop, on a runtime of its own as `bench` gives the run (the
/// shell's has one thread).
async fn whole_drop(args: &BenchArgs) -> anyhow::Result<super::DropReport> {
    let config = DropConfig {
        customers: args.drop_customers.max(1),
        units: args.drop_units.max(1),
        connections: args.drop_connections.max(1),
        ..DropConfig::new(
            std::env::var("DATABASE_URL").unwrap_or_else(|_| Settings::DEFAULT_DATABASE_URL.into()),
        )
    };
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(run_drop(&config))
    })
    .await?
}
