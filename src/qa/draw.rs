//! `flashsale draw verify`: a product's published draw checked from the
//! outside, with nothing a customer could not fetch themselves, and held to
//! what the customer saved when they joined (the commitment, their ticket).

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context;
use chrono::SecondsFormat;

use crate::domain::draw::{
    verify_with, vouched_for, Check, Claims, DrawFault, DrawRecord, DrawVerdict, Vouched,
};
use crate::domain::ProductId;

/// Faults listed per check before the rest are only counted: a tampered
/// order of 2,000 tickets should not print 2,000 lines.
const SHOWN_PER_CHECK: usize = 10;

pub struct DrawReport {
    /// Where the document came from (its URL or file).
    pub source: String,
    pub product: ProductId,
    /// What the customer brought to hold the document to.
    pub claims: Claims,
    pub outcome: DrawOutcome,
}

pub enum DrawOutcome {
    /// The document is not a draw: it did not parse.
    Unreadable(String),
    Checked {
        record: Box<DrawRecord>,
        verdict: DrawVerdict,
    },
}

impl DrawReport {
    pub fn passed(&self) -> bool {
        match &self.outcome {
            DrawOutcome::Unreadable(_) => false,
            DrawOutcome::Checked { record, verdict } => {
                record.product == self.product && verdict.passed()
            }
        }
    }

    pub fn render(&self) -> String {
        let mut out = format!("draw of product {} from {}\n", self.product, self.source);
        let mut problems = Vec::new();
        match &self.outcome {
            DrawOutcome::Unreadable(error) => {
                let text = format!("not a draw: {error}");
                line(&mut out, "FAIL", "document", &text);
                problems.push("document");
            }
            DrawOutcome::Checked { record, verdict } => {
                let start = record
                    .starts_at
                    .to_rfc3339_opts(SecondsFormat::AutoSi, true);
                let _ = writeln!(out, "  commitment {}, start {start}", record.seed_sha256);
                if record.product != self.product {
                    let text = format!("the document is the draw of product {}", record.product);
                    line(&mut out, "FAIL", "product", &text);
                    problems.push("product");
                }
                for check in Check::ALL {
                    let faults: Vec<&DrawFault> = verdict.faults_of(check).collect();
                    if faults.is_empty() {
                        let vouched = vouched_for(check, record, &self.claims, verdict);
                        let (status, text) = match vouched {
                            Vouched::For(text) => ("PASS", text),
                            Vouched::Skipped(why) => ("SKIP", why.to_string()),
                            Vouched::NotClaimed if check == Check::Commitment => {
                                ("SKIP", COMMITMENT_NOT_GIVEN.to_string())
                            }
                            Vouched::NotClaimed => ("SKIP", TICKET_NOT_GIVEN.to_string()),
                        };
                        line(&mut out, status, check.name(), &text);
                        continue;
                    }
                    problems.push(check.name());
                    for fault in faults.iter().take(SHOWN_PER_CHECK) {
                        line(&mut out, "FAIL", check.name(), &fault.to_string());
                    }
                    if faults.len() > SHOWN_PER_CHECK {
                        // Blank status and check: the count sits under the faults' text.
                        let text = format!("... and {} more", faults.len() - SHOWN_PER_CHECK);
                        line(&mut out, "    ", "", &text);
                    }
                }
            }
        }
        if problems.is_empty() {
            out.push_str(
                "PASS: the order follows from the committed seed and the list frozen before \
                 its reveal, and the admissions followed the order\n",
            );
        } else {
            let _ = writeln!(out, "FAIL: {}", problems.join(", "));
        }
        out
    }
}

/// What to pass for a claim that was not given, and what it would show.
const COMMITMENT_NOT_GIVEN: &str = "not given: --commitment HEX, the seed_sha256 you saved \
    when you joined, shows the seed was not picked later";
const TICKET_NOT_GIVEN: &str = "not given: --ticket TICKET finds your entry and its place";

fn line(out: &mut String, status: &str, check: &str, text: &str) {
    let _ = writeln!(out, "{status} {check:<11}{text}");
}

/// Checks a `draw.json` already in hand against itself.
pub fn check_document(product: ProductId, source: &str, body: &str) -> DrawReport {
    check_document_with(product, source, body, Claims::default())
}

/// Checks a `draw.json` already in hand, and holds it to the customer's claims.
pub fn check_document_with(
    product: ProductId,
    source: &str,
    body: &str,
    claims: Claims,
) -> DrawReport {
    let outcome = match serde_json::from_str::<DrawRecord>(body) {
        Ok(record) => {
            let verdict = verify_with(&record, &claims);
            DrawOutcome::Checked {
                record: Box::new(record),
                verdict,
            }
        }
        Err(error) => DrawOutcome::Unreadable(error.to_string()),
    };
    DrawReport {
        source: source.to_string(),
        product,
        claims,
        outcome,
    }
}

/// Fetches `{base_url}/products/{product}/draw.json` and checks it against itself.
pub async fn fetch_and_check(base_url: &str, product: ProductId) -> anyhow::Result<DrawReport> {
    fetch_and_check_with(base_url, product, Claims::default()).await
}

/// Fetches `{base_url}/products/{product}/draw.json`, checks it and holds it
/// to the customer's claims. A shop that does not answer with the document
/// is an error, not a failed draw: nothing was checked.
pub async fn fetch_and_check_with(
    base_url: &str,
    product: ProductId,
    claims: Claims,
) -> anyhow::Result<DrawReport> {
    let url = format!(
        "{}/products/{product}/draw.json",
        base_url.trim_end_matches('/')
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let response = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = response.status();
    if !status.is_success() {
        anyhow::bail!("GET {url} answered {status}");
    }
    let body = response
        .text()
        .await
        .with_context(|| format!("GET {url}: reading the body"))?;
    Ok(check_document_with(product, &url, &body, claims))
}

#[cfg(test)]
mod tests {
    use actix_web::{web, App, HttpResponse, HttpServer};

    use super::*;

    const FIXTURE: &str = include_str!("../../tests/fixtures/draw.json");

    fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut json: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
        edit(&mut json);
        json.to_string()
    }

    #[test]
    fn the_fixture_passes() {
        let report = check_document(ProductId(7), "draw.json", FIXTURE);
        assert!(report.passed());
        assert_eq!(
            report.render(),
            "draw of product 7 from draw.json\n\
             \x20 commitment 630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd, start 2026-12-01T10:00:00Z\n\
             PASS seed       revealed; its SHA-256 is the published commitment\n\
             SKIP commitment not given: --commitment HEX, the seed_sha256 you saved when you joined, shows the seed was not picked later\n\
             PASS entries    8 (6 drawn at the start, 2 late); tickets and sequence numbers unique; late flags agree with the join times\n\
             PASS frozen     the 6 drawn tickets are the list frozen at 2026-12-01T10:00:00.004Z, SHA-256 fbc8a67fa62427541e56c7ff2456e42f9d0082df945ed9425d4be458e889c7ae\n\
             PASS order      8 tickets, as recomputed from the seed and the entries\n\
             PASS admissions 4 issued (2 used, 1 lapsed, 1 outstanding), to the first 4 tickets of the order in turn\n\
             SKIP ticket     not given: --ticket TICKET finds your entry and its place\n\
             PASS: the order follows from the committed seed and the list frozen before its reveal, and the admissions followed the order\n"
        );
    }

    fn claims(commitment: &str, ticket: &str) -> Claims {
        Claims {
            commitment: Some(commitment.parse().unwrap()),
            ticket: Some(ticket.parse().unwrap()),
            entries: None,
        }
    }

    const SAVED: &str = "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd";

    /// The scenarios are the domain's (`domain::draw::claims`); here, that
    /// the report lists the claims' faults like the others.
    #[test]
    fn claims_the_draw_does_not_bear_out_fail() {
        let other = "02d449a31fbb267c8f352e9968a79e3e5fc95c1bbeaa502fd6454ebde5a4bedc";
        let report = check_document_with(ProductId(7), "f", FIXTURE, claims(other, "A7A7A7A7A7"));
        assert!(!report.passed());
        let text = report.render();
        assert!(
            text.contains(&format!(
                "FAIL commitment the published commitment {SAVED} is not the one you saved, {other}"
            )),
            "{text}"
        );
        assert!(
            text.contains("FAIL ticket     your ticket A7A7A7A7A7 is not among the entries"),
            "{text}"
        );
        assert!(text.ends_with("FAIL: commitment, ticket\n"), "{text}");
    }

    #[test]
    fn a_tampered_order_fails_and_says_where() {
        let body = edited(|json| {
            let order = json["order"].as_array_mut().unwrap();
            order.swap(1, 2);
        });
        let report = check_document(ProductId(7), "draw.json", &body);
        assert!(!report.passed());
        let text = report.render();
        assert!(
            text.contains(
                "FAIL order      position 2 of the order: published QX5V6JM8GR, \
                 recomputed from the seed 0A1B2C3D4E (2 positions differ in all)\n"
            ),
            "{text}"
        );
        // The admissions are held to the order as published.
        assert!(
            text.contains("FAIL admissions admission 2 went to 0A1B2C3D4E"),
            "{text}"
        );
        assert!(text.ends_with("FAIL: order, admissions\n"), "{text}");
    }

    #[test]
    fn a_wrong_seed_skips_the_order_instead_of_passing_it() {
        let body = edited(|json| json["seed"] = "11".repeat(32).into());
        let text = check_document(ProductId(7), "draw.json", &body).render();
        assert!(
            text.contains("FAIL seed       the revealed seed's SHA-256 is "),
            "{text}"
        );
        assert!(
            text.contains("SKIP order      not checked: needs the committed seed\n"),
            "{text}"
        );
        assert!(text.ends_with("FAIL: seed\n"), "{text}");
    }

    #[test]
    fn before_the_start_the_draw_cannot_pass() {
        let body = edited(|json| {
            json["seed"] = serde_json::Value::Null;
            json["order"] = serde_json::json!([]);
            json["admissions"] = serde_json::json!([]);
        });
        let report = check_document(ProductId(7), "draw.json", &body);
        assert!(!report.passed());
        assert!(report
            .render()
            .contains("FAIL seed       the seed is not revealed yet"));
    }

    #[test]
    fn another_products_draw_or_a_broken_document_fails() {
        let report = check_document(ProductId(8), "draw.json", FIXTURE);
        assert!(!report.passed());
        assert!(report
            .render()
            .contains("FAIL product    the document is the draw of product 7\n"));

        let report = check_document(ProductId(7), "draw.json", "<html>Not found</html>");
        assert!(!report.passed());
        let text = report.render();
        assert!(text.contains("FAIL document   not a draw: "), "{text}");
        assert!(text.ends_with("FAIL: document\n"), "{text}");
    }

    #[test]
    fn many_faults_are_counted_not_all_listed() {
        let body = edited(|json| {
            let admissions = json["admissions"].as_array_mut().unwrap();
            let template = admissions[0].clone();
            for i in 0..15 {
                let mut extra = template.clone();
                extra["ticket"] = format!("A7A7A7A7{i:02}").into();
                extra["issued_at"] = "2026-12-01T10:05:00Z".into();
                admissions.push(extra);
            }
        });
        let text = check_document(ProductId(7), "draw.json", &body).render();
        assert_eq!(
            text.matches("FAIL admissions").count(),
            SHOWN_PER_CHECK,
            "{text}"
        );
        assert!(text.contains("... and 5 more\n"), "{text}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn checks_a_draw_served_over_http() {
        let tampered = edited(|json| json["order"].as_array_mut().unwrap().swap(0, 5));
        let server = HttpServer::new(move || {
            let tampered = tampered.clone();
            App::new().route(
                "/products/{id}/draw.json",
                web::get().to(move |id: web::Path<u32>| {
                    let body = match *id {
                        7 => Some(FIXTURE.to_string()),
                        9 => Some(tampered.clone()),
                        _ => None,
                    };
                    async move {
                        match body {
                            Some(body) => HttpResponse::Ok()
                                .content_type("application/json")
                                .body(body),
                            None => HttpResponse::NotFound().finish(),
                        }
                    }
                }),
            )
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .unwrap();
        let base = format!("http://127.0.0.1:{}/", server.addrs()[0].port());
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);

        let saved = claims(SAVED, "QX5V6JM8GR");
        let report = fetch_and_check_with(&base, ProductId(7), saved)
            .await
            .unwrap();
        let text = report.render();
        assert!(report.passed(), "{text}");
        assert!(text.starts_with(&format!(
            "draw of product 7 from {base}products/7/draw.json\n"
        )));
        assert!(
            text.contains("PASS commitment the published commitment is the one you saved\n"),
            "{text}"
        );
        let place = "QX5V6JM8GR is entry 5, drawn at the start and in the frozen list, \
                     position 3 of 8; admitted by admission 3 (used)\n";
        assert!(text.contains(&format!("PASS ticket     {place}")), "{text}");

        // Product 9 is served product 7's draw with its order tampered.
        let report = fetch_and_check(&base, ProductId(9)).await.unwrap();
        let text = report.render();
        assert!(!report.passed());
        assert!(text.contains("FAIL product "), "{text}");
        assert!(text.contains("FAIL order "), "{text}");

        let error = fetch_and_check(&base, ProductId(8)).await.err().unwrap();
        assert!(
            error.to_string().ends_with("answered 404 Not Found"),
            "{error:#}"
        );

        handle.stop(false).await;
    }
}
