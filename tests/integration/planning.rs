//! How the shop's connections plan: a statement prepared while a sale's
//! tables were empty must not keep the plan it got then for long. Postgres
//! plans a purchase's foreign-key checks that way (a generic plan per
//! connection, kept), and a sequential scan kept from an empty `orders`
//! reads the whole table on every check as a sale fills it; each
//! connection drops its plans every second (`db::PLANS_KEPT`).

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::Text;

use crate::helpers::spawn_app;

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

#[derive(QueryableByName)]
struct Backend {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pid: i32,
}

fn backend(conn: &mut PgConnection) -> QueryResult<i32> {
    Ok(diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Backend>(conn)?
        .pid)
}

fn plan_of_check(conn: &mut PgConnection) -> QueryResult<String> {
    let lines: Vec<PlanLine> = diesel::sql_query("EXPLAIN EXECUTE order_exists(1)").load(conn)?;
    Ok(lines
        .into_iter()
        .map(|l| l.line)
        .collect::<Vec<_>>()
        .join("\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_made_on_an_empty_table_is_made_again_within_a_second() {
    let app = spawn_app().await;
    app.customer("planning@example.com").await;
    let mut admin = app.db.conn();
    // The state of a new shop after autovacuum: the tables analyzed empty.
    admin.batch_execute("VACUUM ANALYZE orders").unwrap();

    let (pid, kept) = flashsale::db::run(&app.shop.pool, |conn| {
        // The foreign-key check a purchase's order item fires, as Postgres
        // words it, prepared and run while `orders` is empty: past five
        // runs Postgres settles on a generic plan and keeps it.
        conn.batch_execute(
            "PREPARE order_exists(bigint) AS SELECT 1 FROM ONLY orders x WHERE id = $1 FOR KEY SHARE OF x",
        )?;
        for _ in 0..8 {
            conn.batch_execute("EXECUTE order_exists(1)")?;
        }
        conn.batch_execute(
            "INSERT INTO orders (customer_id, status, total_cents, payment_deadline) \
             SELECT (SELECT id FROM customers WHERE email = 'planning@example.com'), 'expired', 100, now() \
             FROM generate_series(1, 20000)",
        )?;
        Ok((backend(conn)?, plan_of_check(conn)?))
    })
    .await
    .unwrap();
    // What this guards against: the plan made on the empty table, kept.
    assert!(kept.contains("Seq Scan"), "the check planned as:\n{kept}");

    tokio::time::sleep(flashsale::db::PLANS_KEPT + std::time::Duration::from_millis(200)).await;
    // The same connection, next lent out a second later: every connection
    // of the pool lent at once (each held a moment, so no two lookups get
    // the same one), so the one that prepared the check is among them.
    let lookups = (0..app.shop.pool.max_size()).map(|_| {
        let pool = app.shop.pool.clone();
        async move {
            flashsale::db::run(&pool, move |conn| {
                let plan = match backend(conn)? == pid {
                    true => {
                        let plan = plan_of_check(conn)?;
                        conn.batch_execute("DEALLOCATE order_exists")?;
                        Some(plan)
                    }
                    false => None,
                };
                std::thread::sleep(std::time::Duration::from_millis(300));
                Ok(plan)
            })
            .await
            .unwrap()
        }
    });
    let plan = futures::future::join_all(lookups)
        .await
        .into_iter()
        .flatten()
        .next();
    let plan = plan.expect("the pool never lent the connection again");
    assert!(
        plan.contains("Index Scan using orders_pkey") && !plan.contains("Seq Scan"),
        "after 20,000 orders and a second the check still plans as:\n{plan}"
    );
}

/// A batch's read of its buyers' holdings looks each buyer up by primary
/// key, also for a product whose holdings the statistics have not seen: a
/// join the planner shaped from the last analyze read all of a new
/// product's holdings for every batch, slower the more it had sold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holdings_read_looks_up_each_buyer_whatever_the_statistics_say() {
    let app = spawn_app().await;
    let (earlier, product) = (
        app.product(1_000_000, Some(1)).await,
        app.product(1_000_000, Some(1)).await,
    );
    let mut admin = app.db.conn();
    // The statistics stay those of the analyze below (this test's database
    // is its own).
    admin
        .batch_execute("ALTER TABLE holdings SET (autovacuum_enabled = off)")
        .unwrap();
    let holders_of = |admin: &mut PgConnection, product: i64, first: i64| {
        admin
            .batch_execute(&format!(
                "WITH made AS (INSERT INTO customers (email, password_hash) \
                   SELECT 'holder' || n || '@example.com', 'x' FROM generate_series({first}, {first} + 19999) AS n \
                   RETURNING id) \
                 INSERT INTO holdings (product_id, customer_id, units, cap) SELECT {product}, id, 1, 1 FROM made"
            ))
            .unwrap();
    };
    // Analyzed after an earlier sale, then 20,000 buyers of this one.
    holders_of(&mut admin, earlier, 1);
    admin.batch_execute("VACUUM ANALYZE holdings").unwrap();
    holders_of(&mut admin, product, 100_001);
    let buyers: Vec<String> = (0..32)
        .map(|n| {
            app.db
                .count(&format!(
                    "SELECT id AS n FROM customers WHERE email = 'holder{}@example.com'",
                    100_001 + n * 600
                ))
                .to_string()
        })
        .collect();
    let explain = |admin: &mut PgConnection, sql: &str| {
        admin.batch_execute("DEALLOCATE ALL").unwrap();
        admin
            .batch_execute(&format!("PREPARE holders_of(bigint[], bigint[]) AS {sql}"))
            .unwrap();
        let lines: Vec<PlanLine> = diesel::sql_query(format!(
            "EXPLAIN EXECUTE holders_of(ARRAY[{product}]::bigint[], ARRAY[{}]::bigint[])",
            buyers.join(",")
        ))
        .load(admin)
        .unwrap();
        lines
            .into_iter()
            .map(|l| l.line)
            .collect::<Vec<_>>()
            .join("\n")
    };
    // The join it used to be: every holding of the product read for it.
    let join = explain(
        &mut admin,
        "SELECT c.id, c.email_confirmed_at IS NOT NULL, h.product_id, h.units \
         FROM customers c LEFT JOIN holdings h ON h.customer_id = c.id AND h.product_id = ANY($1) \
         WHERE c.id = ANY($2)",
    );
    let looks_up_each_buyer = |plan: &str| {
        plan.lines()
            .any(|l| l.contains("Index Cond:") && l.contains("customer_id = c.id"))
    };
    assert!(
        !looks_up_each_buyer(&join) && join.contains("Join Filter: (h.customer_id = c.id)"),
        "this setup no longer misleads the planner:\n{join}"
    );
    // As planned for these buyers, and as the generic plan a connection
    // keeps once the statement has run a few times.
    for mode in ["auto", "force_generic_plan"] {
        admin
            .batch_execute(&format!("SET plan_cache_mode = {mode}"))
            .unwrap();
        let plan = explain(&mut admin, flashsale::db::holdings::HOLDERS);
        assert!(
            looks_up_each_buyer(&plan) && !plan.contains("Materialize"),
            "the holdings read plans as ({mode}):\n{plan}"
        );
    }
}
