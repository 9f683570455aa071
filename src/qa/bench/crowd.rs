//! The crowd's cheap answers: `/healthz`, the pages, the waiting room's
//! status polls and sold-out buys, each beside `/healthz`; and, last, the
//! waiting-room joins and the time to a room's first pass.

use super::customers::Customer;
use super::first_pass::time_to_first_pass;
use super::fixtures::{queue_sale, QUEUE_UNITS};
use super::joins::{join_waiting_room, solved_bot_checks};
use super::measure::{Bench, Yardstick};
use super::wrk::Requests;
use super::*;

/// Joins per second the joins scenario has pairs for: past them a request
/// repeats a place (answered, but no new row), so the rooms are as many as
/// that rate over the run calls for.
const JOIN_PAIRS_PER_SECOND: f64 = 10_000.0;

fn tag(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

/// `/healthz` both ways, then the pages, the status polls and the sold-out
/// buys, as `signed` (the rotating customers) or anonymous.
pub(super) async fn crowd_runs(
    bench: &mut Bench<'_>,
    pool: &crate::db::PgPool,
    signed: &[Customer],
    hot: i64,
    sold_out: i64,
) -> anyhow::Result<Vec<Measured>> {
    let mut runs = Vec::new();
    let anonymous: &[Customer] = &[];
    let buy = |products: Vec<i64>, customers, name: &str| Requests::Buy {
        products,
        customers,
        tag: tag(name),
    };
    let get = |path: String, customers| Requests::Get {
        paths: vec![path],
        customers,
        count: false,
    };
    runs.push(
        bench
            .measure(
                HEALTHZ,
                Requests::Plain {
                    path: "/healthz".into(),
                },
                64,
                200,
                String::new(),
                Yardstick::RunsOwn,
            )
            .await?,
    );
    runs.push(
        bench
            .measure(
                HEALTHZ_SCRIPTED,
                Requests::Get {
                    paths: vec!["/healthz".into()],
                    customers: anonymous,
                    count: true,
                },
                64,
                200,
                String::new(),
                Yardstick::RunsOwn,
            )
            .await?,
    );
    let product = format!("/products/{hot}");
    for (scenario, path, who) in [
        (LIST_ANON, "/".to_string(), anonymous),
        (LIST_SIGNED, "/".to_string(), signed),
        (PRODUCT_ANON, product.clone(), anonymous),
        (PRODUCT_SIGNED, product.clone(), signed),
    ] {
        check_page(&bench.address(), &path, who.first()).await?;
        runs.push(
            bench
                .measure(
                    scenario,
                    get(path, who),
                    64,
                    200,
                    String::new(),
                    Yardstick::Beside,
                )
                .await?,
        );
    }
    let waiting_room = queue_sale(pool, "waiting room", QUEUE_UNITS).await?;
    join_waiting_room(&bench.address(), signed, waiting_room).await?;
    bench.set_up_done()?;
    runs.push(
        bench
            .measure(
                QUEUE_STATUS,
                get(format!("/products/{waiting_room}/queue.json"), signed),
                64,
                200,
                String::new(),
                Yardstick::Beside,
            )
            .await?,
    );
    bench.warm(&buy(vec![sold_out], signed, "warm"), 64).await?;
    runs.push(
        bench
            .measure(
                SOLD_OUT,
                buy(vec![sold_out], signed, "gone"),
                64,
                409,
                String::new(),
                Yardstick::Beside,
            )
            .await?,
    );

    Ok(runs)
}

/// The joins (last, as their waiting rooms stay live, ticking, from then
/// on), then a room's start to its first pass.
pub(super) async fn join_runs(
    bench: &mut Bench<'_>,
    pool: &crate::db::PgPool,
    joiners: &[Customer],
) -> anyhow::Result<(Measured, Vec<FirstPass>)> {
    let room_count =
        ((bench.seconds() * JOIN_PAIRS_PER_SECOND) / joiners.len() as f64).ceil() as usize;
    let mut rooms = Vec::new();
    for n in 0..room_count.max(1) {
        rooms.push(queue_sale(pool, &format!("joins {n}"), QUEUE_UNITS).await?);
    }
    // The shop's copy of the sales learns of them within a second.
    tokio::time::sleep(crate::services::sale_cache::SERVE_AT_MOST).await;
    let pairs = rooms.len() * joiners.len();
    let solving = std::time::Instant::now();
    // The join form's field, customer-major, as `Requests::Join` takes them.
    let solutions = solved_bot_checks(&bench.address(), joiners.len(), &rooms)
        .await?
        .into_iter()
        .map(|solved| serde_urlencoded::to_string([("altcha", solved)]))
        .collect::<Result<Vec<_>, _>>()?;
    // The last pairs are used last: every solution must outlive the run.
    anyhow::ensure!(
        solving.elapsed().as_secs_f64() + 2.0 * bench.seconds() + 60.0
            < crate::services::door::CHALLENGE_LIFETIME.as_secs_f64(),
        "solving {pairs} bot checks took {:.0} s: with a {:.0} s run some would expire \
         before their join (fewer --seconds)",
        solving.elapsed().as_secs_f64(),
        bench.seconds()
    );
    bench.set_up_done()?;
    let note = format!("{} rooms, {pairs} customer-room pairs", rooms.len());
    let joins = bench
        .measure(
            JOINS,
            Requests::Join {
                products: rooms,
                customers: joiners,
                solutions: &solutions,
            },
            64,
            303,
            note,
            Yardstick::RunsOwn,
        )
        .await?;
    if joins.answers > pairs as u64 {
        eprintln!(
            "joins: {} answers for {pairs} pairs; the rest joined again (no new place)",
            joins.answers
        );
    }
    let mut first_passes = Vec::new();
    for waiters in [1, joiners.len()] {
        first_passes.push(time_to_first_pass(pool, &bench.address(), joiners, waiters).await?);
    }
    Ok((joins, first_passes))
}

/// The page runs tell answers apart only as below 400 or not, so before
/// them: the page is a 200, and signed in or not as the run means it to be.
async fn check_page(address: &str, path: &str, who: Option<&Customer>) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let mut request = client.get(format!("{address}{path}"));
    if let Some(customer) = who {
        request = request.header(reqwest::header::COOKIE, &customer.cookie);
    }
    let response = request.send().await?;
    let status = response.status();
    let signed_in = response.text().await?.contains("action=\"/logout\"");
    anyhow::ensure!(
        status == reqwest::StatusCode::OK && signed_in == who.is_some(),
        "GET {path} answered {status}, signed in: {signed_in}, expected 200 and {}",
        who.is_some()
    );
    Ok(())
}
