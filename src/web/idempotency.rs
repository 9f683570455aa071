//! Runs a state-changing request at most once per idempotency key, as
//! payment APIs do: the key comes from the form's hidden `idempotency_key`
//! field or the `Idempotency-Key` header.

use std::future::Future;
use std::time::Duration;

use actix_web::body::to_bytes;
use actix_web::http::{header, StatusCode};
use actix_web::{HttpRequest, HttpResponse, ResponseError};

use super::see_other;
use crate::domain::{CustomerId, IdempotencyKey};
use crate::error::AppError;
use crate::services::checkout::{keeps_answers_at_gate, AnswerKey, PurchaseOutcome};
use crate::services::idempotency::{
    claim, fingerprint, legacy_fingerprint, release, save, take_over_abandoned, Abandoned, Claim,
    SavedResponse,
};
use crate::services::Shop;

const POLL: Duration = Duration::from_millis(25);

/// Marks a response whose answer the action kept with its own writes (a
/// purchase names its order on the key, in the order's transaction), so
/// nothing more needs saving.
pub struct AnswerKept;

/// `response`, marked as kept with the action's own writes.
pub fn answer_kept(mut response: HttpResponse) -> HttpResponse {
    response.extensions_mut().insert(AnswerKept);
    response
}

/// What identifies the intended action: the path and the fields that matter
/// (product ids, quantities, card), never the CSRF token or the key itself.
pub struct Intent<'a> {
    pub request: &'a HttpRequest,
    pub form_key: Option<&'a str>,
    pub fields: String,
    /// The action is a purchase, which names its order on the key in the
    /// order's own transaction: the key's `order_id` then says exactly
    /// whether it committed, so an uncertain outcome can be looked up.
    pub names_order: bool,
}

impl Intent<'_> {
    /// The key the request carries (form field first, then header), parsed,
    /// with the keyed fingerprint of what it asks for.
    fn key(&self, shop: &Shop) -> Result<Option<(IdempotencyKey, String)>, AppError> {
        let Some(raw) = self.raw_key() else {
            return Ok(None);
        };
        let key = IdempotencyKey::parse(raw)?;
        Ok(Some((
            key,
            fingerprint(&shop.fingerprint_key, &request_text(self)),
        )))
    }

    fn raw_key(&self) -> Option<&str> {
        let header_key = self
            .request
            .headers()
            .get("Idempotency-Key")
            .map(|v| v.to_str().unwrap_or(""));
        self.form_key.or(header_key)
    }
}

/// What a fingerprint covers: the method, the path and the fields that matter.
fn request_text(intent: &Intent<'_>) -> String {
    format!(
        "{} {}\n{}",
        intent.request.method(),
        intent.request.path(),
        intent.fields
    )
}

/// Marks `response` as a repeat's answer.
fn replayed(mut response: HttpResponse) -> HttpResponse {
    response.headers_mut().insert(
        header::HeaderName::from_static("idempotent-replayed"),
        header::HeaderValue::from_static("true"),
    );
    response
}

/// Runs a one-product purchase at most once per key, wherever checkout
/// keeps a purchase's answer. At the stock gate, the key goes with the
/// purchase: a refusal is recorded where it is decided and costs no
/// database write, and a repeat is answered from the gate (or from the
/// order the key names). Without the gate, the key is claimed here like any
/// other keyed request's. `buy` gets the key as parsed (a malformed one is
/// its 4xx) and answers with the purchase's outcome.
pub async fn purchase_once<F, Fut>(
    shop: &Shop,
    customer: CustomerId,
    intent: Intent<'_>,
    buy: F,
) -> Result<HttpResponse, AppError>
where
    F: FnOnce(Result<Option<AnswerKey>, AppError>) -> Fut,
    Fut: Future<Output = Result<PurchaseOutcome, AppError>>,
{
    let order_page = |order| see_other(&format!("/orders/{order}"));
    if !keeps_answers_at_gate(shop) {
        return once(shop, customer, intent, |key| async move {
            let order = buy(Ok(key.map(AnswerKey::Claimed))).await?.into_result()?;
            Ok(answer_kept(order_page(order)))
        })
        .await;
    }
    let answer_key = intent
        .key(shop)
        .map(|key| key.map(|(key, fingerprint)| AnswerKey::AtGate { key, fingerprint }));
    let outcome = buy(answer_key).await;
    let replay = matches!(&outcome, Ok(outcome) if outcome.is_replay());
    let response = match outcome.and_then(PurchaseOutcome::into_result) {
        Ok(order) => order_page(order),
        Err(error) => error.error_response(),
    };
    Ok(if replay { replayed(response) } else { response })
}

pub async fn once<F, Fut>(
    shop: &Shop,
    customer: CustomerId,
    intent: Intent<'_>,
    action: F,
) -> Result<HttpResponse, AppError>
where
    F: FnOnce(Option<IdempotencyKey>) -> Fut,
    Fut: Future<Output = Result<HttpResponse, AppError>>,
{
    let Some(raw_key) = intent.raw_key() else {
        return action(None).await;
    };
    let key = IdempotencyKey::parse(raw_key)?;
    let request_text = request_text(&intent);
    let print = fingerprint(&shop.fingerprint_key, &request_text);
    // Claimed before fingerprints were keyed: the same request matches its
    // plain hash. Such keys age out within the retention.
    let legacy = legacy_fingerprint(&request_text);

    // A repeat that arrives while the first is running waits for its answer,
    // up to about as long as the first can take to get its lock.
    let patience = tokio::time::Instant::now() + shop.settings.lock_wait * 2;
    let mut looked_for_abandoned = false;
    loop {
        match claim(&shop.bookkeeping, customer, &key, &print, &legacy).await? {
            Claim::Run => break,
            Claim::Replay(saved) => return Ok(replay(saved)),
            Claim::Mismatch => return Err(AppError::KeyReused),
            // A claim kept because its outcome could not be learned: once no
            // request can still commit under it, its order_id is final, and
            // a claim without an order or an answer did nothing that the
            // action itself would not see (pay and refund check the order's
            // state, a purchase is named on the key), so it runs again.
            Claim::InProgress if !looked_for_abandoned => {
                looked_for_abandoned = true;
                let longest = if intent.names_order {
                    shop.settings.longest_purchase()
                } else {
                    shop.settings.longest_purchase() + shop.settings.payment_provider_timeout
                };
                match take_over_abandoned(&shop.bookkeeping, customer, &key, &print, longest)
                    .await?
                {
                    Abandoned::Ordered(order) => return Ok(replay(SavedResponse::order(order))),
                    Abandoned::TakenOver => break,
                    Abandoned::NotYet => {}
                }
            }
            Claim::InProgress if tokio::time::Instant::now() < patience => {
                tokio::time::sleep(POLL).await
            }
            Claim::InProgress => return Err(AppError::KeyInProgress),
        }
    }

    let result = action(Some(key.clone())).await;
    if let Err(AppError::OutcomeUnknown(_)) = &result {
        // The COMMIT may have landed: releasing the key now would let the
        // resend act a second time. A purchase has already looked its key up
        // (checkout answers "nothing committed" as unavailable), so the claim
        // stays until the database can say, or no request can still commit.
        return result;
    }
    let (status, location, body) = match &result {
        Ok(response) if response.extensions().contains::<AnswerKept>() => return result,
        Ok(response) => (
            response.status(),
            response
                .headers()
                .get(header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(String::from),
            None,
        ),
        Err(error) => {
            let body = to_bytes(error.error_response().into_body()).await.ok();
            (
                error.status_code(),
                None,
                body.map(|b| String::from_utf8_lossy(&b).into_owned()),
            )
        }
    };
    if status.is_server_error() {
        // Fail-closed answers changed nothing: let the same form be sent again.
        release(&shop.bookkeeping, customer, &key).await?;
    } else {
        save(
            &shop.bookkeeping,
            customer,
            &key,
            SavedResponse {
                status: status.as_u16(),
                location,
                body,
            },
        )
        .await?;
    }
    result
}

fn replay(saved: SavedResponse) -> HttpResponse {
    let status = StatusCode::from_u16(saved.status).unwrap_or(StatusCode::OK);
    let mut response = HttpResponse::build(status);
    response.insert_header(("Idempotent-Replayed", "true"));
    if let Some(location) = saved.location {
        response.insert_header((header::LOCATION, location));
    }
    match saved.body {
        Some(body) => response.content_type("text/html; charset=utf-8").body(body),
        None => response.finish(),
    }
}
