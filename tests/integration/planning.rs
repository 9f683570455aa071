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
    // The same connection, next lent out a second later (the pool lends
    // others too: ask until it is the one that prepared the check).
    let mut plan = None;
    for _ in 0..200 {
        plan = flashsale::db::run(&app.shop.pool, move |conn| match backend(conn)? == pid {
            true => {
                let plan = plan_of_check(conn)?;
                conn.batch_execute("DEALLOCATE order_exists")?;
                Ok(Some(plan))
            }
            false => Ok(None),
        })
        .await
        .unwrap();
        if plan.is_some() {
            break;
        }
    }
    let plan = plan.expect("the pool never lent the connection again");
    assert!(
        plan.contains("Index Scan using orders_pkey") && !plan.contains("Seq Scan"),
        "after 20,000 orders and a second the check still plans as:\n{plan}"
    );
}
