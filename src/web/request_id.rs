//! One id per request: the caller's `X-Request-Id` when it is sane, else a
//! fresh UUID. It is returned in the response's `X-Request-Id` and recorded on
//! the request's span, so every log line of the request carries it. Only the
//! method and path are logged: never bodies, cookies or authorisation headers.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use tracing::Instrument;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const MAX_LEN: usize = 64;

/// Short and of letters, digits and dashes only, so a caller cannot forge log
/// structure or fill the logs through it.
fn is_sane(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

pub fn request_id_of(request: &ServiceRequest) -> String {
    request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|value| value.to_str().ok())
        .filter(|id| is_sane(id))
        // From the thread's CSPRNG rather than a system call per request:
        // an id must be unique, not secret.
        .map_or_else(
            || {
                uuid::Builder::from_random_bytes(rand::random())
                    .into_uuid()
                    .to_string()
            },
            str::to_owned,
        )
}

pub async fn tag_request(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let id = request_id_of(&request);
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.path(),
    );
    let started = Instant::now();
    // Handlers' errors arrive here as responses; an Err is an inner middleware
    // failing, which actix answers without this header (the request must not
    // be cloned to build one: routing needs it unshared).
    let mut response = next
        .call(request)
        .instrument(span.clone())
        .await
        .inspect_err(|error| tracing::warn!(parent: &span, %error, "middleware failed"))?;
    let status = response.status().as_u16();
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    // Per-request lines stay at debug so a sale burst does not flood the log;
    // server errors are worth a warning.
    if status >= 500 {
        tracing::warn!(parent: &span, status, elapsed_ms, "request failed");
    } else {
        tracing::debug!(parent: &span, status, elapsed_ms, "request finished");
    }
    response.headers_mut().insert(
        REQUEST_ID,
        HeaderValue::from_str(&id).expect("a sane id or a UUID is a valid header value"),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::is_sane;

    #[test]
    fn only_short_plain_ids_are_kept() {
        assert!(is_sane("abc-123-DEF"));
        assert!(is_sane(&"a".repeat(64)));
        assert!(!is_sane(&"a".repeat(65)));
        assert!(!is_sane(""));
        assert!(!is_sane("a b"));
        assert!(!is_sane("id\"}{"));
    }
}
