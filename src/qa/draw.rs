//! `flashsale draw verify`: a product's published draw checked from the
//! outside, with nothing a customer could not fetch themselves.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context;

use crate::domain::draw::{verify, Check, DrawFault, DrawRecord, DrawVerdict};
use crate::domain::ProductId;

/// Faults listed per check before the rest are only counted: a tampered
/// order of 2,000 tickets should not print 2,000 lines.
const SHOWN_PER_CHECK: usize = 10;

pub struct DrawReport {
    /// Where the document came from (its URL or file).
    pub source: String,
    pub product: ProductId,
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
                line(&mut out, false, "document", &format!("not a draw: {error}"));
                problems.push("document");
            }
            DrawOutcome::Checked { record, verdict } => {
                let _ = writeln!(
                    out,
                    "  commitment {}, start {}",
                    record.seed_sha256,
                    record
                        .starts_at
                        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
                );
                if record.product != self.product {
                    line(
                        &mut out,
                        false,
                        "product",
                        &format!("the document is the draw of product {}", record.product),
                    );
                    problems.push("product");
                }
                for check in Check::ALL {
                    let faults: Vec<&DrawFault> = verdict.faults_of(check).collect();
                    if faults.is_empty() {
                        match passed_line(check, record, verdict) {
                            Some(text) => line(&mut out, true, check.name(), &text),
                            None => {
                                let _ = writeln!(
                                    out,
                                    "SKIP {:<11}not checked: needs the committed seed",
                                    check.name()
                                );
                            }
                        }
                        continue;
                    }
                    problems.push(check.name());
                    for fault in faults.iter().take(SHOWN_PER_CHECK) {
                        line(&mut out, false, check.name(), &fault.to_string());
                    }
                    if faults.len() > SHOWN_PER_CHECK {
                        let _ = writeln!(
                            out,
                            "     {:<11}... and {} more",
                            "",
                            faults.len() - SHOWN_PER_CHECK
                        );
                    }
                }
            }
        }
        if problems.is_empty() {
            out.push_str(
                "PASS: the order follows from the committed seed, and the admissions followed the order\n",
            );
        } else {
            let _ = writeln!(out, "FAIL: {}", problems.join(", "));
        }
        out
    }
}

fn line(out: &mut String, pass: bool, check: &str, text: &str) {
    let _ = writeln!(
        out,
        "{} {check:<11}{text}",
        if pass { "PASS" } else { "FAIL" }
    );
}

/// What a check that found nothing wrong vouches for; `None` when it could
/// not run (the order, without the committed seed).
fn passed_line(check: Check, record: &DrawRecord, verdict: &DrawVerdict) -> Option<String> {
    let counts = &verdict.counts;
    Some(match check {
        Check::Seed => "revealed; its SHA-256 is the published commitment".into(),
        Check::Entries => format!(
            "{} ({} drawn at the start, {} late); tickets and sequence numbers unique; \
             late flags agree with the join times",
            counts.entries, counts.drawn, counts.late
        ),
        Check::Order => {
            if verdict.faults_of(Check::Seed).next().is_some() {
                return None;
            }
            format!(
                "{} tickets, as recomputed from the seed and the entries",
                record.order.len()
            )
        }
        Check::Admissions => format!(
            "{} issued ({} used, {} lapsed, {} outstanding), to the first {} tickets \
             of the order in turn",
            counts.admissions, counts.used, counts.lapsed, counts.outstanding, counts.admissions
        ),
    })
}

/// Checks a `draw.json` already in hand.
pub fn check_document(product: ProductId, source: &str, body: &str) -> DrawReport {
    let outcome = match serde_json::from_str::<DrawRecord>(body) {
        Ok(record) => {
            let verdict = verify(&record);
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
        outcome,
    }
}

/// Fetches `{base_url}/products/{product}/draw.json` and checks it. A shop
/// that does not answer with the document is an error, not a failed draw:
/// nothing was checked.
pub async fn fetch_and_check(base_url: &str, product: ProductId) -> anyhow::Result<DrawReport> {
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
    Ok(check_document(product, &url, &body))
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
             PASS entries    8 (6 drawn at the start, 2 late); tickets and sequence numbers unique; late flags agree with the join times\n\
             PASS order      8 tickets, as recomputed from the seed and the entries\n\
             PASS admissions 4 issued (2 used, 1 lapsed, 1 outstanding), to the first 4 tickets of the order in turn\n\
             PASS: the order follows from the committed seed, and the admissions followed the order\n"
        );
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
            App::new()
                .route(
                    "/products/7/draw.json",
                    web::get().to(|| async {
                        HttpResponse::Ok()
                            .content_type("application/json")
                            .body(FIXTURE)
                    }),
                )
                .route(
                    "/products/9/draw.json",
                    web::get().to(move || {
                        let body = tampered.clone();
                        async move {
                            HttpResponse::Ok()
                                .content_type("application/json")
                                .body(body)
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

        let report = fetch_and_check(&base, ProductId(7)).await.unwrap();
        assert!(report.passed(), "{}", report.render());
        assert!(report.render().starts_with(&format!(
            "draw of product 7 from {base}products/7/draw.json\n"
        )));

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
