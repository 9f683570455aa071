//! Customers joining a waiting room as browsers do: the bot check fetched
//! and solved, then the join form posted with the session's cookie.

use futures::StreamExt;

use super::customers::Customer;

/// One bot check per customer and room, customer-major (customer c's for
/// room r at `c * rooms.len() + r`), each fetched and solved before the
/// run as that customer's browser would: a join spends its own.
pub(super) async fn solved_bot_checks(
    address: &str,
    customers: usize,
    rooms: &[i64],
) -> anyhow::Result<Vec<String>> {
    let client = reqwest::Client::new();
    let pairs = (0..customers).flat_map(|_| rooms.iter().copied());
    futures::stream::iter(pairs)
        .map(|room| solved_bot_check(&client, address, room))
        .buffered(64)
        .collect::<Vec<anyhow::Result<String>>>()
        .await
        .into_iter()
        .collect()
}

/// A bot check of `room`'s door fetched and solved as the page's widget
/// does: the `altcha` field's value.
async fn solved_bot_check(
    client: &reqwest::Client,
    address: &str,
    room: i64,
) -> anyhow::Result<String> {
    let challenge: altcha::Challenge = serde_json::from_str(
        &client
            .get(format!("{address}/door/challenge?sale={room}"))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?,
    )?;
    crate::qa::harness::solve(challenge).await
}

/// Every customer joins `product`'s waiting room through the shop's form.
pub(super) async fn join_waiting_room(
    address: &str,
    customers: &[Customer],
    product: i64,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    futures::stream::iter(customers)
        .map(|customer| {
            let client = client.clone();
            async move {
                // The bench's sales set a one-try check: the door is
                // passed (solved, spent, counted) as a browser passes it.
                let solved = solved_bot_check(&client, address, product).await?;
                let response = client
                    .post(format!("{address}/products/{product}/queue"))
                    .header(reqwest::header::COOKIE, &customer.cookie)
                    .header("X-Forwarded-For", &customer.address)
                    .form(&[
                        ("csrf_token", customer.csrf.as_str()),
                        ("altcha", solved.as_str()),
                    ])
                    .send()
                    .await?;
                anyhow::ensure!(
                    response.status() == reqwest::StatusCode::SEE_OTHER,
                    "joining the waiting room answered {}",
                    response.status()
                );
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<anyhow::Result<()>>>()
        .await
        .into_iter()
        .collect()
}
