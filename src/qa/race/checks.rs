//! The race's checks once every buyer has an answer: with the database at
//! hand, the ledger audit and the counts of orders, items and history rows
//! against the answers; otherwise what the admin dashboard reports.

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use reqwest::StatusCode;

use super::{Invariant, RaceReport};
use crate::qa::harness::{Browser, Count};
use crate::services::ledger_audit::run_audit;

pub(super) fn invariant(report: &mut RaceReport, name: &str, ok: bool, detail: String) {
    report.invariants.push(Invariant {
        name: name.into(),
        ok,
        detail,
    });
}

pub(super) async fn check_in_database(
    report: &mut RaceReport,
    url: &str,
    fresh: bool,
) -> anyhow::Result<()> {
    report.checked_via = "database".into();
    let url = url.to_string();
    let product = report.product;
    let (audit, stock, initial, orders, items, history, restored) =
        tokio::task::spawn_blocking(move || {
            let mut conn = PgConnection::establish(&url)?;
            let audit = run_audit(&mut conn)?;
            let stock = count(
                &mut conn,
                "SELECT stock::int8 AS n FROM products WHERE id = $1",
                product,
            )?;
            let initial = count(
                &mut conn,
                "SELECT initial_stock::int8 AS n FROM products WHERE id = $1",
                product,
            )?;
            let orders = count(
                &mut conn,
                "SELECT count(DISTINCT order_id) AS n FROM order_items WHERE product_id = $1",
                product,
            )?;
            let items = count(
                &mut conn,
                "SELECT count(*) AS n FROM order_items WHERE product_id = $1",
                product,
            )?;
            let history = count(
                &mut conn,
                "SELECT count(*) AS n FROM stock_history WHERE product_id = $1 AND reason = 'purchase'",
                product,
            )?;
            let restored = count(
                &mut conn,
                "SELECT COALESCE(sum(delta), 0)::int8 AS n FROM stock_history WHERE product_id = $1 AND delta > 0 AND reason <> 'admin_adjust'",
                product,
            )?;
            anyhow::Ok((audit, stock, initial, orders, items, history, restored))
        })
        .await??;
    if fresh {
        report.stock = initial;
    }
    let sold = report.purchased as i64 * i64::from(report.quantity);
    invariant(
        report,
        "successes <= stock",
        sold <= initial,
        format!("{sold} units sold of {initial}"),
    );
    invariant(
        report,
        "remaining >= 0",
        stock >= 0,
        format!("{stock} units remain"),
    );
    if fresh {
        invariant(
            report,
            "successes + remaining = initial",
            sold - restored + stock == initial,
            format!("{sold} sold - {restored} restored + {stock} remaining vs {initial} initial"),
        );
        let n = report.purchased as i64;
        invariant(
            report,
            "orders = items = purchase history rows = successes",
            orders == n && items == n && history == n,
            format!("{orders} orders, {items} items, {history} history rows, {n} successes"),
        );
    }
    let problems = audit.problems.join("; ");
    invariant(
        report,
        "ledger audit clean",
        audit.is_clean(),
        if problems.is_empty() {
            format!("{} products agree with their history", audit.products.len())
        } else {
            problems
        },
    );
    Ok(())
}

pub(super) async fn check_via_dashboard(
    report: &mut RaceReport,
    admin: &Browser,
) -> anyhow::Result<()> {
    report.checked_via = "admin dashboard".into();
    let sold = report.purchased as i64 * i64::from(report.quantity);
    let stock = report.stock;
    invariant(
        report,
        "successes <= stock",
        sold <= stock,
        format!("{sold} units sold of {stock} (as given by --stock)"),
    );
    let response = admin.get("/admin").await?;
    let status = response.status();
    let page = response.text().await?;
    invariant(
        report,
        "ledger audit clean",
        status == StatusCode::OK && page.contains("Ledger audit: clean"),
        if status == StatusCode::OK {
            "admin dashboard reports the ledger audit".into()
        } else {
            format!("GET /admin answered {status}")
        },
    );
    Ok(())
}

fn count(conn: &mut PgConnection, sql: &str, product: i64) -> anyhow::Result<i64> {
    Ok(diesel::sql_query(sql)
        .bind::<BigInt, _>(product)
        .get_result::<Count>(conn)?
        .n)
}
