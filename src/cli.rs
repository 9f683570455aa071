//! The `flashsale` command line.

use std::io::Write;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::db;
use crate::domain::draw::{Claims, EntriesCommitment, SeedCommitment, Ticket};
use crate::domain::{Email, Money, Password, ProductId};
use crate::qa::bench::{bench, BenchArgs};
use crate::qa::draw::{check_document_with, fetch_and_check_with};
use crate::qa::lab::{
    lab_document, render_experiments, run_experiments, run_lab, Contest, LabConfig, Strategy,
};
use crate::qa::race::{run_race, PayMode, RaceConfig};
use crate::services::accounts::ensure_admin;
use crate::services::catalog::{create_product, SaleSpec};
use crate::services::ledger_audit::run_audit;
use crate::services::seed::seed_demo;
use crate::startup::Application;

#[derive(Parser)]
#[command(
    name = "flashsale",
    version,
    about = "A flash-sale shop that never sells more than it has"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Shop(ShopCommand),
    /// Race many buyers for one product on a running shop; exits 1 if an invariant fails.
    Race(RaceArgs),
    /// Run one stock contest per strategy against real Redis and Postgres (DATABASE_URL's server, REDIS_URL).
    Lab(LabArgs),
    /// Load-test a shop served in this process against the pgbench ceiling (see scripts/bench).
    Bench(BenchArgs),
    /// A waiting room's published draw.
    Draw {
        #[command(subcommand)]
        command: DrawCommand,
    },
}

#[derive(Subcommand)]
enum DrawCommand {
    /// Check a product's draw.json as any customer could: the seed against
    /// its commitment (and the one you saved), the drawn entries against the
    /// list frozen at the start, the order against the seed, the admissions
    /// against the order, and your ticket's place. Exits 1 unless every
    /// check passes.
    Verify(DrawVerifyArgs),
}

#[derive(clap::Args)]
struct DrawVerifyArgs {
    /// The shop, e.g. http://127.0.0.1:8080; GET {base}/products/{id}/draw.json.
    #[arg(long, required_unless_present = "file", conflicts_with = "file")]
    base_url: Option<String>,
    #[arg(long, value_parser = product_id_arg)]
    product: ProductId,
    /// A saved draw.json to check instead of the shop's.
    #[arg(long)]
    file: Option<std::path::PathBuf>,
    /// The seed's commitment (seed_sha256) as you saved it when you joined:
    /// the published one must be the same, or the seed may have been picked later.
    #[arg(long, value_name = "HEX")]
    commitment: Option<SeedCommitment>,
    /// Your ticket: it must be an entry, in the frozen list if you joined
    /// before the start, and in the order.
    #[arg(long, value_name = "TICKET")]
    ticket: Option<Ticket>,
    /// The frozen pre-queue's commitment (entries_sha256) as you saved it
    /// at the start: the published one must be the same.
    #[arg(long, value_name = "HEX")]
    entries: Option<EntriesCommitment>,
}

#[derive(clap::Args)]
struct LabArgs {
    #[command(subcommand)]
    command: Option<LabCommand>,
    /// UNITSxREQUESTSxWORKERS, repeatable (default: 5x20x20 and 100x1000x32).
    #[arg(long = "contest", value_name = "UNITSxREQUESTSxWORKERS")]
    contests: Vec<Contest>,
    /// Only these strategies, repeatable (default: all).
    #[arg(long = "strategy", value_enum)]
    strategies: Vec<Strategy>,
    /// Also write the tables and the Redis experiments as Markdown to this file.
    #[arg(long)]
    output: Option<std::path::PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum LabCommand {
    /// The five Redis atomicity experiments, each with expected vs observed.
    Experiments {
        #[arg(long)]
        json: bool,
    },
}

/// Commands that run the shop or change its database, configured by `Settings::from_env`.
#[derive(Subcommand)]
enum ShopCommand {
    /// Migrate the database, then serve the shop on BIND (default 127.0.0.1:8080).
    Serve,
    /// Create the database if needed and apply pending migrations.
    Migrate,
    /// Create the demo admin, customers and flash sales (idempotent).
    SeedDemo,
    /// Manage admin accounts.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Manage flash-sale products.
    Product {
        #[command(subcommand)]
        command: ProductCommand,
    },
    /// Check the stock ledger; exits 1 and names what disagrees.
    Audit,
}

#[derive(clap::Args)]
struct RaceArgs {
    #[arg(long)]
    base_url: String,
    #[arg(long)]
    admin_email: String,
    #[arg(long)]
    admin_password: String,
    #[arg(long, default_value_t = 5)]
    stock: i32,
    #[arg(long, default_value_t = 20)]
    buyers: usize,
    #[arg(long, default_value_t = 1)]
    quantity: u32,
    /// Buys in flight at once (default: every buyer).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Pay each purchased order after the race.
    #[arg(long, value_enum)]
    pay: Option<PayMode>,
    /// Refund this many paid orders as the admin.
    #[arg(long, default_value_t = 0)]
    refund: usize,
    /// Race on an existing product instead of creating one through DATABASE_URL.
    #[arg(long)]
    product: Option<i64>,
    /// Buyer accounts are TAG0@flashsale.test, TAG1@..., reused across runs.
    #[arg(long, default_value = "racer")]
    buyer_tag: String,
    /// Where to create the product and check the ledger; without it the admin dashboard's audit is used.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Create an admin (or make an existing account an admin with this password).
    Create {
        #[arg(long)]
        email: String,
        #[arg(long)]
        password: String,
    },
}

#[derive(Subcommand)]
enum ProductCommand {
    /// Create a flash sale and print its id.
    Create {
        #[arg(long)]
        name: String,
        /// Price in dollars, e.g. 12.50
        #[arg(long)]
        price: String,
        #[arg(long)]
        stock: i32,
        /// Units one customer may hold in live orders; no limit when omitted.
        #[arg(long)]
        limit: Option<i32>,
        /// RFC 3339 start of the sale; now when omitted.
        #[arg(long)]
        starts_at: Option<DateTime<Utc>>,
        /// RFC 3339 end of the sale; open-ended when omitted.
        #[arg(long)]
        ends_at: Option<DateTime<Utc>>,
        #[arg(long, default_value = "")]
        description: String,
        /// Queue mode: customers join a waiting room and buy in a drawn
        /// order with a pass (needs --limit: a pass covers that many units).
        #[arg(long)]
        queue: bool,
        /// RFC 3339 opening of the waiting room; 15 minutes before the start when omitted.
        #[arg(long, requires = "queue")]
        queue_opens_at: Option<DateTime<Utc>>,
        /// The bot check's size for joining the waiting room (tries a
        /// browser makes on average); JOIN_CHECK_WORK when omitted.
        #[arg(long, requires = "queue")]
        bot_check_work: Option<i32>,
    },
}

pub async fn main() -> ExitCode {
    crate::db::init_libpq();
    if let Err(error) = crate::logging::init() {
        eprintln!("flashsale: {error:#}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    match run(cli.command).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("flashsale: {}", said(&error));
            ExitCode::FAILURE
        }
    }
}

/// A product id as clap takes it, refused in the shop's own words.
fn product_id_arg(raw: &str) -> Result<ProductId, String> {
    raw.parse::<ProductId>()
        .map_err(|invalid| crate::web::error::in_words(&invalid.into()))
}

/// What the command line says went wrong: a refusal of the shop's rules
/// or of a value typed in, in the words the shop's pages use for it
/// (`web::error::in_words`); anything else as the error chain.
fn said(error: &anyhow::Error) -> String {
    use crate::error::AppError;
    if let Some(input) = error.downcast_ref::<crate::domain::InvalidInput>() {
        return crate::web::error::in_words(&input.clone().into());
    }
    match error.downcast_ref::<AppError>() {
        Some(
            refused @ (AppError::Invalid(_)
            | AppError::NotFound(_)
            | AppError::Forbidden(_)
            | AppError::Conflict(_)),
        ) => crate::web::error::in_words(refused),
        _ => format!("{error:#}"),
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Shop(command) => shop(command).await,
        Command::Race(args) => race(args).await,
        Command::Lab(args) => lab(args).await,
        Command::Bench(args) => bench(args).await,
        Command::Draw {
            command: DrawCommand::Verify(args),
        } => draw_verify(args).await,
    }
}

async fn draw_verify(args: DrawVerifyArgs) -> anyhow::Result<ExitCode> {
    let claims = Claims {
        commitment: args.commitment,
        ticket: args.ticket,
        entries: args.entries,
    };
    let report = match (&args.file, &args.base_url) {
        (Some(path), _) => {
            let body = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
            check_document_with(args.product, &path.display().to_string(), &body, claims)
        }
        (None, Some(base_url)) => fetch_and_check_with(base_url, args.product, claims).await?,
        (None, None) => unreachable!("clap requires --base-url or --file"),
    };
    print!("{}", report.render());
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn shop(command: ShopCommand) -> anyhow::Result<ExitCode> {
    let settings = Settings::from_env()?;
    match command {
        ShopCommand::Serve => {
            migrate(&settings)?;
            let app = Application::build(settings.clone()).await?;
            let host = settings
                .bind
                .rsplit_once(':')
                .map(|(h, _)| h)
                .unwrap_or("127.0.0.1");
            println!("flashsale listening on http://{host}:{}", app.port());
            std::io::stdout().flush()?;
            app.run_until_signalled().await?;
            // Dropping the runtime would wait, without a bound, for blocking
            // calls still running (a COMMIT waiting for a lost standby, cut
            // at the stop's deadline): the stop is over, so the process is.
            std::io::stdout().flush()?;
            std::process::exit(0);
        }
        ShopCommand::Migrate => {
            migrate(&settings)?;
            println!("database migrated");
        }
        ShopCommand::SeedDemo => {
            migrate(&settings)?;
            let pool = pool(&settings);
            for line in seed_demo(&pool).await? {
                println!("{line}");
            }
        }
        ShopCommand::Admin {
            command: AdminCommand::Create { email, password },
        } => {
            let account = ensure_admin(
                &pool(&settings),
                Email::parse(&email)?,
                Password::parse(&password)?,
            )
            .await?;
            println!("admin {} (id {})", account.email, account.id);
        }
        ShopCommand::Product {
            command:
                ProductCommand::Create {
                    name,
                    price,
                    stock,
                    limit,
                    starts_at,
                    ends_at,
                    description,
                    queue,
                    queue_opens_at,
                    bot_check_work,
                },
        } => {
            let spec = SaleSpec {
                name,
                description,
                price: Money::parse_decimal(&price)?,
                stock,
                per_customer_limit: limit,
                starts_at: starts_at.unwrap_or_else(Utc::now),
                ends_at,
                queue_mode: queue,
                queue_opens_at,
                join_check_work: bot_check_work.unwrap_or(settings.security.door.join_work),
            };
            let product = create_product(&pool(&settings), spec).await?;
            println!("{}", product.id);
        }
        ShopCommand::Audit => {
            let report = db::run(&pool(&settings), run_audit).await?;
            for product in &report.products {
                println!(
                    "product {:>5}  offered {:>7}  paid {:>7}  awaiting {:>7}  restored {:>7}  stock {:>7}  {}",
                    product.id,
                    product.offered(),
                    product.paid_units,
                    product.awaiting_units,
                    product.restored_units,
                    product.stock,
                    product.name
                );
            }
            if report.is_clean() {
                println!("audit clean: {} products", report.products.len());
            } else {
                for problem in &report.problems {
                    println!("PROBLEM: {problem}");
                }
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn race(args: RaceArgs) -> anyhow::Result<ExitCode> {
    let mut config = RaceConfig::new(&args.base_url, &args.admin_email, &args.admin_password);
    config.stock = args.stock;
    config.buyers = args.buyers;
    config.quantity = args.quantity;
    config.concurrency = args.concurrency;
    config.pay = args.pay;
    config.refund = args.refund;
    config.product = args.product;
    config.buyer_tag = args.buyer_tag;
    config.database_url = args.database_url;
    config.progress = !args.json;
    let report = run_race(config).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn lab(args: LabArgs) -> anyhow::Result<ExitCode> {
    let mut config = LabConfig::from_env();
    if let Some(LabCommand::Experiments { json }) = args.command {
        let experiments = run_experiments(&config.redis_url).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&experiments)?);
        } else {
            print!("{}", render_experiments(&experiments));
        }
        return Ok(if experiments.iter().all(|e| e.pass) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if !args.contests.is_empty() {
        config.contests = args.contests;
    }
    if !args.strategies.is_empty() {
        config.strategies = args.strategies;
    }
    let report = run_lab(&config).await?;
    let failures = report.failures();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.markdown());
        for failure in &failures {
            println!("FAIL: {failure}");
        }
    }
    let mut experiments_pass = true;
    if let Some(path) = args.output {
        let experiments = run_experiments(&config.redis_url).await?;
        experiments_pass = experiments.iter().all(|e| e.pass);
        std::fs::write(&path, lab_document(&report, &experiments))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(if failures.is_empty() && experiments_pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn migrate(settings: &Settings) -> anyhow::Result<()> {
    db::create_database_if_missing(&settings.database_url)?;
    db::run_migrations(&settings.database_url)
}

fn pool(settings: &Settings) -> db::PgPool {
    db::build_one_shot_pool(
        &settings.database_url,
        settings.db_statement_timeout,
        settings.db_connect_timeout,
    )
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn draw_verify_takes_a_shop_or_a_file() {
        let parse =
            |args: &[&str]| Cli::try_parse_from([&["flashsale", "draw", "verify"], args].concat());
        assert!(parse(&["--base-url", "http://127.0.0.1:8080", "--product", "7"]).is_ok());
        assert!(parse(&["--file", "draw.json", "--product", "7"]).is_ok());
        assert!(parse(&["--product", "7"]).is_err());
        assert!(parse(&[
            "--base-url",
            "http://x",
            "--file",
            "d.json",
            "--product",
            "7"
        ])
        .is_err());
        assert!(parse(&["--base-url", "http://x", "--product", "0"]).is_err());

        let commitment = "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd";
        let claimed =
            |extra: &[&str]| parse(&[&["--file", "d.json", "--product", "7"], extra].concat());
        assert!(claimed(&["--commitment", commitment, "--ticket", "7K2M9QXH4D"]).is_ok());
        assert!(claimed(&["--ticket", "7K2M9QXH4D"]).is_ok());
        assert!(claimed(&["--commitment", &commitment[..62]]).is_err());
        assert!(claimed(&["--ticket", "7k2m9qxh4d"]).is_err());
    }

    #[test]
    fn a_queue_opening_needs_queue_mode() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(
                [
                    &[
                        "flashsale",
                        "product",
                        "create",
                        "--name",
                        "Lamp",
                        "--price",
                        "10",
                        "--stock",
                        "5",
                        "--limit",
                        "1",
                    ],
                    args,
                ]
                .concat(),
            )
        };
        assert!(parse(&["--queue"]).is_ok());
        assert!(parse(&["--queue", "--queue-opens-at", "2030-01-01T08:45:00Z"]).is_ok());
        let error = parse(&["--queue-opens-at", "2030-01-01T08:45:00Z"])
            .err()
            .expect("refused without --queue");
        assert!(error.to_string().contains("--queue"), "{error}");
        assert!(parse(&["--queue", "--queue-opens-at", "soon"]).is_err());
    }
}
